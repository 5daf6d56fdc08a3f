"""Numba kernels of the fused greedy chain step (`lookahead.fused`): a step's host work after the forward, in two
calls instead of some forty small Python and numpy operations.

`draft` is `ChainSizing.draft` over `NgramIndex`es (the policy's length, the fill up to the step's padded width);
`accept` is greedy acceptance, the policy's update (`DraftLength.update`), each row's gained tokens cut where plain
decoding stops (`Stopper.keep` without criteria) and the index's extension with them (`NgramIndex.extend`). Each
row's index is passed as its three arrays (typed lists: hist, table, state), which the kernels change in place.
"""
import numpy as np
from numba import njit, typed

from ._policy_kernels import choose, record
from .index import _kernels as NK

PTR, RUN, N, USED = NK.PTR, NK.RUN, NK.N, NK.USED


@njit(cache=True)
def draft(hists, states, lens, max_new, max_tokens, pads, edges, accepted, rejected, version, costs, table, seen,
          drafts, sizes, matches, budgets):
    """Each row's next chain draft into drafts [r, >= max_tokens] (zero past its size), sizes [r] and the match
    behind it, matches [r]; returns the widest draft. `lens` [r]: tokens each row has generated, of max_new;
    pads [max_tokens + 1]: the draft columns a step verifying n computes anyway (the target's `padded(n)`)."""
    r = len(states)
    for k in range(r):
        matches[k] = states[k][RUN] if states[k][PTR] >= 0 else 0
    choose(matches, edges, accepted, rejected, version, costs, table, seen, budgets)
    top = 0
    for k in range(r):
        budgets[k] = min(budgets[k], max_new - 1 - lens[k])
        top = max(top, budgets[k])
    upto = min(pads[top], max_tokens) if top > 0 else 0
    width = 0  # what the policy drafts: a row with a match drafts up to `upto`, the policy counts its budget
    for k in range(r):
        ask = max(min(upto, max_new - 1 - lens[k]) if matches[k] > 0 else 0, budgets[k])
        sizes[k] = NK.ngram_propose(hists[k], states[k], ask, drafts[k]) if ask > 0 else -1
        if sizes[k] >= 0:
            width = max(width, min(sizes[k], budgets[k]))
    fill = min(pads[width], max_tokens) if top > 0 else 0  # ... and its forward verifies anyway
    widest = 0
    for k in range(r):
        sizes[k] = min(sizes[k], max(budgets[k], fill)) if sizes[k] > 0 else 0
        widest = max(widest, sizes[k])
    for k in range(r):
        drafts[k, sizes[k]:widest] = 0
    return widest


@njit(cache=True)
def has_room(hists, tables, states, extra, max_ngram):
    """Whether every index takes `extra` more tokens without growing (the rule of `NgramIndex._reserve`)."""
    for k in range(len(hists)):
        if states[k][N] + extra > hists[k].shape[0]:
            return False
        if 2 * (states[k][USED] + (extra + 1) * max_ngram) > tables[k].shape[0]:
            return False
    return True


@njit(cache=True)
def accept(targets, drafts, sizes, matches, hists, tables, states, max_ngram, min_ngram, edges, accepted, rejected,
           version, eos, max_new, lens, out, last, counts, bonus, done, totals):
    """A verified step of r rows: targets [r, N+1] the target's argmax after the root and each draft column.

    Writes counts, bonus (the `Verdict`), each row's gained tokens into out[k, lens[k]:] (lens, last moved on),
    done [r]; adds the drafted and accepted tokens to totals [2]. Returns the rows done, or -1 (nothing changed)
    when an index must grow first."""
    r = drafts.shape[0]
    if not has_room(hists, tables, states, drafts.shape[1] + 1, max_ngram):
        return -1
    for k in range(r):
        a = 0
        while a < sizes[k] and drafts[k, a] == targets[k, a]:
            a += 1
        counts[k], bonus[k] = a, targets[k, a]
        totals[0] += sizes[k]
        totals[1] += a
    record(matches, sizes, counts, edges, accepted, rejected, version)
    finished = 0
    for k in range(r):
        start, keep = lens[k], min(counts[k] + 1, max_new - lens[k])
        stop = False
        for j in range(keep):
            t = drafts[k, j] if j < counts[k] else bonus[k]
            out[k, start + j] = t
            if not stop:
                for e in eos:
                    if t == e:
                        stop, keep = True, j + 1
                        break
            if stop:
                break
        lens[k] = start + keep
        last[k] = out[k, lens[k] - 1]
        done[k] = stop or lens[k] >= max_new
        finished += done[k]
        NK.ngram_extend(out[k, start:lens[k]], hists[k], tables[k], states[k], max_ngram, min_ngram)
    return finished


@njit(cache=True)
def kept(items, keep):
    """The typed list `items` without its entries where keep [len(items)] is False."""
    out = typed.List.empty_list(items._dtype)
    for k in range(len(items)):
        if keep[k]:
            out.append(items[k])
    return out


def warm_up() -> None:
    """Compile (or load from cache) the kernels on a non-empty input, one row (tuples) and more (typed lists)."""
    from .index.ngram import NgramIndex

    index = NgramIndex(4)
    index.extend(np.array([1, 2, 3, 1, 2], dtype=np.int64))
    for hists, tables, states in ((index._hist,), (index._table,), (index._state,)), (
            typed.List([index._hist]), typed.List([index._table]), typed.List([index._state])):
        _warm(hists, tables, states)
    for array in (index._hist, index._table, index._state):
        kept(typed.List([array]), np.ones(1, np.bool_))


def _warm(hists, tables, states) -> None:
    from .policy import _BUCKETS

    buckets = len(_BUCKETS)
    accepted, rejected, version = np.full(buckets, 3.0), np.ones(buckets), np.zeros(buckets, np.int64)
    drafts, lens, ints = np.zeros((1, 8), np.int64), np.zeros(1, np.int64), [np.zeros(1, np.int64) for _ in range(5)]
    widest = draft(hists, states, lens, 8, 4, np.array([0, 1, 3, 3, 7]), _BUCKETS, accepted, rejected, version,
                   np.array([1.0, 1.1, 1.2, 1.3, 1.4]), np.zeros(buckets, np.int64), np.full(buckets, -1), drafts,
                   *ints[:3])
    accept(np.zeros((1, widest + 1), np.int64), drafts[:, :widest], ints[0], ints[1], hists, tables, states, 4, 1,
           _BUCKETS, accepted, rejected, version, np.array([7]), 8, lens, np.zeros((1, 8), np.int64), *ints[2:],
           np.zeros(1, np.bool_), np.zeros(2, np.int64))
