"""The loop's step fused for the common calls: greedy chains from `NgramIndex`es (the default of `generate` on a
decoder-only model) and greedy trees from `SuffixIndex`es, with no logits processor, stopping criterion, streamer or
recorded scores.

Such a step's host work is what the sizing policy's `draft`, `DraftBatch.pack`, greedy acceptance, the policy's
`update`, `Stopper.keep` and the index's `extend` do, some forty small Python and numpy operations; here they are one
numba call a step (`_fused_kernels.step`: this step's acceptance, then the next step's draft), taken as the
acceptance of the step every driver takes (`engine.Batch.step`), whose forward here gives the argmax without scores
(`verify_ids`) and whose commit is the target's own. The prefill's token is
taken by the same call, as the acceptance of an empty draft. The steps, the drafts and the tokens are those of the
unfused loop (tests/test_fused.py checks it), so `generate`'s loop hands its rows to `run_rows` until one finishes,
then drops it as always (reference: gpt-fast and vLLM keep a decoding step's host side to a few calls for the same
reason).
"""
from __future__ import annotations

import types

import numpy as np
from numba import typed, typeof
from numba.core.typing.typeof import typeof_impl

from ..runtime.jit import interpreted, kernels
from . import _fused_kernels, _fused_recycle
from ._fused_kernels import Calibration, Chains, Policy, Rows, Sizing, Trees, TreeWork
from ..index.ngram import NgramIndex
from ..index.recycle import RecycleIndex
from ..index.suffix import SuffixIndex
from ..model import CausalLM, StaticCausalLM
from ..verify.batch import DraftBatch, Verdict, _chain_parents
from .policy import _BUCKETS, Stacked
from .recycling import Recycling
from .sizing import StackedTrees


def fused(target, rows, run, max_new: int, clock):
    """A fused loop for this call (`FusedChains`, `FusedSuffixChains`, `FusedTrees`), or None where a step needs what
    only the unfused loop does."""
    plain = (type(target) in (CausalLM, StaticCausalLM) and not run.sampling and not run.scorer.active
             and not run.stopper.criteria and run.recorder is None and run.streamer.streamer is None)
    index = type(rows.indexes[0]) if rows.indexes else None
    kind = {(True, NgramIndex): FusedChains, (True, SuffixIndex): FusedSuffixChains,
            (False, SuffixIndex): FusedTrees, (False, RecycleIndex): FusedRecycleTrees}.get((run.sizing.chain, index))
    if not plain or kind is None or not all(type(ix) is index for ix in rows.indexes):
        return None
    if kind is FusedRecycleTrees and not FusedRecycleTrees.takes(rows.indexes, run):
        return None
    return kind(target, run, max_new, clock, rows.indexes)


def for_rows(target, indexes: list, lengths: list, eos, max_new: int, stats, widths=None, trees=None,
             width: int = 0):
    """A fused step for greedy rows driven from outside `generate` (the server's engine, `start` and `step` one step
    at a time): the rows' indexes (all `NgramIndex`es or all `SuffixIndex`es), their own `DraftLength`s (one row's as
    it is, several stacked, `policy.Stacked`: the kernels teach each row's), their eos ids (any collection: `_Fused`
    sorts them into the kernels' array), most new tokens, the stats their forwards count in, and `widths`: what the
    batch's step costs at each draft width, [most draft tokens + 1], which the caller may rewrite before each step
    (`_fused_kernels._batch_cut`; None: each row drafts what its policy asks). `trees`: each row's `TreeSizing`, for
    rows drafting trees from `SuffixIndex`es (`FusedTrees`) or from `RecycleIndex`es merged with one over one
    `Recycled`, which the step's kernel teaches each forward's top-k (`FusedRecycleTrees`); several stacked
    (`sizing.StackedTrees`: each row's policy and calibration taught there; `lengths` and `widths` unread). `width`:
    the chain draft buffers' width at least (the caller may write drafts of its own there before a step: rows'
    predictions, `serve.engine`). None where no fused step takes the indexes, their sizings or the target."""
    first = type(indexes[0])
    same = all(type(ix) is first for ix in indexes)
    if trees is not None:
        kind = {SuffixIndex: FusedTrees, RecycleIndex: FusedRecycleTrees}.get(first) \
            if same and StackedTrees.takes(trees) else None
    else:
        kind = {NgramIndex: FusedChains, SuffixIndex: FusedSuffixChains}.get(first)
        if (not same or not Stacked.takes(lengths) or
                (kind is FusedChains and len({(ix.max_ngram, ix.min_ngram) for ix in indexes}) > 1)):
            kind = None
    if kind is None or not isinstance(target, (CausalLM, StaticCausalLM)):
        return None
    if trees is not None:
        sizing = trees[0] if len(trees) == 1 else StackedTrees(trees)
    else:
        sizing = types.SimpleNamespace(chain=True, length=lengths[0] if len(lengths) == 1 else Stacked(lengths))
    run = types.SimpleNamespace(sizing=sizing, stopper=types.SimpleNamespace(eos=eos), stats=stats, forwards=0,
                                recycling=Recycling(indexes[0].recycled.k) if kind is FusedRecycleTrees else None)
    if kind is FusedRecycleTrees and not FusedRecycleTrees.takes(indexes, run):
        return None
    fused = kind(target, run, max_new, _UNTIMED, indexes)
    if widths is not None:
        fused.widths = widths
    fused.width = max(fused.width, width)
    return fused


