"""Sampling acceptance: speculative sampling with a draft that is a point mass.

Reference: Leviathan et al. (2023), Algorithm 1; Chen et al., "Accelerating LLM Decoding with Speculative Sampling"
(2023). With a draft distribution q that puts all its mass on the proposed token x, the rule "accept x with
probability min(1, p(x) / q(x))" becomes "accept with probability p(x)", and the residual norm(max(0, p - q)) is p
with x removed. Every emitted token is then distributed exactly as the target's own sample from p.
"""
from __future__ import annotations

import numpy as np
import torch


def sample_accept(drafts: np.ndarray, draft_lens: np.ndarray, probs: torch.Tensor, generator=None) -> tuple:
    """Accept draft tokens by the speculative sampling rule; sample each row's next token.

    Args:
        drafts: [B, D] draft tokens (entries past a row's length are ignored).
        draft_lens: [B] number of real draft tokens per row.
        probs: [B, D + 1, V] the target's processed distribution at the last verified token and after each draft.
        generator: a `torch.Generator` on probs' device, or None for the global generator.

    Returns:
        (accepted [B] int64, next [B] int64): row i gains drafts[i, :accepted[i]] followed by next[i], which is
        sampled from p with the rejected draft removed, or from p after the last draft when all were accepted.

    Example:
        >>> a, nxt = sample_accept(np.array([[3]]), np.array([1]), torch.full((1, 2, 8), 1 / 8))
    """
    b, d = drafts.shape
    device = probs.device
    x = torch.from_numpy(drafts).to(device)  # [B, D]
    u = torch.rand((b, d), generator=generator, device=device, dtype=probs.dtype)
    lens = torch.from_numpy(draft_lens).to(device)
    real = torch.arange(d, device=device)[None, :] < lens[:, None]
    ok = (u < probs[:, :d].gather(-1, x[..., None])[..., 0]) & real  # accept x with probability p(x)
    accepted = ok.long().cumprod(1).sum(1)  # [B]
    p = probs[torch.arange(b, device=device), accepted]  # [B, V] the distribution after the accepted prefix
    if d:
        rejected = accepted < lens
        x_rejected = x.gather(1, accepted.clamp(max=d - 1)[:, None])  # [B, 1]
        p = p.scatter(1, x_rejected, torch.where(rejected[:, None], 0.0, p.gather(1, x_rejected)))
    nxt = torch.multinomial(p, 1, generator=generator)[:, 0]  # multinomial renormalizes
    both = torch.stack([accepted, nxt]).cpu().numpy()  # the one host-device sync
    return both[0], both[1]
