"""Warm-ups of the fused step's kernels (`_fused_kernels`): each compiled (or loaded from numba's cache) on a small
input for every argument type the loop passes, once per process, on the first fused call of its kind: one row's
types (tuples of arrays), and the typed lists of several rows only once a call has several (`many`): compiling
those costs a fresh install tens of seconds that a one-row call never needs."""
import numpy as np
from numba import typed

from ._fused_kernels import (Calibration, Chains, Policy, Rows, Sizing, Trees, TreeWork, draft, draft_suffix,
                             draft_trees, kept, step, step_suffix, step_trees)
from ._fused_recycle import draft_recycle_trees, step_recycle_trees


def warm_up_chains(many: bool = False) -> None:
    """Compile (or load from cache) the chain kernels on a non-empty input, for one row (tuples) and, if `many`, more
    (typed lists). The step kernels take whole draft buffers and a width: one type however wide a step is."""
    from ..index.ngram import NgramIndex

    index = NgramIndex(4)
    index.extend(np.array([1, 2, 3, 1, 2], dtype=np.int64))
    for items in _variants(index.kernel_state(), many):
        _warm(*items)


def warm_up_trees(many: bool = False) -> None:
    """The same for the tree kernels."""
    _warm_suffix(_warm_trees, many)


def warm_up_suffix_chains(many: bool = False) -> None:
    """The same for the kernels of chains from suffix indexes."""
    _warm_suffix(_warm_suffix_chains, many)


def _warm_suffix(warm, many: bool) -> None:
    from ..index.suffix import SuffixIndex

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
    """A length policy (`Policy`), a sizing of at most 4 tokens (`Sizing`) and r rows' `Rows` for the warm-ups."""
    from .policy import _BUCKETS

    buckets = len(_BUCKETS)
    policy = Policy(_BUCKETS, np.full(buckets, 3.0), np.ones(buckets), np.zeros(buckets, np.int64))
    sizing = Sizing(4, np.array([0, 1, 3, 3, 7]), np.array([1.0, 1.1, 1.2, 1.3, 1.4]), np.zeros(buckets, np.int64),
                    np.full(buckets, -1))
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
    return trees, Calibration(cal.EDGES, cal.accepted, cal.seen, cal.prior), work


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


def warm_up_recycle_trees(many: bool = False) -> None:
    """The same for the kernels of merged trees (`_fused_recycle`)."""
    from ..index.recycle import Recycled, RecycleIndex
    from ..index.suffix import SuffixIndex

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
