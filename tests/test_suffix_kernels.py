"""The suffix kernels against the plain-Python reference (lookahead/index/_suffix_reference.py), and SuffixIndex.copy."""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from lookahead.index import SuffixIndex
from lookahead.index import _suffix_build as K
from lookahead.index._suffix_reference import Text, rank, rejoin
from strategies import any_tokens, index_calls, replay_calls

HALF_LIVES = st.sampled_from([1.0, 16.0, 512.0])


@given(any_tokens(max_size=64), st.data(), HALF_LIVES)
def test_the_copy_in_progress_follows_the_rejoin_rule(tokens, data, half_life):
    """After every token, the occurrence the index copies from, how long it has agreed, where the last copy broke
    off and the learned votes between the most recent and the first occurrence are the reference's; a request
    boundary anywhere."""
    cut = data.draw(st.integers(0, len(tokens)))
    index, text = SuffixIndex(half_life=half_life), Text(half_life)
    for i, token in enumerate(tokens):
        if i == cut:
            index.begin_request()
            text.begin_request()
        index.extend([token])
        text.append(token)
        meta = index._sam.meta
        assert (meta[K.PTR], meta[K.RUN], meta[K.CURSOR]) == (text.ptr, text.run, text.cursor)
        assert index._sam.stats[K.VOTE, :2].tolist() == text.votes


@given(any_tokens(max_size=64), st.data(), HALF_LIVES)
def test_the_first_level_of_a_tree_is_the_reference_ranking(tokens, data, half_life):
    """The children of the root (the continuations of the longest recurring suffix) carry exactly the reference's
    probabilities, most probable first; all of them unless the budget ran out on more probable deeper nodes."""
    cut = data.draw(st.integers(0, len(tokens)))
    index = SuffixIndex(min_prob=0.0, max_branch=64, half_life=half_life, max_guesses=0)  # every continuation
    text = Text(half_life)
    index.extend(tokens[:cut])
    index.begin_request()
    index.extend(tokens[cut:])
    for i, token in enumerate(tokens):
        if i == cut:
            text.begin_request()
        text.append(token)
    draft = index.propose_tree(512)
    children = {int(t): float(p) for t, p, parent in zip(draft.tokens, draft.probs, draft.parents) if parent == -1}
    expected = dict(text.root_children())
    assert bool(children) == bool(expected) and set(children.items()) <= set(expected.items())
    assert list(children.values()) == sorted(children.values(), reverse=True)
    least = min(children.values(), default=0.0)
    assert all(token in children for token, p in expected.items() if p > least)


def test_rank_shares_occurrences_and_adds_the_bonuses():
    """3 of 4 occurrences went on with 5, one with 6; the copy in progress goes on with 6, the most recent
    occurrence with 5: 6 gets the largest bonus but not the larger share. One continuation keeps q."""
    ranked = rank({5: 3, 6: 1}, 4, 0.8, recent=5, first=6, follow=6)
    norm = 1.0 + 0.05 + 0.02 + 0.3
    assert ranked == [(5, 0.8 * (0.75 + 0.05) / norm), (6, 0.8 * (0.25 + 0.02 + 0.3) / norm)]
    assert rank({7: 2}, 2, 0.3, recent=7, first=7, follow=None) == [(7, 0.3)]


def test_rejoin_prefers_the_source_just_after_the_break_then_the_first_occurrence():
    """The suffix (4,) occurs ending at 2, 5 and 9: the copy broke off at 3, so the text rejoins at 5; with no break
    point the first occurrence (2) or, when it has predicted better, the most recent (9)."""
    tokens = [1, 4, 9, 2, 4, 8, 3, 3, 4, 7, 4]
    assert rejoin(tokens, 1, 3, first=2, recent=9, recent_better=False) == 5
    assert rejoin(tokens, 1, -1, first=2, recent=9, recent_better=False) == 2
    assert rejoin(tokens, 1, -1, first=2, recent=9, recent_better=True) == 9


@given(index_calls())
def test_a_copy_behaves_exactly_like_the_original(calls):
    """After copy(), the same calls give the same drafts on the copy and on the original, and the copy's calls
    leave the original as it was (buffer growth and request boundaries included)."""
    base, rest = calls
    original = SuffixIndex()
    for tokens in base:
        original.extend(tokens)
    twin = original.copy()
    on_twin = replay_calls(twin, rest)
    fresh = SuffixIndex()
    fresh.extend([t for tokens in base for t in tokens])
    assert replay_calls(original.copy(), [("tree", 16), ("chain", 16)]) == replay_calls(fresh, [("tree", 16), ("chain", 16)])
    assert replay_calls(original, rest) == on_twin


def test_a_copy_of_an_empty_index_grows_on_its_own():
    original = SuffixIndex()
    twin = original.copy()
    twin.extend(np.arange(3000) % 700)
    assert len(original) == 0 and len(twin) == 3000 and twin.propose(3).tolist() == [200, 201, 202]
