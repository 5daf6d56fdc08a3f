"""Numba kernels of the fused greedy step for trees from `RecycleIndex`es merged with suffix indexes
(``lookup="suffix+recycle"``, `lookahead.decode.fused.FusedRecycleTrees`): the step's acceptance (`accept_trees`'s),
M learning the step's top-k and each row's index taking its tokens, then the next step's merged trees, sized as
`TreeSizing.draft` sizes them, in one call.

A row is passed as its suffix automaton and scratch (`SuffixIndex`) and its `RecycleIndex._row`: merge scratch (ints,
floats, cand, cval, heap, found ids and probabilities), its latest draft (out, est) and its state (prev, last,
pending, held); M's arrays are the call's one `Recycled`.
"""
import numpy as np
from numba import njit

from ..index._recycle_kernels import LAST, PENDING, PREV, advance, merged_tree, update_step
from ..index._suffix_draft import Scratch, suffix_tree
from ._fused_kernels import _suffix_match, accept_trees, suffix_room
from ._policy_kernels import choose, pack_picked, tree_pick, tree_size


@njit(cache=True)
def _match(automaton, ids, state):
    """`RecycleIndex.match_length`: the suffix match, else 1 where M knows what follows the last token."""
    m = _suffix_match(automaton)
    if m > 0:
        return m
    last = state[LAST]
    return 1 if 0 <= last < ids.shape[0] and ids[last, 0] >= 0 else 0


@njit(cache=True)
def _propose(automaton, scratch, row, m, keep, budget):
    """`RecycleIndex.propose_tree(budget)` of one row into its row buffers; returns its nodes."""
    ids, score, keys, pair, pprob, calib, meta = m
    ints, floats, cand, cval, heap, found_ids, found_probs, out, est, state = row
    nb = suffix_tree(automaton, scratch, budget) if budget > 0 else 0
    buf = Scratch(*scratch)
    n = merged_tree(ids, score, keys, pair, pprob, calib, meta, state[PREV], state[LAST], buf.tree[0, :nb],
                    buf.tree[1, :nb], buf.probs[:nb], nb, keep, budget, ints, floats, cand, cval, heap, found_ids,
                    found_probs)
    for j in range(n):
        out[0, j], out[1, j], out[2, j] = ints[0, j], ints[1, j], ints[2, j]
        est[0, j], est[1, j] = floats[0, j], floats[1, j]
    state[PENDING] = n
    return n


@njit(cache=True)
def _draft_recycle_trees(automata, scratches, rows, m, keep, lens, max_new, max_nodes, pads, edges, accepted, rejected,
                        version, costs, table, seen, cal_edges, cal_accepted, cal_seen, prior, step_costs, tokens,
                        parents, probs, sizes, matches, depths, nodes):
    """`_fused_kernels._draft_trees` over merged trees (m: M's arrays ids, score, keys, pair, pprob, calib, meta)."""
    r = len(automata)
    for k in range(r):
        matches[k] = _match(automata[k], m[0], rows[k][9])
    choose(matches, edges, accepted, rejected, version, costs, table, seen, depths)
    top = 0
    best, pick, path, remap = np.empty(r, np.int64), np.empty(max_nodes, np.int64), np.empty(max_nodes, np.int64), \
        np.empty(max_nodes, np.int64)
    for k in range(r):
        nodes[k] = _propose(automata[k], scratches[k], rows[k], m, keep,
                            max(min(max_nodes, max_new - 1 - lens[k]), 0))
        out, est = rows[k][7], rows[k][8]
        c = 0 if cal_accepted.shape[0] == 1 else k  # one calibration, or each row its own
        best[k] = tree_size(est[1, :nodes[k]], cal_edges, cal_accepted[c], cal_seen[c], prior, step_costs)
        top = max(top, tree_pick(out[1, :nodes[k]], best[k], 0, depths[k], True, pick, path))
    fill = min(pads[top], max_nodes)  # the nodes the step's forward verifies anyway
    widest = 0
    for k in range(r):
        out, est = rows[k][7], rows[k][8]
        sizes[k] = tree_pick(out[1, :nodes[k]], best[k], fill, depths[k], True, pick, path)
        pack_picked(out[0], out[1], est[1], pick, sizes[k], tokens[k], parents[k], probs[k], remap)
        widest = max(widest, sizes[k])
    for k in range(r):
        for j in range(sizes[k], widest):
            tokens[k, j], parents[k, j], probs[k, j] = 0, -1, 0.0
    return widest


