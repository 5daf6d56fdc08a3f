"""How many draft tokens to verify: as many as pay for themselves, judged by the acceptance seen so far.

Verifying k drafts costs about (1 + overhead + per_token * k) single-token forwards (overhead: what any multi-token
forward costs beyond a one-token one, large on a CPU where one token is a cheap matrix-vector product, about 0 on a
GPU at small batch); if each draft token is accepted with probability
q (given the previous one was), a step yields 1 + q + ... + q^k tokens in expectation. The policy picks the k that
maximizes tokens per unit of cost, with q estimated online for each match length (a long match is a better bet than
a one-token one): weak evidence gets short drafts or none, strong evidence long ones.
"""
from __future__ import annotations

import functools

import numpy as np

from ..runtime.jit import kernels
from . import _policy_kernels


_BUCKETS = np.array([0, 1, 2, 3, 4, 6, 8, 12, 16, 32], dtype=np.int64)  # lower edges of match-length buckets


class CostCurve:
    """A measured verification cost: ``costs[k]`` is a forward verifying k drafts, in one-token forwards.

    The curve is what `lookahead.decode.calibrate.measure_draft_cost` measures. It need not be linear, nor even
    increasing: on a CPU the matrix kernels work on blocks of rows, so a forward over 3 tokens can cost more than one
    over 4 (SmolLM2-135M on an AMD EPYC: 1.93 and 1.39 one-token forwards). Verifying k drafts never needs to cost
    more than verifying more of them (pad the step), so ``pads[k]`` is the number of drafts k' >= k whose forward
    costs least (the widest of equals), and ``costs[k]`` is its cost (never less than a one-token forward). A cost
    given as ``inf`` was not measured: steps pad past it. Beyond the curve the cost grows by the slope fitted to the
    measured points.

    Example:
        >>> curve = CostCurve([1.0, 1.9, 2.2, 1.8])
        >>> curve.costs.tolist(), curve.pads.tolist()
        ([1.0, 1.8, 1.8, 1.8], [0, 3, 3, 3])
    """

    seconds = None  # a one-token forward's time when the curve was measured (None: not measured here)
    check = None  # the same after `calibrate.CHECK_CONTEXT` tokens, what a kept curve is checked against
    busy = None  # cores other processes kept busy while it was measured (None: not measured here, or not seen)

    def __init__(self, costs):
        raw = np.asarray(costs, dtype=float)
        if (raw.ndim != 1 or len(raw) < 2 or np.any(np.isnan(raw)) or not np.isfinite(raw[0])
                or not np.isfinite(raw[-1]) or np.any(raw <= 0)):
            raise ValueError(f"a cost curve needs at least 2 positive costs (k = 0, 1, ...), the first and the last "
                             f"measured, got {costs!r}")
        self.raw = raw
        self.pads = self.pads_within(len(raw) - 1)
        self.costs = np.concatenate([[1.0], np.maximum(raw[self.pads[1:]] / raw[0], 1.0)])  # timing noise aside
        measured = np.flatnonzero(np.isfinite(raw[1:])) + 1
        self.slope = (max(float(np.polyfit(measured, self.costs[measured], 1)[0]), 0.0) if len(measured) > 1
                      else 0.0)

    def pads_within(self, most: int) -> np.ndarray:
        """[min(most, len - 1) + 1]: for each k the drafts k' in [k, most] whose forward costs least, the widest on
        a tie (k itself where none of them was measured).

        >>> CostCurve([1.0, 1.9, 2.2, 1.8, 2.0]).pads_within(2).tolist()
        [0, 1, 2]
        """
        most = min(most, len(self.raw) - 1)
        pads = np.arange(most + 1, dtype=np.int64)
        best = most
        for k in range(most, 0, -1):
            if self.raw[k] < self.raw[best] or not np.isfinite(self.raw[best]):
                best = k
            pads[k] = best if np.isfinite(self.raw[best]) else k
        return pads

    def __call__(self, k):
        k = np.asarray(k)
        last = len(self.costs) - 1
        return self.costs[np.minimum(k, last)] + self.slope * np.maximum(k - last, 0)

    def linear(self) -> tuple:
        """The (overhead, per_token) line closest to the multi-token costs (least squares, clipped at 0)."""
        k = np.arange(1, len(self.costs))
        if len(k) == 1:
            return max(float(self.costs[1]) - 1.0, 0.0), 0.0
        per_token, intercept = np.polyfit(k, self.costs[1:], 1)
        return max(float(intercept) - 1.0, 0.0), max(float(per_token), 0.0)

    def __repr__(self) -> str:
        return f"CostCurve({np.round(self.costs, 3).tolist()})"


