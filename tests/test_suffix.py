"""SuffixIndex against a plain-Python reference."""
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lookahead.index import MAX_DRAFT, SuffixIndex
from strategies import any_tokens, chunked


def naive_longest_suffix(tokens):
    """(k, ends): the longest k >= 1 such that tokens[-k:] also occurs earlier, and the ends (exclusive) of its
    earlier occurrences; (0, []) when not even the last token occurred before."""
    n, best = len(tokens), (0, [])
    for k in range(1, n):
        ends = [e for e in range(k, n) if tokens[e - k:e] == tokens[n - k:]]
        if not ends:
            break  # a longer suffix cannot recur if this one does not
        best = (k, ends)
    return best


def follows_some_suffix(tokens, text, token):
    """Whether `token` followed, somewhere in `tokens`, an occurrence of the last token of `text`."""
    return any(tokens[e - 1] == text[-1] and tokens[e] == token for e in range(1, len(tokens)))


def continues_an_occurrence(tokens, path, ends):
    """Whether `path` is what followed an earlier occurrence (end in `ends`) of the longest recurring suffix;
    past the end of the tokens (a copy that caught up with the text), each further token must have followed an
    occurrence of a suffix of tokens + path so far."""
    n = len(tokens)
    if not path:
        return True
    for e in ends:
        d = min(len(path), n - e)
        if path[:d] == tokens[e:e + d] and all(
                follows_some_suffix(tokens, tokens + path[:i], path[i]) for i in range(d, len(path))):
            return True
    return False


def is_frequent(tokens, token, top=32):
    """Whether `token` is among the `top` most frequent of `tokens` (ties count for it)."""
    counts = {t: tokens.count(t) for t in set(tokens)}
    return token in counts and sum(c > counts[token] for c in counts.values()) < top


def copies_or_guesses(tokens, path, ends):
    """A draft path of the default index: a copy (`continues_an_occurrence`), or a guess, a frequent token,
    followed by a copy of what followed one of its occurrences."""
    if continues_an_occurrence(tokens, path, ends):
        return True
    guess_ends = [e for e in range(1, len(tokens)) if tokens[e - 1] == path[0]]
    return is_frequent(tokens, path[0]) and continues_an_occurrence(tokens, path[1:], guess_ends)


def tree_of(index, budget):
    """(tokens, parents) of the index's draft tree."""
    draft = index.propose_tree(budget)
    return draft.tokens, draft.parents


def root_paths(tokens, parents):
    """Token path from the root to every node of a draft tree."""
    paths = []
    for i in range(len(tokens)):
        paths.append((paths[parents[i]] if parents[i] >= 0 else []) + [int(tokens[i])])
    return paths


def first_path(tokens, parents):
    """The path that follows each node's first child."""
    path, node = [], -1
    while True:
        children = [i for i in range(len(tokens)) if parents[i] == node]
        if not children:
            return path
        node = children[0]
        path.append(int(tokens[node]))


@given(any_tokens(), st.integers(0, 40), st.sampled_from([0.0, 0.002, 0.05]))
def test_every_tree_path_continues_an_occurrence_of_the_longest_suffix(tokens, budget, min_prob):
    """Without guesses, each root path copies what followed an earlier occurrence of the longest recurring suffix."""
    index = SuffixIndex(min_prob=min_prob, max_guesses=0)
    index.extend(tokens)
    draft, parents = tree_of(index, budget)
    k, ends = naive_longest_suffix(tokens)
    assert index.match_length == k
    assert draft.dtype == parents.dtype == np.int64 and len(draft) == len(parents) <= budget
    assert all(-1 <= parents[i] < i for i in range(len(parents)))  # parents precede children
    for path in root_paths(draft, parents):
        assert continues_an_occurrence(tokens, path, ends)
    siblings = [(int(p), int(t)) for p, t in zip(parents, draft)]
    assert len(set(siblings)) == len(siblings)  # no two children of a node carry the same token


@given(any_tokens(), st.integers(0, 40), st.sampled_from([0.0, 0.002, 0.05]))
def test_every_tree_path_copies_or_guesses_a_frequent_token(tokens, budget, min_prob):
    """With guesses, a root path that is not a copy starts with one of the 32 most frequent tokens held and goes on
    with what followed it; where the last token is new, every path is such a guess."""
    index = SuffixIndex(min_prob=min_prob)
    index.extend(tokens)
    draft, parents = tree_of(index, budget)
    k, ends = naive_longest_suffix(tokens)
    assert all(-1 <= parents[i] < i for i in range(len(parents)))
    paths = root_paths(draft, parents)
    assert all(copies_or_guesses(tokens, path, ends) for path in paths)
    if k == 0:
        assert all(is_frequent(tokens, path[0]) for path in paths)
    siblings = [(int(p), int(t)) for p, t in zip(parents, draft)]
    assert len(set(siblings)) == len(siblings)


