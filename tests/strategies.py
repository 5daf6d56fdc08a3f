"""Hypothesis strategies shared by the index tests."""
from hypothesis import strategies as st


def token_lists(max_size: int = 200, vocab: int = 6) -> st.SearchStrategy:
    """Short token sequences over a tiny vocabulary, so that n-grams recur often."""
    return st.lists(st.integers(min_value=0, max_value=vocab - 1), max_size=max_size)


def chunked(tokens_strategy: st.SearchStrategy) -> st.SearchStrategy:
    """A token list cut into consecutive chunks, to feed `extend` in pieces."""
    return tokens_strategy.flatmap(
        lambda toks: st.lists(st.integers(0, len(toks)), max_size=8).map(
            lambda cuts: [toks[a:b] for a, b in zip([0] + sorted(cuts), sorted(cuts) + [len(toks)])]
        )
    )
