"""Draft trees: one forward verifies every branch (tree attention), the longest matching path is kept.

A tree is (tokens, parents) per row: parents[j] is the index of node j's parent, -1 for a child of the row's last
token; parents come before children. Column 0 of the forward is the last token (the root), column 1 + j is node j.
Each column attends to the cache and to its ancestors only, at position (row position + depth). Reference:
Miao et al., "SpecInfer" (2024); Cai et al., "Medusa" (2024).

Sampling over a tree is SpecInfer's multi-step speculative sampling with point-mass drafts: at a column with target
distribution p, the children are tried in tree order, child x accepted with probability p(x) / m, m the mass of p
not yet rejected, and a rejected x removed from p. The first accepted child is descended into; when all are
rejected the next token is sampled from p without them. Token by token this is sampling from p without
replacement stopped at the first draw, so every emitted token is distributed exactly as the target's own sample.
"""
from __future__ import annotations

import numpy as np
import torch

from ..runtime.jit import kernels
from . import _kernels


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
    kern = kernels(_kernels)
    b, n = parents.shape
    seen = np.zeros((b, n + 1, n + 1), dtype=bool)  # the kernel writes columns 0..n: the root and n nodes
    depth = np.zeros((b, n + 1), dtype=np.int64)
    kern.ancestry(np.ascontiguousarray(parents, dtype=np.int64), seen, depth)
    return seen, depth


def tree_mask(cache_mask: torch.Tensor, seen: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Additive 4D attention mask [b, 1, N+1, S+N+1]: the row's cache slots, then its ancestors in the tree."""
    b, q = seen.shape[:2]
    allowed = torch.cat([cache_mask.bool()[:, None, :].expand(b, q, -1),
                         torch.from_numpy(seen).pin_memory().to(cache_mask.device, non_blocking=True)
                         if cache_mask.is_cuda else torch.from_numpy(seen)], dim=2)
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
    kern = kernels(_kernels)
    b, n = tokens.shape  # a path holds at most n nodes: paths [b, n]
    paths, counts, bonus = np.empty((b, n), dtype=np.int64), np.empty(b, dtype=np.int64), np.empty(b, dtype=np.int64)
    kern.greedy_tree(tokens, parents, sizes, targets, paths, counts, bonus)
    return [row[:a] for row, a in zip(paths[:, : counts.max(initial=0)].tolist(), counts.tolist())], bonus


def sample_tree_accept(tokens: np.ndarray, parents: np.ndarray, sizes: np.ndarray, probs: torch.Tensor,
                       generator=None) -> tuple:
    """Accept a path of each row's tree by multi-step speculative sampling; sample each row's next token.

    A sibling repeating an earlier sibling's token is skipped: once that token is rejected it has no mass left, so
    skipping keeps the rule exact (`SuffixIndex.propose_tree` never repeats a token among siblings). Two host-device
    syncs: the walk needs the nodes' probabilities, and sampling every column's bonus token up front instead would
    cost N+1 draws over the vocabulary per row.

    Args:
        tokens, parents, sizes: packed trees (`pack_trees`).
        probs: [b, N+1, V] the target's processed distribution after the root (column 0) and after each node
            (column 1 + j).
        generator: a `torch.Generator` on probs' device, or None for the global generator.

    Returns:
        (paths, bonus): as `greedy_tree_accept`; bonus[i] is sampled from p after the path's last node with the
        node's rejected children removed.

    Example:
        >>> paths, bonus = sample_tree_accept(*pack_trees([([3, 4], [-1, -1])]), torch.full((1, 3, 8), 1 / 8))
    """
    b, n = tokens.shape
    device = probs.device
    rows = torch.arange(b, device=device)[:, None]
    p_node = probs[rows, torch.from_numpy(1 + parents).to(device), torch.from_numpy(tokens).to(device)]  # [b, N]
    u = torch.rand((b, n), generator=generator, device=device, dtype=probs.dtype)
    p_node, u = torch.stack([p_node, u]).double().cpu().numpy()  # host-device sync 1 of 2
    paths, ends, removed = [], np.zeros(b, dtype=np.int64), []
    for i, size in enumerate(sizes):
        path, rejected = _walk(tokens[i, :size], parents[i, :size], p_node[i], u[i])
        paths.append(path)
        ends[i] = 1 + path[-1] if path else 0
        removed += [(i, int(x)) for x in rejected]
    p = probs[rows[:, 0], torch.from_numpy(ends).to(device)]  # [b, V] the distribution after each path
    if removed:
        at = torch.tensor(removed, device=device).T
        residual = p.index_put((at[0], at[1]), torch.zeros((), device=device, dtype=p.dtype))
        p = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)  # nothing left only by rounding
    bonus = torch.multinomial(p, 1, generator=generator)[:, 0].cpu().numpy()  # multinomial renormalizes; sync 2
    return paths, bonus


def _walk(tokens: np.ndarray, parents: np.ndarray, p_node: np.ndarray, u: np.ndarray) -> tuple:
    """One row's walk down its tree: (accepted node indices, tokens rejected at the last column)."""
    path, col = [], 0
    while True:
        m, rejected = 1.0, []
        for j in np.flatnonzero(parents == col - 1):
            if tokens[j] in rejected:
                continue
            if u[j] * m < p_node[j]:  # accept x with probability p(x) / m
                path.append(int(j))
                break
            m -= p_node[j]
            rejected.append(tokens[j])
        else:
            return path, rejected
        col = 1 + path[-1]


def path_slots(paths: list) -> np.ndarray:
    """Columns to keep in the cache per row [b, W]: the root then the accepted nodes, padded with the root."""
    width = 1 + max(map(len, paths), default=0)
    slots = np.full((len(paths), width), -1, dtype=np.int64)  # node indices first, the root and padding -1
    for i, p in enumerate(paths):
        slots[i, 1: 1 + len(p)] = p
    slots += 1
    return slots
