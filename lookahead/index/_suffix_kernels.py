"""Numba kernels for the suffix index: an online suffix automaton (SAM) and a best-first draft tree over it.
References: Blumer et al. 1985 (the suffix automaton, built online); SuffixDecoding (Oliaro et al. 2024).

Layout shared with `suffix.SuffixIndex` (every array is owned by the caller):
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
  top    int64[GK, 3]      the GK most frequent tokens held, their counts and 1-token states, most frequent
                           first (-1: empty)
  stats  float64[NB*NO+2+2*GK, 3]
    rows < NB*NO   per (match length, occurrences) bucket: decayed (trials, hits, -) of "the next token was a
                   known continuation of the longest recurring suffix"
    row PARAMS     min_prob, prior_weight, decay
    row VOTE       decayed hits of the continuations of the most recent and of the first occurrence
    rows GUESS+r   decayed (trials, hits, -) of "the token after a never-seen token is top[r]"
    rows MISS+r    the same after a recurring suffix, when the token was none of its known continuations
Counts and positions are updated along at most MAX_WALK suffix links per token: exact unless the text is
degenerate (a run of one token longer than MAX_WALK), and every proposal stays a real copy either way.
"""
import numpy as np
from numba import njit

LEN, LINK, CNT, LAST, PREV, FIRST, HEAD, DEG, FIRSTR = 0, 1, 2, 3, 4, 5, 6, 7, 8
TOK, TGT, NEXT, SRC = 0, 1, 2, 3
N, NS, NE, CUR, MAXB, PTR, RUN, CURSOR, MAXG, BOUND = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
# candidate rows of the draft search: token, parent node, SAM state (-1: copying hist[POS:]), POS (in a state:
# the next position of the occurrence followed, or -1), context length, next sibling (-1: none)
C_TOK, C_PAR, C_STATE, C_POS, C_CTX, C_SIB = 0, 1, 2, 3, 4, 5
NB, NO = 48, 4
GK = 32  # frequent tokens kept as guesses
PARAMS, VOTE, GUESS, MISS = NB * NO, NB * NO + 1, NB * NO + 2, NB * NO + 2 + GK
GUESSING = -2  # candidate state of the root of a draft from a never-seen token: its children are guesses
MAX_WALK = 64
WINDOW = 64  # how far after the point where a copy broke off the text may rejoin its source
# extra shares: following the copy in progress; ties go to the most recent occurrence's, then the first's
_FOLLOW_BONUS, _RECENT_BONUS, _FIRST_BONUS = 0.3, 0.05, 0.02
# a new copy starts from the first occurrence (sources are read front to back) unless the most recent one has
# predicted the text this much better
_RECENT_ODDS = 5.0 / 3.0
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


@njit(cache=True, inline="always")
def _slot(state, tok, mask):
    z = ((np.uint64(state) << np.uint64(32)) | np.uint64(tok)) * _M1
    z ^= z >> np.uint64(31)
    z *= _M2
    return np.int64((z ^ (z >> np.uint64(29))) & np.uint64(mask))


@njit(cache=True, inline="always")
def find_edge(ed, table, state, tok):
    """Edge id of the transition (state, tok), or -1."""
    mask = table.shape[0] - 1
    i = _slot(state, tok, mask)
    while table[i] >= 0:
        e = table[i]
        if ed[e, TOK] == tok and ed[e, SRC] == state:
            return e
        i = (i + 1) & mask
    return -1


@njit(cache=True, inline="always")
def _hash_put(ed, table, e):
    mask = table.shape[0] - 1
    i = _slot(ed[e, SRC], ed[e, TOK], mask)
    while table[i] >= 0:
        i = (i + 1) & mask
    table[i] = e


@njit(cache=True, inline="always")
def _add_edge(st, ed, table, meta, src, tok, tgt):
    e, meta[NE] = meta[NE], meta[NE] + 1
    ed[e, TOK], ed[e, TGT], ed[e, NEXT], ed[e, SRC] = tok, tgt, st[src, HEAD], src
    st[src, HEAD], st[src, DEG] = e, st[src, DEG] + 1
    _hash_put(ed, table, e)


