"""The loop's step fused for the common call: greedy chains drafted from `NgramIndex`es, with no logits processor,
stopping criterion, streamer or recorded scores (the default of `generate` on a decoder-only model).

Such a step's host work is what `ChainSizing.draft`, `DraftBatch.pack`, greedy acceptance, `ChainSizing.update`,
`Stopper.keep` and `NgramIndex.extend` do, about forty small Python and numpy operations; here they are two numba
calls (`_fused_kernels`), and what is left in Python is the target's own: its forward and commit. The steps, the
drafts and the tokens are those of the unfused loop (tests/test_fused.py checks it), so `generate`'s loop hands its
rows to `FusedChains.run` until one finishes, then drops it as always (reference: gpt-fast and vLLM keep a decoding
step's host side to a few calls for the same reason).
"""
from __future__ import annotations

import functools

import numpy as np
from numba import typed

from . import _fused_kernels as K
from .index.ngram import NgramIndex
from .policy import _BUCKETS
from .targets import CausalLM
from .static import StaticCausalLM
from .verify.batch import DraftBatch, Verdict, _chain_parents

_warm_up = functools.cache(K.warm_up)  # on the first fused call, not at import


class FusedChains:
    """Runs a call's steps two kernels a step (see module docstring); `of` says whether a call qualifies.

    Args:
        target: a `CausalLM` or `StaticCausalLM`.
        run: the call's `_Run` (its policy, stopper, stats).
        max_new: most new tokens per row.
        clock: the call's `Clock` (the phases "draft", "forward" and "accept": acceptance, policy, stop and
            index in one).
    """

    def __init__(self, target, run, max_new: int, clock):
        _warm_up()
        self.target, self.run, self.max_new, self.clock = target, run, max_new, clock
        self.policy = run.sizing.length
        self.eos = np.array(sorted(run.stopper.eos), dtype=np.int64)
        self.pads = np.array([target.padded(n) for n in range(self.policy.max_tokens + 1)], dtype=np.int64)
        self._held = None  # (row ids, typed lists of their index arrays), kept across `run_rows` calls

    @classmethod
    def of(cls, target, rows, run, max_new: int, clock) -> "FusedChains | None":
        """A fused loop for this call, or None where a step needs what only the unfused loop does."""
        plain = (type(target) in (CausalLM, StaticCausalLM) and run.sizing.chain and not run.sampling
                 and not run.scorer.active and not run.stopper.criteria and run.recorder is None
                 and run.streamer.streamer is None)
        if not plain or not all(type(ix) is NgramIndex for ix in rows.indexes):
            return None
        return cls(target, run, max_new, clock)

    def run_rows(self, rows, outs: list) -> list:
        """Step `rows` (the loop's `_Rows`) until one of them is done; append the new tokens to `outs`; return
        which rows are done, as the loop's `_append` does."""
        r, run, policy, target = len(rows.ids), self.run, self.policy, self.target
        indexes = rows.indexes
        lists = self._arrays(rows)
        lens = np.array([len(outs[i]) for i in rows.ids], dtype=np.int64)
        start, out = lens.copy(), np.zeros((r, self.max_new), dtype=np.int64)
        drafts = np.zeros((r, max(self.policy.max_tokens, 1)), dtype=np.int64)
        sizes, matches, budgets, counts, bonus = (np.zeros(r, dtype=np.int64) for _ in range(5))
        done, totals, tables = np.zeros(r, dtype=np.bool_), np.zeros(2, dtype=np.int64), policy.tables(r)
        ngram = (indexes[0].max_ngram, indexes[0].min_ngram)
        finished = 0
        while not finished:
            widest = K.draft(lists[0], lists[2], lens, self.max_new, policy.max_tokens, self.pads, _BUCKETS,
                             policy.accepted, policy.rejected, policy.version, *tables, drafts, sizes, matches,
                             budgets)
            batch = DraftBatch(None, drafts[:, :widest], _chain_parents(r, widest), sizes, True)
            self.clock.lap("draft")
            targets = target.verify_ids(rows.last, batch, run.stats)  # [r, widest + 1]
            self.clock.lap("forward")
            while (finished := K.accept(targets, batch.tokens, sizes, matches, *lists, *ngram, _BUCKETS,
                                        policy.accepted, policy.rejected, policy.version, self.eos, self.max_new, lens,
                                        out, rows.last, counts, bonus, done, totals)) < 0:
                for ix in indexes:  # an index must grow first: the kernel changed nothing
                    ix._reserve(widest + 1)
                lists = self._arrays(rows, grown=True)
            target.commit(batch, Verdict(counts, bonus))
            run.forwards += 1
            self.clock.lap("accept")
        run.stats.draft_tokens += int(totals[0])
        run.stats.accepted_tokens += int(totals[1])
        for k, rid in enumerate(rows.ids):
            outs[rid].extend(out[k, start[k]:lens[k]].tolist())
        return done.tolist()

    def _arrays(self, rows, grown: bool = False) -> tuple:
        """The rows' index arrays as the kernels take them, (hists, tables, states): a tuple each for one row, else
        typed lists, made once per call and then cut to the rows still running (making one costs 20-100 us)."""
        indexes = rows.indexes
        if len(indexes) == 1:
            return tuple((getattr(indexes[0], name),) for name in _ARRAYS)
        if self._held is None:
            self._held = rows.ids, tuple(typed.List([getattr(ix, name) for ix in indexes]) for name in _ARRAYS)
        held, lists = self._held
        if held != rows.ids:
            running = set(rows.ids)
            keep = np.array([rid in running for rid in held], dtype=np.bool_)
            lists = tuple(K.kept(items, keep) for items in lists)
            self._held = rows.ids, lists
        for k, ix in enumerate(indexes if grown else ()):
            for items, name in zip(lists, _ARRAYS):
                items[k] = getattr(ix, name)
        return lists


_ARRAYS = ("_hist", "_table", "_state")  # an `NgramIndex`'s arrays, as the kernels take them