class _Lists(tuple):
    """Several rows' index arrays as the kernels take them: a tuple of typed lists, one per item of the indexes'
    `kernel_state`, whose numba type is found once (numba types a plain tuple of typed lists anew at every call:
    28 us a step, against 6 us here). A typed list's type never changes, so neither does the tuple's."""


@typeof_impl.register(_Lists)
def _typeof_lists(val, c):
    found = val.__dict__.get("numba_type")
    if found is None:
        found = val.__dict__["numba_type"] = typeof(tuple(val), c.purpose)
    return found


_UNTIMED = types.SimpleNamespace(lap=lambda phase: None)  # a clock that times nothing
_UNCUT = np.empty(0)  # `Sizing.widths` of a step whose rows draft what their policies ask


class _Fused:
    """Runs a call's steps, one kernel call a step (see module docstring).

    Args:
        target: a `CausalLM` or `StaticCausalLM`.
        run: the call's `_Run` (its policy, stopper, stats).
        max_new: most new tokens per row.
        clock: the call's `Clock` (the phases "draft", "forward" and "accept": acceptance, policy, stop and
            index in one).
        indexes: the rows' indexes.
    """

    def __init__(self, target, run, max_new: int, clock, indexes: list):
        self.lists = list if interpreted() else typed.List  # the Python twins take plain lists (`runtime.jit`)
        self.target, self.run, self.max_new, self.clock = target, run, max_new, clock
        self.budget = run.sizing.max_nodes if not run.sizing.chain else run.sizing.length.max_tokens
        self.width = max(self.budget, 1)  # the draft buffers' (a kernel drafts at most `budget` into them)
        self.eos = np.array(sorted(run.stopper.eos), dtype=np.int64)
        self.pads = np.array([target.padded(n) for n in range(self.budget + 1)], dtype=np.int64)
        self._held = None  # (row ids, typed lists of their index arrays), kept across `run_rows` calls

    def run_rows(self, rows, outs: list, prefill=None) -> list:
        """Step `rows` (the loop's `_Rows`) until one of them is done; append the new tokens to `outs`; return
        which rows are done, as the loop's `_append` does. After the first draft each step is one kernel call: it
        accepts the step's drafts and drafts the next step's (into the other of two draft buffers). `prefill`: the
        prefill's logits [r, 1, V], whose token is taken first (an empty draft's step, with no commit)."""
        run = self.run
        s = self.start(rows, [len(outs[i]) for i in rows.ids], prefill)
        while not s["finished"]:
            self.step(rows, s)
        drafted, accepted = s["rows"].totals.tolist()
        run.stats.draft_tokens += drafted
        run.stats.accepted_tokens += accepted
        for k, rid in enumerate(rows.ids):
            outs[rid].extend(s["out"][k, s["start"][k]:s["lens"][k]].tolist())
        return s["rows"].done.tolist()

    def start(self, rows, held: list, prefill=None) -> dict:
        """What stepping `rows` (a `Batch` with each row's `indexes` and `ids`) needs, by name: the kernels' bundles,
        the index arrays, the draft buffers and the first step's `DraftBatch` ("batch"), drafted, or after taking the
        prefill's token (`prefill`: its logits [r, 1, V]; "finished" counts the rows that token ended). `held`: each
        row's new tokens so far; a row's new tokens go to out[k, start[k]:lens[k]] ("out", "start", "lens")."""
        r = len(rows.ids)
        lists = self._arrays(rows)
        start, lens = np.array([held] * 2, dtype=np.int64)  # lens moves on
        out = np.empty((r, self.max_new), dtype=np.int64)  # written before it is read; a row's tokens stop at max_new
        s = self._step_buffers(r, lens, out, rows.last)
        s.update(start=start, lens=lens, out=out, finished=0)
        now, later = self._drafts(r)  # this step's drafts, the next step's
        if prefill is None:
            s["lists"], s["batch"] = lists, self._batch(now, self._draft(lists, s, now))
            self.clock.lap("draft")
        else:
            s["finished"], s["lists"] = self._accept(self._prefilled(prefill, s), self._batch(now, 0), rows, lists, s,
                                                     now, later)
            self.run.forwards += 1
            self.clock.lap("prefill")
            s["batch"], now, later = self._batch(later, s["widest"]), later, now
        s["now"], s["later"] = now, later
        return s

    def step(self, rows, s: dict) -> None:
        """One step of `rows` from `start`'s state `s`: the step every driver takes (`engine.Batch.step`), this
        kernel call its acceptance (it accepts, stops, extends the indexes and drafts the next step into "batch");
        "finished" counts the rows done."""
        now, later = s["now"], s["later"]
        rows.step(s["batch"], lambda b, out: self._take(out, b, rows, s, now, later), self.run.stats, ids=self.ids)
        self.run.forwards += 1
        self.clock.lap("accept")  # the next step's draft included
        s["batch"], s["now"], s["later"] = self._batch(later, s["widest"]), later, now

    ids = True  # the step's forward gives the target's argmax after the root and each draft node [r, N + 1]

    def _take(self, out, batch: DraftBatch, rows, s: dict, now, later) -> Verdict:
        """The step's acceptance (`Batch.step`'s `accept`): the forward's `out` (`ids`: the argmax, else logits:
        `_targets`) into the step kernel, which accepts, stops, extends the indexes and drafts the next step."""
        self.clock.lap("forward")
        s["finished"], s["lists"] = self._accept(self._targets(out, s), batch, rows, s["lists"], s, now, later)
        return self._verdict(batch, s)

    def _targets(self, out, s: dict) -> np.ndarray:
        """The target's argmax [r, N + 1] from what the forward gave."""
        return out

    def _prefilled(self, logits, s: dict) -> np.ndarray:
        """The argmax of the prefill's logits [r, 1]."""
        return self.target.argmax(logits)

    def _accept(self, targets, batch: DraftBatch, rows, lists, s: dict, now, later) -> tuple:
        """`_step`, after growing the indexes where they must grow first; (rows done, the index arrays)."""
        while (finished := self._step(targets, batch, lists, s, now, later)) < 0:
            for ix in rows.indexes:  # the kernel changed nothing
                ix.reserve(batch.width + 1)
            lists = self._arrays(rows, grown=True)
        return finished, lists

    def _step_buffers(self, r: int, lens: np.ndarray, out: np.ndarray, last: np.ndarray) -> dict:
        """What the kernels read and write for r rows, by name (allocated once per `run_rows`): the rows' `Rows`, the
        call's `Policy` and this many rows' `Sizing` (the kernels' bundles), and the next draft's width."""
        policy = self.run.sizing.length
        budgets, counts, bonus = np.zeros((3, r), dtype=np.int64)  # one allocation: each costs more than its use
        rows = Rows(self.eos, self.max_new, lens, out, last, counts, bonus, np.zeros(r, dtype=np.bool_),
                    np.zeros(2, dtype=np.int64), budgets)
        return {"rows": rows, "policy": Policy(_BUCKETS, *policy.counts),
                "sizing": Sizing(self.budget, self.pads, *policy.tables(r), self.widths), "widest": 0}

    widths = _UNCUT  # what a chain step of the whole batch costs at each width (`for_rows`), or empty

    def _drafts(self, r: int) -> tuple:
        """Two steps' draft buffers for r rows (this step's, the next one's; `Chains`), each tokens [r, budget],
        sizes [r] and the matches behind them [r] (two allocations: each costs more than the kernel's work on a small
        batch)."""
        # a draft kernel writes at most a row's width of tokens, whatever the policy asks (`_fused_kernels.draft*`)
        tokens, ints = np.zeros((2, r, self.width), dtype=np.int64), np.zeros((2, 2, r), dtype=np.int64)
        return tuple(Chains(tokens[i], ints[i, 0], ints[i, 1]) for i in range(2))

    def _batch(self, d, widest: int) -> DraftBatch:
        """The `DraftBatch` of chain drafts d (`Chains`), `widest` columns."""
        return DraftBatch(None, d.tokens[:, :widest], _chain_parents(len(d.sizes), widest), d.sizes, True)

    def _arrays(self, rows, grown: bool = False) -> tuple:
        """The rows' index arrays as the kernels take them, one sequence per item of their `kernel_state`: a tuple
        each for one row, else typed lists, made once per call and then cut to the rows still running (making one
        costs 20-100 us)."""
        kern = kernels(_fused_kernels)
        indexes = rows.indexes
        if len(indexes) == 1:
            return tuple((item,) for item in self._items(indexes[0]))
        if self._held is None:
            self._held = rows.ids, _Lists(self.lists(items) for items in zip(*map(self._items, indexes)))
        held, lists = self._held
        if held != rows.ids:
            running = set(rows.ids)
            keep = np.array([rid in running for rid in held], dtype=np.bool_)
            lists = _Lists(kern.kept(items, keep) for items in lists)
            self._held = rows.ids, lists
        for k, ix in enumerate(indexes if grown else ()):
            for items, item in zip(lists, self._items(ix)):
                items[k] = item
        return lists

    def _items(self, index) -> tuple:
        """What the kernels take of one row's index (`kernel_state`: its arrays, scratch sized for the budget)."""
        return index.kernel_state(self.budget)


