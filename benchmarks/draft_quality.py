"""Draft quality on real traces: target forwards saved by each drafter, model-free (see replay.py).

Prints markdown tables of tokens per target forward (output tokens / forwards) and acceptance rate
(accepted / drafted) for lookahead's indexes and the peers in peers.py, on the datasets of traces.py.

    python benchmarks/draft_quality.py                      # all datasets, budget 10
    python benchmarks/draft_quality.py --budget 32 --limit 50 --datasets code-edit rag --plot dq.png
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

from peers import HindsightOracle, PromptLookup, SuffixDecoding, VllmNgram, suffix_decoding_available
from replay import ReplayStats, replay_dataset
from traces import DATASETS, DEFAULT_CACHE_DIR, DEFAULT_DATA_DIR, REPO_ROOT, load_traces

# (key, row name, factory, tree): factory() returns make_proposer(trace), fresh per dataset
Method = tuple[str, str, Callable[[], Callable], bool]


def lookahead_index_module():
    """``lookahead.index`` from this checkout, or ``None`` (with a message) while it is missing or broken."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    try:
        from lookahead import index
    except Exception as error:  # noqa: BLE001 - a half-written package can fail in any way
        print(f"note: lookahead.index is not importable ({error!r}); skipping lookahead rows", file=sys.stderr)
        return None
    return index


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
    methods = []
    index = lookahead_index_module() if selected & {"ngram", "suffix-index", "suffix-index-tree"} else None
    if index is not None and hasattr(index, "NgramIndex"):
        methods.append(("ngram", "lookahead NgramIndex(4)",
                        lambda: lambda trace: index.NgramIndex(max_ngram=4, min_ngram=1), False))
    if index is not None and hasattr(index, "SuffixIndex"):
        methods.append(("suffix-index", "lookahead SuffixIndex", lambda: lambda trace: index.SuffixIndex(), False))
        methods.append(("suffix-index-tree", f"lookahead SuffixIndex tree ({tree_budget} nodes)",
                        lambda: lambda trace: index.SuffixIndex(), True))
    methods += [
        ("hf2", "HF prompt lookup (ngram 2)", lambda: lambda trace: PromptLookup(2, budget, hf_exact), False),
        ("hf4", "HF prompt lookup (ngram 4)", lambda: lambda trace: PromptLookup(4, budget, hf_exact), False),
        ("vllm", "vLLM n-gram (1..4)", lambda: lambda trace: VllmNgram(1, 4), False),
    ]
    if suffix_decoding_available():
        methods += [
            ("suffix", "SuffixDecoding (per request)", lambda: lambda trace: SuffixDecoding(), False),
            ("suffix-tree", f"SuffixDecoding tree ({tree_budget} nodes)", lambda: lambda trace: SuffixDecoding(),
             True),
            ("suffix-global", "SuffixDecoding (+ global cache)", _shared_suffix_factory, False),
        ]
    elif selected & {"suffix", "suffix-tree", "suffix-global"}:
        print("note: arctic_inference is not installed; skipping SuffixDecoding (see benchmarks/README.md)",
              file=sys.stderr)
    methods.append(("oracle", "hindsight best single copy", lambda: lambda trace: HindsightOracle(trace[1]), False))
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
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no plot written", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(1.5 + 2.2 * len(datasets), 4))
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        values = [results[row, d][0].tokens_per_forward for d in datasets]
        ax.bar([j + i * width for j in range(len(datasets))], values, width, label=row)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(datasets))], datasets)
    ax.set_ylabel("tokens per target forward")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")


def parse_args(argv=None) -> argparse.Namespace:
    keys = ["ngram", "suffix-index", "suffix-index-tree", "hf2", "hf4", "vllm", "suffix", "suffix-tree",
            "suffix-global", "oracle"]
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
    seconds = {row: sum(results[row, d][1] for d in datasets) for row in rows}
    print("\nReplay time: " + ", ".join(f"{row} {s:.1f}s" for row, s in seconds.items()))
    if args.plot:
        plot(results, rows, datasets, args.plot)


if __name__ == "__main__":
    main()
