"""Draft: what an index proposes for one row, a tree of draft tokens; a chain is the tree whose parents are i - 1."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_NO_TOKENS = np.empty(0, dtype=np.int64)
# a chain's parents and probabilities, shared read-only by every chain draft (views, no allocation per step)
_CHAIN_PARENTS, _ONES = np.arange(-1, 4095, dtype=np.int64), np.ones(4096)
_CHAIN_PARENTS.flags.writeable = _ONES.flags.writeable = False


@dataclass(frozen=True)
class Draft:
    """One row's proposal.

    Attributes:
        tokens: [n] int64 draft tokens.
        parents: [n] int64: parents[i] is the index of node i's parent, -1 for a child of the row's last token;
            parents come before their children. A chain has parents [-1, 0, 1, ...].
        probs: [n] float64 estimated probability that each node is accepted (1.0 where the index gives none).
        match_length: length of the match in the held tokens that the proposal continues (0: nothing matched).

    Example:
        >>> Draft.chain(np.array([7, 8])).parents.tolist()
        [-1, 0]
    """

    tokens: np.ndarray
    parents: np.ndarray
    probs: np.ndarray
    match_length: int = 0

    @classmethod
    def chain(cls, tokens: np.ndarray, match_length: int = 0, probs: np.ndarray | None = None) -> "Draft":
        """The draft that proposes `tokens` one after the other."""
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        parents = _CHAIN_PARENTS[:n] if n <= len(_CHAIN_PARENTS) else np.arange(n, dtype=np.int64) - 1
        if probs is None:
            probs = _ONES[:n] if n <= len(_ONES) else np.ones(n)
        return cls(tokens, parents, np.asarray(probs, dtype=np.float64), int(match_length))

    @classmethod
    def empty(cls, match_length: int = 0) -> "Draft":
        return cls(_NO_TOKENS, _NO_TOKENS, np.empty(0), int(match_length))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return bool(np.all(self.parents == np.arange(len(self.parents)) - 1))

    def head(self, n: int) -> "Draft":
        """The first n nodes (a tree still: parents come before children)."""
        return Draft(self.tokens[:n], self.parents[:n], self.probs[:n], self.match_length)

    def take(self, nodes: np.ndarray) -> "Draft":
        """The nodes at the ascending indices `nodes`, each one's parent among them, renumbered (`head(n)` when they
        are the first n).

        >>> Draft(np.array([5, 6, 7]), np.array([-1, -1, 1]), np.ones(3)).take(np.array([1, 2])).parents.tolist()
        [-1, 0]
        """
        n = len(nodes)
        if n == 0 or nodes[n - 1] == n - 1:
            return self.head(n)
        banned = np.ones(len(self.tokens), dtype=bool)
        banned[nodes] = False
        return self.prune(banned)  # no picked node's parent is banned: prune drops exactly the others

    def prune(self, banned: np.ndarray) -> "Draft":
        """The draft without the `banned` nodes ([n] bool) and their descendants; a chain is cut at its first one.

        >>> Draft(np.array([5, 6, 7]), np.array([-1, -1, 1]), np.ones(3)).prune(np.array([False, True, False])).tokens
        array([5])
        """
        keep = ~np.asarray(banned, dtype=bool)
        for j, parent in enumerate(self.parents):  # parents come first: a parent's fate is known
            keep[j] &= parent < 0 or keep[parent]
        index = np.cumsum(keep) - 1  # new index of each kept node
        parents = np.where(self.parents[keep] < 0, -1, index[np.maximum(self.parents[keep], 0)])
        return Draft(self.tokens[keep], parents.astype(np.int64), self.probs[keep], self.match_length)