def as_cost(cost):
    """(overhead, per_token) from a number (per_token, no overhead) or a pair; a `CostCurve` stays as it is."""
    if isinstance(cost, CostCurve):
        return cost
    if isinstance(cost, (tuple, list)):
        overhead, per_token = cost
        return float(overhead), float(per_token)
    return 0.0, float(cost)


def row_cost(cost, batch: int):
    """A row's share of the cost model in a batch of `batch` rows.

    A forward over T tokens costs about 1 + overhead * [T > 1] + per_token * (T - 1) one-token forwards. A row owns
    1/batch of the plain step t(batch) and all of its own drafts: drafting k costs it 1 + per_token * k * batch /
    t(batch) of its share, and the overhead is already paid by any batch > 1. A measured curve (taken at batch 1)
    enters as its closest line.
    """
    if batch <= 1:
        return cost
    overhead, per_token = cost.linear() if isinstance(cost, CostCurve) else cost
    plain = 1.0 + overhead + per_token * (batch - 1)
    return 0.0, per_token * batch / plain


def step_cost(cost, k):
    """Cost of a step verifying k drafts (array or int), in one-token forwards."""
    if isinstance(cost, CostCurve):
        return cost(k)
    overhead, per_token = cost
    return 1.0 + overhead * (np.asarray(k) > 0) + per_token * np.asarray(k)


@functools.lru_cache(maxsize=256)
def step_costs(cost, most: int, batch: int) -> np.ndarray:
    """[most + 1]: what a row's step verifying 0..most drafts costs in a batch of `batch` rows (`step_cost` of
    `row_cost`; `cost` as `as_cost` gives it, a `CostCurve` by identity). Kept across calls, since each call's policy
    is new and the table costs a dozen numpy operations; shared, so never written (it stays writeable: numba types a
    read-only array apart, which would compile every kernel that takes it again)."""
    return np.asarray(step_cost(as_cost(row_cost(cost, batch)), np.arange(most + 1)), dtype=float)


def batch_width(chances: np.ndarray, reach: np.ndarray, costs: np.ndarray) -> int:
    """The draft columns w of a batch's step that give the most tokens per unit of cost, for the whole batch.

    Every row of a step computes as many columns as its widest row (the forward is a rectangle), so one row's long
    draft makes every row pay for w + 1 tokens, and at a large batch the step costs what all of its tokens cost.
    Row i drafts min(w, reach[i]) tokens, each accepted with probability chances[i] given the one before, and gains
    1 + q + ... + q^min(w, reach[i]) tokens in expectation; costs [max(reach) + 1] is what the batch's step costs at
    each width (`StepTimes.costs`). w = 0 is plain decoding, so the chosen step is never expected to yield fewer
    tokens per unit of cost than no drafts at all.

    Example:
        >>> line = step_cost((0.0, 0.05), 2 * (np.arange(9) + 1) - 1)  # two rows, a forward's cost per token
        >>> batch_width(np.array([0.9, 0.1]), np.array([8, 8]), line)  # a good bet pays for both rows
        8
        >>> line = step_cost((0.0, 0.05), 64 * (np.arange(9) + 1) - 1)
        >>> batch_width(np.full(64, 0.2), np.full(64, 8), line)  # 64 weak bets: plain decoding
        0
    """
    q = np.clip(np.asarray(chances, dtype=float), 0.0, 0.999)[:, None]  # [b, 1]
    w = np.arange(len(costs))
    k = np.minimum(w[None, :], np.asarray(reach)[:, None])  # [b, W]: what each row drafts at width w
    gain = ((1.0 - q ** (k + 1)) / (1.0 - q)).sum(axis=0)
    return int(np.argmax(gain / np.asarray(costs, dtype=float)))  # the narrowest of equals


