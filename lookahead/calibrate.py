"""Measure what verifying more tokens costs on the machine at hand, to size drafts by tokens per second.

On a GPU at batch 1 a forward over 32 tokens costs about what a forward over 1 costs; on a CPU, or at large batch,
every verified token adds compute, and on a CPU any multi-token forward costs well over a one-token one (a
matrix-vector product). `measure_draft_cost` times forwards over a filled KV cache and fits that;
pass the result as `generate(..., draft_cost=...)`.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from .verify import new_cache, rollback


def forward_times(model, sizes=(1, 4, 8, 16, 32), context: int = 512, batch: int = 1, repeats: int = 5) -> dict:
    """Median seconds of one forward over n new tokens (n in `sizes`) after `context` cached tokens."""
    device = model.device
    vocab = model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        cache = new_cache(model)
        model(input_ids=torch.randint(0, vocab, (batch, context), generator=g).to(device), past_key_values=cache,
              use_cache=True)
        times = {}
        for n in sizes:
            samples = []
            for _ in range(repeats + 1):  # the first run warms up
                ids = torch.randint(0, vocab, (batch, n), generator=g).to(device)
                start = time.perf_counter()
                model(input_ids=ids, past_key_values=cache, use_cache=True).logits.argmax(-1).cpu()
                samples.append(time.perf_counter() - start)
                rollback(cache, context)
            times[n] = float(np.median(samples[1:]))
    return times


def measure_draft_cost(model, context: int = 512, batch: int = 1, max_tokens: int = 32) -> tuple:
    """(overhead, per_token) of verification on this machine, as fractions of a one-token forward.

    Fits t(n) = t(1) * (1 + overhead + per_token * n) for n = 1 + k verified tokens, k >= 1 drafts, by least
    squares; both are clipped at 0.

    Example:
        >>> cost = measure_draft_cost(model)        # e.g. ~(0, 0.01) on a GPU, ~(0.8, 0.08) on a CPU
        >>> generate(model, ids, lookup="suffix", draft="tree", draft_cost=cost)
    """
    sizes = sorted({1, 2, 4, 8, 16, max_tokens})
    times = forward_times(model, sizes, context, batch)
    k = np.array(sizes[1:], dtype=float) - 1.0
    ratio = np.array([times[s] for s in sizes[1:]]) / times[1]
    per_token, intercept = np.polyfit(k, ratio, 1)
    return max(float(intercept) - 1.0, 0.0), max(float(per_token), 0.0)
