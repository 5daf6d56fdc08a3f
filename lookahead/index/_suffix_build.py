"""Numba kernels that build the suffix index: an online suffix automaton (SAM) over the tokens held, the counts and
positions of its states, the statistics its drafts are scored with, and the most frequent tokens.
Reference: Blumer et al. 1985 (the suffix automaton, built online). Drafting over it is in `_suffix_draft`.

Layout shared with `suffix.SuffixIndex` (every array is owned by the caller), the fields of `Automaton`:
  hist   int32[cap]        the tokens held, hist[:n]
  st     int32[S, 9]       one row per state: LEN, LINK, CNT, LAST, PREV, FIRST, HEAD, DEG, FIRSTR
    LEN, LINK  length of the longest string of the state, its suffix link (-1 for the root)
    CNT        occurrences of its strings; LAST, PREV the two most recent ends, FIRST the earliest (ends are
               exclusive: the token after an occurrence is hist[end])
    HEAD, DEG  first outgoing edge (-1: none), number of outgoing edges
    FIRSTR     the earliest end after BOUND (none yet if <= BOUND): the first occurrence in the current request
  ed     int32[E, 4]       edges: TOK, TGT, NEXT (next edge of the same state, -1 ends the list), SRC
  table  int32[T]          open-addressing hash (SRC, TOK) -> edge id, -1 = empty (T a power of two)
  meta   int64[10]         N tokens, NS states, NE edges, CUR state of the whole text, MAXB max_branch,
                           PTR end of the occurrence the text is copying (-1: none), RUN tokens it agreed for,
                           CURSOR where the last copy broke off, MAXG guesses offered after a never-seen token
                           (a quarter of them beside the continuations of a recurring suffix), BOUND
                           where the current request starts (tokens before it are background: a Memory)
  stats  float64[NB*NO+2+2*GK, 3]
    rows < NB*NO   per (match length, occurrences) bucket: decayed (trials, hits, -) of "the next token was a
                   known continuation of the longest recurring suffix"
    row PARAMS     min_prob, prior_weight, decay
    row VOTE       decayed hits of the continuations of the most recent and of the first occurrence
    rows GUESS+r   decayed (trials, hits, -) of "the token after a never-seen token is top[r]"
    rows MISS+r    the same after a recurring suffix, when the token was none of its known continuations
  top    int64[GK, 3]      the GK most frequent tokens held, their counts and 1-token states, most frequent
                           first (-1: empty)
Counts and positions are updated along at most MAX_WALK suffix links per token: exact unless the text is
degenerate (a run of one token longer than MAX_WALK), and every proposal stays a real copy either way.

Writes stay inside these arrays by the automaton's worst case for n tokens (Blumer et al.: at most 2n - 1 states and
3n - 4 edges for n >= 3), which `fits` checks for the tokens held and those to come before `suffix_extend` writes
anything (it answers FULL; `SuffixIndex.reserve` grows every array by the same rule): hist holds n tokens, st
2n + 2 rows, ed 3n + 8 rows (room for n < 3), and the table, a power of two (the mask keeps a probe inside), at least
twice as many slots as ed has rows, so a probe (`find_edge`, `_hash_put`) always ends at an empty slot. stats and
top have fixed shapes that every index into them stays inside (`_bucket` < NB * NO, ranks <= GK).

Kernels (`kernel`: numba's njit, cached) take the arrays as one `Automaton` (and a draft's buffers as one
`_suffix_draft.Scratch`). Two choices keep that free:
- The entry points take them as plain tuples (`tuple(automaton)`) and name them inside: numba types a plain tuple
  in C, a namedtuple in Python (some 1.5 µs per call, a third of a drafting step).
- The kernels run without numba's reference counting (`_nrt=False`): they allocate nothing (they write into the
  caller's arrays), and with it every inlined call that takes a container counts a reference to each of its
  arrays, which makes a drafting step 2-3.5x slower (measured below `kernel`).
"""
import functools
from typing import NamedTuple

import numpy as np
from numba import njit
from numba.core.cpu import CPUTargetOptions

LEN, LINK, CNT, LAST, PREV, FIRST, HEAD, DEG, FIRSTR = 0, 1, 2, 3, 4, 5, 6, 7, 8
TOK, TGT, NEXT, SRC = 0, 1, 2, 3
N, NS, NE, CUR, MAXB, PTR, RUN, CURSOR, MAXG, BOUND = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
NB, NO = 48, 4
GK = 32  # frequent tokens kept as guesses
PARAMS, VOTE, GUESS, MISS = NB * NO, NB * NO + 1, NB * NO + 2, NB * NO + 2 + GK
MAX_WALK = 64
WINDOW = 64  # how far after the point where a copy broke off the text may rejoin its source
REJOIN_CHECK = 32  # tokens of the match compared when looking for where the text rejoins its source
# a new copy starts from the first occurrence (sources are read front to back) unless the most recent one has
# predicted the text this much better
RECENT_ODDS = 5.0 / 3.0
PRIOR_WEIGHT = 4.0  # pseudo-observations behind the prior hit rate m / (m + 2) of a length-m match
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
FULL = -2  # suffix_extend's answer when the arrays cannot take the tokens: grow them (`SuffixIndex.reserve`), retry

