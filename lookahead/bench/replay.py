"""Model-free greedy-verification replay of a recorded output against a drafter, and the speedup it predicts.

Greedy speculative decoding accepts the longest prefix of the draft that equals what the target would have
written, then the target's own next token comes free from the same forward. Replaying a recorded output
therefore gives the exact number of target forwards a drafter needs, without the target:

    for each step:   draft = propose(k), k = min(budget, tokens left)
                     a = common prefix of draft and output[pos:]
                     the step yields a + 1 tokens (a if that finishes the output); one target forward
                     the drafter is extended with those tokens

A drafter ("proposer") is any object with ``extend(tokens)`` and ``propose(max_tokens) -> 1-D int array``;
tree drafters also have ``propose_tree(max_nodes) -> Draft`` (`lookahead.index.Draft`) with ``parents[i] = -1`` for a
child of the last context token, otherwise the index of the parent node (parents before children).

Example::

    stats = replay_dataset(lambda trace: NgramIndex(max_ngram=4), traces, budget=10)
    print(stats.tokens_per_forward, stats.acceptance_rate, predicted_speedup(stats, cost_ratio=1.1))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

import numpy as np

Trace = tuple[np.ndarray, np.ndarray]  # (prompt_ids, output_ids)
DEFAULT_COST_TOKENS = 11  # a forward over the last token and 10 drafts


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

    def __add__(self, other: "ReplayStats") -> "ReplayStats":
        return ReplayStats(self.tokens + other.tokens, self.steps + other.steps,
                           self.drafted + other.drafted, self.accepted + other.accepted)

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / self.steps if self.steps else float("nan")

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def drafted_per_step(self) -> float:
        return self.drafted / self.steps if self.steps else float("nan")


def forward_cost(tokens, cost_ratio: float, cost_tokens: int = DEFAULT_COST_TOKENS):
    """Cost of a forward over ``tokens`` tokens, relative to a one-token forward.

    Linear through (1, 1) and (``cost_tokens``, ``cost_ratio``), extrapolated beyond: the extra cost of each verified
    token is ``(cost_ratio - 1) / (cost_tokens - 1)`` (the model of ``lookahead.policy.DraftLength``). Memory-bound
    decoding (a GPU at small batch) has ratios near 1; compute-bound decoding (CPU, large batch) larger ones.

    >>> forward_cost(6, cost_ratio=2.0, cost_tokens=11)
    1.5
    """
    if cost_tokens < 2:
        raise ValueError(f"cost_tokens must be >= 2, got {cost_tokens}")
    if cost_ratio <= 0:
        raise ValueError(f"cost_ratio must be > 0, got {cost_ratio}")
    cost = 1.0 + (cost_ratio - 1.0) * (np.asarray(tokens, dtype=float) - 1) / (cost_tokens - 1)
    return cost if np.ndim(cost) else float(cost)


def predicted_speedup(stats: ReplayStats, cost_ratio: float, cost_tokens: int = DEFAULT_COST_TOKENS) -> float:
    """Speedup over one-token decoding: output tokens over the summed cost of the replay's forwards.

    Each step verifies 1 + d tokens (d drafted, tree nodes included) at ``forward_cost(1 + d)``; since the cost
    is linear in d, the total needs only the step and draft counts. The drafter's own time is left out (a few
    microseconds a step, see ``lookahead bench index``).

    Args:
        stats: a replay's totals.
        cost_ratio: cost of a ``cost_tokens``-token forward relative to a one-token forward.
        cost_tokens: the forward size ``cost_ratio`` was measured at (default 11: the last token and 10 drafts).
    Returns:
        tokens / total cost; nan for an empty replay.

    >>> round(predicted_speedup(ReplayStats(tokens=30, steps=10, drafted=200, accepted=20), cost_ratio=1.1), 3)
    2.5
    """
    if not stats.steps:
        return float("nan")
    slope = forward_cost(2, cost_ratio, cost_tokens) - 1.0
    return stats.tokens / (stats.steps + slope * stats.drafted)


def common_prefix_length(draft: np.ndarray, target: np.ndarray) -> int:
    """Number of leading positions where ``draft`` equals ``target`` (greedy acceptance of a chain)."""
    n = min(len(draft), len(target))
    if n == 0:
        return 0
    mismatch = np.flatnonzero(np.asarray(draft[:n]) != np.asarray(target[:n]))
    return int(mismatch[0]) if len(mismatch) else n


def accepted_path_length(tokens: np.ndarray, parents: np.ndarray, target: np.ndarray) -> int:
    """Length of the longest root path of a draft tree that matches ``target`` (greedy tree acceptance).

    Args:
        tokens: token of each node.
        parents: parent index of each node, ``-1`` for children of the root (the last context token).
        target: what the target writes next.
    Returns:
        number of accepted draft tokens.

    >>> accepted_path_length(np.array([5, 6, 7]), np.array([-1, -1, 1]), np.array([6, 7, 9]))
    2
    """
    tokens, parents = np.asarray(tokens), np.asarray(parents)
    node, depth = -1, 0
    while depth < len(target):
        children = np.flatnonzero((parents == node) & (tokens == target[depth]))
        if len(children) == 0:
            break
        node, depth = int(children[0]), depth + 1
    return depth


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
    proposer.extend(prompt)
    stats = ReplayStats()
    pos, total = 0, len(output)
    while pos < total:
        left = total - pos
        target = output[pos:pos + min(budget, left)]
        if tree:
            draft = proposer.propose_tree(budget)
            drafted, accepted = len(draft.tokens), accepted_path_length(draft.tokens, draft.parents, target)
        else:
            draft = np.asarray(proposer.propose(min(budget, left)))[:min(budget, left)]
            drafted, accepted = len(draft), common_prefix_length(draft, target)
        produced = min(accepted + 1, left)
        proposer.extend(output[pos:pos + produced])
        pos += produced
        stats += ReplayStats(produced, 1, drafted, accepted)
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
