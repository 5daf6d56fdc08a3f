"""Numba kernels of the fused greedy step (`lookahead.decode.fused`): a step's host work after the forward, in one call
(`step`, `step_suffix`, `step_trees`: the step's acceptance, then the next step's draft) instead of some forty small
Python and numpy operations.

Chains: `draft` is `ChainSizing.draft` over `NgramIndex`es (the policy's length, the fill up to the step's padded
width); `accept` is greedy acceptance, the policy's update (`DraftLength.update`), each row's gained tokens cut where
plain decoding stops (`Stopper.keep` without criteria) and the index's extension with them (`NgramIndex.extend`).
Trees: `draft_trees` and `accept_trees` do the same for `TreeSizing` over `SuffixIndex`es (best-first trees cut to
the size that pays, the calibration and the chain floor learned from the accepted paths). Each row's index is passed
as its arrays (typed lists, or tuples for one row), which the kernels change in place. The kernels the step calls
(`draft*`, `step*`) take the index's `kernel_state` and the step's state in named bundles (`Rows`, `Policy`,
`Sizing`, `Chains` or `Trees`, `Calibration`, `TreeWork`); the helpers under them take arrays.

What keeps the writes inside the arrays (the caller, `fused._Fused`, allocates them per `run_rows` call):
- the draft buffers, tokens (parents, probs) [r, max(budget, 1)]: a draft writes at most its buffer's width (the
  kernels cut what they ask an index for to it), so the budget never has to agree with the policy's tables;
- sizes <= the width the draft kernels return, which the next step passes back (`width`), so the step's views
  drafts[:, :width] hold every row's draft; paths [r, >= width] and cols [r, >= width + 1] hold an accepted path;
- out [r, max_new]: a row gains at most max_new - lens[k] tokens (`_gain`);
- the indexes: `accept*` first ask every row's index whether it takes width + 1 more tokens (`has_room`,
  `suffix_room`, the indexes' own `fits`) and change nothing when one does not (-1: the caller grows it and calls
  again); the index kernels check it again themselves.
"""
from collections import namedtuple

import numpy as np
from numba import njit, typed

from ..index import _kernels as NK
from ..index import _suffix_build as SB
from ..index._suffix_draft import Scratch, suffix_chain, suffix_tree
from ..verify._kernels import greedy_chain, greedy_tree
from ._policy_kernels import bucket, choose, pack_picked, record, tree_pick, tree_record, tree_size

PTR, RUN = NK.PTR, NK.RUN

# What the step kernels take, in bundles (numba types each as a tuple; `fused._Fused` builds them once per `run_rows`)
Policy = namedtuple("Policy", "edges accepted rejected version")  # the length policy's tables [P, buckets], one
# policy for every row (P = 1, `DraftLength.counts`) or one per row (`policy.Stacked`)
Sizing = namedtuple("Sizing", "most pads costs table seen widths")  # draft tokens or nodes a row asks at most, the
# columns a step verifying n computes anyway (pads [most + 1]), the step costs of this many rows and the best lengths
# (`policy.tables`), and what a chain step of the whole batch costs at each width (empty: each row as its policy
# asks, `generate`; the server's `StepTimes.costs`: `_batch_cut`)
Rows = namedtuple("Rows", "eos max_new lens out last counts bonus done totals budgets")  # the rows' decoding: eos ids,
# most new tokens, tokens so far [r], out [r, max_new], newest token, the step's verdict (counts, bonus), done [r],
# drafted and accepted tokens [2], each row's draft budget [r]
Chains = namedtuple("Chains", "tokens sizes matches")  # a step's chain drafts [r, width], sizes [r], matches [r]
Trees = namedtuple("Trees", "tokens parents probs sizes matches depths")  # a step's trees, and the chain floor's
# depths [r]
Calibration = namedtuple("Calibration", "edges accepted seen prior")  # `TreeCalibration`'s tables [P, bins]
TreeWork = namedtuple("TreeWork", "paths cols nodes step_costs")  # an accepted path [r, width] and its columns
# [r, width + 1], each row's proposed nodes [r], the costs of a step's nodes [most + 1]


