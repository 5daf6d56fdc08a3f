"""What recycled tree nodes gain against what they cost, step by step (issue 28), on SmolLM2-135M-Instruct (fp32,
greedy, the real-model bench's workloads and prompts, `draft_cost="auto"`, 32 nodes, M cold at each call).

Every verified step of ``lookup="suffix+recycle", draft="tree"`` (the fused loop) is recorded beside what its copies
alone would have done: the tokens it gained (accepted + 1) against the accepted path up to its first node that only
M's walk proposed, and its cost (the call's measured curve, by nodes verified) against the cost without those nodes
(copies never hang below a recycled node). No timing: the ratios are the cost model's, free of the machine's drift.

And beside what the suffix tree alone would have verified at the same position: the nodes `draft_trees` (the fused
suffix tree's kernel) picks from the row's suffix index with the call's policy, their cost, and the tokens they would
have gained, read off the call's output once it is written (greedy: the target's tokens do not depend on the
drafts). Such pairs are what a switch between the two sources within a call would have to judge by; the table
gives, per call, how far the first 16 steps' verdict is from the whole call's.

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
from lookahead.decode import _fused_kernels, fused
from lookahead.index._recycle_kernels import PENDING, RECYCLED

WORKLOADS = [*LITTLE_TO_COPY, *OTHERS]  # Spec-Bench's eight categories with little to copy, then the copy workloads
FIRST = 16  # the steps a switch within a call would judge by before it decides (the table's last column)


def _paths(tokens, parents, n) -> list:
    """Each node's token path from the root (a tree's nodes are told apart by their paths)."""
    paths = []
    for j in range(n):
        paths.append((paths[parents[j]] if parents[j] >= 0 else ()) + (int(tokens[j]),))
    return paths


def tree_gain(tokens, parents, n: int, truth) -> int:
    """Tokens a greedy step verifying the tree (tokens, parents [n]: best-first, parents before children) gains when
    the target writes `truth` next: its longest root path along `truth`, plus the target's own token (at most
    len(truth))."""
    node, depth = -1, 0
    while depth < len(truth) - 1:
        node = next((j for j in range(n) if parents[j] == node and tokens[j] == truth[depth]), None)
        if node is None:
            break
        depth += 1
    return min(depth + 1, len(truth))


class Ledger:
    """Sums over verified steps: tokens and cost, of the merged tree and of its copies alone (see the docstring)."""

    def __init__(self):
        self.sums = np.zeros(4)  # tokens, cost, copies' tokens, copies' cost
        self.pairs = np.zeros(4)  # tokens, cost, the suffix tree's tokens, its cost: the steps paired by position
        self.calls = []  # per call: (its pairs' sums, those of its first FIRST steps)
        self._sources = {}  # id of a draft buffer -> (nodes, their sources) of the tree drafted into it
        self._verified = {}  # the call's verified steps: position (new tokens before it) -> (tokens, cost)
        self._picks = {}  # position -> (tokens, parents, nodes, cost) the suffix tree would have verified there

    def step(self, original, loop, targets, batch, lists, s, now, later) -> int:
        """`FusedRecycleTrees._step` (batch 1), recording the step it verifies, the sources of the next draft and
        the suffix tree's own pick at the next step's position."""
        drafted, start = self._sources.pop(id(now["tokens"]), None), int(s["lens"][0])
        done = original(loop, targets, batch, lists, s, now, later)
        size, costs = int(now["sizes"][0]), s["step_costs"]
        if drafted is not None and drafted[0] == size:
            sources, count = drafted[1], int(s["counts"][0])
            path = s["paths"][0, :count]
            copied = next((a for a in range(count) if sources[path[a]] == RECYCLED), count)
            self.sums += [count + 1, costs[size], copied + 1, costs[size - int((sources == RECYCLED).sum())]]
            self._verified[start] = (count + 1, costs[size])
        if done == 0:  # the next step's tree: its nodes' sources, found by path in the row's proposal
            row = lists[2][0]  # the row's `RecycleIndex._row`: (merge scratch ..., out, est, state)
            out, proposed, n = row[-3], int(row[-1][PENDING]), int(later["sizes"][0])
            by_path = dict(zip(_paths(out[0], out[1], proposed), out[2].tolist()))
            picked = _paths(later["tokens"][0], later["parents"][0], n)
            self._sources[id(later["tokens"])] = (n, np.array([by_path[p] for p in picked], dtype=np.int64))
            self._picks[int(s["lens"][0])] = self._tree_pick(loop, lists, s)
        return done

    @staticmethod
    def _tree_pick(loop, lists, s) -> tuple:
        """The nodes the fused suffix tree (`draft_trees`) picks from the row's suffix index (lists[0], lists[1]),
        with the call's policy and calibration: (tokens, parents, nodes, their cost). Its kernel writes only the
        suffix index's scratch, which the merged draft has already read."""
        width = max(loop.budget, 1)
        tokens, parents, probs = np.zeros((1, width), np.int64), np.zeros((1, width), np.int64), np.zeros((1, width))
        sizes, matches, depths, nodes = np.zeros((4, 1), np.int64)
        _fused_kernels.draft_trees(lists[0], lists[1], s["lens"], loop.max_new, loop.budget, s["sizing"][0],
                                   *s["policy"], *s["sizing"][1:], *s["calibration"], s["step_costs"], tokens,
                                   parents, probs, sizes, matches, depths, nodes)
        n = int(sizes[0])
        return tokens[0, :n].copy(), parents[0, :n].copy(), n, float(s["step_costs"][n])

    def settle(self, new_tokens) -> None:
        """Pair the call's verified steps with the suffix tree's picks at their positions, now that the call's
        `new_tokens` are known; add them to `pairs` and `calls`."""
        truth, rows = list(map(int, new_tokens)), []
        for at in sorted(set(self._verified) & set(self._picks)):
            tokens, parents, n, cost = self._picks[at]
            rows.append([*self._verified[at], tree_gain(tokens, parents, n, truth[at:]), cost])
        self._verified, self._picks = {}, {}
        rows = np.array(rows).reshape(-1, 4)
        call = rows.sum(0)
        self.pairs += call
        self.calls.append((call, rows[:FIRST].sum(0)))


