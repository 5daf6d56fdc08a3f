"""Measure what verifying more tokens costs on the machine at hand, to size drafts by tokens per second.

On a GPU at batch 1 a forward over 32 tokens costs about what a forward over 1 costs; on a CPU, or at large batch,
every verified token adds compute. `measure_draft_cost` times forwards over a filled KV cache and fits
t(n) = t(1) * (1 + cost * (n - 1)); pass the result as `generate(..., draft_cost=...)`.
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


def measure_draft_cost(model, context: int = 512, batch: int = 1, max_tokens: int = 32) -> float:
    """Extra cost of one more verified token as a fraction of a one-token forward (>= 0), fitted by least squares.

    Example:
        >>> cost = measure_draft_cost(model)        # e.g. ~0.01 on a GPU, ~0.05-0.2 on a CPU
        >>> generate(model, ids, lookup="suffix", draft="tree", draft_cost=cost)
    """
    sizes = sorted({1, 2, 4, 8, 16, max_tokens})
    times = forward_times(model, sizes, context, batch)
    n = np.array(sizes, dtype=float) - 1.0
    t = np.array([times[s] for s in sizes])
    slope, intercept = np.polyfit(n, t, 1)
    return max(float(slope / max(intercept, 1e-9)), 0.0)
