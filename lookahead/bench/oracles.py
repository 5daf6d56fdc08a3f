"""Hindsight references for the replay: what the best copying drafter could do, knowing the answer.

- ``HindsightOracle``: the longest prefix of the true continuation that appears anywhere in the context (prompt plus
  output so far): the best any single-copy drafter could do. Brute force; a reference, not a drafter.
- ``AnchoredOracle``: the ceiling of drafters that copy what followed an earlier occurrence of the last token (every
  n-gram and suffix drafter, ours and the peers'): among those occurrences (``longest=True``: only those of the
  longest recurring suffix), the one whose continuation matches the truth longest. A reference, not a drafter.

Both are proposers (``extend``, ``propose``) made per trace from the recorded output (``registry`` passes it).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .peers import ContextBuffer

@njit(cache=True)
def longest_copy_kernel(context, target):
    """Longest ``l`` such that ``target[:l]`` equals ``context[j:j + l]`` for some ``j`` (brute force)."""
    n, m = context.shape[0], target.shape[0]
    best = 0
    for j in range(n):
        length = 0
        while length < m and j + length < n and context[j + length] == target[length]:
            length += 1
        if length > best:
            best = length
            if best == m:
                break
    return best


class HindsightOracle:
    """Best single copy in hindsight: drafts the longest prefix of the true next tokens found in the context."""

    def __init__(self, output: np.ndarray):
        self._output = np.ascontiguousarray(output, dtype=np.int32)
        self._context = ContextBuffer(np.int32)
        self._prompt_len = -1

    def extend(self, tokens) -> None:
        if self._prompt_len < 0:
            self._prompt_len = len(np.asarray(tokens).reshape(-1))
        self._context.extend(tokens)

    def propose(self, max_tokens: int) -> np.ndarray:
        pos = len(self._context) - self._prompt_len
        target = self._output[pos:pos + max_tokens]
        return target[:self._copied(target)].astype(np.int64)

    def _copied(self, target: np.ndarray) -> int:
        """How much of the true continuation `target` the oracle copies."""
        return longest_copy_kernel(self._context.view(), target)


@njit(cache=True)
def anchored_copy_kernel(context, target, longest_only):
    """Longest prefix of ``target`` that follows an earlier occurrence of ``context[-1]`` (of its longest recurring
    suffix, up to 64 tokens, when ``longest_only``); a copy may run past the end of the context into itself."""
    n, m = context.shape[0], target.shape[0]
    best, best_match = 0, 0
    for i in range(n - 1):
        if context[i] != context[n - 1]:
            continue
        match = 1
        while match <= i and match < 64 and context[i - match] == context[n - 1 - match]:
            match += 1
        length = 0  # an overlapping copy reads its own draft past the end of the context (LZ77-style)
        while length < m and (context[i + 1 + length] if i + 1 + length < n
                              else target[i + 1 + length - n]) == target[length]:
            length += 1
        if longest_only and match > best_match:
            best, best_match = length, match
        elif (match == best_match or not longest_only) and length > best:
            best = length
    return best


class AnchoredOracle(HindsightOracle):
    """Best copy in hindsight among the continuations of earlier occurrences of the last token.

    ``longest=True`` considers only the occurrences of the longest recurring suffix (the best a drafter that ranks
    them could do); ``False`` every occurrence of the last token (the best any such copy could do).
    """

    def __init__(self, output: np.ndarray, longest: bool):
        super().__init__(output)
        self._longest = longest

    def _copied(self, target: np.ndarray) -> int:
        return anchored_copy_kernel(self._context.view(), target, self._longest)
