"""Which acceptance rule a call uses: greedy, or speculative sampling from the processed distribution.

A rule maps a `DraftBatch` and the processed scores of its forward [b, N+1, V] to a `Verdict`. Chains take the
vectorised rules (`greedy_accept`, `sample_accept`), trees walk their branches (`verify/tree.py`).
"""
from __future__ import annotations

import numpy as np
import torch

from . import tree as T
from .batch import DraftBatch, Verdict
from .greedy import greedy_accept
from .sampling import sample_accept


def acceptance_rule(do_sample: bool, generator=None, device=None):
    """The rule of a call: greedy, or sampling with one generator for every draw (so that draws are independent).

    Args:
        do_sample: sample (True) or take the argmax (False).
        generator: a `torch.Generator`, an int seed (a generator on `device` is made from it) or None (torch's global
            generator).
        device: where the scores live.
    """
    if not do_sample:
        return greedy
    if isinstance(generator, int):
        generator = torch.Generator(device=device).manual_seed(generator)
    return lambda batch, scores: sample(batch, scores, generator)


def greedy(batch: DraftBatch, scores: torch.Tensor) -> Verdict:
    """The longest draft path that equals the target's argmax, then the argmax after it."""
    targets = scores.argmax(-1).cpu().numpy()  # [b, N+1]; the one host-device sync
    if batch.chain:
        counts = greedy_accept(batch.tokens, batch.sizes, targets)
        return Verdict(counts, targets[np.arange(len(counts)), counts])
    return Verdict.of_paths(*T.greedy_tree_accept(batch.tokens, batch.parents, batch.sizes, targets))


def sample(batch: DraftBatch, scores: torch.Tensor, generator=None) -> Verdict:
    """Speculative sampling (point-mass drafts): every emitted token is distributed as the target samples it."""
    probs = torch.softmax(scores, dim=-1)
    if batch.chain:
        return Verdict(*sample_accept(batch.tokens, batch.sizes, probs, generator))
    return Verdict.of_paths(*T.sample_tree_accept(batch.tokens, batch.parents, batch.sizes, probs, generator))
