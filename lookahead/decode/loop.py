"""The decode loop: draft from an index, verify every draft token in one target forward, keep what the target agrees
with.

A step, the same for chains and trees, greedy and sampling:

    draft (each row's index, sized by the policy) -> cut (what a processor forbids) -> verify (one forward)
    -> score (processors, each position with its own prefix) -> accept (the rule) -> update the sizing
    -> commit (the cache keeps the accepted path) -> advance (append, stop, drop finished rows)

The common calls (plain greedy chains or trees) run the fused step instead (`fused`): the same steps, each one
kernel call on the host. `lookahead.generate.decode` sets up the call and runs `run_loop`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..index.draft import Draft
from ..model.facts import ModelFacts
from ..verify.batch import DraftBatch, to_device
from ..verify.rules import acceptance_rule
from .fused import fused as fused_loop
from .outputs import Recorder
from .processing import Scorer, Stopper, Streamer
from .recycling import Recycling
from .settings import GenerationStats, Settings
from .sizing import make_sizing

__all__ = ["Rows", "Run", "assemble", "make_run", "run_loop", "token_ids"]


@dataclass
class Rows:
    """Decoding state of the rows still running; entry i of each field belongs to original row `ids[i]`."""

    ids: list
    prompts: torch.Tensor  # [b, P] what precedes the new tokens: the left-padded prompt (decoder start for seq2seq)
    last: np.ndarray  # [b] newest token, not yet in the cache
    indexes: list  # [b] each row's index (None: nothing is drafted)


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


def run_loop(target, rows: Rows, run: Run, max_new: int) -> list:
    """Run the loop; return the new tokens of each row."""
    outs = [[] for _ in rows.ids]
    run.stats.forwards_by_row = [0] * len(outs)  # each row's, written when it finishes (`_drop`)
    clock = run.stats.clock()
    logits = target.prefill(run.stats)  # [b, 1, V]
    fused = fused_loop(target, rows, run, max_new, clock)
    if fused is not None:  # the prefill's token taken by the fused step, which drafts the first step with it
        rows = _drop(target, rows, fused.run_rows(rows, outs, logits), run)
    else:
        empty = DraftBatch.pack([Draft.empty()] * len(outs), chain=True)
        top = run.recycling.launch(logits) if run.recycling is not None else None
        scores = run.scorer(logits, rows, outs, empty)
        verdict = run.accept(empty, scores)
        if top is not None:
            run.recycling.learn(top, rows.indexes, empty)
        rows = _advance(target, rows, outs, run, empty, verdict, scores, logits)
        clock.lap("prefill")
    while rows.ids:
        if fused is not None:  # the common call: a step's host work in one kernel call, until a row is done
            rows = _drop(target, rows, fused.run_rows(rows, outs), run)
            continue
        drafts = run.sizing.draft(rows.indexes, max_new - 1 - np.array([len(outs[r]) for r in rows.ids]),
                                  target.padded)
        batch = DraftBatch.pack(run.scorer.cut(drafts, rows, outs, run.sizing.chain), run.sizing.chain)
        clock.lap("draft")
        logits = target.verify(rows.last, batch, run.stats)  # [b, N+1, V]
        top = run.recycling.launch(logits) if run.recycling is not None else None  # [b, N+1, k] ids, probs
        clock.lap("forward")
        scores = run.scorer(logits, rows, outs, batch)  # each column scored with its own prefix
        verdict = run.accept(batch, scores)  # accepted path and next token of each row
        if top is not None:  # before the indexes take the step's tokens: the root's context is their last two
            run.recycling.learn(top, rows.indexes, batch)
        clock.lap("accept")
        run.sizing.update(batch, verdict)
        target.commit(batch, verdict)
        rows = _advance(target, rows, outs, run, batch, verdict, scores, logits)
        clock.lap("commit")
    clock.total()
    return outs


def _advance(target, rows: Rows, outs, run: Run, batch: DraftBatch, verdict, scores, logits) -> Rows:
    """Count the step, append each row's gained tokens (accepted drafts + the target's own) and drop finished rows.

    scores/logits [b, N+1, V] are the step's; the rows' gained tokens read them along the accepted paths."""
    run.stats.draft_tokens += int(batch.sizes.sum())
    run.stats.accepted_tokens += int(verdict.counts.sum())
    run.forwards += 1
    cols = verdict.columns()
    if cols is not None and (run.recorder is not None or run.stopper.criteria):  # trees: the accepted path's columns
        at, cols = torch.arange(len(cols), device=scores.device)[:, None], to_device(cols, scores.device)
        scores, logits = scores[at, cols], logits[at, cols]
    return _drop(target, rows, _append(rows, outs, verdict.gained(batch), run, scores, logits), run)


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


def _drop(target, rows: Rows, done: list, run: Run) -> Rows:
    """Remove finished rows from the batch (and from the target's cache) so they cost nothing more; a finished row
    took part in every forward so far."""
    if not any(done):
        return rows
    for rid, d in zip(rows.ids, done):
        if d:
            run.stats.forwards_by_row[rid] = run.forwards
    keep = [i for i, d in enumerate(done) if not d]
    if not keep:  # the call is over: slices, not the selection of no rows
        return Rows([], rows.prompts[:0], rows.last[:0], [])
    target.keep(keep)
    return Rows([rows.ids[i] for i in keep], rows.prompts[keep], rows.last[keep], [rows.indexes[i] for i in keep])


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
