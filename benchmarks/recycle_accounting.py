"""What recycled tree nodes gain against what they cost, step by step (issue 28), on SmolLM2-135M-Instruct (fp32,
greedy, the real-model bench's workloads and prompts, `draft_cost="auto"`, 32 nodes, M cold at each call).

Every verified step of ``lookup="suffix+recycle", draft="tree"`` (the fused loop) is recorded beside what its copies
alone would have done: the tokens it gained (accepted + 1) against the accepted path up to its first node that only
M's walk proposed, and its cost (the call's measured curve, by nodes verified) against the cost without those nodes
(copies never hang below a recycled node). No timing: the ratios are the cost model's, free of the machine's drift.

    python benchmarks/recycle_accounting.py --prompts 4
    python benchmarks/recycle_accounting.py --workloads spec-bench/roleplay rag --prompts 2
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from lookahead import generate, models
from lookahead.arguments import positive_int
from lookahead.bench.real_report import LITTLE_TO_COPY
from lookahead.bench.real_workloads import OTHERS, load
from lookahead.decode import fused
from lookahead.index._recycle_kernels import PENDING, RECYCLED

WORKLOADS = [*LITTLE_TO_COPY, *OTHERS]  # Spec-Bench's eight categories with little to copy, then the copy workloads


def _paths(tokens, parents, n) -> list:
    """Each node's token path from the root (a tree's nodes are told apart by their paths)."""
    paths = []
    for j in range(n):
        paths.append((paths[parents[j]] if parents[j] >= 0 else ()) + (int(tokens[j]),))
    return paths


class Ledger:
    """Sums over verified steps: tokens and cost, of the merged tree and of its copies alone (see the docstring)."""

    def __init__(self):
        self.sums = np.zeros(4)  # tokens, cost, copies' tokens, copies' cost
        self._sources = {}  # id of a draft buffer -> (nodes, their sources) of the tree drafted into it

    def step(self, original, loop, targets, batch, lists, s, now, later) -> int:
        """`FusedRecycleTrees._step` (batch 1), recording the step it verifies and the sources of the next draft."""
        drafted = self._sources.pop(id(now["tokens"]), None)
        done = original(loop, targets, batch, lists, s, now, later)
        size = int(now["sizes"][0])
        if drafted is not None and drafted[0] == size:
            sources, count = drafted[1], int(s["counts"][0])
            path = s["paths"][0, :count]
            copied = next((a for a in range(count) if sources[path[a]] == RECYCLED), count)
            costs = s["step_costs"]
            self.sums += [count + 1, costs[size], copied + 1, costs[size - int((sources == RECYCLED).sum())]]
        if done == 0:  # the next step's tree: its nodes' sources, found by path in the row's proposal
            row = lists[2][0]  # the row's `RecycleIndex._row`: (merge scratch ..., out, est, state)
            out, proposed, n = row[-3], int(row[-1][PENDING]), int(later["sizes"][0])
            by_path = dict(zip(_paths(out[0], out[1], proposed), out[2].tolist()))
            picked = _paths(later["tokens"][0], later["parents"][0], n)
            self._sources[id(later["tokens"])] = (n, np.array([by_path[p] for p in picked], dtype=np.int64))
        return done


def account(model, input_ids: torch.Tensor, ledger: Ledger, **kwargs) -> tuple:
    """`generate(model, input_ids, lookup="suffix+recycle", draft="tree", return_stats=True, **kwargs)` (one row),
    its fused steps recorded in `ledger`; returns what `generate` returns."""
    original = fused.FusedRecycleTrees._step
    fused.FusedRecycleTrees._step = lambda loop, *args: ledger.step(original, loop, *args)
    try:
        with torch.inference_mode():
            return generate(model, input_ids, lookup="suffix+recycle", draft="tree", return_stats=True, **kwargs)
    finally:
        fused.FusedRecycleTrees._step = original


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=WORKLOADS, metavar="NAME")
    parser.add_argument("--prompts", type=positive_int, default=4, help="prompts per workload (default 4)")
    parser.add_argument("--max-new", type=positive_int, default=128)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model, tokenizer, _ = models.load("smollm2")
    print("| workload | steps | tokens | cost | tokens per unit of cost |\n| --- | ---: | ---: | ---: | ---: |")
    for name in args.workloads:
        ledger, steps = Ledger(), 0
        for item in load([name], tokenizer, args.prompts)[name]:
            _, stats = account(model, torch.as_tensor(item.input_ids)[None], ledger, max_new_tokens=args.max_new)
            steps += stats.forward_passes - 1
        t, c, t0, c0 = ledger.sums
        print(f"| {name} | {steps} | {t / t0:.3f}x | {c / c0:.3f}x | {t / c / (t0 / c0):.3f}x |", flush=True)


if __name__ == "__main__":
    main()