@njit(cache=True)
def _draft(hists, states, lens, max_new, max_tokens, pads, edges, accepted, rejected, version, costs, table, seen,
          widths, drafts, sizes, matches, budgets):
    """Each row's next chain draft into drafts [r, >= max_tokens] (zero past its size; a row writes at most drafts'
    width, `ngram_propose`), sizes [r] and the match behind it, matches [r]; returns the widest draft. `lens` [r]:
    tokens each row has generated, of max_new; pads [max_tokens + 1]: the draft columns a step verifying n computes
    anyway (the target's `padded(n)`)."""
    for k in range(len(states)):
        matches[k] = states[k][RUN] if states[k][PTR] >= 0 else 0
    upto = _budgets(matches, lens, max_new, max_tokens, pads, edges, accepted, rejected, version, costs, table, seen,
                    budgets)
    for k in range(len(states)):
        ask = _ask(k, upto, matches, budgets, lens, max_new)
        sizes[k] = NK.ngram_propose(hists[k], states[k], ask, drafts[k]) if ask > 0 else -1
    widest = _cut(sizes, budgets, max_tokens, pads, drafts)
    return _batch_cut(sizes, matches, edges, accepted, rejected, widths, drafts, widest)


@njit(cache=True)
def _draft_suffix(automata, scratches, lens, max_new, max_tokens, pads, edges, accepted, rejected, version, costs,
                 table, seen, widths, drafts, sizes, matches, budgets):
    """`_draft` from `SuffixIndex`es (their greedy paths, `SuffixIndex.propose`); a row asks for at most drafts'
    width (`suffix_chain` writes at most its scratch's chain)."""
    for k in range(len(automata)):
        matches[k] = _suffix_match(automata[k])
    upto = _budgets(matches, lens, max_new, max_tokens, pads, edges, accepted, rejected, version, costs, table, seen,
                    budgets)
    for k in range(len(automata)):
        ask = min(_ask(k, upto, matches, budgets, lens, max_new), drafts.shape[1])
        sizes[k] = suffix_chain(automata[k], scratches[k], ask) if ask > 0 else -1
        chain = Scratch(*scratches[k]).chain
        for j in range(sizes[k]):
            drafts[k, j] = chain[j]
    widest = _cut(sizes, budgets, max_tokens, pads, drafts)
    return _batch_cut(sizes, matches, edges, accepted, rejected, widths, drafts, widest)


@njit(cache=True)
def _budgets(matches, lens, max_new, max_tokens, pads, edges, accepted, rejected, version, costs, table, seen,
             budgets):
    """Each row's draft length as the policy chooses it (budgets [r], cut to the row's room); returns how far a row
    with a match drafts (the step's width for the longest budget), 0 when no row drafts."""
    choose(matches, edges, accepted, rejected, version, costs, table, seen, budgets)
    top = 0
    for k in range(matches.shape[0]):
        budgets[k] = min(budgets[k], max_new - 1 - lens[k])
        top = max(top, budgets[k])
    return min(pads[top], max_tokens) if top > 0 else 0


@njit(cache=True)
def _ask(k, upto, matches, budgets, lens, max_new):
    """How many tokens row k asks its index for: up to `upto` when it has a match, at least its budget."""
    return max(min(upto, max_new - 1 - lens[k]) if matches[k] > 0 else 0, budgets[k])


@njit(cache=True)
def _cut(sizes, budgets, max_tokens, pads, drafts):
    """Cut each row's proposal (sizes [r]: its length, -1 where it asked for none) to its budget or the width the
    step computes for the policy's drafts, whichever is more; zero drafts past the sizes; return the widest."""
    width = 0  # what the policy drafts ...
    for k in range(sizes.shape[0]):
        if sizes[k] >= 0:
            width = max(width, min(sizes[k], budgets[k]))
    fill = min(pads[width], max_tokens) if budgets.max() > 0 else 0  # ... and what its forward verifies anyway
    widest = 0
    for k in range(sizes.shape[0]):
        sizes[k] = min(sizes[k], max(budgets[k], fill)) if sizes[k] > 0 else 0
        widest = max(widest, sizes[k])
    for k in range(sizes.shape[0]):
        drafts[k, sizes[k]:widest] = 0
    return widest


@njit(cache=True)
def _batch_cut(sizes, matches, edges, accepted, rejected, widths, drafts, widest):
    """The server's width for the whole batch (`policy.batch_width`, which `serve.engine` takes on its own path): the
    draft columns w < len(widths) with the most tokens expected per unit of cost, widths[w] what the batch's step
    costs at width w (`StepTimes.costs`); row k drafts min(w, sizes[k]) tokens, each accepted with its policy's
    chance behind its match given the one before. Every row's draft is cut to it (zero past its size); returns the
    widest. Empty widths: no cut (`widest` as it is)."""
    if widths.shape[0] == 0:
        return widest
    r, shared = sizes.shape[0], accepted.shape[0] == 1
    q = np.empty(r)
    for k in range(r):
        p, b = 0 if shared else k, bucket(edges, matches[k])
        q[k] = min(max(accepted[p, b] / (accepted[p, b] + rejected[p, b]), 0.0), 0.999)
    best, best_value = 0, -1.0
    for w in range(min(widths.shape[0], widest + 1)):
        gain = 0.0
        for k in range(r):
            gain += (1.0 - q[k] ** (min(w, sizes[k]) + 1)) / (1.0 - q[k])
        if gain / widths[w] > best_value:  # the narrowest of equals
            best, best_value = w, gain / widths[w]
    cut = 0
    for k in range(r):
        sizes[k] = min(sizes[k], best)
        cut = max(cut, sizes[k])
    for k in range(r):
        drafts[k, sizes[k]:widest] = 0
    return cut


