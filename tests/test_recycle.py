"""Token Recycling (`lookahead.index.recycle`): its kernels against the plain-Python rules, its drafts' shape, and
its errors."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lookahead import Memory
from lookahead.index import Recycled, RecycleIndex, SuffixIndex
from lookahead.index import _recycle_kernels as K
from lookahead.index import _recycle_reference as R
from strategies import any_tokens, recycle_updates

VOCAB, TOP = 12, 4


def _pair(recycled, updates, slots=1024):
    """A `Recycled` and its reference, both taught `updates`."""
    ref = R.ReferenceRecycled(VOCAB, TOP, slots, recycled.decay, lambda key: int(K._slot(recycled.keys, key)))
    for token, prev, ids, probs in updates:
        recycled.update([token], [prev], [ids], [probs])
        ref.update(token, prev, ids, probs)
    return ref


@given(recycle_updates(), st.sampled_from([0.0, 0.5]))
def test_update_and_candidates_follow_the_rules(updates, decay):
    """M's rows (decayed sums, the weakest replaced, best first) and the two-token rows (the latest prediction,
    evicted oldest first) give the reference's candidates after every token and pair."""
    recycled = Recycled(VOCAB, TOP, pair_slots=1024, decay=decay)
    ref = _pair(recycled, updates)
    for token in range(VOCAB):
        for prev in range(-1, VOCAB):
            ids, probs = recycled.candidates(token, prev)
            want = ref.candidates(prev, token)
            assert ids.tolist() == [x for x, _ in want]
            assert np.allclose(probs, [p for _, p in want])


@given(recycle_updates(max_steps=60))
def test_the_two_token_table_evicts_the_oldest_row_of_a_full_window(updates):
    """A table far smaller than the pairs taught (1,024 slots filled through a handful of probe windows, as the
    hash of few keys lands): the reference's evictions, the same candidates."""
    recycled = Recycled(VOCAB, TOP, pair_slots=1024, decay=0.5)
    recycled.keys[:] = np.where(np.arange(1024) % 8 < 6, -2, -1)  # most slots taken by a key nobody asks for
    ref = _pair(recycled, [])
    ref.table = [(-2, [], 0) if i % 8 < 6 else None for i in range(1024)]
    for token, prev, ids, probs in updates:
        recycled.update([token], [prev], [ids], [probs])
        ref.update(token, prev, ids, probs)
    for token in range(VOCAB):
        for prev in range(VOCAB):
            assert recycled.candidates(token, prev)[0].tolist() == [x for x, _ in ref.candidates(prev, token)]


@st.composite
def merges(draw):
    """A taught `Recycled`, a suffix index over some tokens, a budget and a keep threshold."""
    updates = draw(recycle_updates(max_steps=80))
    tokens = [t % VOCAB for t in draw(any_tokens(60))]
    return updates, tokens, draw(st.integers(0, 40)), draw(st.sampled_from([0.0, 0.01, 0.2, 1.0]))


@given(merges(), st.booleans())
def test_merged_tree_is_the_reference_tree(case, merged):
    """The suffix tree's nodes while they are likely enough, then M best-first, valued and ordered: the reference's
    tree node for node; parents before children, values non-increasing and never above a parent's."""
    updates, tokens, budget, keep = case
    recycled = Recycled(VOCAB, TOP, decay=0.5)
    ref = _pair(recycled, updates)
    recycled.calib[:] = np.random.default_rng(len(updates)).uniform(0, 3, recycled.calib.shape)
    recycled.calib[..., 0] += recycled.calib[..., 1]
    ref.calib = recycled.calib.copy()
    row = RecycleIndex(recycled, SuffixIndex() if merged else None, keep=keep)
    row.extend(tokens or [0])
    base = row.suffix.propose_tree(budget) if merged else None
    draft = row.propose_tree(budget)
    want = R.merged_tree(ref, recycled.meta[K.PRIOR], row._prev, row._last,
                         list(zip(base.tokens, base.parents, base.probs)) if merged else [], keep, budget)
    assert draft.tokens.tolist() == [w[0] for w in want]
    assert draft.parents.tolist() == [w[1] for w in want]
    assert np.allclose(draft.probs, [w[4] for w in want])
    assert all(p < j for j, p in enumerate(draft.parents))
    assert all(draft.probs[j] <= (draft.probs[p] if p >= 0 else 1.0) + 1e-12 for j, p in enumerate(draft.parents))
    assert np.all(np.diff(draft.probs) <= 1e-12)
    for j in range(len(draft)):  # no two siblings alike
        assert draft.tokens[j] not in draft.tokens[:j][draft.parents[:j] == draft.parents[j]]


