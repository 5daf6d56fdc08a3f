"""The host work of one decoding step, without a model (issue 12, item 2): what `host_overhead.py` measures inside
whole calls, here in isolation and repeated until it is stable (a whole call's host time drifts by a third between
runs on a shared CPU; this does not).

For each batch size, each row's index holds a recorded code edit's prompt and the first `--at` tokens of its output;
the target's choices are the recording's next tokens (what the forced replay of `host_overhead.py` and `gpu.py` makes
a model choose). A step is then timed as the loop runs it after the forward: draft (the sizing policy over the
indexes), pack, greedy acceptance of the target's choices, the policy's update, each row's gained tokens, the stop
check, the cache decision (`Verdict.in_place`, the accepted columns); reading the target's choices off the
recording is not counted. The indexes are not extended, so every step drafts the same; the policy's calibration goes
on learning, as in a call.

    python benchmarks/host_step.py                 # chains (NgramIndex) and trees (SuffixIndex), batch 1 and 16
    python benchmarks/host_step.py --batch 1 --draft tree --repeats 9
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from lookahead.bench.arguments import positive_int
from lookahead.bench.traces_io import read_traces
from lookahead.index import NgramIndex, SuffixIndex
from lookahead.processing import Stopper
from lookahead.sizing import make_sizing
from lookahead.verify.batch import DraftBatch
from lookahead.verify import tree as T
from lookahead.verify.rules import greedy

TRACES = Path(__file__).resolve().parent / ".cache" / "gpu-traces" / "code-edit.jsonl"
EOS = 50256


def setup(traces: list, batch: int, draft: str, at: int) -> tuple:
    """(indexes, the target's choices by depth [b, L], sizing) for the first `batch` traces whose outputs are longer
    than `at` + 64 tokens (repeated when there are fewer)."""
    long = [t for t in traces if len(t[1]) > at + 64]
    rows = [long[i % len(long)] for i in range(batch)]
    indexes = []
    for prompt, output in rows:
        index = SuffixIndex() if draft == "tree" else NgramIndex(max_ngram=4)
        index.extend(np.concatenate([np.asarray(prompt), np.asarray(output[:at])]))
        indexes.append(index)
    choices = np.array([list(output[at: at + 65]) for _, output in rows], dtype=np.int64)
    sizing = make_sizing(draft, 15, 63, (0.0, 0.02))  # a static step's budgets, the accelerator's draft cost
    return indexes, choices, sizing


def step(indexes: list, choices: np.ndarray, sizing, stopper: Stopper) -> tuple:
    """One step's host work after the forward (see module docstring): (tokens gained, its seconds, the time spent
    reading the target's choices off the recording taken out)."""
    start = time.perf_counter()
    drafts = sizing.draft(indexes, np.full(len(indexes), 1000), lambda n: 15 if sizing.chain else 63)
    batch = DraftBatch.pack(drafts, sizing.chain)
    verdict = greedy(batch, None, lambda scores: _choices(batch, choices, lap))
    sizing.update(batch, verdict)
    if not verdict.in_place:
        verdict.columns()
    gained = 0
    for new in verdict.gained(batch):
        new, _ = stopper.keep(None, [], new, None)
        gained += len(new)
    return gained, time.perf_counter() - start - lap[0]


lap = [0.0]  # seconds the latest step spent in `_choices`


def _choices(batch: DraftBatch, choices: np.ndarray, lap: list) -> np.ndarray:
    """The target's choice after each column [b, N+1]: the recording's token at the column's depth + 1."""
    start = time.perf_counter()
    depth = np.arange(batch.width + 1)[None, :] if batch.chain else T.ancestry(batch.parents)[1]
    targets = np.take_along_axis(choices, np.minimum(depth, choices.shape[1] - 1), 1)
    lap[0] = time.perf_counter() - start
    return targets


def timed(indexes, choices, sizing, steps: int, repeats: int) -> tuple:
    """(median, min) over repeats of the mean microseconds of the step's host work, tokens per row and step."""
    stopper = Stopper(None, (EOS,), 10 ** 9)
    gained, _ = step(indexes, choices, sizing, stopper)  # warm: numba's first calls
    samples = []
    for _ in range(repeats):
        samples.append(sum(step(indexes, choices, sizing, stopper)[1] for _ in range(steps)) / steps * 1e6)
    return float(np.median(samples)), min(samples), gained / len(indexes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=TRACES,
                        help="JSONL of token traces (default: those `python benchmarks/gpu.py --export` writes)")
    parser.add_argument("--batch", type=positive_int, nargs="+", default=[1, 16])
    parser.add_argument("--draft", choices=["chain", "tree"], nargs="+", default=["chain", "tree"])
    parser.add_argument("--at", type=positive_int, default=40, help="output tokens already generated")
    parser.add_argument("--steps", type=positive_int, default=400, help="steps per timed repeat")
    parser.add_argument("--repeats", type=positive_int, default=7)
    args = parser.parse_args(argv)
    if not args.traces.exists():
        print(f"{args.traces}: not found (run `python benchmarks/gpu.py --export`)", file=sys.stderr)
        return 2
    traces, _ = read_traces(args.traces)
    print("| draft | batch | host us/step: median (min) | tokens/row/step |\n| --- | ---: | ---: | ---: |")
    for draft in args.draft:
        for b in args.batch:
            med, low, gained = timed(*setup(traces, b, draft, args.at), args.steps, args.repeats)
            print(f"| {draft} | {b} | {med:.1f} ({low:.1f}) | {gained:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
