"""Greedy acceptance: keep the longest draft prefix that equals the target's argmax, then the target's own token."""
from __future__ import annotations

import numpy as np


def greedy_accept(drafts: np.ndarray, draft_lens: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Number of draft tokens accepted per row.

    Args:
        drafts: [B, D] draft tokens (entries past a row's length are ignored).
        draft_lens: [B] number of real draft tokens per row.
        targets: [B, D + 1] argmax of the target at the last verified token and after each draft token.

    Returns:
        [B] int64, a[i] <= draft_lens[i]; row i gains drafts[i, :a[i]] followed by targets[i, a[i]].
    """
    b, d = drafts.shape
    if d == 0:
        return np.zeros(b, dtype=np.int64)
    ok = (drafts == targets[:, :d]) & (np.arange(d)[None, :] < draft_lens[:, None])  # [B, D]
    return np.cumprod(ok, axis=1).sum(axis=1).astype(np.int64)
