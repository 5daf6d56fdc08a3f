"""Peer drafters that need no extra dependency, as proposers (``extend(tokens)``, ``propose(max_tokens)``) for the
replay and the index timings: Hugging Face prompt lookup and vLLM's n-gram proposer.

HF's rule (transformers ``PromptLookupCandidateGenerator.get_candidates``): the longest suffix n-gram of the context,
``n <= max_matching_ngram_size``, that occurs earlier with at least one token after it; of its occurrences, the
leftmost; draft the ``num_output_tokens`` tokens that follow it (never past the end of the context). The same rule
with a minimum n is vLLM's n-gram proposer (vllm/v1/spec_decode/ngram_proposer.py, ``prompt_lookup_min`` /
``prompt_lookup_max``), so ``prompt_lookup_kernel`` serves both. SuffixDecoding (ArcticInference, an extra
dependency) is wrapped in ``benchmarks/suffix_decoding.py``.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def prompt_lookup_kernel(context, min_n, max_n, max_tokens, out):
    """Longest suffix n-gram (``min_n <= n <= max_n``) seen before, earliest occurrence; write the tokens after it
    into ``out`` and return their count (0 when no suffix of length ``min_n`` recurs; at most ``out``'s length).

    Like HF's and vLLM's searches it scans the whole context every call: O(L) a step, their cost.
    """
    total = context.shape[0]
    best_len, best_end = 0, -1
    for end in range(total - 1):  # an occurrence ending at `end` leaves at least one token after it
        length = 0
        while length < max_n and length <= end and context[end - length] == context[total - 1 - length]:
            length += 1
        if length > best_len:  # strict: the earliest occurrence among the longest
            best_len, best_end = length, end
    if best_len < min_n or best_len == 0:
        return 0
    count = min(max_tokens, total - 1 - best_end, out.shape[0])
    for i in range(count):
        out[i] = context[best_end + 1 + i]
    return count


class ContextBuffer:
    """Growable contiguous token buffer (amortized O(1) append); ``view()`` is the context so far."""

    def __init__(self, dtype=np.int32, capacity: int = 1024):
        self._data = np.empty(capacity, dtype=dtype)
        self._size = 0

    def extend(self, tokens) -> None:
        tokens = np.asarray(tokens).reshape(-1)
        need = self._size + len(tokens)
        if need > len(self._data):
            grown = np.empty(max(need, 2 * len(self._data)), dtype=self._data.dtype)
            grown[:self._size] = self._data[:self._size]
            self._data = grown
        self._data[self._size:need] = tokens
        self._size = need

    def view(self) -> np.ndarray:
        return self._data[:self._size]

    def __len__(self) -> int:
        return self._size


class PromptLookup:
    """HF prompt lookup with ``max_matching_ngram_size`` and ``num_output_tokens`` (transformers' defaults: 2, 10).

    ``exact=True`` calls transformers' ``get_candidates`` on the whole context every step (its real cost: ~15 ms a
    step at 25k tokens on a CPU core); ``exact=False`` computes the same drafts with ``prompt_lookup_kernel``.

    Example:
        >>> hf = PromptLookup(2, 10, exact=False)
        >>> hf.extend([5, 6, 7, 8, 5, 6])
        >>> hf.propose(3).tolist()
        [7, 8, 5]
    """

    def __init__(self, max_matching_ngram_size: int = 2, num_output_tokens: int = 10, exact: bool = True):
        if max_matching_ngram_size < 1 or num_output_tokens < 1:
            raise ValueError(f"max_matching_ngram_size and num_output_tokens must be >= 1, got "
                             f"{max_matching_ngram_size} and {num_output_tokens}")
        self._size, self._num_output_tokens, self._exact = max_matching_ngram_size, num_output_tokens, exact
        self._generator = None
        if exact:
            from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

            # max_length only stops drafting at the generation limit; the caller enforces its own limit.
            self._generator = PromptLookupCandidateGenerator(
                num_output_tokens=num_output_tokens, max_matching_ngram_size=max_matching_ngram_size,
                max_length=2**62)
        self._context = ContextBuffer(np.int64)
        self._out = np.empty(num_output_tokens, dtype=np.int64)
        _warm_up()

    def extend(self, tokens) -> None:
        self._context.extend(tokens)

    def propose(self, max_tokens: int) -> np.ndarray:
        n = len(self._context)
        if not self._exact:
            count = prompt_lookup_kernel(self._context.view(), 1, self._size, self._num_output_tokens, self._out)
            return self._out[:min(count, max_tokens)].copy()
        import torch

        input_ids = torch.from_numpy(self._context.view()).view(1, n)
        candidates, _ = self._generator.get_candidates(input_ids)
        return candidates[0, n:n + max_tokens].numpy()


class VllmNgram:
    """vLLM v1 n-gram proposer rule, full rescan every step (``prompt_lookup_min``/``max`` = min_n/max_n).

    Example:
        >>> vllm = VllmNgram(1, 4)
        >>> vllm.extend([5, 6, 7, 8, 5, 6])
        >>> vllm.propose(2).tolist()
        [7, 8]
    """

    def __init__(self, min_n: int = 1, max_n: int = 4, max_tokens: int = 10):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._out = np.empty(max_tokens, dtype=np.int32)
        self._context = ContextBuffer(np.int32)
        _warm_up()

    def extend(self, tokens) -> None:
        self._context.extend(tokens)

    def propose(self, max_tokens: int) -> np.ndarray:
        if max_tokens > len(self._out):
            self._out = np.empty(max_tokens, dtype=np.int32)
        count = prompt_lookup_kernel(self._context.view(), self.min_n, self.max_n, max_tokens, self._out)
        return self._out[:count].astype(np.int64)


_warm = []


def _warm_up() -> None:
    """Compile (or load from cache) the kernel once per process, on a non-empty input."""
    if not _warm:
        _warm.append(True)
        for dtype in (np.int32, np.int64):
            prompt_lookup_kernel(np.array([1, 2, 1], dtype), 1, 2, 2, np.empty(2, dtype))