@njit(cache=True)
def _suffix_match(arrays):
    """`SuffixIndex.match_length` of the automaton `arrays`."""
    sam = SB.Automaton(*arrays)
    link = sam.st[sam.meta[SB.CUR], SB.LINK]
    return sam.st[link, SB.LEN] if link > 0 else 0


@njit(cache=True)
def has_room(hists, tables, states, extra, max_ngram):
    """Whether every index takes `extra` more tokens without growing (`NgramIndex`'s own rule, `fits`)."""
    for k in range(len(hists)):
        if not NK.fits(hists[k], tables[k], states[k], extra, max_ngram):
            return False
    return True


@njit(cache=True)
def suffix_room(automata, extra):
    """Whether every suffix index takes `extra` more tokens without growing (`SuffixIndex`'s own rule, `fits`)."""
    for k in range(len(automata)):
        if not SB.fits(SB.Automaton(*automata[k]), extra):
            return False
    return True


@njit(cache=True)
def accept(targets, drafts, sizes, matches, hists, tables, states, max_ngram, min_ngram, edges, accepted, rejected,
           version, eos, max_new, lens, out, last, counts, bonus, done, totals):
    """A verified step of r rows: targets [r, N+1] the target's argmax after the root and each draft column of
    drafts [r, N] (sizes <= N).

    Writes counts, bonus (the `Verdict`), each row's gained tokens into out[k, lens[k]:] (lens, last moved on),
    done [r]; adds the drafted and accepted tokens to totals [2]. Returns the rows done, or -1 (nothing changed)
    when an index must grow first."""
    if not has_room(hists, tables, states, drafts.shape[1] + 1, max_ngram):
        return -1
    finished, starts = _accept_chains(targets, drafts, sizes, matches, edges, accepted, rejected, version, eos,
                                      max_new, lens, out, last, counts, bonus, done, totals)
    for k in range(drafts.shape[0]):
        NK.ngram_extend(out[k, starts[k]:lens[k]], hists[k], tables[k], states[k], max_ngram, min_ngram)
    return finished


@njit(cache=True)
def accept_suffix(targets, drafts, sizes, matches, automata, edges, accepted, rejected, version, eos, max_new, lens,
                  out, last, counts, bonus, done, totals):
    """`accept` for `SuffixIndex`es."""
    if not suffix_room(automata, drafts.shape[1] + 1):
        return -1
    finished, starts = _accept_chains(targets, drafts, sizes, matches, edges, accepted, rejected, version, eos,
                                      max_new, lens, out, last, counts, bonus, done, totals)
    for k in range(drafts.shape[0]):
        SB.suffix_extend(out[k, starts[k]:lens[k]], automata[k])
    return finished


@njit(cache=True)
def _accept_chains(targets, drafts, sizes, matches, edges, accepted, rejected, version, eos, max_new, lens, out, last,
                   counts, bonus, done, totals):
    """Greedy acceptance of chains (counts, bonus), counted in totals, what it teaches the policy, and each row's
    gained tokens (`_gain`); returns the rows done and where each row's gained tokens start in `out`."""
    r = drafts.shape[0]
    greedy_chain(drafts, sizes, targets, counts, bonus)  # the rule every greedy chain is accepted by
    for k in range(r):
        totals[0] += sizes[k]
        totals[1] += counts[k]
    record(matches, sizes, counts, edges, accepted, rejected, version)
    finished, path, starts = 0, np.arange(drafts.shape[1]), np.empty(r, np.int64)
    for k in range(r):
        starts[k] = _gain(k, drafts, path, counts[k], bonus[k], eos, max_new, lens, out, last, done)
        finished += done[k]
    return finished, starts


