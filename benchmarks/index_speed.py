"""Drafter cost per decoding step versus context length: one ``propose(10)`` plus one ``extend`` of 3 tokens.

The context is real text (code-edit, summarization and RAG traces, prompt then output, concatenated and tiled
if short), so n-grams repeat as they do in practice; the steps then append the tokens that follow it. The timing
itself is ``lookahead.bench.index_speed`` (``lookahead bench index``); this script adds the real data and the peers
beyond Hugging Face's (vLLM's n-gram rule, SuffixDecoding).

    python benchmarks/index_speed.py                 # markdown table of median (and mean) microseconds per step
    python benchmarks/index_speed.py --steps 500 --sizes 1000 32000 --plot index.png
    python benchmarks/index_speed.py --tree 32      # propose_tree(32) + extend(3), drafters with trees
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from suffix_decoding import drafters as suffix_decoding_drafters
from traces import DEFAULT_DATA_DIR, load_traces

from lookahead.bench import index_speed as S
from lookahead.bench import plot as bench_plot
from lookahead.bench.arguments import int_at_least, positive_int

SIZES = (1_000, 32_000, 256_000, 1_000_000)


def token_pool(data_dir: Path, size: int) -> np.ndarray:
    """At least ``size`` tokens of real text: every trace's prompt then output, tiled when short."""
    return S.token_pool([pair for name in ("code-edit", "summarization", "rag")
                         for pair in load_traces(name, data_dir)], size)


def proposers() -> dict:
    """Method name -> fresh proposer: lookahead's indexes and HF (as in `lookahead bench index`), vLLM's rule and
    SuffixDecoding where installed."""
    external = suffix_decoding_drafters()
    if not external:
        print("note: arctic_inference is not installed; skipping suffixdecoding", file=sys.stderr)
    names = [*S.INDEX_DEFAULT, "vllm-ngram"] + (["suffixdecoding"] if external else [])
    return S.index_makers(names, external)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--sizes", type=positive_int, nargs="+", default=list(SIZES))
    parser.add_argument("--steps", type=positive_int, default=2000, help="timed steps per size (HF: at most 100)")
    parser.add_argument("--torch-threads", type=positive_int, default=1,
                        help="torch intra-op threads for HF (default 1, like every other drafter here: with other "
                             "work on the cores, 2 threads made HF 40x slower at 32k)")
    parser.add_argument("--tree", type=int_at_least(0), default=0,
                        help="time propose_tree(TREE) instead of propose(10), for the drafters that have it")
    parser.add_argument("--plot", default=None, help="write a log-log figure (needs matplotlib)")
    args = parser.parse_args(argv)
    if not args.data_dir.is_dir():
        print(f"skipped: data folder {args.data_dir} not found (pass --data-dir)", file=sys.stderr)
        return
    import torch

    torch.set_num_threads(args.torch_threads)
    makers = proposers()
    sizes = sorted(set(args.sizes))
    pool = token_pool(args.data_dir, max(sizes) + 3 * (args.steps + 3))
    try:
        from tqdm import tqdm as progress
    except ImportError:
        progress = None
    results = S.measure(makers, pool, sizes, args.steps, progress=progress, tree=args.tree)
    proposal = f"propose_tree({args.tree})" if args.tree else "propose(10)"
    print(f"\nMicroseconds per step: median (mean) of {proposal} + extend(3 tokens), after a context of N tokens of "
          f"real text (columns; torch threads: {args.torch_threads})\n")
    labels = [label for label in makers if any(key[0] == label for key in results)]
    print(S.markdown(results, labels, sizes))
    if args.plot:
        try:
            bench_plot.step_cost(results, labels, sizes, args.plot, "drafter cost per step (real text)")
            print(f"plot written to {args.plot}")
        except ValueError as error:
            print(f"note: {error}; no plot written", file=sys.stderr)


if __name__ == "__main__":
    main()
