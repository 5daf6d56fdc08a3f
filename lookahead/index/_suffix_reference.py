"""Plain-Python statement of two rules of the suffix index, for the property tests (tests/test_suffix.py):

- `rejoin`: which earlier occurrence the copy in progress follows when a longer match starts (`_suffix_build._rejoin`),
- `rank`: how the continuations of a draft node are ranked and scored (`_suffix_draft._branch` and `_offer`),

and `Text`, which recomputes from the tokens alone, by rescanning them, everything these rules read: the longest
recurring suffix and its occurrences, the copy in progress, and the statistics learned so far. Quadratic per token:
for short texts, where the kernels' counts are exact (at most MAX_WALK tokens).

Example:
    >>> text = Text()
    >>> for t in [1, 2, 3, 1, 2]:
    ...     text.append(t)
    >>> text.ptr, text.root_children()[0][0]
    (2, 3)
"""
from __future__ import annotations

from collections import Counter

from ._suffix_build import NB, NO, PRIOR_WEIGHT, RECENT_ODDS, REJOIN_CHECK, WINDOW
from ._suffix_draft import FIRST_BONUS, FOLLOW_BONUS, RECENT_BONUS


def rejoin(tokens: list, length: int, cursor: int, first: int, recent: int, recent_better: bool) -> int:
    """Where a copy of the recurring suffix of `length` tokens starts (the end of the occurrence it follows).

    Text that leaves its source rejoins it a little further on: the first occurrence ending within WINDOW tokens
    after `cursor` (where the last copy broke off; -1: none) whose last REJOIN_CHECK tokens match. Otherwise the
    `first` occurrence (sources are read front to back), or the most `recent` one if that has predicted better.
    """
    n, k = len(tokens), min(length, REJOIN_CHECK)
    if cursor >= 0:
        for end in range(max(k, cursor + 1), min(cursor + WINDOW, n - 1) + 1):
            if tokens[end - k:end] == tokens[n - k:]:
                return end
    return recent if recent_better else first


def rank(counts: dict, occurrences: int, q: float, recent: int, first: int, follow: int | None) -> list:
    """The continuations of a draft node as (token, probability), most probable first.

    Args:
        counts: token -> occurrences of the node's context followed by that token.
        occurrences: occurrences of the context that have a token after them.
        q: the node's path probability times the hit rate of its context.
        recent, first: the tokens after the context's most recent and its first occurrence.
        follow: the token the copy in progress goes on with (None: no copy in progress).

    A token's probability is q times its share of the occurrences plus small bonuses for the token the copy goes
    on with, then the most recent occurrence's, then the first's; a single continuation keeps q.
    """
    if len(counts) == 1:
        return [(next(iter(counts)), q)]
    norm = 1.0 + RECENT_BONUS + FIRST_BONUS + FOLLOW_BONUS * (follow is not None)
    scored = []
    for tok, count in counts.items():
        share = min(count / occurrences, 1.0) + RECENT_BONUS * (tok == recent) + FIRST_BONUS * (tok == first)
        scored.append((tok, q * (share + FOLLOW_BONUS * (tok == follow)) / norm))
    return sorted(scored, key=lambda pair: -pair[1])


def bucket(m: int, occ: int) -> int:
    """Statistics row of match length m (exact below 8, then two per octave) and occ occurrences (1/2/3-4/5+)."""
    o = 0 if occ <= 1 else (1 if occ == 2 else (2 if occ <= 4 else 3))
    if m < 8:
        return m * NO + o
    k = m.bit_length() - 1
    return min(8 + 2 * (k - 3) + ((m >> (k - 1)) & 1), NB - 1) * NO + o


class Text:
    """The tokens held, a request boundary, the copy in progress and the learned statistics, from rescans."""

    def __init__(self, half_life: float = 512.0):
        self.tokens: list = []
        self.bound, self.ptr, self.run, self.cursor = 0, -1, 0, -1
        self.decay = 0.5 ** (1.0 / half_life)
        self.trials: dict = {}  # bucket -> [decayed trials, decayed hits]
        self.votes = [0.0, 0.0]  # decayed hits of the most recent and of the first occurrence's continuation

    def begin_request(self) -> None:
        self.bound = len(self.tokens)

    def ends(self, k: int) -> list:
        """Ends (exclusive) of every occurrence of the last k tokens, the suffix itself included."""
        n, suffix = len(self.tokens), self.tokens[len(self.tokens) - k:]
        return [e for e in range(k, n + 1) if self.tokens[e - k:e] == suffix]

    def recurring(self) -> int:
        """Length of the longest suffix that occurs more than once (0: none)."""
        k = 0
        while k < len(self.tokens) and len(self.ends(k + 1)) > 1:
            k += 1
        return k

    def first_end(self, ends: list) -> int:
        """The first occurrence after the request boundary that has a token after it, if the first overall is
        before the boundary; else the first overall."""
        later = [e for e in ends if e > self.bound]
        return later[0] if ends[0] <= self.bound and later and later[0] < len(self.tokens) else ends[0]

    def hit_prob(self, m: int, occ: int) -> float:
        trials, hits = self.trials.get(bucket(m, occ), (0.0, 0.0))
        return (hits + PRIOR_WEIGHT * m / (m + 2.0)) / (trials + PRIOR_WEIGHT)

    def append(self, t: int) -> None:
        """Learn from t, follow (or leave) the copy in progress over it, append it, then rejoin."""
        self._learn(t)
        n = len(self.tokens)
        if 0 <= self.ptr < n and self.tokens[self.ptr] == t:
            self.ptr, self.run = self.ptr + 1, self.run + 1
        else:
            self.cursor, self.ptr, self.run = self.ptr if self.ptr >= 0 else self.cursor, -1, 0
        self.tokens.append(t)
        length = self.recurring()
        if length > self.run:
            ends = self.ends(length)
            recent_better = not RECENT_ODDS * self.votes[1] >= self.votes[0]
            self.ptr = rejoin(self.tokens, length, self.cursor, self.first_end(ends), ends[-2], recent_better)
            self.run = length

    def _learn(self, t: int) -> None:
        length, tokens = self.recurring(), self.tokens
        if length == 0:
            return
        ends = self.ends(length)
        follows = Counter(tokens[e] for e in ends[:-1])
        row = self.trials.setdefault(bucket(length, len(ends) - 1), [0.0, 0.0])
        row[0] = self.decay * row[0] + 1.0
        row[1] = self.decay * row[1] + (1.0 if t in follows else 0.0)
        recent, first = tokens[ends[-2]], tokens[self.first_end(ends)]
        if len(follows) > 1 and recent != first:
            self.votes[0] = self.decay * self.votes[0] + (1.0 if recent == t else 0.0)
            self.votes[1] = self.decay * self.votes[1] + (1.0 if first == t else 0.0)

    def root_children(self) -> list:
        """`rank` of the continuations of the longest recurring suffix: the first level of a draft tree."""
        length, tokens, n = self.recurring(), self.tokens, len(self.tokens)
        if length == 0:
            return []
        ends = self.ends(length)
        occ = len(ends) - 1
        follow = tokens[self.ptr] if 0 <= self.ptr < n else None
        return rank(Counter(tokens[e] for e in ends[:-1]), occ, 1.0 * self.hit_prob(length, occ),
                    tokens[ends[-2]], tokens[self.first_end(ends)], follow)
