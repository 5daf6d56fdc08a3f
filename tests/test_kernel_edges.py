"""Kernels that write into buffers, at the edges of those buffers (issue 25): a buffer that holds exactly what a call
writes, and one that holds one less, where the kernel writes nothing and says so, or writes at most what fits. Each
result is checked against a plain-Python rule or what the public API gives. `test_bounds.py` runs this file again
under numba's bounds checks, where a write past an array raises IndexError instead of corrupting the heap."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import typed

from lookahead.decode import _fused_kernels as FK
from lookahead.decode.policy import _BUCKETS
from lookahead.decode.sizing import ChainSizing, TreeSizing
from lookahead.index import NgramIndex, SuffixIndex
from lookahead.index import _kernels as NK
from lookahead.index import _suffix_build as SB
from lookahead.index._suffix_draft import suffix_chain, suffix_tree
from lookahead.model import _kernels as TK
from lookahead.model.static import _BIT
from lookahead.verify import _kernels as VK
from strategies import any_tokens, replay_calls
from test_static import _inputs_by_numpy

CALLS = [("chain", 1), ("chain", 9), ("tree", 12)]  # what a grown index must still answer as the reference does


@st.composite
def worst_texts(draw) -> list:
    """Any tokens, or a b^k c, the text whose automaton has the most edges for its length (3n - 4)."""
    if draw(st.booleans()):
        return draw(any_tokens(200))
    return [0] + [1] * draw(st.integers(0, 200)) + [2]


@given(worst_texts())
@settings(deadline=None)
def test_the_suffix_automaton_stays_within_the_worst_case_its_arrays_are_sized_for(tokens):
    """After every token, at most 2n - 1 states and 3n - 4 edges for n >= 3 (Blumer et al.), which is what `fits`
    sizes st (2n + 2 rows) and ed (3n + 8) for; a b^k c reaches 3n - 4 exactly."""
    index = SuffixIndex()
    for n, token in enumerate(tokens, 1):
        index.extend([token])
        states, edges = int(index._sam.meta[SB.NS]), int(index._sam.meta[SB.NE])
        assert states <= (2 * n - 1 if n >= 3 else n + 1) and edges <= (3 * n - 4 if n >= 3 else 2 * n - 1)
    if len(tokens) >= 3 and tokens[0] == 0 and tokens[-1] == 2 and set(tokens[1:-1]) <= {1}:
        assert int(index._sam.meta[SB.NE]) == 3 * len(tokens) - 4


def _arrays_of(index) -> list:
    return [a.copy() for a in (index._sam if isinstance(index, SuffixIndex) else
                               (index._hist, index._table, index._state))]


def _fits_by_rule(index, extra: int) -> bool:
    """The room rule of each index, written out: the tokens in hist, and (n-gram) a table at most half full or
    (suffix) the automaton's worst case in st, ed and a table twice ed."""
    if isinstance(index, SuffixIndex):
        sam, n = index._sam, len(index) + extra
        return (n <= len(sam.hist) and 2 * n + 2 <= len(sam.st) and 3 * n + 8 <= len(sam.ed)
                and 2 * len(sam.ed) <= len(sam.table))
    used = int(index._state[NK.USED])
    return len(index) + extra <= len(index._hist) and 2 * (used + (extra + 1) * index.max_ngram) <= len(index._table)


def _extend_kernel(index, new: np.ndarray) -> int:
    if isinstance(index, SuffixIndex):
        return SB.suffix_extend(new, index._arrays)
    return NK.ngram_extend(new, index._hist, index._table, index._state, index.max_ngram, index.min_ngram)


@pytest.mark.parametrize("make", [lambda: NgramIndex(4), lambda: SuffixIndex()], ids=["ngram", "suffix"])
@given(seed=st.integers(0, 2**32 - 1), chunk=st.integers(1, 300))
@settings(max_examples=8, deadline=None)
def test_extend_kernels_append_exactly_while_the_arrays_fit_and_nothing_after(make, seed, chunk):
    """Fed in chunks straight to the kernel (as the fused step feeds it), an index appends each chunk exactly when
    its arrays take it by the written-out rule; otherwise the kernel answers FULL and every array is as it was,
    and once grown (`reserve`) it appends. The index then answers as one fed through `extend`."""
    tokens = np.random.default_rng(seed).integers(0, 40, 2600)
    index, reference = make(), make()
    fulls = 0
    for start in range(0, len(tokens), chunk):
        new = tokens[start:start + chunk]
        before, fits = _arrays_of(index), _fits_by_rule(index, len(new))
        got = _extend_kernel(index, new)
        assert got == (len(new) if fits else NK.FULL) and NK.FULL == SB.FULL
        if not fits:
            fulls += 1
            assert all(np.array_equal(a, b) for a, b in zip(before, _arrays_of(index)))
            index.reserve(len(new))
            assert _extend_kernel(index, new) == len(new)
        reference.extend(new)
    assert fulls > 0 and len(index) == len(tokens)
    assert replay_calls(index, CALLS) == replay_calls(reference, CALLS)


