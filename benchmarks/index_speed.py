"""Drafter cost per decoding step versus context length: one ``propose(10)`` plus one ``extend`` of 3 tokens.

The context is real text (code-edit, summarization and RAG traces, prompt then output, concatenated and tiled
if short), so n-grams repeat as they do in practice; the steps then append the tokens that follow it.

    python benchmarks/index_speed.py                 # markdown table of median (and mean) microseconds per step
    python benchmarks/index_speed.py --steps 500 --sizes 1000 32000
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from peers import PromptLookup, SuffixDecoding, VllmNgram, suffix_decoding_available
from traces import DEFAULT_DATA_DIR, load_traces

SIZES = (1_000, 32_000, 256_000, 1_000_000)
# Slow peers only run where they finish in reasonable time (HF and vLLM rescan the whole context each step).
MAX_SIZE = {"HF prompt lookup (ngram 4)": 32_000, "vLLM n-gram (1..4)": 256_000}
STEPS_CAP = {"HF prompt lookup (ngram 4)": 100}


def token_pool(data_dir: Path, size: int) -> np.ndarray:
    """At least ``size`` tokens of real text: every trace's prompt then output, tiled when short."""
    parts = [np.concatenate(pair) for name in ("code-edit", "summarization", "rag")
             for pair in load_traces(name, data_dir)]
    pool = np.concatenate(parts).astype(np.int32)
    return np.tile(pool, -(-size // len(pool)))[:size]


def time_steps(proposer, context: np.ndarray, stream: np.ndarray, steps: int, warmup: int = 3) -> np.ndarray:
    """Nanoseconds per step (``propose(10)`` then ``extend`` of the next 3 tokens) after feeding ``context``."""
    proposer.extend(context)
    times = np.empty(steps, dtype=np.int64)
    for i in range(warmup + steps):
        chunk = stream[3 * i:3 * i + 3]
        start = time.perf_counter_ns()
        proposer.propose(10)
        proposer.extend(chunk)
        if i >= warmup:
            times[i - warmup] = time.perf_counter_ns() - start
    return times


def proposers() -> dict[str, Callable[[], object]]:
    """Name -> fresh proposer, for everything importable."""
    makers: dict[str, Callable[[], object]] = {}
    from draft_quality import lookahead_index_module

    index = lookahead_index_module()
    if index is not None:
        makers["lookahead NgramIndex(4)"] = lambda: index.NgramIndex(max_ngram=4, min_ngram=1)
        if hasattr(index, "SuffixIndex"):
            makers["lookahead SuffixIndex"] = index.SuffixIndex
    makers["HF prompt lookup (ngram 4)"] = lambda: PromptLookup(4)
    makers["vLLM n-gram (1..4)"] = lambda: VllmNgram(1, 4)
    if suffix_decoding_available():
        makers["SuffixDecoding"] = SuffixDecoding
    else:
        print("note: arctic_inference is not installed; skipping SuffixDecoding", file=sys.stderr)
    return makers


def measure(makers, pool: np.ndarray, sizes, steps: int) -> dict:
    """``{(name, size): (median µs, mean µs, setup s)}`` for each proposer at each context size it supports."""
    results = {}
    for name, make in makers.items():
        for size in sizes:
            if size > MAX_SIZE.get(name, size) or size + 3 * (steps + 3) > len(pool):
                continue
            n = min(steps, STEPS_CAP.get(name, steps))
            start = time.perf_counter()
            times = time_steps(make(), pool[:size], pool[size:], n)
            results[name, size] = (np.median(times) / 1e3, times.mean() / 1e3, time.perf_counter() - start)
            print(f"  {name} @ {size}: median {results[name, size][0]:.1f} µs ({n} steps)", file=sys.stderr)
    return results


def markdown(results: dict, names, sizes) -> str:
    label = {s: f"{s // 1000}k" if s < 1_000_000 else f"{s // 1_000_000}M" for s in sizes}
    lines = ["| drafter | " + " | ".join(label[s] for s in sizes) + " |", "| --- |" + " ---: |" * len(sizes)]
    for name in names:
        cells = [f"{results[name, s][0]:.1f} ({results[name, s][1]:.1f})" if (name, s) in results else "—"
                 for s in sizes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per size (HF: at most 100)")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch intra-op threads for HF (default 1, like every other drafter here: with other "
                             "work on the cores, 2 threads made HF 40x slower at 32k)")
    args = parser.parse_args(argv)
    if not args.data_dir.is_dir():
        print(f"skipped: data folder {args.data_dir} not found (pass --data-dir)", file=sys.stderr)
        return
    import torch

    torch.set_num_threads(args.torch_threads)
    makers = proposers()
    sizes = sorted(set(args.sizes))
    pool = token_pool(args.data_dir, max(sizes) + 3 * (args.steps + 3))
    results = measure(makers, pool, sizes, args.steps)
    print(f"\nMicroseconds per step: median (mean) of propose(10) + extend(3 tokens), after a context of "
          f"(torch threads: {args.torch_threads})\n")
    print(markdown(results, list(makers), sizes))


if __name__ == "__main__":
    main()