@given(any_tokens(), st.integers(0, 40), st.sampled_from([0.0, 0.002, 0.05]), st.sampled_from([0, 32]))
def test_chain_is_the_first_path_of_the_tree(tokens, budget, min_prob, max_guesses):
    """propose() is the greedy path; the tree's first path is a prefix of it, and shorter budgets cut it."""
    index = SuffixIndex(min_prob=min_prob, max_guesses=max_guesses)
    index.extend(tokens)
    chain = index.propose(budget).tolist()
    k, ends = naive_longest_suffix(tokens)
    real = continues_an_occurrence if max_guesses == 0 else copies_or_guesses
    assert len(chain) <= budget and (not chain or real(tokens, chain, ends))
    first = first_path(*tree_of(index, budget))
    assert chain[:len(first)] == first
    assert index.propose(budget // 2).tolist() == chain[:budget // 2]


@given(any_tokens(), st.integers(1, 20))
def test_nothing_is_proposed_iff_no_suffix_recurs(tokens, budget):
    """Rule: without guesses and with min_prob=0 a draft is empty iff not even the last token occurred before; any
    min_prob only shortens it (a token is drafted iff its path probability >= min_prob). With guesses and
    min_prob=0 there is a draft whenever a token is held."""
    k, _ = naive_longest_suffix(tokens)
    guessing = SuffixIndex(min_prob=0.0)
    guessing.extend(tokens)
    assert (len(guessing.propose(budget)) > 0) == (len(guessing.propose_tree(budget).tokens) > 0) == (len(tokens) > 0)
    drafts = []
    for min_prob in (0.0, 0.01, 0.2, 1.0):
        index = SuffixIndex(min_prob=min_prob, max_guesses=0)
        index.extend(tokens)
        drafts.append(index.propose(budget).tolist())
        assert (len(index.propose_tree(budget).tokens) > 0) == (len(drafts[-1]) > 0)
    assert (len(drafts[0]) > 0) == (k > 0)
    assert all(longer[:len(shorter)] == shorter for longer, shorter in zip(drafts, drafts[1:]))


@given(chunked(any_tokens()), st.lists(st.integers(0, 12), min_size=8, max_size=8))
def test_interleaved_extend_and_propose_equal_a_fresh_index(chunks, asks):
    """Proposing between extends changes nothing: chain and tree depend on the tokens alone, not on chunking."""
    incremental = SuffixIndex()
    seen = []
    for chunk, ask in zip(chunks, asks * 2):
        incremental.extend(chunk)
        seen += chunk
        fresh = SuffixIndex()
        fresh.extend(seen)
        assert incremental.propose(ask).tolist() == fresh.propose(ask).tolist()
        tree, fresh_tree = incremental.propose_tree(ask), fresh.propose_tree(ask)
        assert tree.tokens.tolist() == fresh_tree.tokens.tolist() and tree.parents.tolist() == fresh_tree.parents.tolist()
        assert len(incremental) == len(fresh) == len(seen)


def test_follows_the_longest_match_over_a_more_recent_short_one():
    """The suffix (3, 4) last occurred before 7, but the longest recurring suffix (1, 2, 3, 4) says 5."""
    index = SuffixIndex()
    index.extend([1, 2, 3, 4, 5, 9, 3, 4, 7, 9, 1, 2, 3, 4])
    assert index.propose(2).tolist() == [5, 9]
    assert index.match_length == 4


def test_branches_where_the_evidence_is_split_and_ranks_by_it():
    """After 1 came 2 three times and 3 once: the chain says 2, the tree offers 3 as well (and, with guesses, the
    frequent token 1 after both copies)."""
    index = SuffixIndex(min_prob=0.0, max_guesses=0)
    index.extend([1, 2, 1, 2, 1, 2, 1, 3, 1])
    assert index.propose(1).tolist() == [2]
    tokens, parents = tree_of(index, 8)
    assert sorted(tokens[parents == -1].tolist()) == [2, 3]
    assert tokens[0] == 2
    guessing = SuffixIndex(min_prob=0.0)
    guessing.extend([1, 2, 1, 2, 1, 2, 1, 3, 1])
    proposal = guessing.propose_tree(8)
    tokens, parents, probs = proposal.tokens, proposal.parents, proposal.probs
    assert tokens[parents == -1].tolist() == [2, 3, 1] and guessing.propose(1).tolist() == [2]


@given(any_tokens(), st.data())
def test_paths_stay_copies_or_guesses_after_begin_request(tokens, data):
    """Marking a request boundary anywhere changes which occurrence is preferred, never what a path may be."""
    cut = data.draw(st.integers(0, len(tokens)))
    index = SuffixIndex(min_prob=0.0)
    index.extend(tokens[:cut])
    index.begin_request()
    index.extend(tokens[cut:])
    draft, parents = tree_of(index, data.draw(st.integers(0, 40)))
    k, ends = naive_longest_suffix(tokens)
    assert index.match_length == k
    assert all(copies_or_guesses(tokens, path, ends) for path in root_paths(draft, parents))


def test_a_new_request_copies_its_own_text_before_the_background():
    """Memory held before begin_request: a copy that starts anew follows the request's first occurrence, not the
    memory's; without the mark it follows the first overall, and incremental use still equals a fresh index."""
    memory, request = [1, 5, 6, 7, *range(100, 200)], [1, 2, 3, 4, *range(300, 400), 1]
    plain, marked = SuffixIndex(), SuffixIndex()
    plain.extend(memory + request)
    marked.extend(memory)
    marked.begin_request()
    marked.extend(request[:50])
    marked.propose_tree(8)
    marked.extend(request[50:])
    assert plain.propose(3).tolist() == [5, 6, 7] and marked.propose(3).tolist() == [2, 3, 4]
    fresh = SuffixIndex()
    fresh.extend(memory)
    fresh.begin_request()
    fresh.extend(request)
    assert fresh.propose_tree(16).tokens.tolist() == marked.propose_tree(16).tokens.tolist()


def test_after_a_new_token_guesses_the_most_frequent_ones():
    """9 was never seen: nothing to copy, so the draft guesses the frequent tokens, most frequent first, each
    followed by what followed it; the guesses' hit rates are learned (5 keeps coming after new tokens)."""
    index = SuffixIndex(min_prob=0.0)
    index.extend([5, 1, 5, 2, 5, 1, 7, 9])
    tokens, parents = tree_of(index, 3)
    assert tokens[parents == -1].tolist()[:2] == [5, 1] and index.propose(2).tolist() == [5, 1]
    assert index.match_length == 0
    assert len(SuffixIndex(max_guesses=0).propose(2)) == 0
    learner = SuffixIndex(min_prob=0.0)
    for new in range(100, 140):
        learner.extend([1, 1, 1, new, 6])  # 1 is the most frequent, 6 always follows a new token
    learner.extend([200])
    assert learner.propose(1).tolist() == [6]


def test_a_copy_that_broke_off_rejoins_its_source_further_on():
    """After an edit, of the three earlier occurrences of 99 the one just after the break point is followed."""
    source = np.random.default_rng(2).permutation(np.arange(1000, 5000))[:150].tolist()
    for where in (10, 30, 120):
        source[where] = 99
    index = SuffixIndex()
    index.extend(source + source[15:25] + [500, 99])  # copies source[15:25], edits, then 99 again
    assert index.match_length == 1
    assert index.propose(3).tolist() == source[31:34]


def test_degenerate_runs_still_give_real_continuations():
    """A run longer than the 64 suffix links walked per token leaves counts approximate, drafts still real."""
    tokens = [7] * 300 + [8] + [7] * 5
    index = SuffixIndex()
    index.extend(tokens)
    k, ends = naive_longest_suffix(tokens)
    assert index.match_length == k
    for path in root_paths(*tree_of(index, 32)):
        assert continues_an_occurrence(tokens, path, ends)


def test_long_matches_get_long_drafts_and_weak_ones_short():
    """A 40-token copy in progress fills the budget; a 1-token match seen once is cut early by min_prob."""
    rng = np.random.default_rng(0)
    text = rng.permutation(5000)[:300].tolist()
    strong, weak = SuffixIndex(min_prob=0.05), SuffixIndex(min_prob=0.05)
    strong.extend(text + text[100:140])
    weak.extend(text + [text[100]])
    assert strong.propose(32).tolist() == text[140:172]
    assert weak.match_length == 1 and 0 < len(weak.propose(32)) <= 4


def test_a_draft_that_catches_up_with_the_text_continues_the_repetition():
    """Periodic text extrapolates past the end of the tokens held."""
    index = SuffixIndex()
    index.extend([7, 8, 9, 7, 8, 9, 7])
    assert index.propose(7).tolist() == [8, 9, 7, 8, 9, 7, 8]


def test_large_inputs_grow_buffers_and_keep_matching():
    """Past the initial capacity (rehashes included) the longest match is still found and copied."""
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 100_000, 6000).tolist()
    tokens += tokens[1234:1290]
    index = SuffixIndex()
    for start in range(0, len(tokens), 700):
        index.extend(np.array(tokens[start:start + 700]))
    assert index.match_length == 56
    assert index.propose(10).tolist() == tokens[1290:1300]
    assert first_path(*tree_of(index, 10)) == tokens[1290:1300]