def test_extend_after_the_fused_step_filled_an_index_reads_its_room_off_the_arrays():
    """The fused step appends through the kernel, past `SuffixIndex.extend`: a later `extend` must still grow the
    arrays first (a room counted apart from them, as before, stayed at the capacity the kernel had used up, and the
    next `extend` wrote past hist)."""
    tokens = np.random.default_rng(0).integers(0, 30, 1500)
    index, reference = SuffixIndex(), SuffixIndex()
    capacity = len(index._sam.hist)
    assert SB.suffix_extend(tokens[:capacity], index._arrays) == capacity  # full to the last token
    index.extend(tokens[capacity:])
    reference.extend(tokens)
    assert len(index) == len(tokens) and len(index._sam.hist) > capacity
    assert replay_calls(index, CALLS) == replay_calls(reference, CALLS)


def _periodic_suffix_index() -> SuffixIndex:
    """An index over periodic text: its drafts extrapolate to any length asked for."""
    index = SuffixIndex(min_prob=0.0)
    index.extend(np.tile([5, 6, 7], 40))
    return index


def test_suffix_drafts_write_at_most_their_scratch_whatever_the_budget():
    """`suffix_chain` and `suffix_tree` asked for more than their scratch holds write what it holds: the same
    tokens (and nodes) as a proposal of that size through the API, which sizes the scratch itself."""
    index = _periodic_suffix_index()
    size = len(index._buf.chain)
    assert suffix_chain(index._arrays, index._scratch, 50 * size) == size
    chain = index._buf.chain.copy()
    assert np.array_equal(chain, index.propose(size))
    nodes = suffix_tree(index._arrays, index._scratch, 50 * size)
    assert nodes == size
    tree = index._buf.tree[:, :nodes].copy()
    draft = index.propose_tree(size)
    assert np.array_equal(tree[0], draft.tokens) and np.array_equal(tree[1], draft.parents)


@pytest.mark.parametrize("kind", ["ngram", "suffix", "tree"])
@pytest.mark.parametrize("width", [1, 3, 7])
def test_fused_drafts_write_at_most_their_buffers_width(kind, width):
    """The fused draft kernels, given draft buffers narrower than the budget the policy drafts to (and costs that
    make it draft the whole budget), write at most the buffers' width: each row's first tokens (nodes) of what its
    index proposes."""
    budget, r, max_new = 40, 2, 1000
    sizing = TreeSizing(budget, budget, 0.0) if kind == "tree" else ChainSizing(budget, 0.0)
    policy = sizing.length
    indexes = [NgramIndex(4) if kind == "ngram" else SuffixIndex(min_prob=0.0) for _ in range(r)]
    for k, ix in enumerate(indexes):
        ix.extend(np.tile([5 + k, 6, 7, 8], 30))
        if kind != "ngram":
            ix._buffers(budget)
    tokens, parents, probs = np.full((r, width), 9), np.full((r, width), 9), np.full((r, width), 9.0)
    sizes, matches, budgets, lens = (np.zeros(r, np.int64) for _ in range(4))
    pads, tables = np.arange(budget + 1), policy.tables(r)
    common = (lens, max_new, budget, pads, _BUCKETS, *policy.counts, *tables)
    if kind == "ngram":
        FK._draft(typed.List([ix._hist for ix in indexes]), typed.List([ix._state for ix in indexes]), *common,
                 np.empty(0), tokens, sizes, matches, budgets)
    elif kind == "suffix":
        FK._draft_suffix(typed.List([ix._arrays for ix in indexes]), typed.List([ix._scratch for ix in indexes]),
                        *common, np.empty(0), tokens, sizes, matches, budgets)
    else:
        cal = sizing.calibration
        FK._draft_trees(typed.List([ix._arrays for ix in indexes]), typed.List([ix._scratch for ix in indexes]),
                       *common, cal.EDGES, *cal.counts, cal.prior, sizing.step_costs(r), tokens, parents,
                       probs, sizes, matches, budgets, np.zeros(r, np.int64))
    assert sizes.tolist() == [width] * r
    for k, ix in enumerate(indexes):
        if kind == "tree":
            draft = ix.propose_tree(width)
            assert tokens[k].tolist() == draft.tokens.tolist() and parents[k].tolist() == draft.parents.tolist()
        else:
            assert tokens[k].tolist() == ix.propose(width).tolist()


@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_a_commit_writes_nothing_where_the_mask_is_one_slot_short(data):
    """`commit_slots` with a mask one slot narrower than the commit answers -1 and changes neither the mask nor the
    positions; exactly as wide, it writes the plain rule: 1 up to each row's root and accepted drafts, 0 after."""
    b = data.draw(st.integers(1, 5))
    counts = np.array([data.draw(st.integers(0, 9)) for _ in range(b)], dtype=np.int64)
    width, start = data.draw(st.sampled_from([0, int(counts.max()) + 1, int(counts.max()) + 2])), data.draw(
        st.integers(0, 5))
    kept = width or int(counts.max()) + 1
    for short in (1, 0):
        slots, pos = np.full((b, start + kept - short), 9, dtype=np.int64), np.arange(b, dtype=np.int64)
        got = TK.commit_slots(slots, start, width, counts, pos)
        if short:
            assert got == -1 and (slots == 9).all() and np.array_equal(pos, np.arange(b))
        else:
            assert got == kept and (slots[:, :start] == 9).all()
            assert np.array_equal(slots[:, start:], (np.arange(kept) <= counts[:, None]).astype(np.int64))
            assert np.array_equal(pos, np.arange(b) + counts + 1)


