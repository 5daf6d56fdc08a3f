"""Warm-ups of the fused step's kernels (`_fused_kernels`): each compiled (or loaded from numba's cache) on a small
input for every argument type the loop passes, once per process, on the first fused call of its kind: one row's
types (tuples of arrays), and the typed lists of several rows only once a call has several (`many`): compiling
those costs a fresh install tens of seconds that a one-row call never needs."""
import numpy as np
from numba import typed

from ._fused_kernels import draft, draft_suffix, draft_trees, kept, step, step_suffix, step_trees
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


def _policy_and_sizing() -> tuple:
    """A length policy's arrays (edges, accepted, rejected, version) and a sizing (max tokens, pads, costs, table,
    seen) for the warm-ups."""
    from .policy import _BUCKETS

    buckets = len(_BUCKETS)
    policy = (_BUCKETS, np.full(buckets, 3.0), np.ones(buckets), np.zeros(buckets, np.int64))
    sizing = (4, np.array([0, 1, 3, 3, 7]), np.array([1.0, 1.1, 1.2, 1.3, 1.4]), np.zeros(buckets, np.int64),
              np.full(buckets, -1))
    return policy, sizing


def _warm(hists, tables, states) -> None:
    """The chain kernels over r = len(hists) rows, as the loop calls them."""
    (policy, sizing), r = _policy_and_sizing(), len(hists)
    drafts, lens, ints = np.zeros((2, r, 8), np.int64), np.zeros(r, np.int64), [np.zeros(r, np.int64) for _ in range(8)]
    widest = draft(hists, states, lens, 8, *sizing[:2], *policy, *sizing[2:], drafts[0], *ints[:3])
    step(np.zeros((r, widest + 1), np.int64), drafts[0], widest, ints[0], ints[1], hists, tables, states, 4, 1,
         *policy, np.array([7]), 8, lens, np.zeros((r, 8), np.int64), *ints[3:6], np.zeros(r, np.bool_),
         np.zeros(2, np.int64), *sizing, drafts[1], ints[6], ints[7], ints[2])


def _warm_suffix_chains(automata, scratches) -> None:
    """`_warm` for chains from suffix indexes."""
    (policy, sizing), r = _policy_and_sizing(), len(automata)
    drafts, lens, ints = np.zeros((2, r, 8), np.int64), np.zeros(r, np.int64), [np.zeros(r, np.int64) for _ in range(8)]
    widest = draft_suffix(automata, scratches, lens, 8, *sizing[:2], *policy, *sizing[2:], drafts[0], *ints[:3])
    step_suffix(np.zeros((r, widest + 1), np.int64), drafts[0], widest, ints[0], ints[1], automata, scratches,
                *policy, np.array([7]), 8, lens, np.zeros((r, 8), np.int64), *ints[3:6], np.zeros(r, np.bool_),
                np.zeros(2, np.int64), *sizing, drafts[1], ints[6], ints[7], ints[2])


def _warm_trees(automata, scratches) -> None:
    """`_warm` for trees."""
    from .policy import TreeCalibration

    (policy, sizing), cal, r = _policy_and_sizing(), TreeCalibration(), len(automata)
    calibration = (cal.EDGES, cal.accepted, cal.seen, cal.prior)
    ints = [np.zeros(r, np.int64) for _ in range(12)]
    tokens, parents, probs = np.zeros((2, r, 8), np.int64), np.zeros((2, r, 8), np.int64), np.zeros((2, r, 8))
    widest = draft_trees(automata, scratches, ints[0], 8, *sizing[:2], *policy, *sizing[2:], *calibration,
                         np.ones(5), tokens[0], parents[0], probs[0], *ints[1:5])
    step_trees(np.zeros((r, widest + 1), np.int64), tokens[0], parents[0], probs[0], widest, ints[1], ints[2],
               ints[3], automata, scratches, *policy, *calibration, np.array([7]), 8, ints[0],
               np.zeros((r, 8), np.int64), *ints[5:8], np.zeros((r, 8), np.int64), np.zeros((r, 9), np.int64),
               np.zeros(r, np.bool_), np.zeros(2, np.int64), *sizing, np.ones(5), tokens[1], parents[1], probs[1],
               *ints[8:11], ints[4])


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
    from .policy import TreeCalibration

    (policy, sizing), cal, r = _policy_and_sizing(), TreeCalibration(), len(lists[0])
    calibration = (cal.EDGES, cal.accepted, cal.seen, cal.prior)
    ints = [np.zeros(r, np.int64) for _ in range(12)]
    tokens, parents, probs = np.zeros((2, r, 8), np.int64), np.zeros((2, r, 8), np.int64), np.zeros((2, r, 8))
    m = (table.ids, table.score, table.keys, table.pair, table.pprob, table.calib, table.meta)
    widest = draft_recycle_trees(*lists, m, 0.01, ints[0], 8, *sizing[:2], *policy, *sizing[2:], *calibration,
                                 np.ones(5), tokens[0], parents[0], probs[0], *ints[1:5])
    top = (np.zeros((r, widest + 1, 2), np.int64), np.zeros((r, widest + 1, 2), np.float32))
    step_recycle_trees(np.zeros((r, widest + 1), np.int64), *top, tokens[0], parents[0], probs[0], widest, ints[1],
                       ints[2], ints[3], *lists, (*table.arrays, table.calib), 0.01, *policy, *calibration,
                       np.array([7]), 8, ints[0], np.zeros((r, 8), np.int64), *ints[5:8], np.zeros((r, 8), np.int64),
                       np.zeros((r, 9), np.int64), np.zeros(r, np.bool_), np.zeros(2, np.int64), *sizing, np.ones(5),
                       tokens[1], parents[1], probs[1], *ints[8:11], ints[4])
