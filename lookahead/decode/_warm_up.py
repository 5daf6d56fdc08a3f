"""The one warm-up: a small call of every kernel signature lookahead's calls use, so that no call of a compiled kind
waits for numba (`lookahead.runtime.jit`). ``lookahead warm`` (`lookahead.warm`, in the foreground or as the
background compiler) runs `kind` before each kind's own short call: the index, policy and acceptance kernels, and
the fused step's for the kind's lookup, draft and rows: one row's types (tuples of arrays), and the typed lists of
several rows only for a kind of several (compiling those costs a fresh install tens of seconds that a one-row call
never needs). Nothing else compiles ahead: a kernel whose signature none of these calls made compiles at its first
call, where numba puts it (`tests/test_fused.py` holds every call of every kind to these signatures)."""
import numpy as np
from numba import typed

from ..index.ngram import NgramIndex
from ..index.suffix import SuffixIndex
from ..verify import _kernels as _verify_kernels
from . import _policy_kernels
from ._fused_kernels import (Calibration, Chains, Policy, Rows, Sizing, Trees, TreeWork, draft, draft_suffix,
                             draft_trees, kept, step, step_suffix, step_trees)
from ._fused_recycle import draft_recycle_trees, step_recycle_trees


def kind(lookup: str, draft: str, rows: int, cache: str, decoding: str) -> None:
    """Compile (or load from numba's cache) the kernels a call of this kind (`jit.KINDS`) uses, on small inputs."""
    policy(), acceptance(), indexes()
    fused = {("ngram", "chain"): chains, ("suffix", "chain"): suffix_chains,
             ("suffix", "tree"): trees, ("suffix+recycle", "tree"): recycle_trees}
    if decoding == "greedy" and (lookup, draft) in fused:  # sampling is unfused
        fused[lookup, draft](rows > 1)
    elif decoding == "served":  # the server's greedy rows of chains and trees (merged ones too), one row's and
        chains(True), suffix_chains(True), trees(True), recycle_trees(True)  # several rows' (`fused.for_rows`), and
        recycling()  # its recycling rows' indexes


def indexes() -> None:
    """The n-gram and suffix indexes' kernels: extending by int64 and int32 ids, proposing, growing."""
    for index in (NgramIndex(4), SuffixIndex(min_prob=0.0, max_branch=2, half_life=1.0, max_guesses=2)):
        for dtype in (np.int64, np.int32):
            index.extend(np.array([1, 2, 3, 1, 2, 4, 1, 2], dtype))
        index.propose(4)
        if isinstance(index, SuffixIndex):
            index.propose_tree(4)
        index.reserve(4096)  # past the first capacity: the arrays grow and the table is rebuilt


def recycling() -> None:
    """The kernels of `RecycleIndex`es (``"recycle"`` and ``"suffix+recycle"``) as the server's engine calls them:
    extending by int64 ids, proposing chains and trees, learning a step's top-k (the prefill's: an empty draft)."""
    from ..index.recycle import Recycled, RecycleIndex

    table = Recycled(16, 2)
    for index in (RecycleIndex(table), RecycleIndex(table, SuffixIndex())):
        none, top = np.zeros(0, np.int64), (np.ones((3, 2), np.int64), np.full((3, 2), 0.5, np.float32))
        index.observe(none, none, 0, *top)
        index.extend(np.array([1, 2, 3, 1, 2], np.int64))
        draft = index.propose_tree(2)
        index.observe(draft.tokens, draft.parents, len(draft), *top)
        chain, parents = index.propose(2), np.arange(-1, 1)
        parents.flags.writeable = False  # a chain batch's parents are one read-only row (`DraftBatch.pack`)
        index.observe(chain, parents[:len(chain)], len(chain), *top)
        index.extend(np.array([3], np.int64))