class FusedChains(_Fused):
    """Greedy chains from `NgramIndex`es, fused (`_fused_kernels.draft` first, then `step`: `accept` and `draft`)."""


    def __init__(self, target, run, max_new: int, clock, indexes: list):
        super().__init__(target, run, max_new, clock, indexes)
        self.ngram = (indexes[0].max_ngram, indexes[0].min_ngram) if indexes else None  # the call's n-gram settings

    def _draft(self, lists, s: dict, d) -> int:
        """The first step's drafts into d; returns their width."""
        return kernels(_fused_kernels).draft(lists, s["rows"], s["sizing"], s["policy"], d)

    def _step(self, targets, batch: DraftBatch, lists, s: dict, now, later) -> int:
        finished, s["widest"] = kernels(_fused_kernels).step(targets, now, batch.width, lists, self.ngram,
                                                             s["policy"], s["rows"], s["sizing"], later)
        return finished

    def _verdict(self, batch: DraftBatch, s: dict) -> Verdict:
        return Verdict(s["rows"].counts, s["rows"].bonus)


class _FusedSuffix(_Fused):
    """Rows drafted from `SuffixIndex`es: their automata (which the kernels extend, and `SuffixIndex.extend` then
    finds as full as they are: it reads their room off the arrays) and scratch."""


