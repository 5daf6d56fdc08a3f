"""How many draft tokens to verify: as many as pay for themselves, judged by the acceptance seen so far.

Verifying k drafts costs about (1 + overhead + per_token * k) single-token forwards (overhead: what any multi-token
forward costs beyond a one-token one, large on a CPU where one token is a cheap matrix-vector product, about 0 on a
GPU at small batch); if each draft token is accepted with probability
q (given the previous one was), a step yields 1 + q + ... + q^k tokens in expectation. The policy picks the k that
maximizes tokens per unit of cost, with q estimated online for each match length (a long match is a better bet than
a one-token one): weak evidence gets short drafts or none, strong evidence long ones.
"""
from __future__ import annotations

import numpy as np

_BUCKETS = np.array([0, 1, 2, 3, 4, 6, 8, 12, 16, 32])  # lower edges of match-length buckets


def as_cost(cost) -> tuple:
    """(overhead, per_token) from a number (per_token, no overhead) or a pair."""
    if isinstance(cost, (tuple, list)):
        overhead, per_token = cost
        return float(overhead), float(per_token)
    return 0.0, float(cost)


def row_cost(cost: tuple, batch: int) -> tuple:
    """A row's share of the cost model in a batch of `batch` rows.

    A forward over T tokens costs about 1 + overhead * [T > 1] + per_token * (T - 1) one-token forwards. A row owns
    1/batch of the plain step t(batch) and all of its own drafts: drafting k costs it 1 + per_token * k * batch /
    t(batch) of its share, and the overhead is already paid by any batch > 1.
    """
    overhead, per_token = cost
    if batch <= 1:
        return cost
    plain = 1.0 + overhead + per_token * (batch - 1)
    return 0.0, per_token * batch / plain


def step_cost(cost: tuple, k):
    """Cost of a step verifying k drafts (array or int), in one-token forwards."""
    overhead, per_token = cost
    return 1.0 + overhead * (np.asarray(k) > 0) + per_token * np.asarray(k)


class DraftLength:
    """Online choice of draft length per row.

    Args:
        max_tokens: the most draft tokens per step.
        cost: the verification cost model, `per_token` or `(overhead, per_token)`, as fractions of a one-token
            forward (see `as_cost`).
        prior: (accepted, rejected) pseudo-counts each bucket starts from.

    Example:
        >>> policy = DraftLength(10, cost=0.1)
        >>> policy.choose(np.array([4, 1]))        # match lengths of two rows -> draft lengths
    """

    def __init__(self, max_tokens: int, cost: float, prior: tuple = (3.0, 1.0)):
        self.max_tokens, self.cost = max_tokens, as_cost(cost)
        self.accepted = np.full(len(_BUCKETS), prior[0])
        self.rejected = np.full(len(_BUCKETS), prior[1])
        self._tables = {}

    def choose(self, match_lengths: np.ndarray) -> np.ndarray:
        """Draft length for each row, given the length of the match behind its next proposal (one per row)."""
        batch = len(match_lengths)
        if batch not in self._tables:
            self._tables[batch] = self._best_lengths(row_cost(self.cost, batch))
        lengths = self._tables[batch][self._bucket(match_lengths)]
        return np.where(match_lengths > 0, lengths, 0)

    def update(self, match_lengths: np.ndarray, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """Record a step: the rows' match lengths, how many tokens each drafted and how many were accepted."""
        used = drafted > 0
        buckets = self._bucket(match_lengths[used])
        np.add.at(self.accepted, buckets, accepted[used])
        np.add.at(self.rejected, buckets, (accepted[used] < drafted[used]).astype(float))
        self._tables = {}

    def acceptance(self) -> np.ndarray:
        """Estimated per-token acceptance probability of each match-length bucket."""
        return self.accepted / (self.accepted + self.rejected)

    def _best_lengths(self, cost: tuple) -> np.ndarray:
        q = self.acceptance()[:, None]  # [buckets, 1]
        k = np.arange(self.max_tokens + 1)[None, :]  # [1, K+1]
        gain = np.cumsum(np.where(k > 0, q ** k, 1.0), axis=1)  # expected tokens of a step drafting k
        return np.argmax(gain / step_cost(cost, k), axis=1)

    @staticmethod
    def _bucket(match_lengths: np.ndarray) -> np.ndarray:
        return np.searchsorted(_BUCKETS, match_lengths, side="right") - 1
