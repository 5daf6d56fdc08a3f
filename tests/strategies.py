"""Hypothesis strategies shared by the index tests."""
import numpy as np
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


@st.composite
def edited_copies(draw, max_size: int = 160, vocab: int = 50) -> list:
    """Random tokens followed by copies of earlier stretches with point edits, like code edits or extractive
    summaries: long matches that break and resume."""
    tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=max_size // 4))
    for _ in range(draw(st.integers(0, 4))):
        start = draw(st.integers(0, len(tokens) - 1))
        piece = tokens[start:start + draw(st.integers(1, max_size // 4))]
        edits = draw(st.lists(st.tuples(st.integers(0, len(piece) - 1), st.integers(0, vocab - 1)), max_size=2))
        for where, token in edits:
            piece[where] = token
        tokens = (tokens + piece)[:max_size]
    return tokens


def any_tokens(max_size: int = 160) -> st.SearchStrategy:
    """Tiny-vocabulary sequences (many short matches, runs) or edited copies over a larger one (long matches)."""
    return st.one_of(token_lists(max_size, vocab=3), token_lists(max_size, vocab=8), edited_copies(max_size))


@st.composite
def index_calls(draw, max_calls: int = 12) -> tuple:
    """(base, calls): token lists an index is built from, then calls to replay on it and on a copy of it: extends
    (now and then one long enough to grow the buffers), request boundaries ("mark"), chain and tree proposals."""
    base = draw(chunked(any_tokens()))
    long_run = st.integers(0, 2**32 - 1).map(
        lambda seed: ("extend", np.random.default_rng(seed).integers(0, 60, 1500).tolist()))
    call = st.one_of(any_tokens(40).map(lambda tokens: ("extend", tokens)), long_run, st.just(("mark",)),
                     st.integers(0, 40).map(lambda k: ("chain", k)), st.integers(0, 40).map(lambda k: ("tree", k)))
    return base, draw(st.lists(call, max_size=max_calls))


@st.composite
def memory_calls(draw, max_calls: int = 10) -> list:
    """Calls on a Memory: ("add", tokens) and ("row", lookup, documents, source), a request drafting from it."""
    add = any_tokens(60).map(lambda tokens: ("add", tokens))
    row = st.tuples(st.just("row"), st.sampled_from(["ngram", "suffix"]), st.lists(any_tokens(30), max_size=2),
                    any_tokens(40))
    return draw(st.lists(st.one_of(add, row), max_size=max_calls))


def replay_calls(index, calls) -> list:
    """What the index answers to each call: ("extend", tokens), ("mark",), ("chain", k) or ("tree", k); an index
    without begin_request or propose_tree (the n-gram index) skips those calls."""
    seen = []
    for name, *args in calls:
        if name == "extend":
            index.extend(args[0])
        elif name == "mark" and hasattr(index, "begin_request"):
            index.begin_request()
        elif name == "chain":
            seen.append(index.propose(args[0]).tolist())
        elif name == "tree" and hasattr(index, "propose_tree"):
            draft = index.propose_tree(args[0])
            seen.append((draft.tokens.tolist(), draft.parents.tolist(), draft.probs.tolist(), draft.match_length))
        seen.append((len(index), index.match_length))
    return seen


@st.composite
def recycle_updates(draw, vocab: int = 12, k: int = 4, max_steps: int = 40) -> list:
    """Verified columns to teach a `Recycled`: (token, prev, ids, probs), tokens over a tiny vocabulary (rows and
    two-token rows recur, slots fill and are evicted) with ids now and then outside it, and probabilities that are
    multiples of 1/16 (exact in float32, so sums and decays agree with a float64 reference)."""
    column = st.tuples(st.integers(-1, vocab), st.integers(-1, vocab - 1),
                       st.lists(st.integers(-1, vocab + 1), min_size=1, max_size=k, unique=True),
                       st.integers(0, 2**32 - 1))

    def probs(col):
        token, prev, ids, seed = col
        p = np.sort(np.random.default_rng(seed).integers(0, 17, len(ids)))[::-1] / 16
        return token, prev, ids, p.tolist()

    return draw(st.lists(column.map(probs), max_size=max_steps))
