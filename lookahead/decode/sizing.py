"""How much each row drafts per step: one interface (`draft`, `update`) over the chain and the tree policies.

Chains ask each row's index for as many tokens as the learned acceptance of its match pays for (`DraftLength`).
Trees ask for the whole node budget, then keep the best-first nodes that pay for their verification judged by the
index's node probabilities as calibrated online (`TreeCalibration`), and always the chain `DraftLength` would
draft (the tree's first path), so that a tree step never does worse than a chain step: only that chain's nodes,
not every node valued above its end (`_policy_kernels.tree_pick`; a recycling index's tree keeps those too: there
they are accepted more often than their calibrated values say, benchmarks/RESULTS.md).
Then every row with a match fills its draft up to the columns the step's forward computes anyway (the widest row's
draft, or a static step's padded width): padding costs the same as drafted tokens, so drafting there is free.
"""
from __future__ import annotations

import numpy as np

from ..runtime.jit import kernels
from . import _policy_kernels
from ..index.draft import Draft
from .policy import DraftLength, Stacked, TreeCalibration, as_cost, step_cost, step_costs


def make_sizing(draft: str, num_draft_tokens: int, max_draft_nodes: int, cost):
    """The sizing policy of a call: `ChainSizing` or `TreeSizing` (draft="tree")."""
    if draft == "tree":
        return TreeSizing(max_draft_nodes, num_draft_tokens, cost)
    return ChainSizing(num_draft_tokens, cost)


def _matches(indexes: list) -> np.ndarray:
    return np.fromiter((0 if ix is None else ix.match_length for ix in indexes), dtype=np.int64, count=len(indexes))


class ChainSizing:
    """One continuation per row, as long as its match's learned acceptance pays for.

    Args:
        max_tokens: most draft tokens per row and step.
        cost: the verification cost model (`lookahead.decode.policy`).
    """

    chain = True

    def __init__(self, max_tokens: int, cost):
        self.length = DraftLength(max_tokens, cost)

    def draft(self, indexes: list, rooms: np.ndarray, padded=None) -> list:
        """Each row's `Draft`; `rooms` [b] caps a row's draft at the tokens it may still generate minus one.

        `padded(n)`: the draft columns a forward verifying n of them computes anyway (the batch's widest draft, a
        static step's width); every row with a match drafts that many (at most `max_tokens`), since they are free."""
        matches = _matches(indexes)
        budgets = np.minimum(self.length.choose(matches), rooms).tolist()  # Python ints: a batch is a few rows
        matches = matches.tolist()
        if padded is None or not any(budgets):
            return [Draft.chain(ix.propose(n), m) if n > 0 else Draft.empty(m)
                    for ix, n, m in zip(indexes, budgets, matches)]
        upto = min(padded(max(budgets)), self.length.max_tokens)
        asks = [max(min(upto, room) if m > 0 else 0, n) for m, room, n in zip(matches, rooms.tolist(), budgets)]
        tokens = [ix.propose(n) if n > 0 else None for ix, n in zip(indexes, asks)]
        width = max(min(len(t), n) for t, n in zip(tokens, budgets) if t is not None)  # what the policy drafts
        fill = min(padded(width), self.length.max_tokens)  # ... and what its forward verifies anyway
        return [Draft.empty(m) if t is None else Draft.chain(t[: max(n, fill)], m)
                for t, n, m in zip(tokens, budgets, matches)]

    def update(self, batch, verdict) -> None:
        """Learn from a verified step: how much of each row's draft was accepted."""
        matches = np.fromiter((d.match_length for d in batch.drafts), dtype=np.int64, count=len(batch.drafts))
        self.length.update(matches, batch.sizes, verdict.counts)


