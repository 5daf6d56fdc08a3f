"""GPT-Neo's local attention layers, windowed by position.

GPT-Neo's attention layers cut what they see themselves, from a band of slots they keep (`bias` [1, 1, N, N]: causal,
and for "local" layers no further back than `window_size`) and slice as `bias[:, :, K - Q:K, :K]` for Q queries over
K keys: a query's slot is taken for its position, and each key's slot for its. A tree's nodes (siblings share a
depth), a batch's rows (their padding and the slots of rejected drafts) and the static cache (its whole buffer of
slots) break that. Within `by_position`, each such layer reads the band of the positions lookahead hands it: a local
layer's query at position q sees a key at position k where q - k < window, a global layer's every key; which keys a
query sees at all is the attention mask's (causal, its own row, its tree ancestors), as for every other layer.
"""
from __future__ import annotations

import contextlib

import torch


class _Band:
    """What a layer's `bias[...]` slice returns within `by_position`: the band [b, 1, Q, K] of this forward."""

    def __init__(self, band: torch.Tensor):
        self.band = band

    def __getitem__(self, index) -> torch.Tensor:
        return self.band


def banded_layers(model) -> list:
    """The attention modules of `model` that cut their keys by a band of slots of their own (GPT-Neo's)."""
    return [m for m in model.modules() if getattr(m, "attention_type", None) in ("global", "local")
            and isinstance(m._buffers.get("bias") if hasattr(m, "_buffers") else None, torch.Tensor)]


@contextlib.contextmanager
def by_position(model, key_pos: torch.Tensor, query_pos: torch.Tensor, window: int):
    """Within: `model`'s banded attention layers see keys at `key_pos` [b, K] from queries at `query_pos` [b, Q] as
    decoding alone would, a local layer those less than `window` positions back, a global one all (the mask decides
    the rest)."""
    near = ((query_pos[:, :, None] - key_pos[:, None, :]) < window)[:, None]  # [b, 1, Q, K]
    every = torch.ones_like(near)
    layers = banded_layers(model)
    for layer in layers:  # an instance attribute, read before the buffer of that name
        layer.__dict__["bias"] = _Band(near if layer.attention_type == "local" else every)
    try:
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("bias", None)
