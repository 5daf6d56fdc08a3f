"""Numba kernels of Token Recycling: M[token] -> the k tokens the target predicted after it, updated from every
verified column's top-k, and the draft trees walked from it (alone, or filling what a suffix tree leaves of the
budget). Reference: Luo et al., "Turning Trash into Treasure: Accelerating Inference of Large Language Models with
Token Recycling" (ACL 2025).

Layout shared with `recycle.Recycled` (every array owned by the caller), the fields of `Table`:
  ids     int32[V, K]     M: the candidates after each token, best first (-1: none)
  score   float32[V, K]   their decayed sums (x decay per update) of the probabilities the target gave them
  keys    int64[H]        two-token rows: prev * V + token (-1: empty), H a power of two
  pair    int32[H, K]     their candidates, as the last column after (prev, token) predicted them
  pprob   float32[H, K]   and those probabilities
  stamp   int64[H]        when each two-token row was written (the oldest of a probe window is replaced)
  calib   float64[S, B, 2] per node source (COPY, RECYCLED, BOTH) and bin of its estimate: decayed (trials, hits)
  meta    float64[4]      decay of the scores, decay of the calibration, the clock, the prior's weight

A draft node's estimate is its conditional acceptance given its parent's: a suffix node's path probability over its
parent's, a recycled node's stored probability. Its value is the product along its path of the estimates calibrated
in the node's own (source, bin) (`calibrated`): every draft is ordered best-first by value, so any prefix is the best
tree of its size and the sizing policy weighs copied and recycled nodes alike.
"""
import numpy as np
from numba import njit

COPY, RECYCLED, BOTH = 0, 1, 2
DECAY, CAL_DECAY, CLOCK, PRIOR = 0, 1, 2, 3
PREV, LAST, PENDING, HELD = 0, 1, 2, 3  # a row's state (`recycle.RecycleIndex._state`)
EDGES = np.array([0.0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9])
PROBES = 4  # slots of the two-token table a key may sit in
FALLBACK = 0.5  # weight of M[token]'s candidates behind those of a known two-token row