class FusedSuffixChains(_FusedSuffix):
    """Greedy chains from `SuffixIndex`es, fused (`_fused_kernels.draft_suffix` first, then `step_suffix`)."""


    def _draft(self, lists, s: dict, d) -> int:
        return kernels(_fused_kernels).draft_suffix(lists, s["rows"], s["sizing"], s["policy"], d)

    def _step(self, targets, batch: DraftBatch, lists, s: dict, now, later) -> int:
        finished, s["widest"] = kernels(_fused_kernels).step_suffix(targets, now, batch.width, lists, s["policy"],
                                                                    s["rows"], s["sizing"], later)
        return finished

    _verdict = FusedChains._verdict


class FusedTrees(_FusedSuffix):
    """Greedy trees from `SuffixIndex`es, fused (`_fused_kernels.draft_trees` first, then `step_trees`)."""


    def _step_buffers(self, r: int, lens: np.ndarray, out: np.ndarray, last: np.ndarray) -> dict:
        width, sizing = self.width, self.run.sizing  # the draft buffers' width (`_drafts`): a step's trees
        cal = sizing.calibration  # are at most that wide, so paths [r, width] and cols [r, width + 1] hold a path
        work = TreeWork(np.zeros((r, width), dtype=np.int64), np.zeros((r, width + 1), dtype=np.int64),
                        np.zeros(r, dtype=np.int64), sizing.step_costs(r))
        return {**super()._step_buffers(r, lens, out, last), "work": work, "in_place": True,
                "calibration": Calibration(cal.EDGES, *cal.counts, cal.prior)}

    def _drafts(self, r: int) -> tuple:
        """Two steps' tree buffers for r rows (`Trees`), each with parents and probs [r, budget] and the chain
        floor's depths [r] besides the chains' buffers."""
        width = self.width
        parents, probs = np.zeros((2, r, width), dtype=np.int64), np.zeros((2, r, width))
        depths = np.zeros((2, r), dtype=np.int64)
        return tuple(Trees(d.tokens, parents[i], probs[i], d.sizes, d.matches, depths[i])
                     for i, d in enumerate(super()._drafts(r)))

    def _batch(self, d, widest: int) -> DraftBatch:
        return DraftBatch(None, d.tokens[:, :widest], d.parents[:, :widest], d.sizes, False, d.probs[:, :widest])

    def _draft(self, lists, s: dict, d) -> int:
        return kernels(_fused_kernels).draft_trees(lists, s["rows"], s["sizing"], s["policy"], s["calibration"],
                                                   s["work"], d)

    def _step(self, targets, batch: DraftBatch, lists, s: dict, now, later) -> int:
        finished, s["in_place"], s["widest"] = kernels(_fused_kernels).step_trees(
            targets, now, batch.width, lists, s["policy"], s["calibration"], s["rows"], s["work"], s["sizing"], later)
        return finished

    def _verdict(self, batch: DraftBatch, s: dict) -> Verdict:
        """Every row on its tree's first nodes: a chain's verdict (nothing moves); else the accepted paths'
        columns."""
        rows = s["rows"]
        if s["in_place"]:
            return Verdict(rows.counts, rows.bonus)
        return Verdict(rows.counts, rows.bonus, cols=s["work"].cols[:, : 1 + int(rows.counts.max())], ordered=False)


