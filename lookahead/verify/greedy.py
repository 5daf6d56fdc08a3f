"""Greedy acceptance: keep the longest draft prefix that equals the target's argmax, then the target's own token."""
from __future__ import annotations

import numpy as np

from ..runtime.jit import kernels
from . import _kernels


def greedy_accept(drafts: np.ndarray, draft_lens: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Number of draft tokens accepted per row.

    Args:
        drafts: [B, D] draft tokens (entries past a row's length are ignored).
        draft_lens: [B] number of real draft tokens per row.
        targets: [B, D + 1] argmax of the target at the last verified token and after each draft token.

    Returns:
        [B] int64, a[i] <= draft_lens[i]; row i gains drafts[i, :a[i]] followed by targets[i, a[i]].
    """
    return greedy_accept_with_bonus(drafts, draft_lens, targets)[0]


def greedy_accept_with_bonus(drafts: np.ndarray, draft_lens: np.ndarray, targets: np.ndarray) -> tuple:
    """(accepted [B], the target's token after them [B]): `greedy_accept` and the next token in one pass."""
    kern = kernels(_kernels)
    counts, bonus = np.empty(len(drafts), dtype=np.int64), np.empty(len(drafts), dtype=np.int64)
    kern.greedy_chain(drafts, draft_lens, targets, counts, bonus)
    return counts, bonus