# `_nrt` is numba's own (underscored) option. Median µs with reference counting off / on (benchmarks/suffix_nrt.py at 91e0e9a:
# 7 alternated runs of each, 2,000 steps on 1k and 32k tokens of real text, numba 0.68, a 2-core machine at load
# 4-7): propose(10) 1.6 / 5.0, propose_tree(32) 4.5 / 15-16, extend(3) 1.8-2.3 / 3.7-4.2, the fused tree step
# 10-11 / 22-23; no run of one variant overlaps the other's. A numba without the option gets the same kernels with
# reference counting on (correct, that much slower) rather than an import error.
kernel = functools.partial(njit, cache=True, **({"_nrt": False} if hasattr(CPUTargetOptions, "_nrt") else {}))


class Automaton(NamedTuple):
    """The arrays of a suffix index (see the module docstring for their layout)."""

    hist: np.ndarray
    st: np.ndarray
    ed: np.ndarray
    table: np.ndarray
    meta: np.ndarray
    stats: np.ndarray
    top: np.ndarray


@kernel(inline="always")
def _slot(state, tok, mask):
    z = ((np.uint64(state) << np.uint64(32)) | np.uint64(tok)) * _M1
    z ^= z >> np.uint64(31)
    z *= _M2
    return np.int64((z ^ (z >> np.uint64(29))) & np.uint64(mask))


@kernel(inline="always")
def find_edge(sam, state, tok):
    """Edge id of the transition (state, tok), or -1."""
    ed, table = sam.ed, sam.table
    mask = table.shape[0] - 1
    i = _slot(state, tok, mask)
    while table[i] >= 0:
        e = table[i]
        if ed[e, TOK] == tok and ed[e, SRC] == state:
            return e
        i = (i + 1) & mask
    return -1


@kernel(inline="always")
def fits(sam, extra):
    """Whether the automaton's arrays take `extra` more tokens without growing (see the module docstring): a few
    comparisons, so that neither `suffix_extend` nor the fused step (`suffix_room`) depends on a count kept apart."""
    n = sam.meta[N] + extra
    return (n <= sam.hist.shape[0] and 2 * n + 2 <= sam.st.shape[0] and 3 * n + 8 <= sam.ed.shape[0]
            and 2 * sam.ed.shape[0] <= sam.table.shape[0])


@kernel(inline="always")
def _hash_put(ed, table, e):
    mask = table.shape[0] - 1
    i = _slot(ed[e, SRC], ed[e, TOK], mask)
    while table[i] >= 0:
        i = (i + 1) & mask
    table[i] = e


@kernel(inline="always")
def _add_edge(sam, src, tok, tgt):
    """Edge row NE (< 3n + 8 rows: `fits`) from src to tgt on tok, at the head of src's list and in the table."""
    st, ed, meta = sam.st, sam.ed, sam.meta
    e, meta[NE] = meta[NE], meta[NE] + 1
    ed[e, TOK], ed[e, TGT], ed[e, NEXT], ed[e, SRC] = tok, tgt, st[src, HEAD], src
    st[src, HEAD], st[src, DEG] = e, st[src, DEG] + 1
    _hash_put(ed, sam.table, e)


@kernel(inline="always")
def _new_state(sam, length, like):
    """A state of the given LEN whose link, counts and positions are copied from `like` (-1: empty); row NS of st
    (< 2n + 2 rows: `fits`)."""
    st, meta = sam.st, sam.meta
    s, meta[NS] = meta[NS], meta[NS] + 1
    st[s, :] = -1
    st[s, LEN], st[s, CNT], st[s, DEG] = length, 0, 0
    if like >= 0:
        st[s, LINK], st[s, CNT] = st[like, LINK], st[like, CNT]
        st[s, LAST], st[s, PREV], st[s, FIRST] = st[like, LAST], st[like, PREV], st[like, FIRST]
        st[s, FIRSTR] = st[like, FIRSTR]
    return s


@kernel
def _split(sam, p, q, t):
    """Clone q as the state of length LEN[p] + 1 and redirect the t-edges of p's suffix chain. Returns it."""
    st, ed = sam.st, sam.ed
    c = _new_state(sam, st[p, LEN] + 1, q)
    e = st[q, HEAD]
    while e >= 0:
        _add_edge(sam, c, ed[e, TOK], ed[e, TGT])
        e = ed[e, NEXT]
    e = find_edge(sam, p, t)
    while p >= 0 and e >= 0 and ed[e, TGT] == q:
        ed[e, TGT] = c
        p = st[p, LINK]
        e = find_edge(sam, p, t) if p >= 0 else -1
    st[q, LINK] = c
    return c


