"""Draft trees: one forward verifies every branch (tree attention), the longest matching path is kept.

A tree is (tokens, parents) per row: parents[j] is the index of node j's parent, -1 for a child of the row's last
token; parents come before children. Column 0 of the forward is the last token (the root), column 1 + j is node j.
Each column attends to the cache and to its ancestors only, at position (row position + depth). Reference:
Miao et al., "SpecInfer" (2024); Cai et al., "Medusa" (2024).
"""
from __future__ import annotations

import numpy as np
import torch

from ..policy import as_cost, step_cost


def pack_trees(trees: list) -> tuple:
    """Pad per-row trees to one width.

    Returns:
        tokens [b, N] int64, parents [b, N] int64 (padding: children of the root), sizes [b].
    """
    sizes = np.array([len(t) for t, _ in trees], dtype=np.int64)
    n = int(sizes.max(initial=0))
    tokens = np.zeros((len(trees), n), dtype=np.int64)
    parents = np.full((len(trees), n), -1, dtype=np.int64)
    for i, (t, p) in enumerate(trees):
        tokens[i, : len(t)], parents[i, : len(p)] = t, p
    return tokens, parents, sizes


def ancestry(parents: np.ndarray) -> tuple:
    """Ancestor-or-self matrix over columns [b, N+1, N+1] (bool) and the depth of each column [b, N+1]."""
    b, n = parents.shape
    seen = np.zeros((b, n + 1, n + 1), dtype=bool)
    depth = np.zeros((b, n + 1), dtype=np.int64)
    seen[:, 0, 0] = True
    for j in range(n):  # parents come first, so a parent's row is complete when its child copies it
        col = 1 + parents[:, j]  # [b] column of the parent (0: the root)
        seen[:, j + 1] = seen[np.arange(b), col]
        seen[:, j + 1, j + 1] = True
        depth[:, j + 1] = depth[np.arange(b), col] + 1
    return seen, depth


def tree_mask(cache_mask: torch.Tensor, seen: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Additive 4D attention mask [b, 1, N+1, S+N+1]: the row's cache slots, then its ancestors in the tree."""
    b, q = seen.shape[:2]
    allowed = torch.cat([cache_mask.bool()[:, None, :].expand(b, q, -1),
                         torch.from_numpy(seen).to(cache_mask.device)], dim=2)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=cache_mask.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def greedy_tree_accept(tokens: np.ndarray, parents: np.ndarray, sizes: np.ndarray, targets: np.ndarray) -> tuple:
    """The longest path of each row's tree that the target's argmax agrees with.

    Args:
        tokens, parents, sizes: packed trees (`pack_trees`).
        targets: [b, N+1] argmax after the root (column 0) and after each node (column 1 + j).

    Returns:
        (paths, bonus): per row the accepted node indices root to leaf, and the target's own next token.
    """
    paths, bonus = [], np.empty(len(sizes), dtype=np.int64)
    for i, size in enumerate(sizes):
        path, col = [], 0
        while True:
            want = targets[i, col]
            hits = np.flatnonzero((parents[i, :size] == col - 1) & (tokens[i, :size] == want))
            if len(hits) == 0:
                break
            path.append(int(hits[0]))
            col = 1 + int(hits[0])
        paths.append(path)
        bonus[i] = targets[i, col]
    return paths, bonus


def path_slots(paths: list) -> np.ndarray:
    """Columns to keep in the cache per row [b, W]: the root then the accepted nodes, padded with the root."""
    width = 1 + max((len(p) for p in paths), default=0)
    slots = np.zeros((len(paths), width), dtype=np.int64)
    for i, p in enumerate(paths):
        slots[i, 1: 1 + len(p)] = np.asarray(p, dtype=np.int64) + 1
    return slots


def best_size(probs: np.ndarray, cost) -> int:
    """How many of the best-first nodes to verify: the n maximizing expected tokens per unit of forward cost,
    (1 + p_1 + ... + p_n) / step_cost(n), with p_i the nodes' acceptance probabilities (non-increasing) and `cost`
    a per-token cost or an (overhead, per_token) pair (`lookahead.policy.as_cost`)."""
    gain = 1.0 + np.concatenate([[0.0], np.cumsum(probs)])
    return int(np.argmax(gain / step_cost(as_cost(cost), np.arange(len(gain)))))