class StepTimes:
    """What a batch's step costs at each draft width, measured as the engine runs.

    A cost model measured at batch 1 misses what a batch adds (at 16 rows of 800-token contexts a plain step of
    SmolLM2 on this CPU took 2.6 one-token forwards, where the batch-1 curve says 1.5 for 16 tokens), so the engine
    times its steps, whole (the drafts, the forward, the acceptance, each row's advance: the host's part grows with
    the drafts too): per batch size (rounded up to a power of two), the seconds per row of a plain step and what
    each draft column adds per row (exponential averages of the steps seen). Until a batch size's plain step was
    timed, its costs are the model's (`step_cost` of the whole step's tokens on the model's line: a measured curve's
    steps, such as a forward of 17 tokens costing twice one of 16, are a batch of one's); until a wider step was
    timed, a column adds what the line says, relative to the timed plain step, and once one was, what it took.
    The steps' outcome decides last (`drafts`): where steps with drafts gave clearly fewer tokens per second than plain
    ones (`LOSS`), the batch size decodes plainly (a draft's chances may be guessed too high, its cost too low). A step
    right after rows joined or left is not timed (the cache's buffers are copied then).

    Args:
        cost: the batch-1 cost model (a `CostCurve`, whose closest line is taken, or a line, `as_cost`).
        weight: how much a new timing moves an average.
        timed: False: the costs are the model's alone and nothing is timed (a cost the user gave).
        told: called as ``told(rows, paying, drafted, plain)`` when a batch size's steps start or stop verifying
            drafts, once its steps with drafts were timed (rows: the batch sizes' upper bound, a power of two;
            drafted, plain: the tokens per second that steps with drafts and plain ones gave there), so that a
            speedup cut under load is said (the server logs it and sets a metric), or None.
    """

    PROBE = 8  # every PROBE-th step of a batch size goes the other way (plain where drafts pay, and the reverse)
    LOSS = 0.1  # drafting stops where steps with drafts gave at least this share fewer tokens per second than plain
    # ones. Nearer (cuts came at 0.4% to 2.7% apart), the averages' noise decided, and stopping lost: 4 SmolLM2
    # requests (`benchmarks/serve_load.py`) 1.06x `"lookup": "none"` twice against 1.02x and 1.05x, 4 stories260K
    # rows (`serve_step.py --rows 4`) 165 forwards against 181; 16 requests the same either way

    def __init__(self, cost, weight: float = 0.2, timed: bool = True, told=None):
        cost = as_cost(cost)
        self.timed, self.told = timed, told
        self.paying = {}  # bucket -> whether its steps verify drafts, as last told
        self.cost, self.weight = (cost.linear() if isinstance(cost, CostCurve) else cost), weight
        self.plain, self.column = {}, {}  # bucket -> seconds per row: of a plain step; per draft column
        self.wide = {}  # bucket -> tokens per second that steps with drafts gave (their average; a plain step's:
        # 1 / plain, whatever the batch size in the bucket)
        self.asked = {}  # bucket -> steps that asked `drafts`

    def drafts(self, b: int) -> bool:
        """Whether a step of b rows may verify drafts: once its batch size's plain step was timed, and unless steps
        with drafts there gave fewer tokens per second than plain ones, by `LOSS` or more: whatever the rows'
        chances and the costs predict, drafting that loses stops. One step in `PROBE` goes the other way, so that
        both averages stay fresh (a plain step timed once, early, may have been slow)."""
        key = _size(b)
        if not self.timed:
            return True
        if key not in self.plain:
            return False  # a plain step first: what drafting must beat
        pays = key not in self.wide or self.wide[key] * self.plain[key] >= 1.0 - self.LOSS
        if key in self.wide and self.paying.get(key, True) != pays:
            self.paying[key] = pays
            if self.told is not None:
                self.told(key, pays, self.wide[key], 1.0 / self.plain[key])
        self.asked[key] = self.asked.get(key, 0) + 1
        return pays != (self.asked[key] % self.PROBE == 0)

    def costs(self, b: int, most: int, least: int = 0) -> np.ndarray:
        """[most + 1]: what a step of b rows costs at each width w (at least `least`: columns it computes anyway)."""
        w = np.maximum(np.arange(most + 1), least)
        model = step_cost(self.cost, b * (w + 1) - 1)  # in one-token forwards
        key = _size(b)
        if key not in self.plain:
            return model
        plain = self.plain[key]
        if key in self.column:
            return b * (plain + self.column[key] * w)
        return plain * b * model / float(step_cost(self.cost, b - 1))

    def record(self, b: int, width: int, seconds: float, gained: int) -> None:
        """A step of b rows verifying `width` draft columns took `seconds` and gave `gained` tokens."""
        if not self.timed:
            return
        key, per_row = _size(b), seconds / b
        if width == 0:
            self.plain[key] = _moved(self.plain.get(key), per_row, self.weight)
        elif key in self.plain:
            self.column[key] = _moved(self.column.get(key), max(per_row - self.plain[key], 0.0) / width,
                                      self.weight)
            self.wide[key] = _moved(self.wide.get(key), gained / seconds, self.weight)


