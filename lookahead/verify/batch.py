"""A step's drafts packed for one forward (`DraftBatch`), and what the target accepted of them (`Verdict`).

Column 0 of a verification forward is each row's last token (the root), column 1 + j is draft node j. A chain is the
tree whose parents are i - 1: the model wrapper and the acceptance rules take faster paths for it (a causal step
mask, a cache cut instead of a gather, a cumulative product instead of a walk), nothing else tells them apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from . import tree as T


def to_device(array: np.ndarray, device, dtype=None) -> torch.Tensor:
    """A step's host array on the device without a host-device sync: through pinned memory, copied asynchronously
    (a pageable copy to CUDA waits for the stream). On a CPU the array's own memory."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if str(device).startswith("cuda"):
        tensor = tensor.pin_memory().to(device, non_blocking=True)
    return tensor if dtype is None else tensor.to(dtype)


_PARENTS = {}  # (rows, width) -> read-only parents of chains, shared by the steps of that shape


def _chain_parents(rows: int, width: int) -> np.ndarray:
    """[rows, width] parents i - 1: padding continues each chain, so one causal mask serves every row."""
    parents = _PARENTS.get((rows, width))
    if parents is None:
        if len(_PARENTS) > 256:
            _PARENTS.clear()
        parents = np.repeat(np.arange(-1, width - 1, dtype=np.int64)[None], rows, 0)
        parents.flags.writeable = False
        _PARENTS[rows, width] = parents
    return parents


@dataclass
class DraftBatch:
    """Per-row drafts padded to one width.

    Attributes:
        drafts: the rows' `lookahead.index.Draft`s.
        tokens: [b, N] int64 draft tokens (0 past a row's size).
        parents: [b, N] int64 parent of each node (-1: a child of the root; padding hangs from the root).
        sizes: [b] int64 real nodes per row.
        chain: every draft is a chain (parents i - 1), verified with a causal mask.
        probs: trees: [b, N] each node's estimated acceptance probability (0 past a row's size), what the tree
            policy calibrates; None for chains.
    """

    drafts: list
    tokens: np.ndarray
    parents: np.ndarray
    sizes: np.ndarray
    chain: bool
    probs: np.ndarray | None = None

    @classmethod
    def pack(cls, drafts: list, chain: bool) -> "DraftBatch":
        if not chain:
            tokens, parents, sizes = T.pack_trees([(d.tokens, d.parents) for d in drafts])
            probs = np.zeros(tokens.shape)
            for i, d in enumerate(drafts):
                probs[i, : len(d)] = d.probs
            return cls(drafts, tokens, parents, sizes, chain, probs)
        sizes = [len(d.tokens) for d in drafts]
        tokens = np.zeros((len(drafts), max(sizes, default=0)), dtype=np.int64)
        for i, d in enumerate(drafts):
            tokens[i, : sizes[i]] = d.tokens
        return cls(drafts, tokens, _chain_parents(*tokens.shape), np.array(sizes, dtype=np.int64), chain)

    @property
    def width(self) -> int:
        """Draft columns N (the forward verifies N + 1)."""
        return self.tokens.shape[1]

    def widened(self, width: int) -> "DraftBatch":
        """These chains with filler columns (token 0) up to `width` drafts; the rows' sizes stay theirs, so no
        acceptance reads the filler."""
        assert self.chain and width >= self.width, "only chains widen"
        tokens = np.zeros((len(self.tokens), width), dtype=np.int64)
        tokens[:, : self.width] = self.tokens
        return DraftBatch(self.drafts, tokens, _chain_parents(*tokens.shape), self.sizes, True)

    @cached_property
    def ancestry(self) -> tuple:
        """(seen [b, N+1, N+1] ancestor-or-self of each column, depth [b, N+1])."""
        return T.ancestry(self.parents)

    def paths(self, column: int) -> list:
        """Per row, the draft tokens from the root down to `column` (its prefix inside the step)."""
        if self.chain:
            return list(self.tokens[:, :column])
        seen = self.ancestry[0]
        return [self.tokens[i, seen[i, column, 1:]] for i in range(len(self.drafts))]


@dataclass
class Verdict:
    """What the target accepted of a `DraftBatch`.

    Attributes:
        counts: [b] accepted draft tokens per row.
        bonus: [b] the target's own next token after them.
        paths: per row the accepted node indices, root to leaf; None for chains (the first counts[i] nodes).
        cols: trees: the paths' forward columns [b, W] (`columns`), where the acceptance already has them; else None
            (computed from the paths when asked for).
        ordered: whether every row accepted its first nodes in order (`in_place`), where the acceptance already knows
            it (the fused trees give cols and this, no paths); None: from the paths.
    """

    counts: np.ndarray
    bonus: np.ndarray
    paths: list | None = None
    cols: np.ndarray | None = None
    ordered: bool | None = None

    @classmethod
    def of_paths(cls, paths: list, bonus: np.ndarray) -> "Verdict":
        return cls(np.fromiter(map(len, paths), dtype=np.int64, count=len(paths)), bonus, paths)

    def gained(self, batch: DraftBatch) -> list:
        """Each row's new tokens: its accepted drafts, then the bonus token."""
        if self.paths is None:
            counts, bonus = self.counts.tolist(), self.bonus.tolist()
            return [row[:a] + [t] for row, a, t in zip(batch.tokens.tolist(), counts, bonus)]
        return [[row[j] for j in p] + [t] for row, p, t in zip(batch.tokens.tolist(), self.paths, self.bonus.tolist())]

    @property
    def in_place(self) -> bool:
        """Whether every row accepted its draft's first nodes in order (0, 1, ..., k-1), as chains always do: their
        keys and values already sit right behind the root, so keeping them moves nothing (trees are numbered best
        first: while their likeliest path stays likelier than every branch, it is their first nodes). Chains answer
        without the cached property (and its lock, on Python 3.11)."""
        if self.ordered is not None:
            return self.ordered
        return self.paths is None or self._first_nodes

    @cached_property
    def _first_nodes(self) -> bool:
        return all(p == list(range(len(p))) for p in self.paths)

    def columns(self) -> np.ndarray | None:
        """[b, W] forward columns along each row's accepted path (root first); None for chains (columns 0..W-1)."""
        if self.cols is not None:
            return self.cols
        return None if self.paths is None else self._columns

    @cached_property
    def _columns(self) -> np.ndarray:
        return T.path_slots(self.paths)