@njit(cache=True)
def _gain(k, tokens, path, count, bonus, eos, max_new, lens, out, last, done):
    """Row k's gained tokens: tokens[path[:count]] then bonus, cut where plain decoding stops (an eos id, max_new
    tokens), written at out[k, lens[k]:] (out [r, >= max_new]: at most max_new - lens[k] of them); lens, last and
    done of the row are moved on. Returns where they start."""
    start, keep = lens[k], min(count + 1, max_new - lens[k])
    stop = False
    for j in range(keep):
        t = tokens[k, path[j]] if j < count else bonus
        out[k, start + j] = t
        for e in eos:
            if t == e:
                stop = True
        if stop:
            keep = j + 1
            break
    lens[k] = start + keep
    last[k] = out[k, lens[k] - 1]
    done[k] = stop or lens[k] >= max_new
    return start


@njit(cache=True)
def _draft_trees(automata, scratches, lens, max_new, max_nodes, pads, edges, accepted, rejected, version, costs, table,
                seen, cal_edges, cal_accepted, cal_seen, prior, step_costs, tokens, parents, probs, sizes, matches,
                depths, nodes):
    """Each row's best-first tree, its nodes that pay and the chain floor's path (`TreeSizing.draft`, `tree_pick`),
    packed into tokens, parents [r, >= max_nodes] (padding: 0, children of the root; a row writes at most their
    width) and probs, with sizes [r], the match behind it and the floor's depth (depths [r]); nodes [r] is scratch.
    pads [max_nodes + 1], step_costs [max_nodes + 1]. Returns the widest tree."""
    r = len(automata)
    for k in range(r):
        matches[k] = _suffix_match(automata[k])
    choose(matches, edges, accepted, rejected, version, costs, table, seen, depths)
    top, most = 0, min(max_nodes, tokens.shape[1])
    best, pick, path, remap = np.empty(r, np.int64), np.empty(most, np.int64), np.empty(most, np.int64), \
        np.empty(most, np.int64)
    for k in range(r):
        nodes[k] = suffix_tree(automata[k], scratches[k], max(min(most, max_new - 1 - lens[k]), 0))
        buf = Scratch(*scratches[k])
        c = 0 if cal_accepted.shape[0] == 1 else k  # one calibration, or each row its own
        best[k] = tree_size(buf.probs[:nodes[k]], cal_edges, cal_accepted[c], cal_seen[c], prior, step_costs)
        top = max(top, tree_pick(buf.tree[1, :nodes[k]], best[k], 0, depths[k], False, pick, path))
    fill = min(pads[top], most)  # the nodes the step's forward verifies anyway
    widest = 0
    for k in range(r):
        buf = Scratch(*scratches[k])
        sizes[k] = tree_pick(buf.tree[1, :nodes[k]], best[k], fill, depths[k], False, pick, path)
        pack_picked(buf.tree[0], buf.tree[1], buf.probs, pick, sizes[k], tokens[k], parents[k], probs[k], remap)
        widest = max(widest, sizes[k])
    for k in range(r):
        for j in range(sizes[k], widest):
            tokens[k, j], parents[k, j], probs[k, j] = 0, -1, 0.0
    return widest


@njit(cache=True)
def accept_trees(targets, tokens, parents, sizes, probs, matches, depths, automata, edges, accepted, rejected, version,
                 cal_edges, cal_accepted, cal_seen, eos, max_new, lens, out, last, counts, bonus, paths, cols, done,
                 totals):
    """A verified tree step of r rows (targets [r, N+1], sizes <= N): the longest agreeing path of each row (paths
    [r, >= N], counts, bonus; cols [r, >= N+1] its columns, root first), the calibration and the chain floor taught,
    each row's gained tokens cut where plain decoding stops and added to its index (lens, last, done as `accept`).
    Returns the rows done and, second, whether every row accepted its first nodes in order; -1 (nothing changed)
    when an index must grow."""
    r, n = tokens.shape
    if not suffix_room(automata, n + 1):
        return -1, False
    greedy_tree(tokens, parents, sizes, targets, paths, counts, bonus)
    in_place, width = True, 1
    for k in range(r):
        cols[k, :] = 0
        for a in range(counts[k]):
            cols[k, a + 1] = paths[k, a] + 1
            in_place &= paths[k, a] == a
        width = max(width, counts[k] + 1)
        totals[0] += sizes[k]
        totals[1] += counts[k]
    floors, followed = np.zeros(r, np.int64), np.zeros(r, np.int64)
    tree_record(parents, sizes, probs, depths, cols[:, :width], counts, cal_edges, cal_accepted, cal_seen, floors,
                followed, np.zeros(n, np.bool_))
    record(matches, floors, followed, edges, accepted, rejected, version)
    finished = 0
    for k in range(r):
        start = _gain(k, tokens, paths[k], counts[k], bonus[k], eos, max_new, lens, out, last, done)
        finished += done[k]
        SB.suffix_extend(out[k, start:lens[k]], automata[k])
    return finished, in_place


