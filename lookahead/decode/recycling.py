"""What a recycling lookup (`lookahead.index.recycle`) takes from each forward: the target's top-k after every
verified column of every running row, taken on the logits' device and copied to the host in one piece ([b, N+1, k]
ids and probabilities, nothing else of the logits), then learned by each row's index before it is extended with the
step's tokens (the root's two-token context is the row's last two tokens)."""
from __future__ import annotations

import numpy as np
import torch

from ..verify.batch import DraftBatch


def top_k(logits: torch.Tensor, k: int) -> tuple:
    """(ids [..., k] int64, probabilities [..., k] float32) of the k largest logits (the raw distribution: M is the
    model's, whatever a call's sampling settings), as host arrays. On CUDA the copy is asynchronous, into pinned
    memory: the step's one host-device sync (its acceptance) comes before the arrays are read."""
    values, ids = logits.topk(min(k, logits.shape[-1]), dim=-1)
    probs = (values.float() - logits.float().logsumexp(-1, keepdim=True)).exp()
    if logits.device.type == "cpu":
        return ids, probs
    return ids.to("cpu", non_blocking=True), probs.to("cpu", non_blocking=True)  # into pinned memory


class Recycling:
    """The loop's side of a recycling call: `launch` after a forward, `learn` after its acceptance.

    Args:
        k: predictions taken per column (the `Recycled` table's k).
    """

    def __init__(self, k: int):
        self.k = k

    def launch(self, logits: torch.Tensor) -> tuple:
        """The top-k after every column of a step's logits [b, N+1, V] (see `top_k`)."""
        return top_k(logits, self.k)

    def learn(self, top: tuple, indexes: list, batch: DraftBatch) -> None:
        """Each row's index learns its columns' predictions (before it is extended with the step's tokens)."""
        ids, probs = (np.ascontiguousarray(t.numpy()) for t in top)
        for i, index in enumerate(indexes):
            if index is not None:
                index.observe(batch.tokens[i], batch.parents[i], int(batch.sizes[i]), ids[i], probs[i])
