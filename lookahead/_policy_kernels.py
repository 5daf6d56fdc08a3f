"""Numba kernels of the draft-length policy (`lookahead.policy.DraftLength`): choose each row's draft length, record
what a step accepted.

They replace a dozen numpy calls per step (bucketing, bincounts, a [buckets, K+1] table refresh) whose fixed cost
was a sixth of a batch-1 step's host time. Each bucket's best length is cached in a table per batch size and
recomputed only when a step taught its bucket something (`version` moved past the table's `seen`).
"""
import numpy as np
from numba import njit


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
    """out[i] = the draft length of a row whose match is matches[i] (0 when nothing matched).

    A bucket's table entry is recomputed when its version moved since the table saw it (table, seen [buckets]).
    """
    for i in range(matches.shape[0]):
        if matches[i] <= 0:
            out[i] = 0
            continue
        b = bucket(edges, matches[i])
        if seen[b] != version[b]:
            table[b] = best_length(accepted[b] / (accepted[b] + rejected[b]), costs)
            seen[b] = version[b]
        out[i] = table[b]


@njit(cache=True)
def record(matches, drafted, counts, edges, accepted, rejected, version):
    """Add a step's rows to their buckets: counts[i] accepted of drafted[i] (rows that drafted nothing teach nothing).

    A row adds its accepted tokens to `accepted` and one to `rejected` when it stopped short of its draft."""
    for i in range(matches.shape[0]):
        if drafted[i] <= 0:
            continue
        b = bucket(edges, matches[i])
        accepted[b] += counts[i]
        if counts[i] < drafted[i]:
            rejected[b] += 1.0
        version[b] += 1


def warm_up() -> None:
    """Compile (or load from cache) the kernels on a non-empty input."""
    edges = np.array([0, 1, 2], dtype=np.int64)
    accepted, rejected = np.ones(3), np.ones(3)
    version, seen, table = np.zeros(3, np.int64), np.full(3, -1, np.int64), np.zeros(3, np.int64)
    matches, one = np.array([2], np.int64), np.ones(1, np.int64)
    choose(matches, edges, accepted, rejected, version, np.ones(3), table, seen, np.zeros(1, np.int64))
    record(matches, one, one, edges, accepted, rejected, version)