@kernel(inline="always")
def _append(sam, t):
    """The online SAM extension by one token (written at hist[n], n < capacity: `fits`), then the occurrence update
    along the new suffix chain. Returns the state of the token alone (-1 if the update stopped short of it)."""
    st, ed, meta = sam.st, sam.ed, sam.meta
    n = meta[N]
    sam.hist[n], meta[N] = t, n + 1
    cur = _new_state(sam, st[meta[CUR], LEN] + 1, -1)
    st[cur, FIRST] = n + 1
    p, e = meta[CUR], -1
    while p >= 0:
        e = find_edge(sam, p, t) if st[p, DEG] > 0 else -1
        if e >= 0:
            break
        _add_edge(sam, p, t, cur)
        p = st[p, LINK]
    if p < 0:
        st[cur, LINK] = 0
    elif st[p, LEN] + 1 == st[ed[e, TGT], LEN]:
        st[cur, LINK] = ed[e, TGT]
    else:
        st[cur, LINK] = _split(sam, p, ed[e, TGT], t)
    meta[CUR] = cur
    x, k, unigram = cur, 0, -1
    while x > 0 and k < MAX_WALK:
        st[x, CNT], st[x, PREV], st[x, LAST] = st[x, CNT] + 1, st[x, LAST], n + 1
        if st[x, FIRSTR] <= meta[BOUND]:  # none yet in this request (an older one is from before BOUND)
            st[x, FIRSTR] = n + 1
        unigram = x if st[x, LINK] == 0 else unigram
        x, k = st[x, LINK], k + 1
    return unigram


@kernel(inline="always")
def earlier_end(sam, x):
    """End of the most recent occurrence of state x that has a token after it (-1 if none)."""
    st = sam.st
    return st[x, LAST] if st[x, LAST] < sam.meta[N] else st[x, PREV]


@kernel(inline="always")
def first_end(sam, x):
    """End of the first occurrence of state x in the current request that has a token after it, else its first one."""
    st, meta = sam.st, sam.meta
    return st[x, FIRSTR] if st[x, FIRST] <= meta[BOUND] < st[x, FIRSTR] < meta[N] else st[x, FIRST]


@kernel(inline="always")
def occurrences(sam, x):
    """Occurrences of state x that have a token after them."""
    st = sam.st
    return max(st[x, CNT] - (1 if st[x, LAST] == sam.meta[N] else 0), 1)


@kernel(inline="always")
def _bucket(m, occ):
    """Statistics row of match length m (exact below 8, then two per octave) and occ occurrences (1/2/3-4/5+)."""
    o = 0 if occ <= 1 else (1 if occ == 2 else (2 if occ <= 4 else 3))
    if m < 8:
        return m * NO + o
    k = 0
    while (m >> (k + 1)) > 0:
        k += 1
    return min(8 + 2 * (k - 3) + ((m >> (k - 1)) & 1), NB - 1) * NO + o


@kernel(inline="always")
def hit_prob(sam, m, occ):
    """P(the next token is a known continuation | match length m, occ occurrences), learned and shrunk to the
    prior m / (m + 2)."""
    stats = sam.stats
    b, w = _bucket(m, occ), stats[PARAMS, 1]
    return (stats[b, 1] + w * m / (m + 2.0)) / (stats[b, 0] + w)


@kernel(inline="always")
def _learn(sam, t):
    """Score the upcoming token t against the continuations of the longest recurring suffix; returns whether it is
    one of them."""
    hist, st, meta, stats = sam.hist, sam.st, sam.meta, sam.stats
    s, n, decay = st[meta[CUR], LINK], meta[N], stats[PARAMS, 2]
    if n == 0 or s <= 0:
        return False
    b, known = _bucket(st[s, LEN], occurrences(sam, s)), find_edge(sam, s, t) >= 0
    stats[b, 0] = decay * stats[b, 0] + 1.0
    stats[b, 1] = decay * stats[b, 1] + (1.0 if known else 0.0)
    if st[s, DEG] > 1 and hist[earlier_end(sam, s)] != hist[first_end(sam, s)]:
        stats[VOTE, 0] = decay * stats[VOTE, 0] + (1.0 if hist[earlier_end(sam, s)] == t else 0.0)
        stats[VOTE, 1] = decay * stats[VOTE, 1] + (1.0 if hist[first_end(sam, s)] == t else 0.0)
    return known


