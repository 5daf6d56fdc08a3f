"""Token Recycling: drafts from what the target itself predicted after each token (Luo et al., ACL 2025), alone or
filling what a suffix tree leaves of the budget.

Every verification forward computes the target's distribution after the root and every draft node; greedy keeps only
the argmax. `Recycled` keeps the top-k of each: M[token] -> the k tokens the target predicted after it (ranked by a
decayed sum of their probabilities), and a row keyed by the last two tokens (the latest prediction there), updated
from every verified column, rejected nodes included: the tree's nodes are the model's own likely continuations, so
the tokens the next steps draft from are mostly this step's nodes, and their rows are refreshed in the current
context. No draft model, no training; a few MB per model and vocabulary, shared by the rows of a call and, through a
`lookahead.Memory`, by later calls.

`RecycleIndex` is a row's index over it (the row's last two tokens), with a `SuffixIndex` for
``lookup="suffix+recycle"``: the suffix tree's nodes are kept while their path probability is at least ``keep``
(copies, where the text repeats itself), the rest of the budget is filled best-first from M. Each node's estimate
(a copy's conditional path probability, a recycled node's stored probability) is calibrated online per source
against what the target chose, and the tree is ordered by the calibrated path values, so that a sizing policy that
keeps a prefix keeps the nodes most likely accepted whatever their source.
"""
from __future__ import annotations

import numpy as np

from .._checks import check_float, check_int
from ..runtime.jit import kernels
from . import _recycle_kernels
from ._tokens import as_token_array, draft_budget
from .draft import Draft
from .suffix import SuffixIndex

K = _recycle_kernels  # its constants; its kernels are bound per call (`kernels`)


class Recycled:
    """M: the target's latest top-k predictions after each token (and each pair of tokens), shared by rows and calls.

    Memory: vocab x k x 8 bytes (M's ids and scores) plus pair_slots x (k x 8 + 16) bytes (two-token rows):
    3 + 2.5 MiB for a 49,152-token vocabulary at the defaults.

    Args:
        vocab: the model's vocabulary (ids >= vocab are never stored nor drafted).
        k: predictions kept per token, in [1, 64].
        pair_slots: slots of the two-token table, a power of two in [1024, 2**24].
        decay: weight of earlier predictions at each update, in [0, 1) (0: the latest prediction only).

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range, named.

    Example:
        >>> m = Recycled(vocab=10, k=2)
        >>> m.update([3], [-1], [[5, 6]], [[0.7, 0.2]])
        >>> m.candidates(3)[0].tolist()
        [5, 6]
    """

    def __init__(self, vocab: int, k: int = 8, pair_slots: int = 1 << 15, decay: float = 0.7):
        self.vocab = check_int("vocab", vocab, 1, 2**31 - 1)
        self.k = check_int("k", k, 1, 64)
        check_int("pair_slots", pair_slots, 1024, 1 << 24)
        if pair_slots & (pair_slots - 1):
            raise ValueError(f"pair_slots must be a power of two, got {pair_slots}")
        self.decay = check_float("decay", decay, 0.0, 1.0)
        if self.decay >= 1.0:
            raise ValueError(f"decay must be < 1, got {decay:g}")
        self.ids = np.full((vocab, k), -1, dtype=np.int32)
        self.score = np.zeros((vocab, k), dtype=np.float32)
        self.keys = np.full(pair_slots, -1, dtype=np.int64)
        self.pair = np.full((pair_slots, k), -1, dtype=np.int32)
        self.pprob = np.zeros((pair_slots, k), dtype=np.float32)
        self.stamp = np.zeros(pair_slots, dtype=np.int64)
        self.calib = np.zeros((3, len(K.EDGES), 2))
        self.meta = np.array([self.decay, 0.998, 0.0, 4.0])

    def __repr__(self) -> str:
        return f"Recycled(vocab={self.vocab}, k={self.k}, pair_slots={len(self.keys)}, decay={self.decay})"

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays) + self.calib.nbytes + self.meta.nbytes

    @property
    def arrays(self) -> tuple:
        """(ids, score, keys, pair, pprob, stamp, meta): what the kernels take, in order."""
        return self.ids, self.score, self.keys, self.pair, self.pprob, self.stamp, self.meta

    def update(self, tokens, prevs, top_ids, top_probs) -> None:
        """Learn that after tokens[c] (preceded by prevs[c], -1: unknown) the target predicted top_ids[c] [n, <= k]
        with probabilities top_probs[c].

        Raises:
            ValueError: arrays of mismatched lengths.
        """
        kern = kernels(_recycle_kernels)
        tokens, prevs = as_token_array(tokens), as_token_array(prevs)
        top_ids = np.ascontiguousarray(np.asarray(top_ids, dtype=np.int64))
        top_probs = np.ascontiguousarray(np.asarray(top_probs, dtype=np.float32))
        if len(prevs) != len(tokens) or top_ids.shape != top_probs.shape or top_ids.shape[:1] != tokens.shape:
            raise ValueError(f"update needs tokens [n], prevs [n] and top_ids, top_probs [n, k] alike, got "
                             f"{len(tokens)}, {len(prevs)}, {top_ids.shape}, {top_probs.shape}")
        kern.update(*self.arrays, tokens, prevs, top_ids, top_probs, len(tokens))

    def candidates(self, token: int, prev: int = -1) -> tuple:
        """(ids, probabilities) predicted after `token` (preceded by `prev`), best first, at most k."""
        kern = kernels(_recycle_kernels)
        ids, probs = np.empty(self.k, dtype=np.int64), np.empty(self.k)
        n = kern.candidates(self.ids, self.score, self.keys, self.pair, self.pprob, self.meta, int(prev), int(token),
                         ids, probs)
        return ids[:n], probs[:n]

    def state(self) -> dict:
        """Its arrays by name (what `Memory.save` writes)."""
        return {"ids": self.ids, "score": self.score, "keys": self.keys, "pair": self.pair, "pprob": self.pprob,
                "stamp": self.stamp, "calib": self.calib, "meta": self.meta}

    @classmethod
    def from_state(cls, state: dict) -> "Recycled":
        """The `Recycled` whose arrays are `state`'s (as `state()` gave them)."""
        vocab, k = state["ids"].shape
        out = cls(int(vocab), int(k), int(len(state["keys"])), float(state["meta"][K.DECAY]))
        for name, value in state.items():
            getattr(out, name)[...] = value
        return out


