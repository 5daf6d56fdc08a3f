"""Model-free greedy-verification replay of a recorded output against a drafter.

Greedy speculative decoding accepts the longest prefix of the draft that equals what the target would have
written, then the target's own next token comes free from the same forward. Replaying a recorded output
therefore gives the exact number of target forwards a drafter needs, without the target:

    for each step:   draft = propose(k), k = min(budget, tokens left)
                     a = common prefix of draft and output[pos:]
                     the step yields a + 1 tokens (a if that finishes the output); one target forward
                     the drafter is extended with those tokens

A drafter ("proposer") is any object with ``extend(tokens)`` and ``propose(max_tokens) -> 1-D int array``;
tree drafters also have ``propose_tree(max_nodes) -> (tokens, parents)`` with ``parents[i] = -1`` for a
child of the last context token, otherwise the index of the parent node (parents before children).

Example::

    stats = replay_dataset(lambda trace: NgramIndex(max_ngram=4), traces, budget=10)
    print(stats.tokens_per_forward, stats.acceptance_rate)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

import numpy as np

Trace = tuple[np.ndarray, np.ndarray]


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
    node, depth = -1, 0
    while depth < len(target):
        children = np.flatnonzero((np.asarray(parents) == node) & (np.asarray(tokens) == target[depth]))
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
            tokens, parents = proposer.propose_tree(budget)
            drafted, accepted = len(tokens), accepted_path_length(tokens, parents, target)
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

    ``make_proposer`` receives the whole trace only so that the hindsight oracle can read the answer; real
    drafters ignore it. ``progress`` wraps the iterable (e.g. ``tqdm``).
    """
    stats = ReplayStats()
    for prompt, output in (progress(traces) if progress else traces):
        stats += replay_trace(make_proposer((prompt, output)), prompt, output, budget, tree)
    return stats
