"""Numba kernels that draft from the suffix automaton of `_suffix_build`: the greedy chain and the best-first tree.
Reference: SuffixDecoding (Oliaro et al. 2024).

A draft search walks candidate rows, each a draft node waiting to be placed (the fields of `Scratch.cand`):
  C_TOK    its token
  C_PAR    the index of its parent node (-1: a child of the last token held)
  C_STATE  the SAM state of the text + its path (-1: copying hist[C_POS:]; GUESSING: the root of a guess)
  C_POS    in a state, the next position of the occurrence followed (-1: none); copying, where the copy is
  C_CTX    the length of the context it matched
  C_SIB    its next sibling, less probable (-1: none)
and `cprob` holds each row's path probability. A node's children are ranked by its continuations' shares of the
occurrences plus small bonuses (`_offer`); `_suffix_reference.rank` states the same rule in plain Python.

The entry points take the automaton and the scratch as plain tuples, and no kernel counts references (see
`_suffix_build`).

Writes stay inside the scratch whatever its size, by checks in the kernels (a few comparisons a call): a candidate
row is pushed only while count < cand's rows (`_offer`, `_guesses`, `_expand`; a full cand cuts the draft short);
each candidate row enters the heap at most once, so the heap never holds more than cand's rows; and the entry points
write at most as many tokens or nodes as chain, tree and probs hold, whatever the budget asks.
`SuffixIndex._buffers` sizes the scratch so that neither limit binds for the budgets it was made for.
"""
from typing import NamedTuple

import numpy as np

from ._suffix_build import (CNT, CUR, DEG, GK, GUESS, HEAD, LEN, LINK, MAX_WALK, MAXB, MAXG, MISS, N, NEXT, PARAMS,
                            PTR, TGT, TOK, Automaton, earlier_end, find_edge, first_end, hit_prob, kernel, occurrences,
                            ranks)

C_TOK, C_PAR, C_STATE, C_POS, C_CTX, C_SIB = 0, 1, 2, 3, 4, 5
GUESSING = -2  # candidate state of the root of a draft from a never-seen token: its children are guesses
# extra shares: following the copy in progress; ties go to the most recent occurrence's, then the first's
FOLLOW_BONUS, RECENT_BONUS, FIRST_BONUS = 0.3, 0.05, 0.02


class Scratch(NamedTuple):
    """Buffers of a draft search, owned by the caller: candidate rows and their path probabilities, the heap of the
    tree search, and the outputs (chain tokens; tree tokens and parents; tree node probabilities)."""

    cand: np.ndarray  # int32[R, 6]
    cprob: np.ndarray  # float64[R]
    heap: np.ndarray  # int32[R]
    chain: np.ndarray  # int64[B]
    tree: np.ndarray  # int64[2, B]
    probs: np.ndarray  # float64[B]


@kernel(inline="always")
def _push(buf, count, tok, parent, state, pos, ctx, q):
    """Write candidate row `count`: every caller first checks count < cand's rows (row 0: cand has one at least)."""
    cand = buf.cand
    cand[count, C_TOK], cand[count, C_PAR], cand[count, C_STATE], cand[count, C_POS] = tok, parent, state, pos
    cand[count, C_CTX], buf.cprob[count] = ctx, q
    return count + 1


@kernel(inline="always")
def _offer(sam, buf, count, tok, y, node, votes):
    """Push continuation tok (state y) of `node` = (q, pos, m, parent) with q times its share of the occurrences,
    plus the bonuses; `votes` = (occurrences, the token after the most recent one, the token after the first)."""
    q, pos, m, parent = node
    occ, rec, first = votes
    follow = pos >= 0 and sam.hist[pos] == tok
    share = min(sam.st[y, CNT] / occ, 1.0) + RECENT_BONUS * (tok == rec) + FIRST_BONUS * (tok == first)
    p = q * (share + FOLLOW_BONUS * follow) / (1.0 + RECENT_BONUS + FIRST_BONUS + FOLLOW_BONUS * (pos >= 0))
    if p < sam.stats[PARAMS, 0] or count >= buf.cand.shape[0]:
        return count
    return _push(buf, count, tok, parent, y, pos + 1 if follow else -1, m + 1, p)


