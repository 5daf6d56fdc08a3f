"""Which acceptance rule a call uses: greedy, or speculative sampling from the processed distribution.

A rule maps a `DraftBatch` and the processed scores of its forward [b, N+1, V] to a `Verdict`. Chains take the
vectorised rules (`greedy_accept`, `sample_accept`), trees walk their branches (`verify/tree.py`). A call has one
rule (`acceptance_rule`); the server's batch, whose rows bring their own, takes each row's (`by_row`).
"""
from __future__ import annotations

import numpy as np
import torch

from . import tree as T
from .batch import DraftBatch, Verdict
from .greedy import greedy_accept_with_bonus
from .sampling import sample_accept


def acceptance_rule(do_sample: bool, generator=None, device=None, argmax_of=None):
    """The rule of a call: greedy, or sampling with one generator for every draw (so that draws are independent).

    Args:
        do_sample: sample (True) or take the argmax (False).
        generator: a `torch.Generator`, an int seed (a generator on `device` is made from it) or None (torch's global
            generator).
        device: where the scores live.
        argmax_of: greedy's `scores -> host argmax` (default `argmax`; a target's own, which may have taken it on
            the device inside its step: `StaticCausalLM.argmax`).
    """
    if not do_sample:
        return greedy if argmax_of is None else lambda batch, scores: greedy(batch, scores, argmax_of)
    if isinstance(generator, int):
        generator = torch.Generator(device=device).manual_seed(generator)
    return lambda batch, scores: sample(batch, scores, generator)


def greedy(batch: DraftBatch, scores: torch.Tensor, argmax_of=None) -> Verdict:
    """The longest draft path that equals the target's argmax (`argmax_of(scores)`, default `argmax`), then the
    argmax after it."""
    targets = (argmax_of or argmax)(scores)  # [b, N+1]; the one host-device sync
    if batch.chain:
        return Verdict(*greedy_accept_with_bonus(batch.tokens, batch.sizes, targets))
    return Verdict.of_paths(*T.greedy_tree_accept(batch.tokens, batch.parents, batch.sizes, targets))


def by_row(batch: DraftBatch, scores: torch.Tensor, greedy_rows: np.ndarray, pick) -> Verdict:
    """Rows of one batch under their own rules (the server's, whose rows each bring theirs): the greedy rows
    (`greedy_rows`, row indices) together by `greedy`'s rule on their own scores only; every other row i by
    `pick(i)` -> (its accepted node indices, its next token), its own sampling rule and generator."""
    b = len(batch.sizes)
    every = len(greedy_rows) == b and bool((greedy_rows == np.arange(b)).all())  # every row greedy, in order
    if every and batch.chain:  # the common step: `greedy`'s own, with no row picked out
        return Verdict(*greedy_accept_with_bonus(batch.tokens, batch.sizes, argmax(scores[:, : batch.width + 1])))
    counts, bonus = np.zeros(b, dtype=np.int64), np.zeros(b, dtype=np.int64)
    paths = [[] for _ in range(b)]
    if len(greedy_rows):
        g = greedy_rows
        targets = argmax(scores[:, : batch.width + 1]) if every else \
            argmax_rows(scores, torch.from_numpy(g), batch.width + 1)  # [g, N+1]
        if batch.chain:
            counts[g], bonus[g] = greedy_accept_with_bonus(batch.tokens[g], batch.sizes[g], targets)
        else:
            found, bonus[g] = T.greedy_tree_accept(batch.tokens[g], batch.parents[g], batch.sizes[g], targets)
            for i, path in zip(g.tolist(), found):
                paths[i] = path
    for i in () if every else sorted(set(range(b)) - set(greedy_rows.tolist())):
        paths[i], bonus[i] = pick(i)
        counts[i] = len(paths[i])
    if batch.chain:  # a chain's accepted path is its first counts[i] nodes
        return Verdict(counts, bonus)
    return Verdict.of_paths(paths, bonus)


def argmax(scores: torch.Tensor) -> np.ndarray:
    """The argmax over the last dimension as a host array (numpy's on a CPU: many times faster than torch's there,
    and the same first-maximum rule)."""
    if scores.device.type == "cpu" and scores.dtype in (torch.float32, torch.float64):
        return scores.numpy().argmax(-1)
    return scores.argmax(-1).cpu().numpy()


GATHER_MOST = 1 << 20  # logits (rows x columns x vocabulary) up to which gathering the rows first costs less


def argmax_rows(scores: torch.Tensor, rows: torch.Tensor, n: int) -> np.ndarray:
    """`argmax` of scores[rows, :n] [r, n] (scores [B, W, V]; rows on their device). On a CPU, large logits are
    reduced row by row in place: gathering the rows would copy them into fresh memory (on the GPT-2 vocabulary at
    batch 16 a step's 40 MB, whose page faults cost more than the reduction)."""
    if scores.device.type != "cpu" or len(rows) * n * scores.shape[-1] <= GATHER_MOST:
        return argmax(scores[rows, :n])
    return np.stack([argmax(scores[i, :n]) for i in rows.tolist()])


def sample(batch: DraftBatch, scores: torch.Tensor, generator=None) -> Verdict:
    """Speculative sampling (point-mass drafts): every emitted token is distributed as the target samples it."""
    probs = torch.softmax(scores.float(), dim=-1)
    if batch.chain:
        return Verdict(*sample_accept(batch.tokens, batch.sizes, probs, generator))
    return Verdict.of_paths(*T.sample_tree_accept(batch.tokens, batch.parents, batch.sizes, probs, generator))
