"""Numba kernels for the n-gram index. Module-level @njit functions over int arrays that the caller owns.

Layout shared with `ngram.NgramIndex`:
  hist   int32[capacity]   the tokens held, hist[:n]
  table  uint64[T, 3]      open-addressing hash table (T a power of two): (key, first, last) per slot, key 0 =
                           empty; first and last are the ends (exclusive) of the key's earliest and most recent
                           occurrences. A slot's fields are adjacent, so a probe costs about one memory access.
  state  int64[7]          n, ptr, run, used, cursor, first votes, recent votes
    ptr  end of the earlier occurrence being copied (-1: none); the draft is hist[ptr:ptr + k]
    run  how many tokens before ptr agree with the last `run` tokens held
    used number of occupied table slots
    cursor  where the last copy broke off in its source (-1: never); a new match is first looked for just after it
    votes   decayed hits (fixed point, ONE a hit) of the token after the first and after the most recent occurrence
            of the longest recurring suffix, counted where the two differ: a new copy starts from the most recent
            occurrence when it has predicted the text RECENT_ODDS times better (code and agents reuse what they
            just wrote or read), else from the first (sources are read front to back)

Writes stay inside these arrays by two invariants, both checked by `fits` before `ngram_extend` writes anything (it
answers FULL, and `NgramIndex.reserve` grows the arrays by the same rule):
  - hist holds the tokens: n + extra <= capacity;
  - the table is a power of two at most half full, so that a probe (`_insert`, `_lookup`) always ends at an empty
    slot: 2 * (used + (extra + 1) * max_ngram) <= T, since each appended token indexes at most max_ngram n-grams.
"""
import numpy as np
from numba import njit

N, PTR, RUN, USED, CURSOR, VFIRST, VRECENT = 0, 1, 2, 3, 4, 5, 6
STATE = np.array([0, -1, 0, 0, -1, 0, 0], dtype=np.int64)  # an empty index's state
SLOT = 3  # a table slot's fields: key, first end, last end
ONE = 1 << 20  # a vote's hit, in fixed point; each vote decays by 1/16 (about the last 16 disagreements count)
RECENT_ODDS_NUM, RECENT_ODDS_DEN = 5, 3  # the suffix index's RECENT_ODDS
FULL = -2  # ngram_extend's answer when the arrays cannot take the tokens: grow them (`NgramIndex.reserve`), call again
WINDOW = 64
_SEED = np.uint64(0x243F6A8885A308D3)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, inline="always")
def _mix(h, t):
    # splitmix64 step over one token; the running value hashes hist[end-k:end] read backwards
    h = (h ^ (np.uint64(t) + _GOLD)) * _M1
    return h ^ (h >> np.uint64(29))


@njit(cache=True, inline="always")
def _key(h, k):
    z = (h + np.uint64(k) * _GOLD) * _M2
    z ^= z >> np.uint64(32)
    return z if z != np.uint64(0) else np.uint64(1)


@njit(cache=True)
def _insert(table, key, end):
    """Record an occurrence of key ending at `end`: a new key's first and last end, a known key's last end.
    Returns 1 if a new slot was taken.

    Writes one slot of table [T, 3], T a power of two (the mask keeps the index inside) with an empty slot left (the
    probe ends there): `fits`."""
    mask = np.int64(table.shape[0] - 1)
    i = np.int64(key & np.uint64(mask))
    while True:
        if table[i, 0] == key:
            table[i, 2] = np.uint64(end)
            return 0
        if table[i, 0] == np.uint64(0):
            table[i, 0] = key
            table[i, 1] = np.uint64(end)
            table[i, 2] = np.uint64(end)
            return 1
        i = (i + 1) & mask


@njit(cache=True)
def _lookup(table, key):
    """The slot holding key, or -1."""
    mask = np.int64(table.shape[0] - 1)
    i = np.int64(key & np.uint64(mask))
    while True:
        if table[i, 0] == key:
            return i
        if table[i, 0] == np.uint64(0):
            return np.int64(-1)
        i = (i + 1) & mask


@njit(cache=True)
def _index_ending_at(hist, end, table, max_ngram):
    """Index every n-gram (1..max_ngram) that ends at `end`. Returns the number of new slots."""
    h = _SEED
    added = 0
    for k in range(1, min(max_ngram, end) + 1):
        h = _mix(h, hist[end - k])
        added += _insert(table, _key(h, k), end)
    return added


@njit(cache=True)
def _rematch(hist, n, table, max_ngram, min_ngram, run):
    """Longest suffix of hist[:n] longer than `run` (and >= min_ngram) that occurred earlier.

    Returns (the ends of its earliest and of its most recent occurrence, its length), or (-1, -1, 0) when none is
    longer than `run`.
    """
    h = _SEED
    first, last, best_k = np.int64(-1), np.int64(-1), 0
    for k in range(1, min(max_ngram, n - 1) + 1):
        h = _mix(h, hist[n - k])
        if k <= run or k < min_ngram:
            continue
        i = _lookup(table, _key(h, k))
        if i < 0:
            break  # a longer suffix cannot recur if this one does not
        first, last, best_k = np.int64(table[i, 1]), np.int64(table[i, 2]), k
    return first, last, best_k


