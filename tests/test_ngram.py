"""NgramIndex against a plain-Python reference."""
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lookahead.index import MAX_DRAFT, NgramIndex
from strategies import chunked, index_calls, replay_calls, token_lists


def naive_longest_match(tokens, min_ngram, max_ngram):
    """(k, ends): the longest suffix length k in [min_ngram, max_ngram] that occurs earlier, and the ends
    (exclusive) of its earlier occurrences; (0, []) when no such suffix recurs."""
    n = len(tokens)
    for k in range(min(max_ngram, n - 1), min_ngram - 1, -1):
        suffix = tokens[n - k:]
        ends = [e for e in range(k, n) if tokens[e - k:e] == suffix]
        if ends:
            return k, ends
    return 0, []


@given(token_lists(), st.integers(1, 5), st.integers(0, 4), st.integers(0, 12))
def test_proposal_continues_an_earlier_occurrence_of_the_longest_suffix(tokens, max_ngram, extra, max_tokens):
    """A proposal is what followed some earlier occurrence of the longest recurring suffix, as long as allowed."""
    min_ngram = max(1, max_ngram - extra)
    index = NgramIndex(max_ngram, min_ngram)
    index.extend(tokens)
    draft = index.propose(max_tokens).tolist()
    k, ends = naive_longest_match(tokens, min_ngram, max_ngram)
    if not ends or max_tokens == 0:
        assert draft == []
        return
    assert any(is_continuation(tokens, e, draft, max_tokens) for e in ends)
    assert index.match_length >= k


def is_continuation(tokens, end, draft, max_tokens):
    """draft is tokens[end:] (as much as allowed), extended past the end only by repeating a full period."""
    period = len(tokens) - end
    if len(draft) < min(max_tokens, period) or draft[:period] != tokens[end:end + len(draft)]:
        return False
    repeats = tokens[end - period:end] == tokens[end:] if end >= period else False
    return len(draft) <= period or (repeats and all(draft[i] == draft[i - period] for i in range(period, len(draft))))


@given(chunked(token_lists()), st.integers(1, 5), st.lists(st.integers(0, 12), min_size=8, max_size=8))
def test_interleaved_extend_and_propose_equal_a_fresh_index(chunks, max_ngram, asks):
    """Proposing between extends changes nothing: the state depends on the tokens alone."""
    incremental = NgramIndex(max_ngram)
    seen = []
    for chunk, ask in zip(chunks, asks * 2):
        incremental.extend(chunk)
        seen += chunk
        fresh = NgramIndex(max_ngram)
        fresh.extend(seen)
        assert incremental.propose(ask).tolist() == fresh.propose(ask).tolist()
        assert len(incremental) == len(fresh) == len(seen)


def test_follows_the_copy_in_progress_over_a_more_recent_short_match():
    """With max_ngram=2 the suffix (3, 4) last occurred before 7, but the copy under way says 5."""
    index = NgramIndex(max_ngram=2)
    index.extend([1, 2, 3, 4, 5, 9, 3, 4, 7, 9, 1, 2, 3, 4])
    assert index.propose(2).tolist() == [5, 9]
    assert index.match_length == 4


def test_periodic_text_is_extrapolated():
    """A repeating pattern keeps being proposed past the end of what was seen."""
    index = NgramIndex(max_ngram=3)
    index.extend([7, 1, 2, 1, 2, 1, 2])
    assert index.propose(5).tolist() == [1, 2, 1, 2, 1]


def test_rejoins_the_source_just_after_where_the_copy_broke_off():
    """After a divergence (6 instead of 5), the next match is looked for after the point where the copy broke."""
    index = NgramIndex(max_ngram=2)
    index.extend([4, 9, 3, 4, 5, 3, 4, 6, 8, 4])
    assert index.propose(1).tolist() == [6]


def test_a_fresh_match_copies_from_the_earliest_occurrence():
    """With no copy to rejoin nearby, the earliest occurrence wins (sources are read front to back)."""
    index = NgramIndex(max_ngram=2)
    index.extend([4, 5] + list(range(10, 80)) + [4, 6, 90, 4])
    assert index.propose(1).tolist() == [5]


@pytest.mark.parametrize("chunked_in", [False, True])
def test_a_fresh_match_copies_from_the_most_recent_occurrence_once_it_predicts_better(chunked_in):
    """(1, 2) was first followed by 9, then by 5 again and again (each time after a new token, so (1, 2) is the
    longest recurring suffix there and its first and most recent occurrences disagree): past a stretch with nothing
    to rejoin, a fresh match of (1, 2) copies the most recent occurrence; where the first one predicted better, the
    first one."""
    blocks = [token for c in range(100, 106) for token in (c, 1, 2, 5)]
    tokens = [1, 2, 9, 8] + blocks + list(range(200, 270)) + [1, 2]
    index = NgramIndex(max_ngram=4)
    if chunked_in:  # votes are counted token by token whatever the chunks
        for start in range(0, len(tokens), 7):
            index.extend(tokens[start:start + 7])
    else:
        index.extend(tokens)
    assert index.propose(1).tolist() == [5]
    assert index.copy().propose(1).tolist() == [5]
    first = NgramIndex(max_ngram=4)  # where they disagreed (first 9, recent 5 at 101), the first one was right
    first.extend([1, 2, 9, 8, 100, 1, 2, 5, 101, 1, 2, 9, 102, 1, 2, 5] + list(range(200, 270)) + [1, 2])
    assert first.propose(1).tolist() == [9]