class FusedRecycleTrees(FusedTrees):
    """Greedy trees from `RecycleIndex`es merged with suffix indexes (``lookup="suffix+recycle"``), fused
    (`_fused_recycle`): each step's forward also gives the top-k after every column (`recycling.top_k`), which M
    learns inside the step's kernel call."""


    @staticmethod
    def takes(indexes: list, run) -> bool:
        """Whether the rows' indexes are merged ones over one `Recycled` with one `keep` (and the call learns)."""
        first = indexes[0]
        return (run.recycling is not None and first.suffix is not None
                and all(ix.suffix is not None and ix.recycled is first.recycled and ix.keep == first.keep
                        for ix in indexes))

    def __init__(self, target, run, max_new: int, clock, indexes: list):
        _Fused.__init__(self, target, run, max_new, clock, indexes)
        table = indexes[0].recycled
        self.recycled = (*table.arrays, table.calib)  # ids, score, keys, pair, pprob, stamp, meta, calib
        self.m = (table.ids, table.score, table.keys, table.pair, table.pprob, table.calib, table.meta)
        self.keep, self.k = indexes[0].keep, run.recycling.k

    ids = False  # the logits: their top-k too

    def _targets(self, logits, s: dict) -> np.ndarray:
        s["top"] = self.run.recycling.launch(logits)
        return self.target.argmax(logits)

    def _prefilled(self, logits, s: dict) -> np.ndarray:
        s["top"] = self.run.recycling.launch(logits)
        return self.target.argmax(logits)

    def _accept(self, targets, batch: DraftBatch, rows, lists, s: dict, now, later) -> tuple:
        s["top_arrays"] = tuple(np.ascontiguousarray(t.numpy()) for t in s["top"])
        return super()._accept(targets, batch, rows, lists, s, now, later)

    def _draft(self, lists, s: dict, d) -> int:
        return kernels(_fused_recycle).draft_recycle_trees(lists, self.m, self.keep, s["rows"], s["sizing"],
                                                           s["policy"], s["calibration"], s["work"], d)

    def _step(self, targets, batch: DraftBatch, lists, s: dict, now, later) -> int:
        finished, s["in_place"], s["widest"] = kernels(_fused_recycle).step_recycle_trees(
            targets, *s["top_arrays"], now, batch.width, lists, self.recycled, self.keep, s["policy"],
            s["calibration"], s["rows"], s["work"], s["sizing"], later)
        return finished