@kernel(inline="always")
def _branch(sam, buf, count, x, node):
    """Push the continuations of state x: its first max_branch edges (the newest continuations), plus those of
    its most recent and of its first occurrence when they were not among them."""
    hist, st, ed = sam.hist, sam.st, sam.ed
    end = earlier_end(sam, x)
    rec, first = hist[end] if end >= 0 else -1, hist[first_end(sam, x)]
    votes = (occurrences(sam, x), rec, first)
    seen_rec, seen_first = rec < 0, False
    e, k = st[x, HEAD], 0
    while e >= 0 and k < sam.meta[MAXB]:
        tok = ed[e, TOK]
        count = _offer(sam, buf, count, tok, ed[e, TGT], node, votes)
        seen_rec, seen_first = seen_rec or tok == rec, seen_first or tok == first
        e, k = ed[e, NEXT], k + 1
    if not seen_rec:
        count = _offer(sam, buf, count, rec, ed[find_edge(sam, x, rec), TGT], node, votes)
    if not seen_first and first != rec:
        count = _offer(sam, buf, count, first, ed[find_edge(sam, x, first), TGT], node, votes)
    return count


@kernel
def _guesses(sam, buf, row, parent, p, start, count):
    """Push the frequent tokens not already in cand[start:count] as continuations, each with its learned hit rate
    in the rows from `row` (shrunk to its share of the tokens held) but ranked after those already there (copies
    come first); each goes on as a 1-token match would."""
    stats, top, cand, cprob = sam.stats, sam.top, buf.cand, buf.cprob
    w, cap = stats[PARAMS, 1], 1.0
    for i in range(start, count):
        cap = min(cap, cprob[i])
    for r in range(ranks(sam, row)):
        if top[r, 0] < 0 or count >= cand.shape[0]:
            break
        q = min(p * (stats[row + r, 1] + w * top[r, 1] / sam.meta[N]) / (stats[row + r, 0] + w), cap)
        dup = False
        for i in range(start, count):
            dup = dup or cand[i, C_TOK] == top[r, 0]
        if q >= stats[PARAMS, 0] and not dup:
            count = _push(buf, count, top[r, 0], parent, top[r, 2], -1, 1, q)
    return count


@kernel(inline="always")
def _expand(sam, buf, c, parent, p, count):
    """Push the continuations of candidate row c (path probability p, node index `parent`) after `count`."""
    hist, st, ed, meta, cand = sam.hist, sam.st, sam.ed, sam.meta, buf.cand
    n = meta[N]
    x, pos, m = cand[c, C_STATE], cand[c, C_POS], cand[c, C_CTX]
    if x == GUESSING:
        return _guesses(sam, buf, GUESS, parent, p, count, count)
    if x < 0 and pos >= n:  # a copy that caught up with the text goes on from the text's length-m suffix
        x, k = meta[CUR], 0
        while st[x, LINK] >= 0 and st[st[x, LINK], LEN] >= m and k < MAX_WALK:
            x, k = st[x, LINK], k + 1
    if x < 0:
        q, tok, y, pos = p * hit_prob(sam, m, 1), hist[pos], -1, pos + 1
    else:
        k = 0
        while x > 0 and st[x, DEG] == 0 and k < MAX_WALK:  # no continuation: back off to a shorter suffix
            x, k = st[x, LINK], k + 1
        if x <= 0 or st[x, DEG] == 0:
            return count
        m, occ, pos = min(m, st[x, LEN]), occurrences(sam, x), pos if pos < n else -1
        q = p * hit_prob(sam, m, occ)
        if st[x, DEG] > 1:
            return _branch(sam, buf, count, x, (q, pos, m, parent))
        e = st[x, HEAD]
        if occ > 1:  # one continuation, seen several times: stay in the automaton
            tok, y = ed[e, TOK], ed[e, TGT]
            pos = pos + 1 if pos >= 0 and hist[pos] == tok else -1
        else:  # a single occurrence: copy what followed it
            end = earlier_end(sam, x)
            tok, y, pos = hist[end], -1, end + 1
    if q < sam.stats[PARAMS, 0] or count >= cand.shape[0]:
        return count
    return _push(buf, count, tok, parent, y, pos, m + 1, q)


@kernel(inline="always")
def _children(sam, buf, c, parent, start):
    """Push the continuations of candidate c from row `start`, most probable first (stable), each linked to its
    next sibling. Returns the end of the block."""
    end = _expand(sam, buf, c, parent, buf.cprob[c], start)
    return _order(buf, start, end)


@kernel
def _root_children(sam, buf):
    """`_children` of the root (row 0, pushed from row 1), with guesses beside the known continuations: the next
    token may be none of them."""
    cand = buf.cand
    end = _expand(sam, buf, 0, -1, 1.0, 1)
    if cand[0, C_STATE] > 0 and sam.meta[MAXG] >= 4:
        miss = 1.0 - hit_prob(sam, cand[0, C_CTX], occurrences(sam, cand[0, C_STATE]))
        end = _guesses(sam, buf, MISS, -1, miss, 1, end)
    return _order(buf, 1, end)


