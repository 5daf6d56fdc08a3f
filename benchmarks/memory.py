"""Memory across requests, model-free: replay traces in order, each request drafting also from earlier ones.

Code edit: the CanItEdit tasks in sequence (each task comes with a descriptive and a lazy instruction, so a task's
second request can copy the first one's answer). Agent: the assistant turns of each trajectory in order, and the
trajectories one after another (earlier trajectories' commands and tool output recur).

    python benchmarks/memory.py --datasets code-edit agent --limit 40 --max-tokens 200000
"""
from __future__ import annotations

import argparse
from pathlib import Path

from tqdm import tqdm

from traces import DEFAULT_DATA_DIR, load_traces

from lookahead import Memory
from lookahead.bench.arguments import positive_int
from lookahead.bench.replay import ReplayStats, replay_trace
from lookahead.index import NgramIndex, SuffixIndex

INDEXES = {"ngram": lambda: NgramIndex(4), "suffix": SuffixIndex}


def replay_in_order(traces, make_index, memory: Memory | None, budget: int, tree: bool) -> ReplayStats:
    """Replay each trace with a fresh index that first holds the memory; then remember the trace."""
    total = ReplayStats()
    for prompt, output in tqdm(traces, desc="traces", leave=False):
        index = make_index()
        for piece in memory.documents()[0] if memory is not None and len(memory) else []:
            index.extend(piece)
        if memory is not None and len(memory) and hasattr(index, "begin_request"):
            index.begin_request()  # as generate(..., memory=) does
        total += replay_trace(index, prompt, output, budget=budget, tree=tree)
        if memory is not None:
            memory.add_tokens(list(prompt) + list(output))
    return total


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["code-edit", "agent"])
    parser.add_argument("--limit", type=positive_int, default=40, help="rows (code edit) or trajectories (agent)")
    parser.add_argument("--max-tokens", type=positive_int, default=200_000, help="memory bound in tokens")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args(argv)
    print("| dataset | index | draft | no memory | with memory |\n|---|---|---|---:|---:|")
    for name in args.datasets:
        traces = load_traces(name, data_dir=args.data_dir, limit=args.limit)
        for index in ("ngram", "suffix"):
            for budget, tree in ((10, False), (32, index == "suffix")):
                cells = [replay_in_order(traces, INDEXES[index], mem, budget, tree).tokens_per_forward
                         for mem in (None, Memory(args.max_tokens))]
                shape = f"{'tree' if tree else 'chain'} {budget}"
                print(f"| {name} | {index} | {shape} | {cells[0]:.2f} | {cells[1]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