class Stacked:
    """Rows' own `DraftLength`s as one policy of [rows, buckets] tables, as the fused kernels take one per row (the
    server's rows: `serve.engine`, `fused.for_rows`). Each policy is bound to its row of the stack (`bind`), so
    what the kernels teach a row, its policy knows, and the row goes on with it when it leaves the stack. The rows'
    policies have one `max_tokens` and one cost model (`takes`).

    Example:
        >>> rows = [DraftLength(4, 0.1), DraftLength(4, 0.1)]
        >>> stack = Stacked(rows)
        >>> stack.counts[0][1, 0] = 7.0
        >>> float(rows[1].accepted[0])
        7.0
    """

    def __init__(self, lengths: list):
        first = lengths[0]
        self.max_tokens, self.cost = first.max_tokens, first.cost
        self.counts = tuple(np.concatenate([length.counts[i] for length in lengths]) for i in range(3))
        for k, length in enumerate(lengths):
            length.bind(*(c[k:k + 1] for c in self.counts))
        self._rows = len(lengths)

    @staticmethod
    def takes(lengths: list) -> bool:
        """Whether these policies stack: the same most draft tokens and cost model."""
        return all(length.max_tokens == lengths[0].max_tokens and length.cost == lengths[0].cost
                   for length in lengths)

    def tables(self, batch: int) -> tuple:
        """`DraftLength.tables` for the stack: (step costs [K+1], best lengths and the versions they were computed at
        [rows, buckets], all unseen: each is computed when first read)."""
        best, seen = np.full((2, self._rows, len(_BUCKETS)), -1, np.int64)
        return step_costs(self.cost, self.max_tokens, batch), best, seen


def _size(b: int) -> int:
    return 1 << max(int(b) - 1, 0).bit_length()


def _moved(average, value: float, weight: float) -> float:
    return value if average is None else (1.0 - weight) * average + weight * value


class TreeCalibration:
    """Maps a draft tree's estimated node probabilities to the acceptance actually seen, online.

    An index estimates how likely each node is to be accepted; on text unlike what it has learned from those
    estimates can be off by a factor of ten (a node put at 0.5% accepted 8% of the time). Each verified node is
    recorded in a bin of its estimate; the calibrated probability is the bin's acceptance rate, shrunk towards the
    estimate by `prior` pseudo-observations. Calibrated values are kept non-increasing along the best-first order,
    so the first n nodes stay the best tree of n nodes.

    Example:
        >>> cal = TreeCalibration()
        >>> cal.update(np.array([0.9, 0.004]), np.array([True, True]))
        >>> cal(np.array([0.9, 0.004])).round(3).tolist()
        [0.92, 0.203]
    """

    EDGES = np.array([0.0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9])

    def __init__(self, prior: float = 4.0):
        self.prior = prior
        self.bind(np.zeros((1, len(self.EDGES))), np.zeros((1, len(self.EDGES))))

    def bind(self, accepted: np.ndarray, seen: np.ndarray) -> None:
        """Keep the counts in these [1, bins] arrays: its own, or its row of a stack (`sizing.StackedTrees`: views,
        so that what a kernel teaches the stack, the calibration knows). `counts` is what the kernels take;
        `accepted` and `seen` are their [bins] rows."""
        self.counts = (accepted, seen)
        self.accepted, self.seen = accepted[0], seen[0]

    def __call__(self, probs: np.ndarray) -> np.ndarray:
        b = self._bin(probs)
        calibrated = (self.accepted[b] + self.prior * probs) / (self.seen[b] + self.prior)
        return np.minimum.accumulate(calibrated)

    def update(self, probs: np.ndarray, accepted: np.ndarray) -> None:
        """Record verified nodes: their estimated probabilities and whether each was on the accepted path."""
        b = self._bin(probs)
        self.accepted += np.bincount(b, accepted, minlength=len(self.EDGES))  # whole counts: exact in any order
        self.seen += np.bincount(b, minlength=len(self.EDGES))

    def _bin(self, probs: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.EDGES, probs, side="right") - 1


