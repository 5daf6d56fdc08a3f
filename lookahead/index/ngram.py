"""NgramIndex: incremental n-gram lookup over the tokens seen so far (prompt, output, documents)."""
from __future__ import annotations

import functools

import numpy as np

from . import _kernels as K
from ._tokens import as_token_array, range_error, table_size as _table_size

_MIN_CAPACITY = 1024


class NgramIndex:
    """Proposes draft tokens by copying what followed an earlier occurrence of the longest recent n-gram.

    Rule: let ``k`` be the length of the longest suffix of the held tokens, ``min_ngram <= k <= max_ngram``, that
    also occurs earlier. Which earlier occurrence to copy from:

    1. the one that agrees with the longest stretch of recent tokens, i.e. the copy already in progress;
    2. when a copy broke off (the text diverged from its source), the first occurrence within 64 tokens after the
       point where it broke: text that leaves its source (a skipped phrase, an edited line) tends to rejoin it a
       little further on;
    3. otherwise the earliest occurrence: sources are read front to back (summaries follow the article's order).

    Following the copy in progress keeps long copies on track where a short n-gram alone would jump to an unrelated
    occurrence (the peers re-search every step and take the leftmost or earliest match).

    ``extend`` costs O(max_ngram) per token (amortized, hash table growth included); ``propose`` costs
    O(max_tokens) whatever the number of tokens held. Memory is O(tokens held * max_ngram).

    Args:
        max_ngram: longest suffix to match (>= 1).
        min_ngram: shortest suffix to match (1 <= min_ngram <= max_ngram).

    Example:
        >>> idx = NgramIndex(max_ngram=3)
        >>> idx.extend([5, 6, 7, 8, 5, 6])
        >>> idx.propose(2).tolist()
        [7, 8]
    """

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1):
        if not isinstance(max_ngram, (int, np.integer)) or isinstance(max_ngram, bool) or max_ngram < 1:
            raise ValueError(f"max_ngram must be an integer >= 1, got {max_ngram!r}")
        if not isinstance(min_ngram, (int, np.integer)) or isinstance(min_ngram, bool) or min_ngram < 1:
            raise ValueError(f"min_ngram must be an integer >= 1, got {min_ngram!r}")
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram must be <= max_ngram, got min_ngram={min_ngram} > max_ngram={max_ngram}")
        self.max_ngram = int(max_ngram)
        self.min_ngram = int(min_ngram)
        self._hist = np.empty(_MIN_CAPACITY, dtype=np.int32)
        self._table = np.zeros((_table_size(_MIN_CAPACITY * 2), 2), dtype=np.uint64)
        self._state = np.array([0, -1, 0, 0, -1], dtype=np.int64)
        self._out = np.empty(64, dtype=np.int64)
        _warm_up()

    def __len__(self) -> int:
        return int(self._state[K.N])

    def __repr__(self) -> str:
        return f"NgramIndex(max_ngram={self.max_ngram}, min_ngram={self.min_ngram}, tokens={len(self)})"

    @property
    def match_length(self) -> int:
        """Length of the current match behind the next proposal (0 when nothing matches); may exceed max_ngram."""
        return int(self._state[K.RUN]) if self._state[K.PTR] >= 0 else 0

    def reset(self) -> None:
        """Forget every token held."""
        self._table[:] = 0
        self._state[:] = (0, -1, 0, 0, -1)

    def extend(self, tokens) -> None:
        """Append token ids (a list, a numpy array or a 1-D tensor of non-negative integers)."""
        new = as_token_array(tokens)
        if new.shape[0] == 0:
            return
        self._reserve(new.shape[0])
        if K.ngram_extend(new, self._hist, self._table, self._state, self.max_ngram, self.min_ngram) < 0:
            raise range_error(new)

    def propose(self, max_tokens: int) -> np.ndarray:
        """Return up to ``max_tokens`` draft tokens (int64, possibly empty) continuing the held tokens."""
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if max_tokens > self._out.shape[0]:
            self._out = np.empty(max_tokens, dtype=np.int64)
        m = K.ngram_propose(self._hist, self._state, max_tokens, self._out)
        return self._out[:m].copy()

    def _reserve(self, extra: int) -> None:
        n = len(self)
        if n + extra > self._hist.shape[0]:
            grown = np.empty(max(2 * self._hist.shape[0], n + extra), dtype=np.int32)
            grown[:n] = self._hist[:n]
            self._hist = grown
        worst = int(self._state[K.USED]) + (extra + 1) * self.max_ngram
        if 2 * worst > self._table.shape[0]:
            self._table = np.zeros((_table_size(2 * worst), 2), dtype=np.uint64)
            self._state[K.USED] = K.ngram_rebuild(self._hist, n, self._table, self.max_ngram)


@functools.cache
def _warm_up() -> None:
    """Compile (or load from cache) the kernels once per process, on a non-empty input."""
    hist = np.zeros(16, np.int32)
    table = np.zeros((1024, 2), np.uint64)
    state = np.array([0, -1, 0, 0, -1], np.int64)
    for dtype in (np.int64, np.int32):
        state[:] = (0, -1, 0, 0, -1)
        table[:] = 0
        K.ngram_extend(np.array([1, 2, 1, 2], dtype), hist, table, state, 4, 1)
    K.ngram_propose(hist, state, 2, np.empty(2, np.int64))
    K.ngram_rebuild(hist, 4, table, 4)