@njit(cache=True, inline="always")
def _vote(hist, n, table, state, max_ngram, min_ngram, t):
    """Score the coming token t against what followed the first and the most recent occurrence of the longest
    recurring suffix of hist[:n], where the two differ (decayed hits, `state` VFIRST and VRECENT)."""
    first, last, k = _rematch(hist, n, table, max_ngram, min_ngram, 0)
    if k == 0 or hist[first] == hist[last]:
        return
    state[VFIRST] += (ONE if hist[first] == t else 0) - (state[VFIRST] >> 4)
    state[VRECENT] += (ONE if hist[last] == t else 0) - (state[VRECENT] >> 4)


@njit(cache=True)
def _near(hist, n, k, cursor, fallback):
    """End of the first occurrence of the k-token suffix of hist[:n] in the WINDOW tokens after `cursor`.

    Text that leaves a copy (a skipped phrase, an edited line) tends to rejoin its source a little further on;
    `fallback` (the first or the most recent occurrence, as the votes say) is returned when it does not.
    """
    if cursor < 0:
        return fallback
    for e in range(max(k, cursor + 1), min(cursor + WINDOW, n - 1) + 1):
        j = 1
        while j <= k and hist[e - j] == hist[n - j]:
            j += 1
        if j > k:
            return e
    return fallback


@njit(cache=True, inline="always")
def fits(hist, table, state, extra, max_ngram):
    """Whether the index takes `extra` more tokens without growing: hist holds them, and the table stays at most half
    full (each token indexes at most max_ngram n-grams; one token's more is slack). `NgramIndex.reserve` grows by
    this rule, the fused step's `has_room` asks it of every row before changing any."""
    return state[N] + extra <= hist.shape[0] and 2 * (state[USED] + (extra + 1) * max_ngram) <= table.shape[0]


@njit(cache=True)
def ngram_extend(new, hist, table, state, max_ngram, min_ngram):
    """Append `new` to hist[:n], keeping the table and the copy pointer current. O(max_ngram) per token.

    Returns the number of tokens appended; -1 (and appends nothing) if an id is negative or above int32; FULL (and
    appends nothing) if the arrays cannot take them (`fits`: the caller grows them and calls again).
    """
    for j in range(new.shape[0]):
        if new[j] < 0 or new[j] > 2147483647:
            return -1
    if not fits(hist, table, state, new.shape[0], max_ngram):
        return FULL
    n, ptr, run, used, cursor = state[N], state[PTR], state[RUN], state[USED], state[CURSOR]
    for j in range(new.shape[0]):
        t = new[j]
        _vote(hist, n, table, state, max_ngram, min_ngram, t)
        # n-grams ending at n are indexed only now, so a lookup never finds the suffix itself
        used += _index_ending_at(hist, n, table, max_ngram)
        hist[n] = t
        n += 1
        if ptr >= 0 and hist[ptr] == t:
            ptr += 1
            run += 1
        else:
            if ptr >= 0:
                cursor = ptr
            ptr, run = -1, 0
        if run < max_ngram:
            first, last, k = _rematch(hist, n, table, max_ngram, min_ngram, run)
            if k > 0:
                recent = RECENT_ODDS_DEN * state[VRECENT] > RECENT_ODDS_NUM * state[VFIRST]
                ptr, run = _near(hist, n, k, cursor, last if recent else first), k
    state[N], state[PTR], state[RUN], state[USED], state[CURSOR] = n, ptr, run, used, cursor
    return new.shape[0]


@njit(cache=True)
def ngram_propose(hist, state, max_tokens, out):
    """Write the continuation of the copy in progress into out; return how many tokens were written (at most
    out.shape[0], whatever max_tokens asks).

    The continuation hist[ptr:n] is extended past the end only when the text is periodic (the match covers at
    least one full period n - ptr): then the next tokens repeat the period.
    """
    n, ptr, run = state[N], state[PTR], state[RUN]
    if ptr < 0 or max_tokens <= 0:
        return 0
    period = n - ptr
    m = min(max_tokens, out.shape[0])
    if run < period:
        m = min(m, period)
    for i in range(m):
        out[i] = hist[ptr + i] if i < period else out[i - period]
    return m


@njit(cache=True)
def ngram_rebuild(hist, n, table, max_ngram):
    """Re-index hist[:n] into a fresh (zeroed) table, as extend would have. Returns slots used.

    The table must hold them at most half full (`NgramIndex.reserve` sizes it for the slots used so far and the
    tokens to come: `fits`)."""
    used = 0
    for end in range(1, n):
        used += _index_ending_at(hist, end, table, max_ngram)
    return used