@kernel(inline="always")
def _order(buf, start, end):
    """Sort cand[start:end] most probable first (stable) and link each row to its next sibling; returns end."""
    cand, cprob = buf.cand, buf.cprob
    for i in range(start + 1, end):
        j = i
        while j > start and cprob[j] > cprob[j - 1]:
            for col in range(C_SIB):
                cand[j, col], cand[j - 1, col] = cand[j - 1, col], cand[j, col]
            cprob[j], cprob[j - 1] = cprob[j - 1], cprob[j]
            j -= 1
    for i in range(start, end):
        cand[i, C_SIB] = i + 1 if i + 1 < end else -1
    return end


@kernel(inline="always")
def _root(sam, buf):
    """Candidate row 0: the whole text, matched by its longest recurring suffix, or guessing when its last token
    was never seen before (False if there is no text, or nothing recurs and guesses are off)."""
    st, meta = sam.st, sam.meta
    s = st[meta[CUR], LINK] if meta[N] > 0 else -1
    if s > 0:
        _push(buf, 0, -1, -1, s, meta[PTR], st[s, LEN], 1.0)
    elif meta[N] > 0 and meta[MAXG] > 0:
        _push(buf, 0, -1, -1, GUESSING, -1, 0, 1.0)
    return s > 0 or (meta[N] > 0 and meta[MAXG] > 0)


@kernel
def suffix_chain(arrays, scratch, max_tokens):
    """Greedy path: repeatedly take the most probable continuation while its path probability is >= min_prob.
    Writes the tokens into scratch's chain; returns how many (at most chain's length, whatever max_tokens asks)."""
    sam, buf = Automaton(*arrays), Scratch(*scratch)
    max_tokens = min(max_tokens, buf.chain.shape[0])
    if max_tokens <= 0 or not _root(sam, buf):
        return 0
    c, end, count = 0, 1, 0
    while count < max_tokens:
        start = end
        end = _children(sam, buf, c, count - 1, start) if count else _root_children(sam, buf)
        if end == start:
            break
        buf.chain[count] = buf.cand[start, C_TOK]
        c, count = start, count + 1
    return count


@kernel(inline="always")
def _before(cprob, a, b):
    """Whether candidate a leaves the heap before b: more probable, or as probable and pushed first."""
    return cprob[a] > cprob[b] or (cprob[a] == cprob[b] and a < b)


@kernel(inline="always")
def _heap_push(buf, size, c):
    """Push candidate row c: size < heap's length, since each row enters the heap once (heap and cand have as many
    rows)."""
    heap, cprob = buf.heap, buf.cprob
    i = size
    heap[i] = c
    while i > 0 and _before(cprob, heap[i], heap[(i - 1) >> 1]):
        heap[i], heap[(i - 1) >> 1] = heap[(i - 1) >> 1], heap[i]
        i = (i - 1) >> 1
    return size + 1


@kernel(inline="always")
def _heap_pop(buf, size):
    heap, cprob = buf.heap, buf.cprob
    top, size, i = heap[0], size - 1, 0
    heap[0] = heap[size]
    while 2 * i + 1 < size:
        j = 2 * i + 1
        if j + 1 < size and _before(cprob, heap[j + 1], heap[j]):
            j += 1
        if _before(cprob, heap[i], heap[j]):
            break
        heap[i], heap[j] = heap[j], heap[i]
        i = j
    return top, size


@kernel
def suffix_tree(arrays, scratch, max_nodes):
    """Best-first draft tree: repeatedly add the most probable pending continuation. The heap holds only the best
    child not yet added of each node (siblings are sorted), so it stays O(max_nodes).

    Writes node i as tree[:, i] = (token, parent node or -1) and its path probability as probs[i] (non-increasing);
    returns the number of nodes (at most tree's and probs' length, whatever max_nodes asks). Parents precede
    children, and following each node's first child gives the `suffix_chain` path.
    """
    sam, buf = Automaton(*arrays), Scratch(*scratch)
    max_nodes = min(max_nodes, buf.tree.shape[1], buf.probs.shape[0])
    if max_nodes <= 0 or not _root(sam, buf):
        return 0
    end = _root_children(sam, buf)
    size, nodes = (_heap_push(buf, 0, 1) if end > 1 else 0), 0
    while nodes < max_nodes and size > 0:
        c, size = _heap_pop(buf, size)
        buf.tree[0, nodes], buf.tree[1, nodes] = buf.cand[c, C_TOK], buf.cand[c, C_PAR]
        buf.probs[nodes] = buf.cprob[c]
        if buf.cand[c, C_SIB] >= 0:
            size = _heap_push(buf, size, buf.cand[c, C_SIB])
        start = end
        end = _children(sam, buf, c, nodes, start)
        if end > start:
            size = _heap_push(buf, size, start)
        nodes += 1
    return nodes
