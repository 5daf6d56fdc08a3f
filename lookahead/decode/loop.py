"""The decode loop: draft from an index, verify every draft token in one target forward, keep what the target agrees
with.

A step, the same for chains and trees, greedy and sampling:

    draft (each row's index, sized by the policy) -> cut (what a processor forbids) -> verify (one forward)
    -> score (processors, each position with its own prefix) -> accept (the rule) -> update the sizing
    -> commit (the cache keeps the accepted path) -> advance (append, stop, drop finished rows)

The forward, the acceptance and the commit are `engine.Batch.step`'s, the step the server's engine takes too. The
common calls (plain greedy chains or trees) run the fused step instead (`fused`): the same steps, each one kernel call
on the host. `lookahead.generate.decode` sets up the call and runs `run_loop`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..index.draft import Draft
from ..model.facts import ModelFacts
from ..verify.batch import DraftBatch, to_device
from ..verify.rules import acceptance_rule
from .engine import Batch
from .fused import fused as fused_loop
from .outputs import Recorder
from .processing import Scorer, Stopper, Streamer
from .recycling import Recycling
from .settings import GenerationStats, Settings
from .sizing import make_sizing

__all__ = ["Rows", "Run", "assemble", "make_run", "run_loop", "token_ids"]


@dataclass
class Rows(Batch):
    """The call's rows still running (an `engine.Batch` whose handles are each row's place in the call, `ids`), with
    what the loop reads of each: entry i of every field belongs to original row `ids[i]`."""

    prompts: torch.Tensor | None = None  # [b, P] what precedes the new tokens: the left-padded prompt (decoder start
    # for seq2seq)
    indexes: list = field(default_factory=list)  # [b] each row's index (None: nothing is drafted)

    @property
    def ids(self) -> list:
        return self.rows

    def _cut(self, keep: list) -> None:
        super()._cut(keep)
        self.prompts = self.prompts[keep] if keep else self.prompts[:0]
        self.indexes = [self.indexes[i] for i in keep]


@dataclass
class Run:
    """What one call applies at every step besides the model."""

    scorer: Scorer
    stopper: Stopper
    accept: object  # (DraftBatch, scores [b, N+1, V]) -> Verdict
    sizing: object  # ChainSizing | TreeSizing: draft(indexes, rooms) -> drafts; update(batch, verdict)
    streamer: Streamer
    recorder: Recorder | None
    stats: GenerationStats
    sampling: bool = False  # do_sample: speculative sampling instead of greedy acceptance
    forwards: int = 0  # forwards so far (the prefill's included): each running row took part in all of them
    recycling: Recycling | None = None  # a recycling lookup's: every forward's top-k, learned by the rows' indexes


def run_loop(rows: Rows, run: Run, max_new: int) -> list:
    """Run the loop over `rows` (and their target); return the new tokens of each row."""
    target = rows.target
    outs = [[] for _ in rows.ids]
    run.stats.forwards_by_row = [0] * len(outs)  # each row's, written when it finishes (`_retire`)
    clock = run.stats.clock()
    logits = target.prefill(run.stats)  # [b, 1, V]
    fused = fused_loop(target, rows, run, max_new, clock)
    if fused is not None:  # the prefill's token taken by the fused step, which drafts the first step with it
        _retire(rows, fused.run_rows(rows, outs, logits), run)
    else:
        empty = DraftBatch.pack([Draft.empty()] * len(outs), chain=True)
        top = run.recycling.launch(logits) if run.recycling is not None else None
        scores = run.scorer(logits, rows, outs, empty)
        verdict = run.accept(empty, scores)
        if top is not None:
            run.recycling.learn(top, rows.indexes, empty)
        _advance(rows, outs, run, empty, verdict, scores, logits)
        clock.lap("prefill")
    while rows.ids:
        if fused is not None:  # the common call: a step's host work in one kernel call, until a row is done
            _retire(rows, fused.run_rows(rows, outs), run)
            continue
        drafts = run.sizing.draft(rows.indexes, max_new - 1 - np.array([len(outs[r]) for r in rows.ids]),
                                  target.padded)
        batch = DraftBatch.pack(run.scorer.cut(drafts, rows, outs, run.sizing.chain), run.sizing.chain)
        clock.lap("draft")
        scored = []

        def accept(batch: DraftBatch, logits: torch.Tensor):
            """The call's acceptance of the step's logits [b, N+1, V], with the recycling and the sizing around it."""
            top = run.recycling.launch(logits) if run.recycling is not None else None  # [b, N+1, k] ids, probs
            clock.lap("forward")
            scores = run.scorer(logits, rows, outs, batch)  # each column scored with its own prefix
            verdict = run.accept(batch, scores)  # accepted path and next token of each row
            if top is not None:  # before the indexes take the step's tokens: the root's context is their last two
                run.recycling.learn(top, rows.indexes, batch)
            clock.lap("accept")
            run.sizing.update(batch, verdict)
            scored.append(scores)
            return verdict

        logits, verdict = rows.step(batch, accept, run.stats)  # the forward, the acceptance, the commit
        _advance(rows, outs, run, batch, verdict, scored[0], logits)
        clock.lap("commit")
    clock.total()
    return outs


def _advance(rows: Rows, outs, run: Run, batch: DraftBatch, verdict, scores, logits) -> None:
    """Count the step, append each row's gained tokens (accepted drafts + the target's own) and drop finished rows.

    scores/logits [b, N+1, V] are the step's; the rows' gained tokens read them along the accepted paths."""
    run.stats.draft_tokens += int(batch.sizes.sum())
    run.stats.accepted_tokens += int(verdict.counts.sum())
    run.forwards += 1
    cols = verdict.columns()
    if cols is not None and (run.recorder is not None or run.stopper.criteria):  # trees: the accepted path's columns
        at, cols = torch.arange(len(cols), device=scores.device)[:, None], to_device(cols, scores.device)
        scores, logits = scores[at, cols], logits[at, cols]
    _retire(rows, _append(rows, outs, verdict.gained(batch), run, scores, logits), run)


def _append(rows: Rows, outs, gained, run: Run, scores, logits) -> list:
    """Append each row's gained tokens, cut where plain decoding would have stopped; return which rows are done."""
    done, criteria = [], bool(run.stopper.criteria)  # rows of tensors are taken only for those who read them
    for i, (rid, new) in enumerate(zip(rows.ids, gained)):
        new, stop = run.stopper.keep(rows.prompts[i] if criteria else None, outs[rid], new,
                                     scores[i] if criteria else None)
        if run.recorder is not None:
            run.recorder.add(rid, scores[i, : len(new)], logits[i, : len(new)])
        run.streamer.put(new)
        outs[rid].extend(new)
        rows.last[i] = new[-1]
        if rows.indexes[i] is not None:
            rows.indexes[i].extend(np.array(new, dtype=np.int64))
        done.append(stop)
    return done