@njit(cache=True, inline="always")
def _new_state(st, meta, length, like):
    """A state of the given LEN whose link, counts and positions are copied from `like` (-1: empty)."""
    s, meta[NS] = meta[NS], meta[NS] + 1
    st[s, :] = -1
    st[s, LEN], st[s, CNT], st[s, DEG] = length, 0, 0
    if like >= 0:
        st[s, LINK], st[s, CNT] = st[like, LINK], st[like, CNT]
        st[s, LAST], st[s, PREV], st[s, FIRST] = st[like, LAST], st[like, PREV], st[like, FIRST]
        st[s, FIRSTR] = st[like, FIRSTR]
    return s


@njit(cache=True)
def _split(st, ed, table, meta, p, q, t):
    """Clone q as the state of length LEN[p] + 1 and redirect the t-edges of p's suffix chain. Returns it."""
    c = _new_state(st, meta, st[p, LEN] + 1, q)
    e = st[q, HEAD]
    while e >= 0:
        _add_edge(st, ed, table, meta, c, ed[e, TOK], ed[e, TGT])
        e = ed[e, NEXT]
    e = find_edge(ed, table, p, t)
    while p >= 0 and e >= 0 and ed[e, TGT] == q:
        ed[e, TGT] = c
        p = st[p, LINK]
        e = find_edge(ed, table, p, t) if p >= 0 else -1
    st[q, LINK] = c
    return c


@njit(cache=True, inline="always")
def _append(hist, st, ed, table, meta, t):
    """The online SAM extension by one token, then the occurrence update along the new suffix chain. Returns
    the state of the token alone (-1 if the update stopped short of it)."""
    n = meta[N]
    hist[n], meta[N] = t, n + 1
    cur = _new_state(st, meta, st[meta[CUR], LEN] + 1, -1)
    st[cur, FIRST] = n + 1
    p, e = meta[CUR], -1
    while p >= 0:
        e = find_edge(ed, table, p, t) if st[p, DEG] > 0 else -1
        if e >= 0:
            break
        _add_edge(st, ed, table, meta, p, t, cur)
        p = st[p, LINK]
    if p < 0:
        st[cur, LINK] = 0
    elif st[p, LEN] + 1 == st[ed[e, TGT], LEN]:
        st[cur, LINK] = ed[e, TGT]
    else:
        st[cur, LINK] = _split(st, ed, table, meta, p, ed[e, TGT], t)
    meta[CUR] = cur
    x, k, unigram = cur, 0, -1
    while x > 0 and k < MAX_WALK:
        st[x, CNT], st[x, PREV], st[x, LAST] = st[x, CNT] + 1, st[x, LAST], n + 1
        if st[x, FIRSTR] <= meta[BOUND]:  # none yet in this request (an older one is from before BOUND)
            st[x, FIRSTR] = n + 1
        unigram = x if st[x, LINK] == 0 else unigram
        x, k = st[x, LINK], k + 1
    return unigram


@njit(cache=True, inline="always")
def _earlier_end(st, x, n):
    """End of the most recent occurrence of state x that has a token after it (-1 if none)."""
    return st[x, LAST] if st[x, LAST] < n else st[x, PREV]


@njit(cache=True, inline="always")
def _first_end(st, meta, x):
    """End of the first occurrence of state x in the current request that has a token after it, else its first one."""
    return st[x, FIRSTR] if st[x, FIRST] <= meta[BOUND] < st[x, FIRSTR] < meta[N] else st[x, FIRST]


@njit(cache=True, inline="always")
def _occurrences(st, x, n):
    """Occurrences of state x that have a token after them."""
    return max(st[x, CNT] - (1 if st[x, LAST] == n else 0), 1)