@njit(cache=True)
def accept_recycle_trees(targets, top_ids, top_probs, tokens, parents, sizes, probs, matches, depths, automata, rows,
                         recycled, edges, accepted, rejected, version, cal_edges, cal_accepted, cal_seen, eos, max_new,
                         lens, out, last, counts, bonus, paths, cols, done, totals):
    """`_fused_kernels.accept_trees`, with M learning every row's columns (top_ids, top_probs [r, N+1, k]: the
    root's context is the row's last two tokens, before the step's) and each row's index taking its gained tokens
    (`advance`). recycled: M's arrays ids, score, keys, pair, pprob, stamp, meta, calib. Returns as accept_trees."""
    r, n = tokens.shape
    if not suffix_room(automata, n + 1):
        return -1, False
    ids, score, keys, pair, pprob, stamp, meta, calib = recycled
    starts = np.empty(r, np.int64)
    for k in range(r):
        state = rows[k][9]
        update_step(ids, score, keys, pair, pprob, stamp, meta, state[PREV], state[LAST], tokens[k], parents[k],
                    sizes[k], top_ids[k], top_probs[k])
        starts[k] = lens[k]
    finished, in_place = accept_trees(targets, tokens, parents, sizes, probs, matches, depths, automata, edges,
                                      accepted, rejected, version, cal_edges, cal_accepted, cal_seen, eos, max_new,
                                      lens, out, last, counts, bonus, paths, cols, done, totals)
    for k in range(r):
        advance(calib, meta, rows[k][7], rows[k][8], rows[k][9], out[k, starts[k]:lens[k]], lens[k] - starts[k])
    return finished, in_place


@njit(cache=True)
def draft_recycle_trees(index, m, keep, rows, sizing, policy, cal, work, d):
    """`_fused_kernels.draft_trees` over merged trees (index: each row's automaton, scratch and `RecycleIndex` row;
    m: M's arrays ids, score, keys, pair, pprob, calib, meta; keep: the merge's least probability)."""
    automata, scratches, recycle_rows = index
    return _draft_recycle_trees(automata, scratches, recycle_rows, m, keep, rows.lens, rows.max_new, sizing.most,
                                sizing.pads, policy.edges, policy.accepted, policy.rejected, policy.version,
                                sizing.costs, sizing.table, sizing.seen, cal.edges, cal.accepted, cal.seen, cal.prior,
                                work.step_costs, d.tokens, d.parents, d.probs, d.sizes, d.matches, d.depths,
                                work.nodes)


@njit(cache=True)
def step_recycle_trees(targets, top_ids, top_probs, now, width, index, recycled, keep, policy, cal, rows, work, sizing,
                       later):
    """`_fused_kernels.step_trees` for merged trees: `accept_recycle_trees` of now's first `width` columns (top_ids,
    top_probs: the step's top-k after every column), then `draft_recycle_trees` into `later`. recycled: M's arrays
    ids, score, keys, pair, pprob, stamp, meta, calib."""
    automata, _, recycle_rows = index
    finished, in_place = accept_recycle_trees(
        targets, top_ids, top_probs, now.tokens[:, :width], now.parents[:, :width], now.sizes, now.probs[:, :width],
        now.matches, now.depths, automata, recycle_rows, recycled, policy.edges, policy.accepted, policy.rejected,
        policy.version, cal.edges, cal.accepted, cal.seen, rows.eos, rows.max_new, rows.lens, rows.out, rows.last,
        rows.counts, rows.bonus, work.paths, work.cols, rows.done, rows.totals)
    if finished != 0:
        return finished, in_place, 0
    m = (recycled[0], recycled[1], recycled[2], recycled[3], recycled[4], recycled[7], recycled[6])
    return 0, in_place, draft_recycle_trees(index, m, keep, rows, sizing, policy, cal, work, later)