def policy() -> None:
    """The sizing policies' kernels (`DraftLength`, `TreeSizing`, `TreeCalibration`)."""
    k = _policy_kernels
    edges = np.array([0, 1, 2], dtype=np.int64)
    accepted, rejected = np.ones((1, 3)), np.ones((1, 3))  # [policies, buckets]
    version, seen, table = np.zeros((1, 3), np.int64), np.full((1, 3), -1, np.int64), np.zeros((1, 3), np.int64)
    matches, one = np.array([2], np.int64), np.ones(1, np.int64)
    k.choose(matches, edges, accepted, rejected, version, np.ones(3), table, seen, np.zeros(1, np.int64))
    k.record(matches, one, one, edges, accepted, rejected, version)
    fedges, probs = np.array([0.0, 0.5]), np.array([[0.9, 0.2]])
    accepted, rejected = accepted[:, :2], rejected[:, :2]  # a calibration's tables [P, bins]
    k.tree_size(probs[0], fedges, accepted[0], rejected[0], 4.0, np.ones(3))
    pick, path = np.zeros(2, np.int64), np.zeros(2, np.int64)
    total = k.tree_pick(np.array([-1, 0], np.int64), 1, 0, 2, False, pick, path)
    k.pack_picked(np.array([3, 4], np.int64), np.array([-1, 0], np.int64), probs[0], pick, total,
                  np.zeros(2, np.int64), np.zeros(2, np.int64), np.zeros(2), np.zeros(2, np.int64))
    parents, cols = np.array([[-1, 0]], np.int64), np.array([[0, 1]], np.int64)
    k.first_path(parents[0], 2, np.zeros(2, dtype=np.int64))
    k.tree_record(parents, one * 2, probs, one, cols, one, fedges, accepted, rejected, one.copy(), one.copy(),
                  np.zeros(2, np.bool_))


def acceptance() -> None:
    """The acceptance kernels (`lookahead.verify`): tree ancestry, greedy chains and trees."""
    k = _verify_kernels
    parents = np.array([[-1, 0, -1]], dtype=np.int64)
    tokens = np.array([[5, 6, 7]], dtype=np.int64)
    targets = np.array([[5, 6, 0, 0]], dtype=np.int64)
    k.ancestry(parents, np.zeros((1, 4, 4), dtype=np.bool_), np.zeros((1, 4), dtype=np.int64))
    one, two = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    k.greedy_chain(tokens, np.array([3], dtype=np.int64), targets, one, two)
    k.greedy_tree(tokens, parents, np.array([3], dtype=np.int64), targets, np.zeros((1, 3), dtype=np.int64), one,
                  two)


def chains(many: bool = False) -> None:
    """The fused step's chain kernels (`_fused_kernels`) on a non-empty input, for one row (tuples) and, if `many`, more
    (typed lists). The step kernels take whole draft buffers and a width: one type however wide a step is."""
    index = NgramIndex(4)
    index.extend(np.array([1, 2, 3, 1, 2], dtype=np.int64))
    for items in _variants(index.kernel_state(), many):
        _warm(*items)


def trees(many: bool = False) -> None:
    """The same for the tree kernels."""
    _warm_suffix(_warm_trees, many)


def suffix_chains(many: bool = False) -> None:
    """The same for the kernels of chains from suffix indexes."""
    _warm_suffix(_warm_suffix_chains, many)


def _warm_suffix(warm, many: bool) -> None:
    suffix = SuffixIndex()
    suffix.extend(np.array([1, 2, 3, 1, 2], dtype=np.int64))
    for items in _variants(suffix.kernel_state(8), many):
        warm(*items)


def _variants(items: tuple, many: bool) -> list:
    """The arguments a one-row call passes (a tuple per item), and with `many` those of two rows (typed lists),
    after warming `kept`, which cuts those lists when a row finishes."""
    if not many:
        return [tuple((item,) for item in items)]
    for item in items:
        kept(typed.List([item]), np.ones(1, np.bool_))
    return [tuple((item,) for item in items), tuple(typed.List([item] * 2) for item in items)]


