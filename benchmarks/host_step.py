"""The host work of one decoding step, without a model (issue 12, item 2): what `host_overhead.py` measures inside
whole calls, here in isolation and repeated until it is stable (a whole call's host time drifts by a third between
runs on a shared CPU; this does not).

Each row's index holds a recorded code edit's prompt and the first `--at` tokens of its output, and the recording's
next tokens stand for the target's choices (what the forced replay of `host_overhead.py` and `gpu.py` makes a model
choose). A step is timed as the loop runs it after the forward: draft (the sizing policy over the indexes), pack,
greedy acceptance, the policy's update, each row's gained tokens cut at a stop, the cache decision, and the indexes
extended with what the rows gained; reading the choices off the recording is not counted. Steps follow the
recording until a row's runs out; then the indexes are made anew, untimed, and the replay starts over.

Variants: "chain" and "tree", the loop's step as `generate` runs it when a call is not fused; "fused-chain" and
"fused-tree", the work of `lookahead.decode.fused`'s step kernel (its acceptance and draft kernels, called apart here).
Budgets are a static step's: 15 tokens, 63 nodes.

    python benchmarks/host_step.py                 # every variant, batch 1 and 16
    python benchmarks/host_step.py --batch 1 --variant chain fused-chain --repeats 9
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from numba import typed

from lookahead.decode import _fused_kernels as FK
from lookahead.bench.arguments import positive_int
from lookahead.bench.traces_io import read_traces
from lookahead.index import NgramIndex, SuffixIndex
from lookahead.decode.policy import _BUCKETS
from lookahead.decode.processing import Stopper
from lookahead.decode.sizing import make_sizing
from lookahead.model.static import WIDTHS
from lookahead.verify import tree as T
from lookahead.verify.batch import DraftBatch, _chain_parents
from lookahead.verify.rules import greedy

TRACES = Path(__file__).resolve().parent / ".cache" / "gpu-traces" / "code-edit.jsonl"
EOS, MAX_NEW, WIDEST = 50256, 4096, 64


class Replay:
    """Rows replaying recorded outputs: their indexes, the policy, and how far each row has gone."""

    def __init__(self, traces: list, batch: int, variant: str, at: int):
        long = [t for t in traces if len(t[1]) > at + 2 * WIDEST]
        self.rows = [long[i % len(long)] for i in range(batch)]
        self.variant, self.at = variant, at
        self.tree = variant.endswith("tree")
        self.sizing = make_sizing("tree" if self.tree else "chain", 15, 63, (0.0, 0.02))
        self.padded = lambda n: next(w for w in WIDTHS if w >= n + 1) - 1  # a static step's
        self.pads = np.array([self.padded(n) for n in range(64 if self.tree else 16)])
        self.reset()

    def reset(self) -> None:
        self.indexes = []
        for prompt, output in self.rows:
            index = SuffixIndex() if self.tree else NgramIndex(max_ngram=4)
            index.extend(np.concatenate([np.asarray(prompt), np.asarray(output[: self.at])]))
            if self.variant.startswith("fused"):
                index._reserve(len(output))  # the kernels stop when an index must grow
            if self.variant == "fused-tree":
                index._buffers(63)  # a scratch for trees of the whole budget
            self.indexes.append(index)
        self.lens = np.zeros(len(self.rows), dtype=np.int64)  # tokens each row gained so far
        self.recorded = np.zeros((len(self.rows), MAX_NEW), dtype=np.int64)
        for k, (_, output) in enumerate(self.rows):
            self.recorded[k, : len(output) - self.at] = output[self.at:]

    def exhausted(self) -> bool:
        return any(self.at + n + WIDEST + 1 > len(o) for n, (_, o) in zip(self.lens, self.rows))

    def choices(self, depth: np.ndarray) -> np.ndarray:
        """The target's choice after each column [b, N+1] at the given depths: the recording's next tokens."""
        return np.take_along_axis(self.recorded, self.lens[:, None] + depth, 1)


def unfused_step(replay: Replay, stopper: Stopper, lap: list) -> float:
    """The loop's step (see module docstring); returns its seconds, the choices' reading taken out."""
    start, sizing = time.perf_counter(), replay.sizing
    drafts = sizing.draft(replay.indexes, MAX_NEW - 1 - replay.lens, replay.padded)
    batch = DraftBatch.pack(drafts, sizing.chain)
    verdict = greedy(batch, None, lambda scores: _timed(lap, replay.choices, _depth(batch)))
    sizing.update(batch, verdict)
    if not verdict.in_place:
        verdict.columns()
    for k, (index, new) in enumerate(zip(replay.indexes, verdict.gained(batch))):
        new, _ = stopper.keep(None, [], new, None)
        index.extend(np.array(new, dtype=np.int64))
        replay.lens[k] += len(new)
    return time.perf_counter() - start - lap[0]


def fused_step(replay: Replay, buffers: dict, lap: list) -> float:
    """The fused chains' draft and acceptance kernels (one `step` call in `FusedChains.run_rows`)."""
    start, policy, b = time.perf_counter(), replay.sizing.length, buffers
    widest = FK.draft(b["hists"], b["states"], replay.lens, MAX_NEW, policy.max_tokens, replay.pads, _BUCKETS,
                      policy.accepted, policy.rejected, policy.version, *policy.tables(len(replay.lens)), b["drafts"],
                      b["sizes"], b["matches"], b["budgets"])
    batch = DraftBatch(None, b["drafts"][:, :widest], _chain_parents(len(replay.lens), widest), b["sizes"], True)
    targets = _timed(lap, replay.choices, np.arange(widest + 1)[None, :])
    FK.accept(targets, batch.tokens, b["sizes"], b["matches"], b["hists"], b["tables"], b["states"], 4, 1, _BUCKETS,
              policy.accepted, policy.rejected, policy.version, np.array([EOS]), MAX_NEW, replay.lens, b["out"],
              b["last"], b["counts"], b["bonus"], b["done"], b["totals"])
    return time.perf_counter() - start - lap[0]