def test_large_inputs_grow_buffers_and_keep_matching():
    """Past the initial capacity (table rebuilds included) the result still agrees with the reference."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 40, 5000).tolist()
    tokens += tokens[1234:1260]
    index = NgramIndex(max_ngram=4)
    for start in range(0, len(tokens), 700):
        index.extend(np.array(tokens[start:start + 700]))
    k, ends = naive_longest_match(tokens, 1, 4)
    assert k == 4
    draft = index.propose(10).tolist()
    assert any(is_continuation(tokens, e, draft, 10) for e in ends)
    assert draft == tokens[1260:1270]  # the 26-token copy in progress wins


def test_accepts_lists_arrays_and_tensors_and_resets():
    index = NgramIndex(max_ngram=3)
    index.extend([1, 2, 3])
    index.extend(np.array([1, 2], dtype=np.int64))
    index.extend(torch.tensor([3, 1]))
    assert len(index) == 7
    assert index.propose(3).dtype == np.int64
    index.reset()
    assert len(index) == 0 and index.propose(3).size == 0
    index.extend([])
    assert len(index) == 0


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"max_ngram": 0}, ValueError, "max_ngram must be >= 1, got 0"),
        ({"max_ngram": 65}, ValueError, "max_ngram must be <= 64, got 65"),
        ({"max_ngram": 10**9}, ValueError, "max_ngram must be <= 64, got 1000000000"),
        ({"max_ngram": 2.5}, TypeError, r"max_ngram must be an int, got float \(2.5\)"),
        ({"max_ngram": True}, TypeError, r"max_ngram must be an int, got bool \(True\)"),
        ({"min_ngram": 0}, ValueError, "min_ngram must be >= 1, got 0"),
        ({"min_ngram": "2"}, TypeError, r"min_ngram must be an int, got str \('2'\)"),
        ({"max_ngram": 2, "min_ngram": 3}, ValueError, "min_ngram must be <= max_ngram, got min_ngram=3 > max_ngram=2"),
    ],
)
def test_constructor_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        NgramIndex(**kwargs)


def test_settings_accept_numpy_integers():
    assert repr(NgramIndex(np.int64(3), np.int32(2))) == "NgramIndex(max_ngram=3, min_ngram=2, tokens=0)"


@pytest.mark.parametrize(
    "tokens, error, message",
    [
        ([1.5, 2.0], TypeError, "tokens must hold integer ids, got dtype float64"),
        (torch.tensor([1.0]), TypeError, "got a tensor of dtype torch.float32"),
        ([[1, 2], [3, 4]], ValueError, r"tokens must be one-dimensional, got shape \(2, 2\)"),
        ([1, -2], ValueError, r"tokens must hold ids in \[0, 2147483647\], got min -2"),
        (np.array([3, 2**63 + 5], dtype=np.uint64), ValueError, "got min 3 and max 9223372036854775813"),
    ],
)
def test_extend_errors(tokens, error, message):
    index = NgramIndex()
    with pytest.raises(error, match=message):
        index.extend(tokens)
    assert len(index) == 0


def test_propose_rejects_bad_budgets():
    with pytest.raises(ValueError, match="max_tokens must be >= 0, got -1"):
        NgramIndex().propose(-1)
    with pytest.raises(TypeError, match=r"max_tokens must be an int, got float \(2.5\)"):
        NgramIndex().propose(2.5)


def test_huge_budgets_are_clamped_to_max_draft():
    """Periodic text extrapolates without end: a budget of 10**9 gets MAX_DRAFT tokens, not gigabytes."""
    index = NgramIndex()
    index.extend([7, 1, 2, 1, 2, 1, 2])
    assert index.propose(10**9).tolist() == [1, 2] * (MAX_DRAFT // 2)
    assert index.propose(np.int64(3)).tolist() == [1, 2, 1]


@given(index_calls(), st.integers(1, 5))
def test_a_copy_behaves_exactly_like_the_original(calls, max_ngram):
    """After copy(), the same calls give the same drafts on the copy and on the original, and the copy's calls
    leave the original as it was (buffer growth included)."""
    base, rest = calls
    original = NgramIndex(max_ngram)
    for tokens in base:
        original.extend(tokens)
    twin = original.copy()
    on_twin = replay_calls(twin, rest)
    fresh = NgramIndex(max_ngram)
    fresh.extend([t for tokens in base for t in tokens])
    assert replay_calls(original.copy(), [("chain", 16)]) == replay_calls(fresh, [("chain", 16)])
    assert replay_calls(original, rest) == on_twin
