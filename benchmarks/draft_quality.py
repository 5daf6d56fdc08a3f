"""Draft quality on real traces: target forwards saved by each drafter, model-free (see lookahead/bench/replay.py).

Prints markdown tables of tokens per target forward (output tokens / forwards), acceptance rate (accepted /
drafted) and the predicted speedup for a forward-cost ratio, for lookahead's modes, HF prompt lookup and the peers
in peers.py, on the datasets of traces.py.

    python benchmarks/draft_quality.py                      # all datasets, budget 10
    python benchmarks/draft_quality.py --budget 32 --limit 50 --datasets code-edit rag --plot dq.png
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from peers import AnchoredOracle, HindsightOracle, SuffixDecoding, VllmNgram, suffix_decoding_available  # noqa: E402
from traces import DATASETS, DEFAULT_CACHE_DIR, DEFAULT_DATA_DIR, load_traces  # noqa: E402

from lookahead.bench import plot as bench_plot  # noqa: E402
from lookahead.bench.quality import replay_methods  # noqa: E402
from lookahead.bench.replay import ReplayStats, predicted_speedup, replay_dataset  # noqa: E402

# (key, row name, factory, tree): factory() returns make_proposer(trace), fresh per dataset
Method = tuple[str, str, Callable[[], Callable], bool]


def _shared_suffix_factory(max_tree_depth: int = 64) -> Callable:
    """SuffixDecoding with one global cache per dataset: earlier traces' outputs help later ones."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = SuffixDecodingCache(max_tree_depth, max_cached_requests=-1)
    previous: list[SuffixDecoding] = []

    def make(trace):
        while previous:
            previous.pop().close()
        previous.append(SuffixDecoding(cache))
        return previous[-1]

    return make


def build_methods(selected: set[str], budget: int, tree_budget: int, hf_exact: bool = False) -> list[Method]:
    """Every available method whose key is in ``selected``, in table order (HF's num_output_tokens = budget)."""
    keys = {"ngram": "ngram", "suffix": "suffix-index", "suffix-tree": "suffix-index-tree", "hf": "hf2", "hf4": "hf4"}
    methods = [(keys[m.key], m.label, lambda m=m: m.make, m.tree)
               for m in replay_methods(budget, tree_budget, hf_exact)]  # lookahead's modes and HF, as in `bench`
    methods.append(("vllm", "vLLM n-gram (1..4)", lambda: lambda trace: VllmNgram(1, 4), False))
    if suffix_decoding_available():
        methods += [
            ("suffix", "SuffixDecoding (per request)", lambda: lambda trace: SuffixDecoding(), False),
            ("suffix-tree", f"SuffixDecoding tree ({tree_budget} nodes)", lambda: lambda trace: SuffixDecoding(),
             True),
            ("suffix-global", "SuffixDecoding (+ global cache)", _shared_suffix_factory, False),
            ("suffix-global-tree", f"SuffixDecoding tree ({tree_budget} nodes, + global cache)",
             _shared_suffix_factory, True),
        ]
    elif selected & {"suffix", "suffix-tree", "suffix-global", "suffix-global-tree"}:
        print("note: arctic_inference is not installed; skipping SuffixDecoding (see benchmarks/README.md)",
              file=sys.stderr)
    methods += [
        ("oracle", "hindsight best single copy", lambda: lambda trace: HindsightOracle(trace[1]), False),
        ("ceiling", "ceiling: best occurrence of the last token",
         lambda: lambda trace: AnchoredOracle(trace[1], longest=False), False),
        ("ceiling-longest", "ceiling: best occurrence of the longest suffix",
         lambda: lambda trace: AnchoredOracle(trace[1], longest=True), False),
    ]
    return [m for m in methods if m[0] in selected]


def run(methods, traces_by_dataset, budget: int, tree_budget: int, progress) -> dict:
    """Replay every method on every dataset; returns ``{(row name, dataset): (ReplayStats, seconds)}``."""
    results = {}
    for key, name, factory, tree in methods:
        for dataset, traces in traces_by_dataset.items():
            start = time.perf_counter()
            bar = (lambda xs, d=f"{key:>13} {dataset}": progress(xs, desc=d, leave=False)) if progress else None
            stats = replay_dataset(factory(), traces, tree_budget if tree else budget, tree, bar)
            results[name, dataset] = (stats, time.perf_counter() - start)
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
    keys = ["ngram", "suffix-index", "suffix-index-tree", "hf2", "hf4", "vllm", "suffix", "suffix-tree",
            "suffix-global", "suffix-global-tree", "oracle", "ceiling", "ceiling-longest"]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument("--budget", type=int, default=10, help="draft tokens per step (default 10)")
    parser.add_argument("--tree-budget", type=int, default=32, help="nodes per step for tree drafters")
    parser.add_argument("--limit", type=int, default=None,
                        help="rows per dataset (trajectories for agent; default: all rows, 10 trajectories)")
    parser.add_argument("--methods", nargs="+", choices=keys, default=keys)
    parser.add_argument("--completions-per-row", type=int, default=1, help="code-edit completions per row")
    parser.add_argument("--raw-summaries", action="store_true", help="keep FRANK's PTB-tokenized summaries")
    parser.add_argument("--max-turns", type=int, default=None, help="agent: assistant turns per trajectory")
    parser.add_argument("--hf-exact", action="store_true",
                        help="call transformers' get_candidates (slow on long contexts), not its rule in numba")
    parser.add_argument("--no-cache", action="store_true", help="do not read or write benchmarks/.cache")
    parser.add_argument("--cost-ratio", type=float, nargs="+", default=[1.1],
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
    methods = build_methods(set(args.methods), args.budget, args.tree_budget, args.hf_exact)
    results = run(methods, traces, args.budget, args.tree_budget, progress)
    rows, datasets = [m[1] for m in methods], list(traces)
    hf = "transformers get_candidates" if args.hf_exact else "its rule in numba (--hf-exact: transformers)"
    print(f"\nTokens per target forward (draft budget {args.budget}; tree rows: {args.tree_budget} nodes; "
          f"HF rows: {hf})\n")
    print(markdown_table(results, rows, datasets, lambda s: f"{s.tokens_per_forward:.2f}"))
    print("\nAcceptance rate (accepted / drafted), drafted tokens per step in brackets\n")
    print(markdown_table(results, rows, datasets, lambda s: f"{s.acceptance_rate:.2f} ({s.drafted_per_step:.1f})"))
    for ratio in args.cost_ratio:
        print(f"\nPredicted speedup over one-token decoding, an 11-token forward costing {ratio:g}x a 1-token one "
              "(lookahead.bench.replay.predicted_speedup)\n")
        print(markdown_table(results, rows, datasets, lambda s, r=ratio: f"{predicted_speedup(s, r):.2f}x"))
    seconds = {row: sum(results[row, d][1] for d in datasets) for row in rows}
    print("\nReplay time: " + ", ".join(f"{row} {s:.1f}s" for row, s in seconds.items()))
    if args.plot:
        plot(results, rows, datasets, args.plot)


if __name__ == "__main__":
    main()
