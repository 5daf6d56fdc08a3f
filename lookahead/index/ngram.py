"""NgramIndex: incremental n-gram lookup over the tokens seen so far (prompt, output, documents)."""
from __future__ import annotations


import numpy as np

from .._checks import check_int
from ..runtime.jit import entry, kernels
from . import _kernels
from ._tokens import as_token_array, draft_budget, grown, range_error, table_size as _table_size

K = _kernels  # its constants; its kernels are bound per call (`kernels`)


_MIN_CAPACITY = 1024
# Longest n-gram indexed. A match longer than this is still followed (the copy in progress goes on growing past
# max_ngram); longer n-grams would only choose among occurrences that agree on 64 tokens, at 48 bytes per token
# per length.
MAX_NGRAM = 64
DEFAULT_MAX_NGRAM = 4  # every entry point's default max_ngram (`decode.settings.OPTIONS` reads it from here)


class NgramIndex:
    """Proposes draft tokens by copying what followed an earlier occurrence of the longest recent n-gram.

    Rule: let ``k`` be the length of the longest suffix of the held tokens, ``min_ngram <= k <= max_ngram``, that
    also occurs earlier. Which earlier occurrence to copy from:

    1. the one that agrees with the longest stretch of recent tokens, i.e. the copy already in progress;
    2. when a copy broke off (the text diverged from its source), the first occurrence within 64 tokens after the
       point where it broke: text that leaves its source (a skipped phrase, an edited line) tends to rejoin it a
       little further on;
    3. otherwise the earliest occurrence: sources are read front to back (summaries follow the article's order);
       or the most recent one, once it has predicted the text clearly better (5:3 in decayed hits, counted where
       the two disagree): code and agents reuse what they just wrote or read (the suffix index's rule).

    Following the copy in progress keeps long copies on track where a short n-gram alone would jump to an unrelated
    occurrence (the peers re-search every step and take the leftmost or earliest match).

    ``extend`` costs O(max_ngram) per token (amortized, hash table growth included); ``propose`` costs
    O(max_tokens) whatever the number of tokens held. Memory is O(tokens held * max_ngram).

    Args:
        max_ngram: longest suffix to match, in [1, 64] (a longer match is still followed once found).
        min_ngram: shortest suffix to match (1 <= min_ngram <= max_ngram).

    Raises:
        TypeError: max_ngram or min_ngram is not an int.
        ValueError: either is out of range, or min_ngram > max_ngram.

    Example:
        >>> idx = NgramIndex(max_ngram=3)
        >>> idx.extend([5, 6, 7, 8, 5, 6])
        >>> idx.propose(2).tolist()
        [7, 8]
    """

    def __init__(self, max_ngram: int = DEFAULT_MAX_NGRAM, min_ngram: int = 1):
        self.max_ngram = check_int("max_ngram", max_ngram, 1, MAX_NGRAM)
        self.min_ngram = check_int("min_ngram", min_ngram, 1)
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"min_ngram must be <= max_ngram, got min_ngram={min_ngram} > max_ngram={max_ngram}")
        self._hist = np.empty(_MIN_CAPACITY, dtype=np.int32)
        self._table = _empty_table(_table_size(_MIN_CAPACITY * 2))
        self._state = K.STATE.copy()
        self._out = np.empty(64, dtype=np.int64)

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
        self._state[:] = K.STATE

    def extend(self, tokens) -> None:
        """Append token ids (a list, a numpy array or a 1-D tensor of non-negative integers).

        Raises:
            TypeError: the ids are not integers.
            ValueError: not one-dimensional, or an id is negative or above 2**31 - 1 (nothing is appended).
        """
        kern = kernels(_kernels)
        new = as_token_array(tokens)
        if new.shape[0] == 0:
            return
        args = (new, self._hist, self._table, self._state, self.max_ngram, self.min_ngram)
        got = entry(kern.ngram_extend, new.dtype, args)(*args)  # one typing per dtype of the ids (`entry`)
        if got == K.FULL:  # the kernel wrote nothing: grow the arrays by its own rule (`K.fits`), then append
            self.reserve(new.shape[0])
            got = kern.ngram_extend(new, self._hist, self._table, self._state, self.max_ngram, self.min_ngram)
        if got < 0:
            raise range_error(new)

    def propose(self, max_tokens: int) -> np.ndarray:
        """Return up to ``max_tokens`` draft tokens (int64, possibly empty) continuing the held tokens.

        At most 4096 (``MAX_DRAFT``) whatever ``max_tokens`` asks: periodic text extrapolates without end.

        Raises:
            TypeError: ``max_tokens`` is not an int.
            ValueError: ``max_tokens`` is negative.
        """
        kern = kernels(_kernels)
        if type(max_tokens) is not int or max_tokens < 0 or max_tokens > self._out.shape[0]:
            max_tokens = draft_budget("max_tokens", max_tokens)
            if max_tokens > self._out.shape[0]:
                self._out = np.empty(max_tokens, dtype=np.int64)
        args = (self._hist, self._state, max_tokens, self._out)
        m = entry(kern.ngram_propose, None, args)(*args)
        return self._out[:m].copy()

    def copy(self) -> "NgramIndex":
        """An independent index holding the same tokens, that proposes exactly what this one would from here on
        (a numpy copy of the state: cheaper than indexing the tokens again).

        >>> base = NgramIndex(); base.extend([1, 2, 3]); row = base.copy(); row.extend([1, 2])
        >>> row.propose(1).tolist(), len(base)
        ([3], 3)
        """
        twin = NgramIndex.__new__(NgramIndex)
        twin.max_ngram, twin.min_ngram = self.max_ngram, self.min_ngram
        twin._hist = grown(self._hist, self._hist.shape[0], len(self))
        twin._table, twin._state = self._table.copy(), self._state.copy()
        twin._out = np.empty_like(self._out)
        return twin

    def kernel_state(self, budget: int = 0) -> tuple:
        """The arrays the fused step's kernels read and write, in their order: (hist, table, state). They stay this
        index's until `reserve` or `extend` grows them (then ask again); `budget` is unused (the drafts go to the
        step's own buffers)."""
        return self._hist, self._table, self._state

    def reserve(self, extra: int) -> None:
        """Grow the arrays to take `extra` more tokens (`K.fits`): hist to n + extra at least, the table to twice the
        slots they may use."""
        kern = kernels(_kernels)
        n = len(self)
        if n + extra > self._hist.shape[0]:
            self._hist = grown(self._hist, max(2 * self._hist.shape[0], n + extra), n)
        worst = int(self._state[K.USED]) + (extra + 1) * self.max_ngram
        if 2 * worst > self._table.shape[0]:
            self._table = _empty_table(_table_size(2 * worst))
            self._state[K.USED] = kern.ngram_rebuild(self._hist, n, self._table, self.max_ngram)


def _empty_table(slots: int) -> np.ndarray:
    """An empty hash table of `slots` slots (a power of two), in the kernels' layout."""
    return np.zeros((slots, K.SLOT), dtype=np.uint64)