def test_accepts_lists_arrays_and_tensors_and_resets():
    index = SuffixIndex()
    index.extend([1, 2, 3])
    index.extend(np.array([1, 2], dtype=np.int64))
    index.extend(torch.tensor([3, 1]))
    assert len(index) == 7 and "tokens=7" in repr(index)
    assert index.propose(3).tolist() == [2, 3, 1]
    index.reset()
    assert len(index) == 0 and index.propose(3).size == 0 and index.propose_tree(3).tokens.size == 0
    assert index.match_length == 0
    index.extend([])
    assert len(index) == 0


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"min_prob": -0.1}, ValueError, "min_prob must be >= 0, got -0.1"),
        ({"min_prob": 2}, ValueError, "min_prob must be <= 1, got 2"),
        ({"min_prob": "0.1"}, TypeError, r"min_prob must be a number, got str \('0.1'\)"),
        ({"max_branch": 0}, ValueError, "max_branch must be >= 1, got 0"),
        ({"max_branch": 257}, ValueError, "max_branch must be <= 256, got 257"),
        ({"max_branch": 2.0}, TypeError, r"max_branch must be an int, got float \(2.0\)"),
        ({"half_life": 0}, ValueError, "half_life must be > 0, got 0"),
        ({"half_life": True}, TypeError, r"half_life must be a number, got bool \(True\)"),
        ({"max_guesses": 33}, ValueError, "max_guesses must be <= 32, got 33"),
        ({"max_guesses": -1}, ValueError, "max_guesses must be >= 0, got -1"),
    ],
)
def test_constructor_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        SuffixIndex(**kwargs)