@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_a_chain_step_writes_nothing_where_the_mask_is_one_slot_short(data):
    """`chain_inputs` into a mask one slot narrower than the step's N + 1 columns answers -1 and writes nothing;
    exactly as wide, the root and each row's real drafts are seen, its padding not."""
    b, n, start = data.draw(st.integers(1, 5)), data.draw(st.integers(0, 9)), data.draw(st.integers(0, 5))
    drafts = np.arange(b * n, dtype=np.int64).reshape(b, n)
    sizes = np.array([data.draw(st.integers(0, n)) for _ in range(b)], dtype=np.int64)
    last, pos = np.arange(b, dtype=np.int64), np.arange(b, dtype=np.int64) * 10
    for short in (1, 0):
        slots, steps = np.full((b, start + n + 1 - short), 9, dtype=np.int64), np.full((2, b, n + 1), -1, np.int64)
        got = TK.chain_inputs(last, drafts, sizes, pos, steps, slots, start)
        if short:
            assert got == -1 and (slots == 9).all() and (steps == -1).all()
        else:
            assert got == b and np.array_equal(steps[1], pos[:, None] + np.arange(n + 1))
            assert np.array_equal(slots[:, start:], (np.arange(n + 1) <= sizes[:, None]).astype(np.int64))


@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_a_static_step_writes_nothing_into_an_input_buffer_narrower_than_it(data):
    """`static_inputs` for trees of N nodes into a width of N (one column short of the root and N nodes) answers -1
    and writes nothing; into N + 1 (host exactly 3 * width + 1 wide), the ancestry matrix's inputs."""
    b = data.draw(st.integers(1, 4))
    rows = np.array(sorted(data.draw(st.sets(st.integers(0, b - 1), min_size=1))), dtype=np.int64)
    n = data.draw(st.integers(1, 20))
    parents = np.array([[data.draw(st.integers(-1, j - 1)) for j in range(n)] for _ in rows], dtype=np.int64)
    tokens = np.arange(len(rows) * n, dtype=np.int64).reshape(len(rows), n)
    last, pos = np.arange(len(rows), dtype=np.int64) + 500, np.arange(b, dtype=np.int64) * 3
    for width in (n, n + 1):
        host = np.full((b, 3 * width + 1), -5, dtype=np.int64)
        got = TK.static_inputs(host, rows, last, tokens, parents, pos, pos + 7, width, _BIT)
        if width == n:
            assert got == -1 and (host == -5).all()
        else:
            assert got == len(rows)
            assert np.array_equal(host, _inputs_by_numpy(rows, last, tokens, parents, pos, pos + 7, width))


def _greedy_tree_by_rule(tokens, parents, size, targets) -> tuple:
    """The longest root path whose nodes equal the target's argmax at their parent, the first matching child
    first: (node indices, the argmax after the path)."""
    path, col = [], 0
    while True:
        children = [j for j in range(size) if parents[j] == col - 1]
        match = next((j for j in children if tokens[j] == targets[col]), None)
        if match is None:
            return path, int(targets[col])
        path.append(match)
        col = match + 1


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_greedy_tree_acceptance_reads_and_writes_only_the_packed_width(data):
    """`greedy_tree` with sizes that claim more nodes than the packed width (a caller's slip) accepts among the
    packed nodes only, into paths exactly as wide: the plain rule over the first min(size, N) nodes."""
    b, n = data.draw(st.integers(1, 4)), data.draw(st.integers(0, 12))
    parents = np.array([[data.draw(st.integers(-1, j - 1)) for j in range(n)] for _ in range(b)],
                       dtype=np.int64).reshape(b, n)
    tokens = np.array(data.draw(st.lists(st.integers(0, 2), min_size=b * n, max_size=b * n)), np.int64).reshape(b, n)
    targets = np.array(data.draw(st.lists(st.integers(0, 2), min_size=b * (n + 1), max_size=b * (n + 1))),
                       np.int64).reshape(b, n + 1)
    sizes = np.array([data.draw(st.integers(0, n + 3)) for _ in range(b)], dtype=np.int64)
    paths, counts, bonus = np.full((b, n), -1, np.int64), np.zeros(b, np.int64), np.zeros(b, np.int64)
    VK.greedy_tree(tokens, parents, sizes, targets, paths, counts, bonus)
    for i in range(b):
        path, after = _greedy_tree_by_rule(tokens[i], parents[i], min(int(sizes[i]), n), targets[i])
        assert paths[i, :counts[i]].tolist() == path and bonus[i] == after
