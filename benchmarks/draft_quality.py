"""Draft quality on real traces: target forwards saved by each drafter, model-free (see lookahead/bench/replay.py).

Prints markdown tables of tokens per target forward (output tokens / forwards), acceptance rate (accepted /
drafted) and the predicted speedup for a forward-cost ratio, for every replayable method of
``lookahead.bench.methods`` (lookahead's indexes, HF prompt lookup, vLLM's rule, the hindsight oracle and copy
ceilings; SuffixDecoding from suffix_decoding.py where installed), on the datasets of traces.py.

    python benchmarks/draft_quality.py                      # all datasets, budget 10
    python benchmarks/draft_quality.py --budget 32 --limit 50 --datasets code-edit rag --plot dq.png
    python benchmarks/draft_quality.py --methods lookahead-suffix hf-prompt-lookup-4 oracle
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

from suffix_decoding import drafters as suffix_decoding_drafters
from traces import DATASETS, DEFAULT_CACHE_DIR, DEFAULT_DATA_DIR, load_traces

from lookahead.bench import plot as bench_plot
from lookahead.bench.arguments import cost_ratio, method_name, positive_int
from lookahead.bench.methods import METHODS, Setup, resolve
from lookahead.bench.replay import ReplayStats, predicted_speedup, ratio_cost, replay_dataset

REPLAYABLE = [name for name, m in METHODS.items() if m.replayable or m.requires]


def build_methods(names, setup: Setup) -> list:
    """The named methods that can be replayed here, in registry order (SuffixDecoding only where installed)."""
    external = suffix_decoding_drafters()
    missing = [n for n in names if METHODS[n].requires and n not in external]
    if missing:
        print(f"note: arctic_inference is not installed; skipping {', '.join(missing)} (see benchmarks/README.md)",
              file=sys.stderr)
    return resolve([n for n in names if n not in missing], external, need="replay")


def run(methods, traces_by_dataset, setup: Setup, progress) -> dict:
    """Replay every method on every dataset; returns ``{(method name, dataset): (ReplayStats, seconds)}``."""
    results = {}
    for method in methods:
        for dataset, traces in traces_by_dataset.items():
            start = time.perf_counter()
            bar = (lambda xs, d=f"{method.name:>26} {dataset}": progress(xs, desc=d, leave=False)) if progress else None
            budget = setup.tree_budget if method.tree else setup.budget
            stats = replay_dataset(method.make(setup), traces, budget, method.tree, bar)
            results[method.name, dataset] = (stats, time.perf_counter() - start)
    return results


def markdown_table(results: dict, rows: list[str], datasets: list[str], cell: Callable[[ReplayStats], str]) -> str:
    lines = ["| method | " + " | ".join(datasets) + " |", "| --- |" + " ---: |" * len(datasets)]
    for row in rows:
        cells = [cell(results[row, d][0]) if (row, d) in results else "" for d in datasets]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict, rows: list[str], datasets: list[str], path: str) -> None:
    values = {key: stats.tokens_per_forward for key, (stats, _) in results.items()}
    try:
        bench_plot.tokens_per_forward(values, rows, datasets, path, "tokens per target forward (model-free replay)")
    except ValueError as error:
        print(f"note: {error}; no plot written", file=sys.stderr)
        return
    print(f"plot written to {path}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument("--budget", type=positive_int, default=10, help="draft tokens per step (default 10)")
    parser.add_argument("--tree-budget", type=positive_int, default=32, help="nodes per step for tree drafters")
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="rows per dataset (trajectories for agent; default: all rows, 10 trajectories)")
    parser.add_argument("--methods", nargs="+", type=method_name, default=REPLAYABLE, metavar="METHOD",
                        help=f"default: all of {', '.join(REPLAYABLE)} (lookahead.bench.methods; old names are "
                             "aliases)")
    parser.add_argument("--completions-per-row", type=positive_int, default=1, help="code-edit completions per row")
    parser.add_argument("--raw-summaries", action="store_true", help="keep FRANK's PTB-tokenized summaries")
    parser.add_argument("--max-turns", type=positive_int, default=None, help="agent: assistant turns per trajectory")
    parser.add_argument("--hf-exact", action="store_true",
                        help="call transformers' get_candidates (slow on long contexts), not its rule in numba")
    parser.add_argument("--no-cache", action="store_true", help="do not read or write benchmarks/.cache")
    parser.add_argument("--cost-ratio", type=cost_ratio, nargs="+", default=[1.1],
                        help="predicted speedup for each cost of an 11-token forward relative to a 1-token one "
                             "(default 1.1, a GPU at batch 1)")
    parser.add_argument("--plot", default=None, help="write a bar chart (needs matplotlib)")
    parser.add_argument("--no-progress", action="store_true")
    return parser.parse_args(argv)


def load_all(args) -> dict:
    options = {"code-edit": {"completions_per_row": args.completions_per_row},
               "summarization": {"detokenize": not args.raw_summaries},
               "agent": {"max_turns": args.max_turns}}
    cache = None if args.no_cache else DEFAULT_CACHE_DIR
    return {d: load_traces(d, args.data_dir, args.limit, cache, **options.get(d, {})) for d in args.datasets}


def main(argv=None) -> None:
    args = parse_args(argv)
    if not args.data_dir.is_dir():
        print(f"skipped: data folder {args.data_dir} not found (pass --data-dir)", file=sys.stderr)
        return
    progress = None
    if not args.no_progress:
        try:
            from tqdm import tqdm as progress
        except ImportError:
            pass
    if args.hf_exact:
        import torch

        torch.set_num_threads(1)  # torch's thread pool contends with anything else on the cores (40x slower)
    traces = load_all(args)
    print(" ".join(f"{d}: {len(t)} traces, {sum(len(o) for _, o in t)} output tokens;" for d, t in traces.items()))
    setup = Setup(args.budget, args.tree_budget, args.hf_exact)
    methods = build_methods(args.methods, setup)
    results = run(methods, traces, setup, progress)
    rows, datasets = [m.name for m in methods], list(traces)
    hf = "transformers get_candidates" if args.hf_exact else "its rule in numba (--hf-exact: transformers)"
    print(f"\nTokens per target forward (draft budget {args.budget}; tree rows: {args.tree_budget} nodes; "
          f"HF rows: {hf})\n")
    print(markdown_table(results, rows, datasets, lambda s: f"{s.tokens_per_forward:.2f}"))
    print("\nAcceptance rate (accepted / drafted), drafted tokens per step in brackets\n")
    print(markdown_table(results, rows, datasets, lambda s: f"{s.acceptance_rate:.2f} ({s.drafted_per_step:.1f})"))
    for ratio in args.cost_ratio:
        print(f"\nPredicted speedup over one-token decoding, an 11-token forward costing {ratio:g}x a 1-token one "
              "(lookahead.bench.replay.predicted_speedup)\n")
        print(markdown_table(results, rows, datasets,
                             lambda s, r=ratio: f"{predicted_speedup(s, ratio_cost(r)):.2f}x"))
    seconds = {row: sum(results[row, d][1] for d in datasets) for row in rows}
    print("\nReplay time: " + ", ".join(f"{row} {s:.1f}s" for row, s in seconds.items()))
    if args.plot:
        plot(results, rows, datasets, args.plot)


if __name__ == "__main__":
    main()