@njit(cache=True)
def _slot(keys, key):
    """The home slot of a two-token key (a multiplicative hash; len(keys) a power of two)."""
    h = (np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    return np.int64(h) & (keys.shape[0] - 1)


@njit(cache=True)
def find_pair(keys, key):
    """The slot holding `key`, or -1."""
    s = _slot(keys, key)
    for i in range(PROBES):
        j = (s + i) & (keys.shape[0] - 1)
        if keys[j] == key:
            return j
    return -1


@njit(cache=True)
def _merge_row(ids, score, t, top_ids, top_probs, decay, vocab):
    """M[t]'s scores decay, then each predicted candidate adds its probability to its score or takes the slot of
    the weakest one it beats; the row is kept sorted, best first."""
    k = ids.shape[1]
    for i in range(k):
        score[t, i] *= decay
    for c in range(top_ids.shape[0]):
        x, p = top_ids[c], top_probs[c]
        if x < 0 or x >= vocab:
            continue
        at, weakest, low = -1, 0, np.inf
        for i in range(k):
            if ids[t, i] == x:
                at = i
            s = -1.0 if ids[t, i] < 0 else score[t, i]  # an empty slot is the weakest
            if s < low:
                weakest, low = i, s
        if at >= 0:
            score[t, at] += p
        elif ids[t, weakest] < 0 or p > score[t, weakest]:
            ids[t, weakest], score[t, weakest] = x, p
    for i in range(1, k):  # insertion sort, best first, empty slots last
        j = i
        while j > 0 and _key(ids, score, t, j) > _key(ids, score, t, j - 1):
            ids[t, j], ids[t, j - 1] = ids[t, j - 1], ids[t, j]
            score[t, j], score[t, j - 1] = score[t, j - 1], score[t, j]
            j -= 1


@njit(cache=True)
def _key(ids, score, t, i):
    return -1.0 if ids[t, i] < 0 else score[t, i]


@njit(cache=True)
def _write_pair(keys, pair, pprob, stamp, meta, key, top_ids, top_probs, vocab):
    """The two-token row of `key` becomes the column's top-k (its own slot, an empty one, or the oldest one of its
    probe window)."""
    s, mask = _slot(keys, key), keys.shape[0] - 1
    at = -1
    for i in range(PROBES):
        j = (s + i) & mask
        if keys[j] == key:
            at = j
            break
    if at < 0:
        at = s
        for i in range(PROBES):
            j = (s + i) & mask
            if keys[j] < 0:
                at = j
                break
            if stamp[j] < stamp[at]:
                at = j
    keys[at] = key
    meta[CLOCK] += 1.0
    stamp[at] = np.int64(meta[CLOCK])
    k = pair.shape[1]
    for i in range(k):
        x = top_ids[i] if i < top_ids.shape[0] else -1
        ok = 0 <= x < vocab
        pair[at, i] = x if ok else -1
        pprob[at, i] = top_probs[i] if ok else 0.0


@njit(cache=True)
def update(ids, score, keys, pair, pprob, stamp, meta, tokens, prevs, top_ids, top_probs, n):
    """Learn from n verified columns: column c's input token tokens[c] (preceded by prevs[c], -1: unknown) was
    followed by the predictions top_ids[c] with probabilities top_probs[c] [n, k]: M[token] merges them
    (`_merge_row`), the two-token row (prev, token) becomes them. Tokens outside [0, V) are skipped."""
    vocab = ids.shape[0]
    for c in range(n):
        t = tokens[c]
        if t < 0 or t >= vocab:
            continue
        _merge_row(ids, score, t, top_ids[c], top_probs[c], meta[DECAY], vocab)
        if 0 <= prevs[c] < vocab:
            _write_pair(keys, pair, pprob, stamp, meta, prevs[c] * vocab + t, top_ids[c], top_probs[c], vocab)


@njit(cache=True)
def update_step(ids, score, keys, pair, pprob, stamp, meta, prev, last, tokens, parents, size, top_ids, top_probs):
    """`update` from one row's verified step: column 0 is its last token (after prev), column 1 + j draft node j
    (after its parent's token); tokens, parents [>= size], top_ids, top_probs [>= size + 1, k]."""
    vocab = ids.shape[0]
    for c in range(size + 1):
        t = last if c == 0 else tokens[c - 1]
        p = prev if c == 0 else (last if parents[c - 1] < 0 else tokens[parents[c - 1]])
        if t < 0 or t >= vocab:
            continue
        _merge_row(ids, score, t, top_ids[c], top_probs[c], meta[DECAY], vocab)
        if 0 <= p < vocab:
            _write_pair(keys, pair, pprob, stamp, meta, p * vocab + t, top_ids[c], top_probs[c], vocab)


@njit(cache=True)
def candidates(ids, score, keys, pair, pprob, meta, prev, tok, out_ids, out_probs):
    """The candidates after `tok` (preceded by `prev`, -1: unknown), best first, into out_ids, out_probs [>= K]:
    the two-token row's first, then M[tok]'s not among them at FALLBACK times their probability. Returns how many."""
    k, vocab, n = ids.shape[1], ids.shape[0], 0
    if tok < 0 or tok >= vocab:
        return 0
    s = find_pair(keys, prev * vocab + tok) if 0 <= prev < vocab else -1
    if s >= 0:
        for i in range(k):
            if pair[s, i] >= 0:
                out_ids[n], out_probs[n] = pair[s, i], pprob[s, i]
                n += 1
    scale = min(1.0, 1.0 - meta[DECAY]) * (FALLBACK if s >= 0 else 1.0)
    for i in range(k):
        x = ids[tok, i]
        if x < 0 or n >= k:
            break
        dup = False
        for j in range(n):
            dup = dup or out_ids[j] == x
        if not dup:
            out_ids[n], out_probs[n] = x, min(score[tok, i] * scale, 1.0)
            n += 1
    return n


@njit(cache=True)
def _bin(e):
    b = 0
    while b + 1 < EDGES.shape[0] and EDGES[b + 1] <= e:
        b += 1
    return b


@njit(cache=True)
def calibrated(calib, meta, source, estimate):
    """A node's conditional acceptance: its (source, bin) hit rate, shrunk to its estimate by the prior's weight."""
    b, w = _bin(estimate), meta[PRIOR]
    return (calib[source, b, 1] + w * estimate) / (calib[source, b, 0] + w)


@njit(cache=True)
def learn(calib, meta, tokens, parents, sources, estimates, n, gained, m):
    """What a step taught the calibration: the target's tokens after the root were gained [m] (its accepted path,
    then its own token), so each child of the root and of every accepted node is a trial whose outcome is known,
    verified or not: its token is the target's there. tokens, parents, sources, estimates [>= n], a draft's nodes."""
    calib *= meta[CAL_DECAY]
    node, d = -1, 0
    while d < m:
        nxt = -1
        for j in range(n):
            if parents[j] == node:
                hit = tokens[j] == gained[d]
                b = _bin(estimates[j])
                calib[sources[j], b, 0] += 1.0
                calib[sources[j], b, 1] += hit
                if hit:
                    nxt = j
        if nxt < 0:
            break
        node, d = nxt, d + 1


@njit(cache=True)
def advance(calib, meta, out, est, state, new, m):
    """A row's index takes tokens new [m] (m > 0): its latest draft (out [3, >= n]: tokens, parents, sources; est[0]:
    estimates; n = state[PENDING]) is learned from (`learn`) and forgotten, and its last two tokens move on."""
    if state[PENDING] > 0:
        learn(calib, meta, out[0], out[1], out[2], est[0], state[PENDING], new, m)
        state[PENDING] = 0
    state[PREV] = new[m - 2] if m > 1 else state[LAST]
    state[LAST] = new[m - 1]
    state[HELD] += m


@njit(cache=True)
def _before(value, a, b):
    return value[a] > value[b] or (value[a] == value[b] and a < b)


@njit(cache=True)
def _push(heap, value, size, c):
    i = size
    heap[i] = c
    while i > 0 and _before(value, heap[i], heap[(i - 1) >> 1]):
        heap[i], heap[(i - 1) >> 1] = heap[(i - 1) >> 1], heap[i]
        i = (i - 1) >> 1
    return size + 1


@njit(cache=True)
def _pop(heap, value, size):
    top, size, i = heap[0], size - 1, 0
    heap[0] = heap[size]
    while 2 * i + 1 < size:
        j = 2 * i + 1
        if j + 1 < size and _before(value, heap[j + 1], heap[j]):
            j += 1
        if _before(value, heap[i], heap[j]):
            break
        heap[i], heap[j] = heap[j], heap[i]
        i = j
    return top, size


@njit(cache=True)
def _child(first, sib, tokens, parent, tok):
    """The child of `parent` (-1: the root, first[0]) holding `tok`, or -1."""
    j = first[parent + 1]
    while j >= 0 and tokens[j] != tok:
        j = sib[j]
    return j


@njit(cache=True)
def _add(nodes, tokens, parents, sources, estimates, first, sib, tok, parent, source, estimate):
    tokens[nodes], parents[nodes], sources[nodes], estimates[nodes] = tok, parent, source, estimate
    sib[nodes], first[nodes + 1] = first[parent + 1], -1
    first[parent + 1] = nodes
    return nodes + 1


@njit(cache=True)
def _expand(ids, score, keys, pair, pprob, meta, prev, tok, node, v, size, pushed, cand, cval, heap, found_ids,
            found_probs):
    """Push the candidates after node (its token tok, its parent's prev) with values v x their probabilities as
    candidate rows pushed, pushed + 1, ...; returns (heap size, rows pushed)."""
    n = candidates(ids, score, keys, pair, pprob, meta, prev, tok, found_ids, found_probs)
    for i in range(n):
        cand[pushed, 0], cand[pushed, 1] = node, found_ids[i]
        cval[pushed, 0], cval[pushed, 1] = v * found_probs[i], found_probs[i]
        size = _push(heap, cval[:, 0], size, pushed)
        pushed += 1
    return size, pushed


@njit(cache=True)
def merged_tree(ids, score, keys, pair, pprob, calib, meta, prev, last, base_tokens, base_parents, base_probs, nbase,
                keep, budget, ints, floats, cand, cval, heap, found_ids, found_probs):
    """A draft tree of at most `budget` nodes after `last` (preceded by `prev`): the base (a suffix tree, best first)
    while its path probabilities are >= keep, then best-first from M (a child scores its path's stored
    probabilities' product; a child already there is shared and the walk goes on below it), then every node valued
    (`calibrated` along its path) and ordered best first.

    Writes node i as ints[0..2, i] = token, parent, source and floats[0..1, i] = estimate, value; returns the count.
    Scratch: ints [6, >= budget + 1], floats [3, >= budget] (rows past the outputs), cand [(budget + 1) * K, 2] int64,
    cval [(budget + 1) * K, 2] float64, heap [(budget + 1) * K] int64, found_ids / found_probs [K]."""
    tokens, parents, sources, first, sib, order = ints[0], ints[1], ints[2], ints[3], ints[4], ints[5]
    estimates, values, work = floats[0], floats[1], floats[2]
    first[0], nodes = -1, 0
    for j in range(min(nbase, budget)):
        if base_probs[j] < keep:
            break
        up = base_probs[base_parents[j]] if base_parents[j] >= 0 else 1.0
        nodes = _add(nodes, tokens, parents, sources, estimates, first, sib, base_tokens[j], base_parents[j], COPY,
                     min(base_probs[j] / up, 1.0) if up > 0 else 0.0)
    size, pushed = _expand(ids, score, keys, pair, pprob, meta, prev, last, -1, 1.0, 0, 0, cand, cval, heap,
                           found_ids, found_probs)
    while size > 0 and nodes < budget:
        c, size = _pop(heap, cval[:, 0], size)
        parent, tok = cand[c, 0], cand[c, 1]
        node = _child(first, sib, tokens, parent, tok)
        if node < 0:
            node = _add(nodes, tokens, parents, sources, estimates, first, sib, tok, parent, RECYCLED,
                        min(cval[c, 1], 1.0)) - 1
            nodes += 1
        elif sources[node] == COPY:
            sources[node] = BOTH
        before = last if parent < 0 else tokens[parent]
        if pushed + found_ids.shape[0] <= heap.shape[0]:  # each node is expanded once: (budget + 1) * K rows
            size, pushed = _expand(ids, score, keys, pair, pprob, meta, before, tok, node, cval[c, 0], size, pushed,
                                   cand, cval, heap, found_ids, found_probs)
    _order(calib, meta, nodes, tokens, parents, sources, estimates, values, work, first, order)
    return nodes


@njit(cache=True)
def _order(calib, meta, n, tokens, parents, sources, estimates, values, work, newpos, order):
    """Value every node (its calibrated estimate times its parent's value: never above the parent's) and sort the
    nodes best first, ties in their order (parents stay before children); parents renumbered."""
    for j in range(n):
        up = values[parents[j]] if parents[j] >= 0 else 1.0
        values[j] = up * min(calibrated(calib, meta, sources[j], estimates[j]), 1.0)
        order[j] = j
    for i in range(1, n):  # insertion sort of the order by value (stable)
        j = i
        while j > 0 and values[order[j]] > values[order[j - 1]]:
            order[j], order[j - 1] = order[j - 1], order[j]
            j -= 1
    for i in range(n):
        newpos[order[i]] = i
    for arr in (tokens, parents, sources):
        for i in range(n):
            work[i] = arr[order[i]]
        for i in range(n):
            arr[i] = np.int64(work[i])
    for i in range(n):
        parents[i] = newpos[parents[i]] if parents[i] >= 0 else -1
    for arr in (estimates, values):
        for i in range(n):
            work[i] = arr[order[i]]
        for i in range(n):
            arr[i] = work[i]


@njit(cache=True)
def chain_from(ids, score, keys, pair, pprob, meta, prev, last, tokens, parents, sources, estimates, start, most,
               found_ids, found_probs):
    """Extend a chain (tokens[:start], parents i - 1, after `last` preceded by `prev`) with M's best candidate at
    each step, up to `most` tokens; returns its length."""
    n = start
    while n < most:
        a = prev if n == 0 else (last if n == 1 else tokens[n - 2])
        b = last if n == 0 else tokens[n - 1]
        if candidates(ids, score, keys, pair, pprob, meta, a, b, found_ids, found_probs) == 0:
            break
        tokens[n], parents[n], sources[n], estimates[n] = found_ids[0], n - 1, RECYCLED, min(found_probs[0], 1.0)
        n += 1
    return n


@njit(cache=True)
def first_path(parents, n, out):
    """The best path of an ordered tree (the first child at each depth) into out; returns its length."""
    node, m = -1, 0
    for j in range(n):
        if parents[j] == node:
            out[m] = j
            node, m = j, m + 1
    return m


@njit(cache=True)
def merged_chain(ids, score, keys, pair, pprob, calib, meta, prev, last, base_tokens, base_parents, base_probs, nbase,
                 keep, most, ints, floats, cand, cval, heap, found_ids, found_probs, chain, chain_estimates):
    """A chain of at most `most` tokens: the best path of `merged_tree(most)`, then M's best candidate at each step.
    Writes chain[0..2, i] = token, parent (i - 1), source and chain_estimates[i]; returns the length. Scratch as
    `merged_tree`'s; chain [3, >= most], chain_estimates [>= most]."""
    n = merged_tree(ids, score, keys, pair, pprob, calib, meta, prev, last, base_tokens, base_parents, base_probs,
                    nbase, keep, most, ints, floats, cand, cval, heap, found_ids, found_probs)
    path = ints[3]
    m = first_path(ints[1], n, path)
    for a in range(m):
        j = path[a]
        chain[0, a], chain[1, a], chain[2, a], chain_estimates[a] = ints[0, j], a - 1, ints[2, j], floats[0, j]
    return chain_from(ids, score, keys, pair, pprob, meta, prev, last, chain[0], chain[1], chain[2], chain_estimates,
                      m, most, found_ids, found_probs)
