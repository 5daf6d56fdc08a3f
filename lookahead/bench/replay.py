"""Model-free greedy-verification replay of a recorded output against a drafter, and the speedup it predicts.

Greedy speculative decoding accepts the longest prefix of the draft that equals what the target would have
written, then the target's own next token comes free from the same forward. Replaying a recorded output
therefore gives the exact number of target forwards a drafter needs, without the target:

    for each step:   draft = propose(k), k = min(budget, tokens left)   (or a tree of `budget` nodes)
                     a = common prefix of draft and output[pos:]  (a tree: its longest matching root path)
                     the step yields a + 1 tokens (a if that finishes the output); one target forward
                     the drafter is extended with those tokens

A drafter ("proposer") is any object with ``extend(tokens)`` and ``propose(max_tokens) -> 1-D int array``;
tree drafters also have ``propose_tree(max_nodes) -> Draft`` (`lookahead.index.Draft`) with ``parents[i] = -1`` for a
child of the last context token, otherwise the index of the parent node (parents before children).

Acceptance is the library's own (`lookahead.verify.greedy_accept`, `lookahead.verify.tree.greedy_tree_accept`), and
so is the cost model of the predicted speedup (`lookahead.decode.policy.step_cost`).

Example::

    stats = replay_dataset(lambda trace: NgramIndex(), traces, budget=10)
    print(stats.tokens_per_forward, stats.acceptance_rate, predicted_speedup(stats, ratio_cost(1.1)))
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

import numpy as np

from ..decode.policy import as_cost, step_cost
from ..verify import greedy_accept
from ..verify.tree import greedy_tree_accept
from .methods import COST_TOKENS

Trace = tuple[np.ndarray, np.ndarray]  # (prompt_ids, output_ids)
DEFAULT_COST_TOKENS = COST_TOKENS  # a forward over the last token and 10 drafts


class Proposer(Protocol):
    def extend(self, tokens) -> None: ...
    def propose(self, max_tokens: int) -> np.ndarray: ...


@dataclass
class ReplayStats:
    """Totals over one or more replayed traces; ratios are sum over sum (token-weighted)."""

    tokens: int = 0     # output tokens produced
    steps: int = 0      # target forwards
    drafted: int = 0    # draft tokens (tree nodes) proposed
    accepted: int = 0   # draft tokens accepted
    draft_sizes: Counter = field(default_factory=Counter)  # draft tokens of a step -> steps that drafted that many

    def __add__(self, other: "ReplayStats") -> "ReplayStats":
        return ReplayStats(self.tokens + other.tokens, self.steps + other.steps, self.drafted + other.drafted,
                           self.accepted + other.accepted, self.draft_sizes + other.draft_sizes)

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / self.steps if self.steps else float("nan")

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def drafted_per_step(self) -> float:
        return self.drafted / self.steps if self.steps else float("nan")


def ratio_cost(cost_ratio: float, cost_tokens: int = DEFAULT_COST_TOKENS) -> tuple:
    """The linear cost model ``(overhead 0, per_token)`` through a one-token forward (1) and a ``cost_tokens``-token
    forward (``cost_ratio``), as `lookahead.decode.policy.step_cost` takes it.

    Memory-bound decoding (a GPU at small batch) has ratios near 1; compute-bound decoding (CPU, large batch) larger
    ones. A ratio below 1 (a bigger forward cheaper than a one-token one) is timing noise, and refused.

    Raises:
        ValueError: cost_ratio < 1 or cost_tokens < 2.

    >>> ratio_cost(2.0, cost_tokens=11)
    (0.0, 0.1)
    """
    if cost_tokens < 2:
        raise ValueError(f"cost_tokens must be >= 2, got {cost_tokens}")
    if not cost_ratio >= 1:
        raise ValueError(f"cost_ratio must be >= 1 (a bigger forward never costs less), got {cost_ratio}")
    return 0.0, (cost_ratio - 1.0) / (cost_tokens - 1)


def predicted_speedup(stats: ReplayStats, cost) -> float:
    """Speedup over one-token decoding: output tokens over the summed cost of the replay's forwards.

    A step that drafted k tokens (tree nodes included) costs ``step_cost(cost, k)`` one-token forwards. The
    drafter's own time is left out (a few microseconds a step, see ``lookahead bench index``).

    Args:
        stats: a replay's totals.
        cost: a `lookahead.decode.policy.CostCurve`, an ``(overhead, per_token)`` pair (e.g. `ratio_cost`) or a per-token
            cost.
    Returns:
        tokens / total cost; nan for an empty replay.

    >>> round(predicted_speedup(ReplayStats(30, 10, 200, 20, Counter({20: 10})), ratio_cost(1.1)), 3)
    2.5
    """
    if not stats.steps:
        return float("nan")
    sizes = np.array(list(stats.draft_sizes), dtype=np.int64)
    counts = np.array([stats.draft_sizes[k] for k in sizes], dtype=float)
    return stats.tokens / float(np.sum(counts * step_cost(as_cost(cost), sizes)))


def _depths(parents: np.ndarray) -> np.ndarray:
    """Depth of each node of a tree (1 for a child of the root); parents come before children."""
    depth = np.empty(len(parents), dtype=np.int64)
    for j, parent in enumerate(parents.tolist()):
        depth[j] = 1 if parent < 0 else depth[parent] + 1
    return depth


def _targets(output: np.ndarray, at: np.ndarray) -> np.ndarray:
    """``output[at]`` where it exists, -1 (no token) past its end."""
    return np.where(at < len(output), output[np.minimum(at, len(output) - 1)], -1)[None, :]


def _step(proposer, output: np.ndarray, pos: int, budget: int, tree: bool) -> tuple:
    """(drafted, accepted) of one step at ``output[pos]``, the recorded output standing in for the target's argmax."""
    if tree:
        draft = proposer.propose_tree(budget)
        tokens, parents = np.asarray(draft.tokens, np.int64), np.asarray(draft.parents, np.int64)
        columns = pos + np.concatenate([[0], _depths(parents)])  # column 0 is the last context token
        paths, _ = greedy_tree_accept(tokens[None], parents[None], np.array([len(tokens)]),
                                      _targets(output, columns))
        return len(tokens), len(paths[0])
    room = min(budget, len(output) - pos)
    draft = np.asarray(proposer.propose(room), dtype=np.int64)[:room]
    accepted = greedy_accept(draft[None], np.array([len(draft)]), _targets(output, pos + np.arange(len(draft) + 1)))
    return len(draft), int(accepted[0])