@njit(cache=True, inline="always")
def _bucket(m, occ):
    """Statistics row of match length m (exact below 8, then two per octave) and occ occurrences (1/2/3-4/5+)."""
    o = 0 if occ <= 1 else (1 if occ == 2 else (2 if occ <= 4 else 3))
    if m < 8:
        return m * NO + o
    k = 0
    while (m >> (k + 1)) > 0:
        k += 1
    return min(8 + 2 * (k - 3) + ((m >> (k - 1)) & 1), NB - 1) * NO + o


@njit(cache=True, inline="always")
def _hit_prob(stats, m, occ):
    """P(the next token is a known continuation | match length m, occ occurrences), learned and shrunk to the
    prior m / (m + 2)."""
    b, w = _bucket(m, occ), stats[PARAMS, 1]
    return (stats[b, 1] + w * m / (m + 2.0)) / (stats[b, 0] + w)


@njit(cache=True, inline="always")
def _learn(hist, st, ed, table, meta, stats, t):
    """Score the upcoming token t against the continuations of the longest recurring suffix; returns whether it is
    one of them."""
    s, n, decay = st[meta[CUR], LINK], meta[N], stats[PARAMS, 2]
    if n == 0 or s <= 0:
        return False
    b, known = _bucket(st[s, LEN], _occurrences(st, s, n)), find_edge(ed, table, s, t) >= 0
    stats[b, 0] = decay * stats[b, 0] + 1.0
    stats[b, 1] = decay * stats[b, 1] + (1.0 if known else 0.0)
    if st[s, DEG] > 1 and hist[_earlier_end(st, s, n)] != hist[_first_end(st, meta, s)]:
        stats[VOTE, 0] = decay * stats[VOTE, 0] + (1.0 if hist[_earlier_end(st, s, n)] == t else 0.0)
        stats[VOTE, 1] = decay * stats[VOTE, 1] + (1.0 if hist[_first_end(st, meta, s)] == t else 0.0)
    return known


