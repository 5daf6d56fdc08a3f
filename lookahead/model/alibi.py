"""ALiBi biases (Bloom; Falcon with `alibi=True`) from each key's own position, for tree verification forwards.

Bloom and Falcon bias each key by its position times a head's slope, the position counted from the 2D attention
mask (the row's real slots before it). A tree's nodes sit after the cache in slot order, but a node's position is its
depth (siblings share one), and a tree step passes a 4D mask, which these builders cannot read. Within
`from_positions`, the modeling module's builder gives every key the bias of the position lookahead hands it: the
values the model's own builder computes for that position (the same slopes and dtype), so a node is biased as it
will be once decoded alone.
"""
from __future__ import annotations

import contextlib

import torch

from .facts import alibi_builder


@contextlib.contextmanager
def from_positions(model, positions: torch.Tensor):
    """Within: `model`'s ALiBi builder returns the biases of keys at `positions` [b, K] (the cache's slots, then the
    step's tokens; a padding slot's any), whatever mask it is handed. For models whose biases come from the 2D mask
    (`facts.alibi == "mask"`)."""
    module, name = alibi_builder(model)
    build = getattr(module, name)

    def biases(attention_mask, num_heads: int, dtype: torch.dtype) -> torch.Tensor:
        rows, keys = positions.shape  # a key's position is below its slot's index: the table covers them all
        table = build(torch.ones((1, keys), dtype=torch.long, device=positions.device), num_heads, dtype)  # [h, 1, K]
        picked = table.reshape(num_heads, keys)[:, positions.clamp(0, keys - 1)]  # [h, b, K]
        return picked.transpose(0, 1).reshape(rows * num_heads, 1, keys)

    setattr(module, name, biases)
    try:
        yield
    finally:
        setattr(module, name, build)