def fused_tree_step(replay: Replay, buffers: dict, lap: list) -> float:
    """The fused trees' draft and acceptance kernels (one `step_trees` call in `FusedTrees.run_rows`)."""
    start, sizing, b, r = time.perf_counter(), replay.sizing, buffers, len(replay.lens)
    policy, cal = sizing.length, sizing.calibration
    widest = FK.draft_trees(b["automata"], b["scratches"], replay.lens, MAX_NEW, 63, replay.pads, _BUCKETS,
                            policy.accepted, policy.rejected, policy.version, *policy.tables(r), cal.EDGES,
                            cal.accepted, cal.seen, cal.prior, sizing._step_costs(r), b["drafts"], b["parents"],
                            b["probs"], b["sizes"], b["matches"], b["depths"], b["nodes"])
    batch = DraftBatch(None, b["drafts"][:, :widest], b["parents"][:, :widest], b["sizes"], False,
                       b["probs"][:, :widest])
    targets = _timed(lap, replay.choices, _depth(batch))
    FK.accept_trees(targets, batch.tokens, batch.parents, b["sizes"], batch.probs, b["matches"], b["depths"],
                    b["automata"], _BUCKETS, policy.accepted, policy.rejected, policy.version, cal.EDGES, cal.accepted,
                    cal.seen, np.array([EOS]), MAX_NEW, replay.lens, b["out"], b["last"], b["counts"], b["bonus"],
                    b["paths"], b["cols"], b["done"], b["totals"])
    return time.perf_counter() - start - lap[0]


def _buffers(replay: Replay) -> dict:
    r, names = len(replay.lens), ("sizes", "matches", "budgets", "last", "counts", "bonus", "depths", "nodes")
    arrays = (("automata", "_arrays"), ("scratches", "_scratch")) if replay.tree else (
        ("hists", "_hist"), ("tables", "_table"), ("states", "_state"))
    lists = {k: typed.List([getattr(ix, a) for ix in replay.indexes]) for k, a in arrays}
    return {**lists, **{n: np.zeros(r, dtype=np.int64) for n in names}, "drafts": np.zeros((r, 64), np.int64),
            "parents": np.zeros((r, 64), np.int64), "probs": np.zeros((r, 64)), "paths": np.zeros((r, 64), np.int64),
            "cols": np.zeros((r, 65), np.int64), "out": np.zeros((r, MAX_NEW), np.int64),
            "done": np.zeros(r, np.bool_), "totals": np.zeros(2, np.int64)}


def _depth(batch: DraftBatch) -> np.ndarray:
    return np.arange(batch.width + 1)[None, :] if batch.chain else T.ancestry(batch.parents)[1]


def _timed(lap: list, f, *args):
    start = time.perf_counter()
    out = f(*args)
    lap[0] = time.perf_counter() - start
    return out


def timed(replay: Replay, steps: int, repeats: int) -> tuple:
    """(median, min) over repeats of the mean microseconds of a step's host work, tokens per row and step."""
    stopper, lap = Stopper(None, (EOS,), MAX_NEW), [0.0]
    samples, gained, taken = [], 0, 0
    for repeat in range(repeats + 1):  # the first warms up (numba's first calls)
        seconds, done = 0.0, 0
        while done < steps:
            replay.reset()
            buffers = _buffers(replay) if replay.variant.startswith("fused") else None
            step = fused_tree_step if replay.variant == "fused-tree" else fused_step
            while done < steps and not replay.exhausted():
                before = int(replay.lens.sum())
                if buffers is None:
                    seconds += unfused_step(replay, stopper, lap)
                else:
                    seconds += step(replay, buffers, lap)
                done += 1
                gained, taken = gained + int(replay.lens.sum()) - before, taken + 1
        if repeat:
            samples.append(seconds / steps * 1e6)
    return float(np.median(samples)), min(samples), gained / taken / len(replay.lens)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=TRACES,
                        help="JSONL of token traces (default: those `python benchmarks/gpu.py --export` writes)")
    parser.add_argument("--batch", type=positive_int, nargs="+", default=[1, 16])
    variants = ["chain", "fused-chain", "tree", "fused-tree"]
    parser.add_argument("--variant", choices=variants, nargs="+", default=variants)
    parser.add_argument("--at", type=positive_int, default=40, help="output tokens already generated")
    parser.add_argument("--steps", type=positive_int, default=400, help="steps per timed repeat")
    parser.add_argument("--repeats", type=positive_int, default=7)
    args = parser.parse_args(argv)
    if not args.traces.exists():
        print(f"{args.traces}: not found (run `python benchmarks/gpu.py --export`)", file=sys.stderr)
        return 2
    traces, _ = read_traces(args.traces)
    print("| variant | batch | host us/step: median (min) | tokens/row/step |\n| --- | ---: | ---: | ---: |")
    for variant in args.variant:
        for b in args.batch:
            med, low, gained = timed(Replay(traces, b, variant, args.at), args.steps, args.repeats)
            print(f"| {variant} | {b} | {med:.1f} ({low:.1f}) | {gained:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
