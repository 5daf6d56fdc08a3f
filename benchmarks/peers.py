"""Peer drafters beyond Hugging Face's, wrapped as proposers (``extend(tokens)``, ``propose(max_tokens)``) for the
replay in ``lookahead.bench.replay``. HF prompt lookup itself lives in ``lookahead.bench.peers``.

- ``VllmNgram``: vLLM v1 ``ngram_proposer`` rule (vllm/v1/spec_decode/ngram_proposer.py): the longest n-gram
  suffix (``min_n..max_n``) that occurs earlier, its earliest occurrence, the tokens after it (never past the
  end of the context); a full O(L) rescan of the context every step, as vLLM does. HF's rule is the same with
  ``min_n=1``, so both use ``prompt_lookup_kernel``.
- ``SuffixDecoding``: Snowflake ArcticInference ``SuffixDecodingCache`` (optional; see benchmarks/README.md),
  default settings (max_tree_depth 64, max_spec_factor 1, min_token_prob 0.1), per request (no global cache
  of other requests' outputs) unless a shared cache is passed in. Chain or tree drafts.
- ``HindsightOracle``: the longest prefix of the true continuation that appears anywhere in the context (prompt
  plus output so far): the best any single-copy drafter could do. Brute force; a reference, not a drafter.
- ``AnchoredOracle``: the ceiling of drafters that copy what followed an earlier occurrence of the last token (every
  n-gram and suffix drafter, ours and the peers'): among those occurrences (``"longest"``: only those of the longest
  recurring suffix), the one whose continuation matches the truth longest. A reference, not a drafter.
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lookahead.bench.peers import ContextBuffer  # noqa: E402
from lookahead.bench.peers import prompt_lookup_kernel as vllm_ngram_kernel  # noqa: E402
from lookahead.index import Draft  # noqa: E402


# ---------------------------------------------------------------------------------------------------------------
# vLLM n-gram rule
# ---------------------------------------------------------------------------------------------------------------

class VllmNgram:
    """vLLM v1 n-gram proposer rule, full rescan every step (``prompt_lookup_min``/``max`` = min_n/max_n)."""

    def __init__(self, min_n: int = 1, max_n: int = 4, max_tokens: int = 10):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._out = np.empty(max_tokens, dtype=np.int32)
        self._context = ContextBuffer(np.int32)

    def extend(self, tokens) -> None:
        self._context.extend(tokens)

    def propose(self, max_tokens: int) -> np.ndarray:
        if max_tokens > len(self._out):
            self._out = np.empty(max_tokens, dtype=np.int32)
        count = vllm_ngram_kernel(self._context.view(), self.min_n, self.max_n, max_tokens, self._out)
        return self._out[:count].copy()


# ---------------------------------------------------------------------------------------------------------------
# SuffixDecoding (ArcticInference), optional
# ---------------------------------------------------------------------------------------------------------------

def suffix_decoding_available() -> bool:
    """Whether ``arctic_inference.suffix_decoding`` imports (it is built from source, see README)."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except ImportError:
        return False
    return True


class SuffixDecoding:
    """ArcticInference ``SuffixDecodingCache`` as a proposer: the first ``extend`` starts the request.

    Pass one ``cache`` (``SuffixDecodingCache(max_cached_requests=-1)``) to several proposers to let outputs of
    earlier traces help later ones (SuffixDecoding's global cache); by default each proposer is on its own.
    """

    _ids = itertools.count()

    def __init__(self, cache=None, max_tree_depth: int = 64, max_spec_factor: float = 1.0,
                 min_token_prob: float = 0.1):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self._cache = cache if cache is not None else SuffixDecodingCache(max_tree_depth, max_cached_requests=0)
        self._depth = self._cache.max_tree_depth
        self._options = dict(max_spec_factor=max_spec_factor, min_token_prob=min_token_prob)
        self._request = next(self._ids)
        self._context = ContextBuffer(np.int32)

    def extend(self, tokens) -> None:
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        if len(self._context) == 0 and self._request not in self._cache.active_requests:
            self._cache.start_request(self._request, tokens)
        else:
            self._cache.add_active_response(self._request, tokens)
        self._context.extend(tokens)

    def _speculate(self, max_tokens: int, tree: bool):
        context = np.ascontiguousarray(self._context.view()[-self._depth:])
        return self._cache.speculate(self._request, context, max_spec_tokens=max_tokens, use_tree_spec=tree,
                                     **self._options)

    def propose(self, max_tokens: int) -> np.ndarray:
        return np.asarray(self._speculate(max_tokens, tree=False).token_ids, dtype=np.int64)

    def propose_tree(self, max_nodes: int) -> Draft:
        draft = self._speculate(max_nodes, tree=True)
        tokens = np.asarray(draft.token_ids, dtype=np.int64)
        return Draft(tokens, np.asarray(draft.parents, dtype=np.int64), np.ones(len(tokens)))

    def close(self) -> None:
        """End the request (its prompt is dropped; a shared cache keeps its output)."""
        if self._request in self._cache.active_requests:
            self._cache.stop_request(self._request)


# ---------------------------------------------------------------------------------------------------------------
# Hindsight oracle
# ---------------------------------------------------------------------------------------------------------------

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