@njit(cache=True, inline="always")
def _ranks(meta, row):
    """How many guesses the rows from `row` hold: MAXG after a never-seen token, a quarter beside known ones."""
    return min(meta[MAXG] if row == GUESS else meta[MAXG] // 4, GK)


@njit(cache=True)
def _learn_guess(st, meta, stats, top, t, known):
    """Score the frequent tokens (the guesses) against the upcoming token t: after a token seen nowhere before
    (rows GUESS), or after a recurring suffix none of whose continuations t is (`known` False; rows MISS)."""
    if meta[N] == 0 or known or meta[MAXG] == 0:
        return
    row, decay = GUESS if st[meta[CUR], LINK] <= 0 else MISS, stats[PARAMS, 2]
    for r in range(_ranks(meta, row)):
        if top[r, 0] < 0:
            break
        stats[row + r, 0] = decay * stats[row + r, 0] + 1.0
        stats[row + r, 1] = decay * stats[row + r, 1] + (1.0 if top[r, 0] == t else 0.0)


@njit(cache=True)
def _count(st, top, t, unigram):
    """Move t, just appended, to its place among the most frequent tokens (its count is that of its 1-token state
    `unigram`, -1 when unknown)."""
    if unigram < 0:
        return
    c = st[unigram, CNT]
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


@njit(cache=True, inline="always")
def _follow(hist, meta, t):
    """Advance the copy in progress over t, or note where it broke off."""
    if 0 <= meta[PTR] < meta[N] and hist[meta[PTR]] == t:
        meta[PTR], meta[RUN] = meta[PTR] + 1, meta[RUN] + 1
    else:
        meta[CURSOR], meta[PTR], meta[RUN] = meta[PTR] if meta[PTR] >= 0 else meta[CURSOR], -1, 0


@njit(cache=True, inline="always")
def _rejoin(hist, st, meta, stats):
    """When the longest recurring suffix is longer than the copy in progress, follow another of its occurrences:
    the first within WINDOW tokens after the point where the last copy broke off (text that leaves its source
    rejoins it a little further on), else its first one, or its most recent one if that predicted better."""
    s, n = st[meta[CUR], LINK], meta[N]
    if s <= 0 or st[s, LEN] <= meta[RUN]:
        return
    k, cursor = min(st[s, LEN], 32), meta[CURSOR]
    for e in range(max(k, cursor + 1), min(cursor + WINDOW, n - 1) + 1 if cursor >= 0 else 0):
        j = 1
        while j <= k and hist[e - j] == hist[n - j]:
            j += 1
        if j > k:
            meta[PTR], meta[RUN] = e, st[s, LEN]
            return
    meta[PTR] = _first_end(st, meta, s) if _RECENT_ODDS * stats[VOTE, 1] >= stats[VOTE, 0] else _earlier_end(st, s, n)
    meta[RUN] = st[s, LEN]


@njit(cache=True)
def suffix_extend(new, hist, st, ed, table, meta, stats, top):
    """Append `new`: for each token, learn from it, then extend the automaton and the copy in progress.

    Returns the number of tokens appended, or -1 (and appends nothing) if an id is negative or above int32.
    """
    for j in range(new.shape[0]):
        if new[j] < 0 or new[j] > 2147483647:
            return -1
    for j in range(new.shape[0]):
        known = _learn(hist, st, ed, table, meta, stats, new[j])
        _learn_guess(st, meta, stats, top, new[j], known)
        _follow(hist, meta, new[j])
        _count(st, top, new[j], _append(hist, st, ed, table, meta, new[j]))
        _rejoin(hist, st, meta, stats)
    return new.shape[0]


@njit(cache=True)
def suffix_rehash(ed, table, meta):
    """Insert every edge into a fresh hash table (all -1). Returns the number of edges."""
    for e in range(meta[NE]):
        _hash_put(ed, table, e)
    return meta[NE]


@njit(cache=True, inline="always")
def _push(cand, cprob, count, tok, parent, state, pos, ctx, q):
    cand[count, C_TOK], cand[count, C_PAR], cand[count, C_STATE], cand[count, C_POS] = tok, parent, state, pos
    cand[count, C_CTX], cprob[count] = ctx, q
    return count + 1


@njit(cache=True, inline="always")
def _offer(hist, st, cand, cprob, count, tok, y, q, occ, rec, first, pos, m, parent, min_prob):
    """Push continuation tok (state y) with q times its share of the occurrences, plus the bonuses."""
    follow = pos >= 0 and hist[pos] == tok
    share = min(st[y, CNT] / occ, 1.0) + _RECENT_BONUS * (tok == rec) + _FIRST_BONUS * (tok == first)
    p = q * (share + _FOLLOW_BONUS * follow) / (1.0 + _RECENT_BONUS + _FIRST_BONUS + _FOLLOW_BONUS * (pos >= 0))
    if p < min_prob or count >= cand.shape[0]:
        return count
    return _push(cand, cprob, count, tok, parent, y, pos + 1 if follow else -1, m + 1, p)


@njit(cache=True, inline="always")
def _branch(hist, st, ed, table, meta, stats, x, m, q, pos, parent, cand, cprob, count):
    """Push the continuations of state x: its first max_branch edges (the newest continuations), plus those of
    its most recent and of its first occurrence when they were not among them."""
    n, min_prob = meta[N], stats[PARAMS, 0]
    occ, end = _occurrences(st, x, n), _earlier_end(st, x, n)
    rec, first = hist[end] if end >= 0 else -1, hist[_first_end(st, meta, x)]
    seen_rec, seen_first = rec < 0, False
    e, k = st[x, HEAD], 0
    while e >= 0 and k < meta[MAXB]:
        tok = ed[e, TOK]
        count = _offer(hist, st, cand, cprob, count, tok, ed[e, TGT], q, occ, rec, first, pos, m, parent,
                       min_prob)
        seen_rec, seen_first = seen_rec or tok == rec, seen_first or tok == first
        e, k = ed[e, NEXT], k + 1
    if not seen_rec:
        y = ed[find_edge(ed, table, x, rec), TGT]
        count = _offer(hist, st, cand, cprob, count, rec, y, q, occ, rec, first, pos, m, parent, min_prob)
    if not seen_first and first != rec:
        y = ed[find_edge(ed, table, x, first), TGT]
        count = _offer(hist, st, cand, cprob, count, first, y, q, occ, rec, first, pos, m, parent, min_prob)
    return count


@njit(cache=True)
def _guesses(meta, stats, top, row, parent, p, cand, cprob, start, count):
    """Push the frequent tokens not already in cand[start:count] as continuations, each with its learned hit rate
    in the rows from `row` (shrunk to its share of the tokens held) but ranked after those already there (copies
    come first); each goes on as a 1-token match would."""
    w, cap = stats[PARAMS, 1], 1.0
    for i in range(start, count):
        cap = min(cap, cprob[i])
    for r in range(_ranks(meta, row)):
        if top[r, 0] < 0 or count >= cand.shape[0]:
            break
        q = min(p * (stats[row + r, 1] + w * top[r, 1] / meta[N]) / (stats[row + r, 0] + w), cap)
        dup = False
        for i in range(start, count):
            dup = dup or cand[i, C_TOK] == top[r, 0]
        if q >= stats[PARAMS, 0] and not dup:
            count = _push(cand, cprob, count, top[r, 0], parent, top[r, 2], -1, 1, q)
    return count


@njit(cache=True, inline="always")
def _expand(hist, st, ed, table, meta, stats, top, c, parent, p, cand, cprob, count):
    """Push the continuations of candidate row c (path probability p, node index `parent`) after `count`."""
    n, min_prob = meta[N], stats[PARAMS, 0]
    x, pos, m = cand[c, C_STATE], cand[c, C_POS], cand[c, C_CTX]
    if x == GUESSING:
        return _guesses(meta, stats, top, GUESS, parent, p, cand, cprob, count, count)
    if x < 0 and pos >= n:  # a copy that caught up with the text goes on from the text's length-m suffix
        x, k = meta[CUR], 0
        while st[x, LINK] >= 0 and st[st[x, LINK], LEN] >= m and k < MAX_WALK:
            x, k = st[x, LINK], k + 1
    if x < 0:
        q, tok, y, pos = p * _hit_prob(stats, m, 1), hist[pos], -1, pos + 1
    else:
        k = 0
        while x > 0 and st[x, DEG] == 0 and k < MAX_WALK:  # no continuation: back off to a shorter suffix
            x, k = st[x, LINK], k + 1
        if x <= 0 or st[x, DEG] == 0:
            return count
        m, occ, pos = min(m, st[x, LEN]), _occurrences(st, x, n), pos if pos < n else -1
        q = p * _hit_prob(stats, m, occ)
        if st[x, DEG] > 1:
            return _branch(hist, st, ed, table, meta, stats, x, m, q, pos, parent, cand, cprob, count)
        e = st[x, HEAD]
        if occ > 1:  # one continuation, seen several times: stay in the automaton
            tok, y = ed[e, TOK], ed[e, TGT]
            pos = pos + 1 if pos >= 0 and hist[pos] == tok else -1
        else:  # a single occurrence: copy what followed it
            end = _earlier_end(st, x, n)
            tok, y, pos = hist[end], -1, end + 1
    if q < min_prob or count >= cand.shape[0]:
        return count
    return _push(cand, cprob, count, tok, parent, y, pos, m + 1, q)


@njit(cache=True, inline="always")
def _children(hist, st, ed, table, meta, stats, top, c, parent, cand, cprob, start):
    """Push the continuations of candidate c from row `start`, most probable first (stable), each linked to its
    next sibling. Returns the end of the block."""
    end = _expand(hist, st, ed, table, meta, stats, top, c, parent, cprob[c], cand, cprob, start)
    return _order(cand, cprob, start, end)


@njit(cache=True)
def _root_children(hist, st, ed, table, meta, stats, top, cand, cprob):
    """`_children` of the root (row 0, pushed from row 1), with guesses beside the known continuations: the next
    token may be none of them."""
    end = _expand(hist, st, ed, table, meta, stats, top, 0, -1, 1.0, cand, cprob, 1)
    if cand[0, C_STATE] > 0 and meta[MAXG] >= 4:
        miss = 1.0 - _hit_prob(stats, cand[0, C_CTX], _occurrences(st, cand[0, C_STATE], meta[N]))
        end = _guesses(meta, stats, top, MISS, -1, miss, cand, cprob, 1, end)
    return _order(cand, cprob, 1, end)


@njit(cache=True, inline="always")
def _order(cand, cprob, start, end):
    """Sort cand[start:end] most probable first (stable) and link each row to its next sibling; returns end."""
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


@njit(cache=True, inline="always")
def _root(st, meta, cand, cprob):
    """Candidate row 0: the whole text, matched by its longest recurring suffix, or guessing when its last token
    was never seen before (False if there is no text, or nothing recurs and guesses are off)."""
    s = st[meta[CUR], LINK] if meta[N] > 0 else -1
    if s > 0:
        _push(cand, cprob, 0, -1, -1, s, meta[PTR], st[s, LEN], 1.0)
    elif meta[N] > 0 and meta[MAXG] > 0:
        _push(cand, cprob, 0, -1, -1, GUESSING, -1, 0, 1.0)
    return s > 0 or (meta[N] > 0 and meta[MAXG] > 0)


@njit(cache=True)
def suffix_chain(hist, st, ed, table, meta, stats, top, max_tokens, cand, cprob, out):
    """Greedy path: repeatedly take the most probable continuation while its path probability is >= min_prob.
    Writes the tokens into out; returns how many."""
    if max_tokens <= 0 or not _root(st, meta, cand, cprob):
        return 0
    c, end, count = 0, 1, 0
    while count < max_tokens:
        start = end
        end = (_children(hist, st, ed, table, meta, stats, top, c, count - 1, cand, cprob, start) if count
               else _root_children(hist, st, ed, table, meta, stats, top, cand, cprob))
        if end == start:
            break
        out[count] = cand[start, C_TOK]
        c, count = start, count + 1
    return count


@njit(cache=True, inline="always")
def _before(cprob, a, b):
    """Whether candidate a leaves the heap before b: more probable, or as probable and pushed first."""
    return cprob[a] > cprob[b] or (cprob[a] == cprob[b] and a < b)


@njit(cache=True, inline="always")
def _heap_push(heap, cprob, size, c):
    i = size
    heap[i] = c
    while i > 0 and _before(cprob, heap[i], heap[(i - 1) >> 1]):
        heap[i], heap[(i - 1) >> 1] = heap[(i - 1) >> 1], heap[i]
        i = (i - 1) >> 1
    return size + 1


@njit(cache=True, inline="always")
def _heap_pop(heap, cprob, size):
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


@njit(cache=True)
def suffix_tree(hist, st, ed, table, meta, stats, top, max_nodes, cand, cprob, heap, out, probs):
    """Best-first draft tree: repeatedly add the most probable pending continuation. The heap holds only the best
    child not yet added of each node (siblings are sorted), so it stays O(max_nodes).

    Writes node i as out[:, i] = (token, parent node or -1) and its path probability as probs[i] (non-increasing);
    returns the number of nodes. Parents precede children, and following each node's first child gives the
    `suffix_chain` path.
    """
    if max_nodes <= 0 or not _root(st, meta, cand, cprob):
        return 0
    end = _root_children(hist, st, ed, table, meta, stats, top, cand, cprob)
    size, nodes = (_heap_push(heap, cprob, 0, 1) if end > 1 else 0), 0
    while nodes < max_nodes and size > 0:
        c, size = _heap_pop(heap, cprob, size)
        out[0, nodes], out[1, nodes] = cand[c, C_TOK], cand[c, C_PAR]
        probs[nodes] = cprob[c]
        if cand[c, C_SIB] >= 0:
            size = _heap_push(heap, cprob, size, cand[c, C_SIB])
        start = end
        end = _children(hist, st, ed, table, meta, stats, top, c, nodes, cand, cprob, start)
        if end > start:
            size = _heap_push(heap, cprob, size, start)
        nodes += 1
    return nodes
