"""SuffixDecoding (Snowflake ArcticInference ``SuffixDecodingCache``) as a proposer for the replay and the index
timings: an optional peer, never a dependency of lookahead (see benchmarks/README.md to install it).

Default settings (max_tree_depth 64, max_spec_factor 1, min_token_prob 0.1), per request (no global cache of other
requests' outputs) unless a shared cache is passed in; chain or tree drafts. ``drafters()`` gives the makers of the
``suffixdecoding*`` methods of ``lookahead.bench.methods``, for ``resolve(..., external=drafters())``.
"""
from __future__ import annotations

import itertools

import numpy as np

from lookahead.bench.peers import ContextBuffer
from lookahead.index import Draft


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


def _per_request(setup):
    """A fresh SuffixDecoding, with a cache of its own, for each trace."""
    return lambda trace: SuffixDecoding()


def _shared(setup):
    """Proposers that share one global cache (made once per dataset): earlier traces' outputs help later ones."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = SuffixDecodingCache(64, max_cached_requests=-1)
    previous: list[SuffixDecoding] = []

    def make(trace):
        while previous:
            previous.pop().close()
        previous.append(SuffixDecoding(cache))
        return previous[-1]

    return make


def drafters() -> dict:
    """Method name -> ``make(setup)`` for the SuffixDecoding methods; empty when arctic_inference is missing."""
    if not suffix_decoding_available():
        return {}
    return {"suffixdecoding": _per_request, "suffixdecoding-tree": _per_request,
            "suffixdecoding-global": _shared, "suffixdecoding-global-tree": _shared}