def test_settings_accept_numpy_scalars_and_show_in_repr():
    index = SuffixIndex(min_prob=np.float32(0.5), max_branch=np.int64(3), half_life=np.int32(64))
    assert repr(index) == "SuffixIndex(min_prob=0.5, max_branch=3, half_life=64.0, max_guesses=32, tokens=0)"


@pytest.mark.parametrize(
    "tokens, error, message",
    [
        ([1.5, 2.0], TypeError, "tokens must hold integer ids, got dtype float64"),
        ([[1, 2], [3, 4]], ValueError, r"tokens must be one-dimensional, got shape \(2, 2\)"),
        ([1, -2], ValueError, r"tokens must hold ids in \[0, 2147483647\], got min -2"),
        (np.array([1, 2**64 - 1], dtype=np.uint64), ValueError, "got min 1 and max 18446744073709551615"),
    ],
)
def test_extend_errors(tokens, error, message):
    index = SuffixIndex()
    with pytest.raises(error, match=message):
        index.extend(tokens)
    assert len(index) == 0


@pytest.mark.parametrize("method, name", [("propose", "max_tokens"), ("propose_tree", "max_nodes")])
def test_propose_rejects_bad_budgets(method, name):
    with pytest.raises(ValueError, match=f"{name} must be >= 0, got -1"):
        getattr(SuffixIndex(), method)(-1)
    with pytest.raises(TypeError, match=rf"{name} must be an int, got float \(2.5\)"):
        getattr(SuffixIndex(), method)(2.5)


def test_huge_budgets_are_clamped_to_max_draft():
    """Repetitive text extrapolates without end: a budget of 10**9 gets MAX_DRAFT tokens, not gigabytes."""
    index = SuffixIndex(min_prob=0.0)
    index.extend([7, 8, 9] * 20)
    assert index.propose(10**9).tolist() == ([7, 8, 9] * (MAX_DRAFT // 3 + 1))[:MAX_DRAFT]
    assert len(index.propose_tree(np.int64(10**9))) == MAX_DRAFT
    assert index.propose(np.int64(5)).tolist() == [7, 8, 9, 7, 8]