def account(model, input_ids: torch.Tensor, ledger: Ledger, **kwargs) -> tuple:
    """`generate(model, input_ids, lookup="suffix+recycle", draft="tree", return_stats=True, **kwargs)` (one row),
    its fused steps recorded in `ledger`; returns what `generate` returns."""
    original = fused.FusedRecycleTrees._step
    fused.FusedRecycleTrees._step = lambda loop, *args: ledger.step(original, loop, *args)
    try:
        with torch.inference_mode():
            out, stats = generate(model, input_ids, lookup="suffix+recycle", draft="tree", return_stats=True,
                                  **kwargs)
    finally:
        fused.FusedRecycleTrees._step = original
    ledger.settle(out[0, input_ids.shape[1]:].tolist())
    return out, stats


def per_cost(sums) -> float:
    """Tokens per unit of cost of the first two sums over those of the last two."""
    return sums[0] / sums[1] / (sums[2] / sums[3])


def setup(argv, doc: str, workloads: list, prompts: int, rounds: int | None = None) -> tuple:
    """(args, model, tokenizer) of a SmolLM2 script (this one, `recycle_wall.py`): its --workloads, --prompts,
    --max-new and, where `rounds` is given, --rounds; SmolLM2-135M-Instruct loaded, torch on two threads."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=workloads, metavar="NAME")
    parser.add_argument("--prompts", type=positive_int, default=prompts,
                        help=f"prompts per workload (default {prompts})")
    if rounds is not None:
        parser.add_argument("--rounds", type=positive_int, default=rounds, help=f"timed rounds (default {rounds})")
    parser.add_argument("--max-new", type=positive_int, default=128)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model, tokenizer, _ = models.load("smollm2")
    return args, model, tokenizer


def main(argv=None) -> None:
    args, model, tokenizer = setup(argv, __doc__, WORKLOADS, 4)
    print("| workload | steps | tokens | cost | tokens per unit of cost | ÷ the suffix tree's picks | per call | "
          f"first {FIRST} steps against the call |\n| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for name in args.workloads:
        ledger, steps = Ledger(), 0
        for item in load([name], tokenizer, args.prompts)[name]:
            _, stats = account(model, torch.as_tensor(item.input_ids)[None], ledger, max_new_tokens=args.max_new)
            steps += stats.forward_passes - 1
        t, c, t0, c0 = ledger.sums
        calls = [per_cost(call) for call, _ in ledger.calls]
        wrong = sum((per_cost(call) >= 1) != (per_cost(first) >= 1) for call, first in ledger.calls)
        print(f"| {name} | {steps} | {t / t0:.3f}x | {c / c0:.3f}x | {per_cost(ledger.sums):.3f}x | "
              f"{per_cost(ledger.pairs):.3f}x | {min(calls):.3f}-{max(calls):.3f} | {wrong} of {len(calls)} |",
              flush=True)


if __name__ == "__main__":
    main()