def _retire(rows: Rows, done: list, run: Run) -> None:
    """Remove finished rows from the batch (and from the target's cache: `Batch.retire`) so they cost nothing more;
    a finished row took part in every forward so far."""
    for rid in rows.retire(done):
        run.stats.forwards_by_row[rid] = run.forwards


def make_run(facts: ModelFacts, batch: int, processors, criteria, config, settings: Settings, eos: tuple,
             max_new: int, cost, argmax_of=None, recycled=None) -> Run:
    """What the call applies at every step besides the model (`Run`); `cost`: its verification cost model
    (`calibrate.draft_cost`); `recycled`: the call's `Recycled` predictions (a recycling lookup), learned from every
    forward."""
    recorder = None
    if config.return_dict_in_generate:
        recorder = Recorder(batch, bool(config.output_scores), bool(config.output_logits))
    sizing = make_sizing(settings.draft, settings.num_draft_tokens, settings.max_draft_nodes, cost)
    return Run(Scorer(processors, batch), Stopper(criteria, eos, max_new),
               acceptance_rule(config.do_sample, settings.generator, facts.device, argmax_of), sizing,
               Streamer(settings.streamer, batch), recorder, settings.stats, bool(config.do_sample),
               recycling=None if recycled is None else Recycling(recycled.k))


def assemble(input_ids: torch.Tensor, outs: list, pad: int) -> torch.Tensor:
    """[B, L + new]: the prompts, then each row's new tokens padded with `pad` (built in numpy: a fraction of torch's
    per-operation cost; on a CPU in one buffer, the prompts copied in)."""
    p, cpu = input_ids.shape[1], input_ids.device.type == "cpu"
    seqs = np.full((len(outs), (p if cpu else 0) + max(map(len, outs))), pad, dtype=np.int64)
    new = seqs[:, p:] if cpu else seqs
    for row, o in zip(new, outs):
        row[: len(o)] = o
    if cpu:
        seqs[:, :p] = input_ids.numpy()
        return torch.from_numpy(seqs)
    return torch.cat([input_ids, torch.from_numpy(seqs).to(input_ids.device)], dim=1)


def token_ids(ids) -> tuple:
    """A generation config's token id field (None, an int, a list or a tensor) as a tuple of ints."""
    if ids is None:
        return ()
    return tuple(int(t) for t in (ids.reshape(-1).tolist() if isinstance(ids, torch.Tensor) else np.ravel(ids)))