def replay_trace(proposer: Proposer, prompt: np.ndarray, output: np.ndarray, budget: int = 10,
                 tree: bool = False) -> ReplayStats:
    """Replay one recorded ``output`` after ``prompt`` with a fresh ``proposer``.

    Args:
        proposer: fresh drafter; receives the prompt, then every token the replay produces.
        prompt, output: token ids of the trace.
        budget: draft tokens per step (chain) or tree nodes per step (``tree=True``).
        tree: call ``propose_tree(budget)`` and accept the longest matching root path.
    Returns:
        ReplayStats for this trace.
    Raises:
        ValueError: budget < 1.
    """
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    output = np.asarray(output, dtype=np.int64)
    proposer.extend(prompt)
    stats = ReplayStats()
    pos = 0
    while pos < len(output):
        drafted, accepted = _step(proposer, output, pos, budget, tree)
        produced = min(accepted + 1, len(output) - pos)
        proposer.extend(output[pos:pos + produced])
        pos += produced
        stats.tokens, stats.steps = stats.tokens + produced, stats.steps + 1
        stats.drafted, stats.accepted = stats.drafted + drafted, stats.accepted + accepted
        stats.draft_sizes[drafted] += 1
    return stats


def replay_dataset(make_proposer: Callable[[Trace], Proposer], traces: Iterable[Trace], budget: int = 10,
                   tree: bool = False, progress: Callable[[Iterable], Iterable] | None = None) -> ReplayStats:
    """Replay every trace with a fresh proposer from ``make_proposer(trace)`` and sum the stats.

    ``make_proposer`` receives the whole trace only so that a hindsight oracle can read the answer; real
    drafters ignore it. ``progress`` wraps the iterable (e.g. ``tqdm``).
    """
    stats = ReplayStats()
    for prompt, output in (progress(traces) if progress else traces):
        stats += replay_trace(make_proposer((prompt, output)), prompt, output, budget, tree)
    return stats