@njit(cache=True)
def draft(index, rows, sizing, policy, d):
    """The first step's chain drafts from `NgramIndex`es (index: their hists, tables, states) into d (`Chains`);
    returns the widest (`_draft`)."""
    hists, _, states = index
    return _draft(hists, states, rows.lens, rows.max_new, sizing.most, sizing.pads, policy.edges, policy.accepted,
                  policy.rejected, policy.version, sizing.costs, sizing.table, sizing.seen, sizing.widths, d.tokens,
                  d.sizes, d.matches, rows.budgets)


@njit(cache=True)
def step(targets, now, width, index, ngram, policy, rows, sizing, later):
    """One call a step: `accept` of this step's chains (the first `width` columns of now's buffer (`Chains`): a
    whole buffer has one type however wide the step, where numba types a view of its first columns by its layout),
    then, when no row is done, `draft` of the next step's into `later`. ngram: (max_ngram, min_ngram). Returns (rows
    done, or -1 as `accept`; the next draft's width)."""
    hists, tables, states = index
    finished = accept(targets, now.tokens[:, :width], now.sizes, now.matches, hists, tables, states, ngram[0],
                      ngram[1], policy.edges, policy.accepted, policy.rejected, policy.version, rows.eos,
                      rows.max_new, rows.lens, rows.out, rows.last, rows.counts, rows.bonus, rows.done, rows.totals)
    if finished != 0:
        return finished, 0
    return 0, draft(index, rows, sizing, policy, later)


@njit(cache=True)
def draft_suffix(index, rows, sizing, policy, d):
    """`draft` from `SuffixIndex`es (index: their automata and scratches)."""
    automata, scratches = index
    return _draft_suffix(automata, scratches, rows.lens, rows.max_new, sizing.most, sizing.pads, policy.edges,
                         policy.accepted, policy.rejected, policy.version, sizing.costs, sizing.table, sizing.seen,
                         sizing.widths, d.tokens, d.sizes, d.matches, rows.budgets)


@njit(cache=True)
def step_suffix(targets, now, width, index, policy, rows, sizing, later):
    """`step` for chains from `SuffixIndex`es (`accept_suffix`, then `draft_suffix`)."""
    finished = accept_suffix(targets, now.tokens[:, :width], now.sizes, now.matches, index[0], policy.edges,
                             policy.accepted, policy.rejected, policy.version, rows.eos, rows.max_new, rows.lens,
                             rows.out, rows.last, rows.counts, rows.bonus, rows.done, rows.totals)
    if finished != 0:
        return finished, 0
    return 0, draft_suffix(index, rows, sizing, policy, later)


@njit(cache=True)
def draft_trees(index, rows, sizing, policy, cal, work, d):
    """The first step's trees from `SuffixIndex`es into d (`Trees`); returns the widest (`_draft_trees`)."""
    automata, scratches = index
    return _draft_trees(automata, scratches, rows.lens, rows.max_new, sizing.most, sizing.pads, policy.edges,
                        policy.accepted, policy.rejected, policy.version, sizing.costs, sizing.table, sizing.seen,
                        cal.edges, cal.accepted, cal.seen, cal.prior, work.step_costs, d.tokens, d.parents, d.probs,
                        d.sizes, d.matches, d.depths, work.nodes)


@njit(cache=True)
def step_trees(targets, now, width, index, policy, cal, rows, work, sizing, later):
    """`step` for trees (`accept_trees` of now's first `width` columns, then `draft_trees` into `later`). Returns
    (rows done or -1, whether every row accepted its first nodes in order, the next tree's width)."""
    finished, in_place = accept_trees(targets, now.tokens[:, :width], now.parents[:, :width], now.sizes,
                                      now.probs[:, :width], now.matches, now.depths, index[0], policy.edges,
                                      policy.accepted, policy.rejected, policy.version, cal.edges, cal.accepted,
                                      cal.seen, rows.eos, rows.max_new, rows.lens, rows.out, rows.last, rows.counts,
                                      rows.bonus, work.paths, work.cols, rows.done, rows.totals)
    if finished != 0:
        return finished, in_place, 0
    return 0, in_place, draft_trees(index, rows, sizing, policy, cal, work, later)


@njit(cache=True)
def kept(items, keep):
    """The typed list `items` without its entries where keep [len(items)] is False."""
    out = typed.List.empty_list(items._dtype)
    for k in range(len(items)):
        if keep[k]:
            out.append(items[k])
    return out