@given(merges(), st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6))
def test_learning_counts_every_child_of_the_accepted_path(case, gained):
    """The calibration after a draft and the tokens that followed it: the reference's counts."""
    updates, tokens, budget, keep = case
    recycled = Recycled(VOCAB, TOP, decay=0.5)
    _pair(recycled, updates)
    row = RecycleIndex(recycled, SuffixIndex(), keep=keep)
    row.extend(tokens or [0])
    draft = row.propose_tree(budget)
    nodes = list(zip(row._out[0, :len(draft)], row._out[1, :len(draft)], row._out[2, :len(draft)],
                     row._est[0, :len(draft)]))
    want = recycled.calib.copy()
    R.learn(want, recycled.meta[K.CAL_DECAY], nodes, gained)
    row.extend(gained)
    assert np.allclose(recycled.calib, want)


def test_a_chain_is_the_best_path_then_m():
    """`propose`: the merged tree's best path, continued with M's best candidate after each token."""
    recycled = Recycled(10, 2)
    recycled.update([1, 2, 3, 4], [-1, 1, 2, 3], [[2, 5], [3, 6], [4, 7], [1, 8]], [[0.9, 0.1]] * 4)
    row = RecycleIndex(recycled)
    row.extend([0, 1])
    assert row.propose(6).tolist() == [2, 3, 4, 1, 2, 3]
    assert row.match_length == 1
    row.extend([9])
    assert row.propose(3).tolist() == [] and row.match_length == 0


def test_a_merged_index_copies_where_the_text_repeats():
    """With M empty a merged index proposes the suffix index's tree (its copies) and the suffix index's match."""
    suffix, plain = SuffixIndex(), SuffixIndex()
    row = RecycleIndex(Recycled(50), suffix, keep=0.0)
    for index in (row, plain):
        index.extend([5, 6, 7, 8, 9, 5, 6])
    assert row.propose_tree(8).tokens.tolist() == plain.propose_tree(8).tokens.tolist()
    assert row.propose(3).tolist() == [7, 8, 9] and row.match_length == 2


def test_memory_keeps_and_saves_the_predictions(tmp_path):
    """`Memory.recycled` is kept per model and vocabulary; `save` and `load` bring back its tokens and predictions;
    a Memory of no tokens holds none."""
    memory = Memory(max_tokens=0)
    table = memory.recycled(VOCAB, "m")
    assert memory.recycled(VOCAB, "m") is table and memory.recycled(VOCAB, "other") is not table
    table.update([3], [2], [[4, 5]], [[0.5, 0.25]])
    memory.add_tokens([1, 2, 3])
    assert len(memory) == 0
    memory.save(tmp_path / "m.npz")
    loaded = Memory.load(tmp_path / "m.npz")
    assert loaded.max_tokens == 0
    assert loaded.recycled(VOCAB, "m").candidates(3, 2)[0].tolist() == [4, 5]
    kept = Memory(10)
    kept.add_tokens([1, 2, 3])
    kept.save(tmp_path / "k.npz")
    assert Memory.load(tmp_path / "k.npz").documents()[0][0].tolist() == [1, 2, 3]


def test_recycled_takes_few_megabytes():
    """M for SmolLM2's vocabulary: about 5.5 MB at the defaults."""
    assert Recycled(49152).nbytes < 6 * 2**20


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(vocab=0), ValueError, "vocab must be >= 1, got 0"),
    (dict(vocab=10, k=0), ValueError, "k must be >= 1, got 0"),
    (dict(vocab=10, k=2.0), TypeError, "k must be an int, got float"),
    (dict(vocab=10, pair_slots=3000), ValueError, "pair_slots must be a power of two, got 3000"),
    (dict(vocab=10, pair_slots=512), ValueError, "pair_slots must be >= 1024, got 512"),
    (dict(vocab=10, decay=1.0), ValueError, "decay must be < 1, got 1"),
    (dict(vocab=10, decay=-0.1), ValueError, "decay must be >= 0, got -0.1"),
])
def test_recycled_names_a_bad_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        Recycled(**kwargs)


def test_recycle_index_names_a_bad_argument():
    with pytest.raises(TypeError, match="recycled must be a lookahead.index.Recycled, got dict"):
        RecycleIndex({})
    with pytest.raises(TypeError, match="suffix must be a SuffixIndex or None, got list"):
        RecycleIndex(Recycled(4), [])
    with pytest.raises(ValueError, match="keep must be <= 1, got 2"):
        RecycleIndex(Recycled(4), keep=2.0)
    with pytest.raises(ValueError, match="max_nodes must be >= 0, got -1"):
        RecycleIndex(Recycled(4)).propose_tree(-1)
    with pytest.raises(ValueError, match=r"tokens must hold ids in \[0, 2147483647\]"):
        RecycleIndex(Recycled(4)).extend([-3])
    with pytest.raises(ValueError, match="update needs tokens"):
        Recycled(4).update([1, 2], [0], [[1]], [[0.5]])