class DraftLength:
    """Online choice of draft length per row.

    Args:
        max_tokens: the most draft tokens per step.
        cost: the verification cost model, `per_token`, `(overhead, per_token)` as fractions of a one-token
            forward, or a measured `CostCurve` (see `as_cost`).
        prior: (accepted, rejected) pseudo-counts each bucket starts from.

    Example:
        >>> policy = DraftLength(10, cost=0.1)
        >>> policy.choose(np.array([4, 1]))        # match lengths of two rows -> draft lengths
        array([3, 3])
    """

    def __init__(self, max_tokens: int, cost: float, prior: tuple = (3.0, 1.0)):
        self.max_tokens, self.cost = max_tokens, as_cost(cost)
        n = len(_BUCKETS)  # version: moves when a step teaches the bucket anything
        self.bind(np.full((1, n), prior[0]), np.full((1, n), prior[1]), np.zeros((1, n), dtype=np.int64))
        self._tables = {}  # per batch size: (step costs [K+1], best length [1, buckets], version seen [1, buckets])

    def bind(self, accepted: np.ndarray, rejected: np.ndarray, version: np.ndarray) -> None:
        """Keep the policy's counts in these [1, buckets] arrays: its own, or its row of a `Stacked` (views, so
        that what a kernel teaches the stack, the policy knows). `counts` is what the kernels take; `accepted`,
        `rejected` and `version` are their [buckets] rows."""
        self.counts = (accepted, rejected, version)
        self.accepted, self.rejected, self.version = accepted[0], rejected[0], version[0]

    def choose(self, match_lengths: np.ndarray) -> np.ndarray:
        """Draft length for each row, given the length of the match behind its next proposal (one per row)."""
        kern = kernels(_policy_kernels)
        matches = np.asarray(match_lengths, dtype=np.int64)
        out = np.empty(len(matches), dtype=np.int64)
        kern.choose(matches, _BUCKETS, *self.counts, *self.tables(len(matches)), out)
        return out

    def tables(self, batch: int) -> tuple:
        """What `choose` reads for a batch of `batch` rows besides the counts: (step costs [K+1], each bucket's best
        length [1, buckets], the bucket version it was computed at [1, buckets])."""
        if batch not in self._tables:
            best, seen = np.full((2, 1, len(_BUCKETS)), -1, np.int64)  # a best length is read only once seen
            self._tables[batch] = (step_costs(self.cost, self.max_tokens, batch), best, seen)
        return self._tables[batch]

    def update(self, match_lengths: np.ndarray, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """Record a step: the rows' match lengths, how many tokens each drafted and how many were accepted."""
        kern = kernels(_policy_kernels)
        kern.record(np.asarray(match_lengths, dtype=np.int64), np.asarray(drafted, dtype=np.int64),
                 np.asarray(accepted, dtype=np.int64), _BUCKETS, *self.counts)

    def acceptance(self) -> np.ndarray:
        """Estimated per-token acceptance probability of each match-length bucket."""
        return self.accepted / (self.accepted + self.rejected)

    def chance(self, match_length: int) -> float:
        """Estimated per-token acceptance probability of a draft behind a match of `match_length` tokens."""
        b = int(np.searchsorted(_BUCKETS, match_length, side="right")) - 1
        return float(self.accepted[b] / (self.accepted[b] + self.rejected[b]))