class TreeSizing:
    """A tree per row: its first nodes that pay for their verification, and the chain's first path (the chain
    `DraftLength` drafts) however far down the best-first order its nodes sit (`_policy_kernels.tree_pick`).

    Args:
        max_nodes: most tree nodes per row and step.
        max_tokens: most tokens of the chain floor (`DraftLength`).
        cost: the verification cost model (`lookahead.decode.policy`).
    """

    chain = False

    def __init__(self, max_nodes: int, max_tokens: int, cost):
        self.max_nodes = max_nodes
        self.length = DraftLength(max_tokens, cost)  # its `cost` prices the trees too (`step_costs`)
        self.calibration = TreeCalibration()

    def draft(self, indexes: list, rooms: np.ndarray, padded=None) -> list:
        """Each row's `Draft` (a tree; `Draft.empty` where a row has no index); `rooms` [b] caps its nodes;
        `padded(n)` as for chains: every row keeps as many nodes as the forward computes anyway."""
        kern = kernels(_policy_kernels)
        costs, cal = self.step_costs(len(indexes)), self.calibration
        pick, path = np.empty(self.max_nodes, dtype=np.int64), np.empty(self.max_nodes, dtype=np.int64)
        trees, sizes = [], []
        for ix, room, k in zip(indexes, rooms, self.length.choose(_matches(indexes))):
            tree = Draft.empty() if ix is None else ix.propose_tree(max(min(self.max_nodes, int(room)), 0))
            best = kern.tree_size(tree.probs, cal.EDGES, cal.accepted, cal.seen, cal.prior, costs)
            whole = getattr(ix, "recycled", None) is not None  # recycled trees: every node up to the chain's end
            trees.append((tree, best, k, whole))
            sizes.append(kern.tree_pick(tree.parents, best, 0, k, whole, pick, path))
        fill = min(padded(max(sizes, default=0)), self.max_nodes) if padded is not None else 0
        return [tree.take(pick[:kern.tree_pick(tree.parents, best, fill, k, whole, pick, path)])
                for tree, best, k, whole in trees]

    def update(self, batch, verdict) -> None:
        """Calibrate the node probabilities against the accepted paths; teach the chain floor how far it went."""
        kern = kernels(_policy_kernels)
        matches = np.fromiter((d.match_length for d in batch.drafts), dtype=np.int64, count=len(batch.drafts))
        floors, followed = np.zeros(len(matches), dtype=np.int64), np.zeros(len(matches), dtype=np.int64)
        cal = self.calibration
        kern.tree_record(batch.parents, batch.sizes, batch.probs, self.length.choose(matches), verdict.columns(),
                      verdict.counts, cal.EDGES, *cal.counts, floors, followed,
                      np.zeros(batch.width, dtype=np.bool_))
        self.length.update(matches, floors, followed)

    def step_costs(self, batch: int) -> np.ndarray:
        return step_costs(self.length.cost, self.max_nodes, batch)


class StackedTrees:
    """Rows' own `TreeSizing`s as one, as the fused tree kernels take one per row (the server's rows: `serve.engine`,
    `fused.for_rows`): their chain floors' policies stacked (`Stacked`) and their calibrations' counts too, [rows,
    bins], each row's `TreeCalibration` bound to its row of the stack, so that what the kernels teach a row, its
    sizing knows, and the row goes on with it when it leaves. The rows have one `max_nodes`, prior and cost model
    (`takes`); their trees are sized for the whole batch's step (`step_costs`), as `generate`'s rows are.

    Example:
        >>> rows = [TreeSizing(8, 4, 0.1), TreeSizing(8, 4, 0.1)]
        >>> stack = StackedTrees(rows)
        >>> stack.calibration.counts[1][1, 0] = 5.0
        >>> float(rows[1].calibration.seen[0])
        5.0
    """

    chain = False

    def __init__(self, trees: list):
        first = trees[0]
        self.max_nodes, self.length = first.max_nodes, Stacked([tree.length for tree in trees])
        cal = self.calibration = TreeCalibration(first.calibration.prior)
        cal.bind(*(np.concatenate([tree.calibration.counts[i] for tree in trees]) for i in range(2)))
        for k, tree in enumerate(trees):
            tree.calibration.bind(*(c[k:k + 1] for c in cal.counts))

    @staticmethod
    def takes(trees: list) -> bool:
        """Whether these sizings stack: the same most nodes, calibration prior, most chain tokens and cost model."""
        first = trees[0]
        return (Stacked.takes([tree.length for tree in trees]) and
                all(tree.max_nodes == first.max_nodes and tree.calibration.prior == first.calibration.prior
                    for tree in trees))

    step_costs = TreeSizing.step_costs


def first_path(parents: np.ndarray, k: int) -> list:
    """Node indices of a best-first tree's first path (the first child at each depth), at most k deep.

    >>> first_path(np.array([-1, -1, 0, 1, 2]), 5)
    [0, 2, 4]
    """
    kern = kernels(_policy_kernels)
    out = np.empty(max(k, 0), dtype=np.int64)
    return out[:kern.first_path(parents, k, out)].tolist()


def best_size(probs: np.ndarray, cost) -> int:
    """How many of the best-first nodes to verify: the n maximizing expected tokens per unit of forward cost,
    (1 + p_1 + ... + p_n) / step_cost(n), with p_i the nodes' acceptance probabilities (non-increasing) and `cost`
    a per-token cost or an (overhead, per_token) pair (`lookahead.decode.policy.as_cost`)."""
    gain = 1.0 + np.concatenate([[0.0], np.cumsum(probs)])
    return int(np.argmax(gain / step_cost(as_cost(cost), np.arange(len(gain)))))