@kernel(inline="always")
def ranks(sam, row):
    """How many guesses the rows from `row` hold: MAXG after a never-seen token, a quarter beside known ones."""
    meta = sam.meta
    return min(meta[MAXG] if row == GUESS else meta[MAXG] // 4, GK)


@kernel
def _learn_guess(sam, t, known):
    """Score the frequent tokens (the guesses) against the upcoming token t: after a token seen nowhere before
    (rows GUESS), or after a recurring suffix none of whose continuations t is (`known` False; rows MISS)."""
    st, meta, stats, top = sam.st, sam.meta, sam.stats, sam.top
    if meta[N] == 0 or known or meta[MAXG] == 0:
        return
    row, decay = GUESS if st[meta[CUR], LINK] <= 0 else MISS, stats[PARAMS, 2]
    for r in range(ranks(sam, row)):
        if top[r, 0] < 0:
            break
        stats[row + r, 0] = decay * stats[row + r, 0] + 1.0
        stats[row + r, 1] = decay * stats[row + r, 1] + (1.0 if top[r, 0] == t else 0.0)


@kernel
def _count(sam, t, unigram):
    """Move t, just appended, to its place among the most frequent tokens (its count is that of its 1-token state
    `unigram`, -1 when unknown)."""
    top = sam.top
    if unigram < 0:
        return
    c = sam.st[unigram, CNT]
    if top[GK - 1, 0] >= 0 and c <= top[GK - 1, 1]:
        return  # the list is full and t is not in it (it was at c - 1 < the smallest count there)
    i = 0
    while i < GK and top[i, 0] >= 0 and top[i, 0] != t:
        i += 1
    i = min(i, GK - 1)  # not in the full list, but now more frequent than its last: replace that one
    top[i, 0], top[i, 1], top[i, 2] = t, c, unigram  # a split that moves "t" to a new state appends t
    while i > 0 and (top[i - 1, 0] < 0 or top[i - 1, 1] < c):
        for col in range(3):
            top[i - 1, col], top[i, col] = top[i, col], top[i - 1, col]
        i -= 1


@kernel(inline="always")
def _follow(sam, t):
    """Advance the copy in progress over t, or note where it broke off."""
    meta = sam.meta
    if 0 <= meta[PTR] < meta[N] and sam.hist[meta[PTR]] == t:
        meta[PTR], meta[RUN] = meta[PTR] + 1, meta[RUN] + 1
    else:
        meta[CURSOR], meta[PTR], meta[RUN] = meta[PTR] if meta[PTR] >= 0 else meta[CURSOR], -1, 0


@kernel(inline="always")
def _rejoin(sam):
    """When the longest recurring suffix is longer than the copy in progress, follow another of its occurrences:
    the first within WINDOW tokens after the point where the last copy broke off (text that leaves its source
    rejoins it a little further on), else its first one, or its most recent one if that predicted better.
    `_suffix_reference.rejoin` states the same rule in plain Python."""
    hist, st, meta, stats = sam.hist, sam.st, sam.meta, sam.stats
    s, n = st[meta[CUR], LINK], meta[N]
    if s <= 0 or st[s, LEN] <= meta[RUN]:
        return
    k, cursor = min(st[s, LEN], REJOIN_CHECK), meta[CURSOR]
    for e in range(max(k, cursor + 1), min(cursor + WINDOW, n - 1) + 1 if cursor >= 0 else 0):
        j = 1
        while j <= k and hist[e - j] == hist[n - j]:
            j += 1
        if j > k:
            meta[PTR], meta[RUN] = e, st[s, LEN]
            return
    meta[PTR] = first_end(sam, s) if RECENT_ODDS * stats[VOTE, 1] >= stats[VOTE, 0] else earlier_end(sam, s)
    meta[RUN] = st[s, LEN]


@kernel
def suffix_extend(new, arrays):
    """Append `new` to the automaton `arrays` (a plain tuple): for each token, learn from it, then extend the
    automaton and the copy in progress.

    Returns the number of tokens appended; -1 (and appends nothing) if an id is negative or above int32; FULL (and
    appends nothing) if the arrays cannot take them (`fits`: the caller grows them and calls again).
    """
    for j in range(new.shape[0]):
        if new[j] < 0 or new[j] > 2147483647:
            return -1
    sam = Automaton(*arrays)
    if not fits(sam, new.shape[0]):
        return FULL
    for j in range(new.shape[0]):
        known = _learn(sam, new[j])
        _learn_guess(sam, new[j], known)
        _follow(sam, new[j])
        _count(sam, new[j], _append(sam, new[j]))
        _rejoin(sam)
    return new.shape[0]


@kernel
def suffix_rehash(arrays):
    """Insert every edge of the automaton `arrays` (a plain tuple) into its table (all -1, at least twice as many
    slots as ed has rows: `SuffixIndex.reserve` makes it so). Returns the number of edges."""
    sam = Automaton(*arrays)
    for e in range(sam.meta[NE]):
        _hash_put(sam.ed, sam.table, e)
    return sam.meta[NE]