def _bundles(r: int) -> tuple:
    """A length policy (`Policy`), a sizing of at most 4 tokens (`Sizing`) and r rows' `Rows`."""
    from .policy import _BUCKETS

    buckets = len(_BUCKETS)
    policy = Policy(_BUCKETS, np.full((1, buckets), 3.0), np.ones((1, buckets)), np.zeros((1, buckets), np.int64))
    sizing = Sizing(4, np.array([0, 1, 3, 3, 7]), np.array([1.0, 1.1, 1.2, 1.3, 1.4]),
                    np.zeros((1, buckets), np.int64), np.full((1, buckets), -1), np.ones(5))  # widths: a batch's cut
    ints = np.zeros((4, r), np.int64)
    rows = Rows(np.array([7]), 8, ints[0], np.zeros((r, 8), np.int64), ints[1], ints[2], ints[3],
                np.zeros(r, np.bool_), np.zeros(2, np.int64), np.zeros(r, np.int64))
    return policy, sizing, rows


def _chains(r: int) -> tuple:
    """Two steps' `Chains` buffers of r rows."""
    return tuple(Chains(np.zeros((r, 8), np.int64), np.zeros(r, np.int64), np.zeros(r, np.int64)) for _ in range(2))


def _trees(r: int) -> tuple:
    """Two steps' `Trees` buffers of r rows, a `Calibration` and the `TreeWork`."""
    from .policy import TreeCalibration

    cal = TreeCalibration()
    trees = tuple(Trees(np.zeros((r, 8), np.int64), np.zeros((r, 8), np.int64), np.zeros((r, 8)), np.zeros(r, np.int64),
                        np.zeros(r, np.int64), np.zeros(r, np.int64)) for _ in range(2))
    work = TreeWork(np.zeros((r, 8), np.int64), np.zeros((r, 9), np.int64), np.zeros(r, np.int64), np.ones(5))
    return trees, Calibration(cal.EDGES, *cal.counts, cal.prior), work


def _warm(hists, tables, states) -> None:
    """The chain kernels over r = len(hists) rows, as the loop calls them."""
    index, r = (hists, tables, states), len(hists)
    (policy, sizing, rows), (now, later) = _bundles(r), _chains(r)
    widest = draft(index, rows, sizing, policy, now)
    step(np.zeros((r, widest + 1), np.int64), now, widest, index, (4, 1), policy, rows, sizing, later)


def _warm_suffix_chains(automata, scratches) -> None:
    """`_warm` for chains from suffix indexes."""
    index, r = (automata, scratches), len(automata)
    (policy, sizing, rows), (now, later) = _bundles(r), _chains(r)
    widest = draft_suffix(index, rows, sizing, policy, now)
    step_suffix(np.zeros((r, widest + 1), np.int64), now, widest, index, policy, rows, sizing, later)


def _warm_trees(automata, scratches) -> None:
    """`_warm` for trees."""
    index, r = (automata, scratches), len(automata)
    (policy, sizing, rows), ((now, later), cal, work) = _bundles(r), _trees(r)
    widest = draft_trees(index, rows, sizing, policy, cal, work, now)
    step_trees(np.zeros((r, widest + 1), np.int64), now, widest, index, policy, cal, rows, work, sizing, later)


def recycle_trees(many: bool = False) -> None:
    """The same for the kernels of merged trees (`_fused_recycle`)."""
    from ..index.recycle import Recycled, RecycleIndex

    table = Recycled(16, 2)
    table.update(np.array([1, 2]), np.array([-1, 1]), np.array([[2, 3], [3, 1]]), np.full((2, 2), 0.5, np.float32))
    index = RecycleIndex(table, SuffixIndex())
    index.extend(np.array([1, 2, 3, 1, 2], dtype=np.int64))
    for lists in _variants(index.kernel_state(8), many):
        _warm_recycle_trees(lists, table)


def _warm_recycle_trees(lists, table) -> None:
    """`_warm_trees` for merged trees."""
    r = len(lists[0])
    (policy, sizing, rows), ((now, later), cal, work) = _bundles(r), _trees(r)
    m = (table.ids, table.score, table.keys, table.pair, table.pprob, table.calib, table.meta)
    widest = draft_recycle_trees(lists, m, 0.01, rows, sizing, policy, cal, work, now)
    top = (np.zeros((r, widest + 1, 2), np.int64), np.zeros((r, widest + 1, 2), np.float32))
    step_recycle_trees(np.zeros((r, widest + 1), np.int64), *top, now, widest, lists, (*table.arrays, table.calib),
                       0.01, policy, cal, rows, work, sizing, later)