class RecycleIndex:
    """A row's drafts from a shared `Recycled`, alone or merged with a `SuffixIndex` (see the module docstring).

    Args:
        recycled: the call's `Recycled`.
        suffix: a `SuffixIndex` over the row's documents and prompt (``lookup="suffix+recycle"``), or None.
        keep: smallest path probability of a suffix node kept before M fills the budget, in [0, 1].

    Example:
        >>> m = Recycled(vocab=10); m.update([4, 5], [-1, 4], [[5], [6]], [[0.9], [0.8]])
        >>> row = RecycleIndex(m); row.extend([4])
        >>> row.propose(2).tolist()
        [5, 6]
    """

    def __init__(self, recycled: Recycled, suffix: SuffixIndex | None = None, keep: float = 0.01):
        if not isinstance(recycled, Recycled):
            raise TypeError(f"recycled must be a lookahead.index.Recycled, got {type(recycled).__name__}")
        if suffix is not None and not isinstance(suffix, SuffixIndex):
            raise TypeError(f"suffix must be a SuffixIndex or None, got {type(suffix).__name__}")
        self.recycled, self.suffix = recycled, suffix
        self.keep = check_float("keep", keep, 0.0, 1.0)
        # the row's second-last and last tokens, the nodes of its latest draft (learned from at the next extend: its
        # gained tokens), the tokens held; an array, which the fused step's kernels move on in place
        self._state = np.array([-1, -1, 0, 0], dtype=np.int64)
        self._budget = 0
        self._scratch(32)

    def __len__(self) -> int:
        return int(self._state[K.HELD])

    @property
    def _prev(self) -> int:
        return int(self._state[K.PREV])

    @property
    def _last(self) -> int:
        return int(self._state[K.LAST])

    def __repr__(self) -> str:
        return f"RecycleIndex({self.recycled!r}, suffix={self.suffix!r}, keep={self.keep})"

    @property
    def match_length(self) -> int:
        """The suffix index's match length where it has one; else 1 where M knows what follows the last token, 0
        where it does not (what the sizing policies bucket their acceptance by)."""
        m = self.suffix.match_length if self.suffix is not None else 0
        if m > 0:
            return m
        return int(0 <= self._last < self.recycled.vocab and self.recycled.ids[self._last, 0] >= 0)

    def extend(self, tokens) -> None:
        """Append token ids; those right after a proposal are what the target chose, which the calibration learns.

        Raises:
            TypeError, ValueError: as `SuffixIndex.extend`.
        """
        kern = kernels(_recycle_kernels)
        new = as_token_array(tokens)
        if self.suffix is not None:
            self.suffix.extend(new)
        elif new.size and (new.min() < 0 or new.max() > np.iinfo(np.int32).max):
            raise ValueError(f"tokens must hold ids in [0, {np.iinfo(np.int32).max}], got min {new.min()} and "
                             f"max {new.max()}")
        if new.size:
            kern.advance(self.recycled.calib, self.recycled.meta, self._out, self._est, self._state, new, len(new))

    def propose(self, max_tokens: int) -> np.ndarray:
        """A chain of at most ``max_tokens`` tokens: the best path of the merged tree, then M's best candidates."""
        kern = kernels(_recycle_kernels)
        budget = self._ask("max_tokens", max_tokens)
        base = self._base(budget)
        m = kern.merged_chain(*self._m(), self._prev, self._last, *base, self.keep, budget, *self._work, self._out,
                           self._est[0])
        self._state[K.PENDING] = m
        return self._out[0, :m].copy()

    def propose_tree(self, max_nodes: int) -> Draft:
        """A draft tree of at most ``max_nodes`` nodes, best first by calibrated value (`Draft.probs`)."""
        kern = kernels(_recycle_kernels)
        budget = self._ask("max_nodes", max_nodes)
        base = self._base(budget)
        n = kern.merged_tree(*self._m(), self._prev, self._last, *base, self.keep, budget, *self._work)
        ints, floats = self._work[0], self._work[1]
        self._out[:, :n], self._est[:, :n] = ints[:3, :n], floats[:2, :n]
        self._state[K.PENDING] = n
        return Draft(ints[0, :n].copy(), ints[1, :n].copy(), floats[1, :n].copy(), self.match_length)

    def observe(self, tokens: np.ndarray, parents: np.ndarray, size: int, top_ids: np.ndarray,
                top_probs: np.ndarray) -> None:
        """Learn from a verified step of this row: its draft (tokens, parents [>= size]) after its last token, and
        the target's top-k after each column (top_ids, top_probs [>= size + 1, k]: the root, then each node)."""
        kern = kernels(_recycle_kernels)
        kern.update_step(*self.recycled.arrays, self._prev, self._last, tokens, parents, size, top_ids, top_probs)

    def reserve(self, extra: int) -> None:
        """Room for `extra` more tokens in the suffix index (the fused step asks before its kernel appends)."""
        if self.suffix is not None:
            self.suffix.reserve(extra)

    def kernel_state(self, budget: int) -> tuple:
        """What the fused step's kernels take of this index, sized for trees of up to `budget` nodes: (the suffix
        index's arrays, its scratch, this index's own work arrays and state); see `SuffixIndex.kernel_state`."""
        self._scratch(budget)
        return (*self.suffix.kernel_state(budget), self._row)

    def _m(self) -> tuple:
        r = self.recycled
        return r.ids, r.score, r.keys, r.pair, r.pprob, r.calib, r.meta

    def _ask(self, name: str, value) -> int:
        if type(value) is not int or value < 0 or value > self._budget:
            value = draft_budget(name, value)
            self._scratch(value)
        return value

    def _base(self, budget: int) -> tuple:
        """The suffix tree's (tokens, parents, probs, count) to merge with, nothing without one."""
        if self.suffix is None or budget == 0:
            return _NONE, _NONE, _NO_PROBS, 0
        tree = self.suffix.propose_tree(budget)
        return tree.tokens, tree.parents, tree.probs, len(tree)

    def _scratch(self, budget: int) -> None:
        """Buffers of proposals of up to `budget` nodes (`_recycle_kernels.merged_tree`)."""
        if budget <= self._budget:
            return
        budget = max(budget, 32)
        k = self.recycled.k
        rows = (budget + 1) * k  # candidate rows: each node is expanded once, into at most k candidates
        self._work = (np.zeros((6, budget + 1), dtype=np.int64), np.zeros((3, budget + 1)),
                      np.zeros((rows, 2), dtype=np.int64), np.zeros((rows, 2)), np.zeros(rows, dtype=np.int64),
                      np.zeros(k, dtype=np.int64), np.zeros(k))
        self._out, self._est = np.zeros((3, budget), dtype=np.int64), np.zeros((2, budget))
        self._budget = budget
        self._row = (*self._work, self._out, self._est, self._state)  # what the fused step's kernels take


_NONE, _NO_PROBS = np.empty(0, dtype=np.int64), np.empty(0)
