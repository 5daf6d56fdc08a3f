"""Numba kernels of the sizing policies: each row's draft length (`lookahead.decode.policy.DraftLength`), a tree's size
(`lookahead.decode.sizing.TreeSizing`, calibrated by `lookahead.decode.policy.TreeCalibration`), and what a step taught both.

They replace a dozen numpy calls per step (bucketing, bincounts, a [buckets, K+1] table refresh) whose fixed cost
was a sixth of a batch-1 step's host time. Each bucket's best length is cached in a table per batch size and
recomputed only when a step taught its bucket something (`version` moved past the table's `seen`).

Every per-bucket array (accepted, rejected, version, table, seen: [P, buckets], one policy or one per row; the
calibration's accepted and seen, [P, bins] the same way) is as long as its edges, and a bucket index is < len(edges)
(`bucket`): the policy objects allocate them from the same edges.
"""

import numpy as np
from numba import njit

@njit(cache=True)
def first_path(parents, k, out):
    """The first child at each depth, at most k deep, into out [>= min(k, n)]; returns its length (the path's nodes
    are distinct and increasing, so at most n = parents' length)."""
    node, m = -1, 0
    while m < k:
        nxt = -1
        for j in range(node + 1, parents.shape[0]):
            if parents[j] == node:
                nxt = j
                break
        if nxt < 0:
            break
        out[m] = nxt
        node = nxt
        m += 1
    return m


@njit(cache=True)
def bucket(edges, match):
    """Index of the last edge <= match (edges ascending, edges[0] <= match)."""
    b = 0
    while b + 1 < edges.shape[0] and edges[b + 1] <= match:
        b += 1
    return b


@njit(cache=True)
def best_length(q, costs):
    """The k in [0, K] that maximizes (1 + q + ... + q^k) / costs[k] (the first such k); costs [K+1]."""
    gain, best, best_value = 1.0, 0, 1.0 / costs[0]
    for k in range(1, costs.shape[0]):
        gain += q ** k
        value = gain / costs[k]
        if value > best_value:
            best, best_value = k, value
    return best


@njit(cache=True)
def choose(matches, edges, accepted, rejected, version, costs, table, seen, out):
    """out[i] = the draft length of a row whose match is matches[i] (0 when nothing matched); out [>= b].

    The policies' tables are [P, buckets] (accepted, rejected, version, and the best lengths `table` with the version
    each was computed at, `seen`): one policy every row shares (P = 1, `generate`'s batch), or one per row (P = the
    rows: the server's, each row its own, `policy.Stacked`). A bucket's table entry is recomputed when its version
    moved since the table saw it.
    """
    shared = accepted.shape[0] == 1
    for i in range(matches.shape[0]):
        if matches[i] <= 0:
            out[i] = 0
            continue
        p, b = 0 if shared else i, bucket(edges, matches[i])
        if seen[p, b] != version[p, b]:
            table[p, b] = best_length(accepted[p, b] / (accepted[p, b] + rejected[p, b]), costs)
            seen[p, b] = version[p, b]
        out[i] = table[p, b]


@njit(cache=True)
def record(matches, drafted, counts, edges, accepted, rejected, version):
    """Add a step's rows to their buckets: counts[i] accepted of drafted[i] (rows that drafted nothing teach nothing).

    A row adds its accepted tokens to `accepted` and one to `rejected` when it stopped short of its draft; the tables
    are [P, buckets] as `choose` reads them (P = 1: one policy for every row)."""
    shared = accepted.shape[0] == 1
    for i in range(matches.shape[0]):
        if drafted[i] <= 0:
            continue
        p, b = 0 if shared else i, bucket(edges, matches[i])
        accepted[p, b] += counts[i]
        if counts[i] < drafted[i]:
            rejected[p, b] += 1.0
        version[p, b] += 1


@njit(cache=True)
def tree_size(probs, edges, accepted, seen, prior, costs):
    """How many of a best-first tree's first nodes pay for their verification: the n maximizing
    (1 + c_1 + ... + c_n) / costs[n], c the nodes' calibrated probabilities (the bin's acceptance shrunk towards the
    estimate by `prior` observations, kept non-increasing). probs [n]; costs [>= n+1]."""
    gain, best, best_value, low = 1.0, 0, 1.0 / costs[0], 1.0
    for j in range(probs.shape[0]):
        b = bucket(edges, probs[j])
        low = min(low, (accepted[b] + prior * probs[j]) / (seen[b] + prior))
        gain += low
        value = gain / costs[j + 1]
        if value > best_value:
            best, best_value = j + 1, value
    return best


@njit(cache=True)
def _picked(path, m, count):
    """Nodes verified with the first `count` best-first nodes and the first path's m nodes (path ascending)."""
    extra = 0
    for a in range(m):
        extra += path[a] >= count
    return count + extra


@njit(cache=True)
def tree_pick(parents, count, least, depth, whole, pick, path):
    """The nodes of a best-first tree that a step verifies, ascending into pick [>= n] (n = len(parents)); returns
    how many. They are its first `count` nodes (`tree_size`), the nodes of its first path at most `depth` deep past
    them (the chain `DraftLength` drafts, the floor: that chain itself, not every node valued above its end; with
    `whole`, every node up to the chain's end), and more of its first nodes while the step verifies no more than
    `least` (the width its forward computes anyway). A node's parent comes before it in pick, as in the tree.
    path [>= n] is scratch."""
    n = parents.shape[0]
    m = first_path(parents, depth, path)
    c = min(count, n)
    if whole and m:
        c = max(c, path[m - 1] + 1)
    most = max(_picked(path, m, c), min(least, n))
    while c < n and _picked(path, m, c + 1) <= most:
        c += 1
    for j in range(c):
        pick[j] = j
    total = c
    for a in range(m):
        if path[a] >= c:
            pick[total] = path[a]
            total += 1
    return total


@njit(cache=True)
def pack_picked(tokens, parents, probs, pick, total, out_tokens, out_parents, out_probs, remap):
    """The picked nodes (`tree_pick`) of a tree [n] packed into out_ [>= total], their parents renumbered; remap [n]
    is scratch."""
    for j in range(total):
        src = pick[j]
        remap[src] = j
        up = parents[src]
        out_tokens[j], out_parents[j], out_probs[j] = tokens[src], remap[up] if up >= 0 else -1, probs[src]


@njit(cache=True)
def tree_record(parents, sizes, probs, depths, cols, counts, edges, accepted, seen, floors, followed, on_path):
    """What a tree step teaches. Per row i: calibration counts of its nodes (`seen` by bin of their estimate probs,
    `accepted` when on the accepted path), the length floors[i] of its first path at most depths[i] deep (the chain
    `DraftLength` would have drafted) and followed[i], how many of that chain's nodes the accepted path took.

    parents, probs [b, N] packed trees of sizes [b] (<= N); cols [b, W] the accepted path's columns (root, then
    node + 1) of counts [b] nodes (W > counts); accepted, seen [P, bins]: one calibration every row shares (P = 1)
    or one per row (the server's rows, `sizing.StackedTrees`); on_path [>= N] scratch; floors, followed [>= b]."""
    chain = np.empty(parents.shape[1], dtype=np.int64)
    shared = accepted.shape[0] == 1
    for i in range(parents.shape[0]):
        p = 0 if shared else i
        for j in range(sizes[i]):
            on_path[j] = False
        for a in range(counts[i]):
            on_path[cols[i, a + 1] - 1] = True
        for j in range(sizes[i]):
            b = bucket(edges, probs[i, j])
            seen[p, b] += 1.0
            if on_path[j]:
                accepted[p, b] += 1.0
        floors[i] = first_path(parents[i, : sizes[i]], depths[i], chain)
        f = 0
        while f < floors[i] and f < counts[i] and cols[i, f + 1] - 1 == chain[f]:
            f += 1
        followed[i] = f
