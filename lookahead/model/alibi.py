"""ALiBi biases (Bloom; Falcon with `alibi=True`; MPT) from each key's own position, for tree and static-cache
verification forwards.

Bloom and Falcon bias each key by its position times a head's slope, the position counted from the 2D attention
mask (the row's real slots before it); MPT biases it by its slot, counted back from the cache's last. A tree's nodes
sit after the cache in slot order, but a node's position is its depth (siblings share one), a tree step passes a 4D
mask, which these builders cannot read, and the static cache's slots run past a row's last token. Within
`from_positions`, the modeling module's builder gives every key the bias of the position lookahead hands it: the
values the model's own builder computes for that position (the same slopes and dtype), so a node is biased as it
will be once decoded alone. MPT's builder makes one bias line for every row (its attention adds a 3D tensor), so it
is followed one row at a time.
"""
from __future__ import annotations

import contextlib

import torch

from .facts import alibi_builder


@contextlib.contextmanager
def from_positions(model, positions: torch.Tensor, kind: str = "mask"):
    """Within: `model`'s ALiBi builder returns the biases of keys at `positions` [b, K] (the cache's slots, then the
    step's tokens; a padding slot's any), whatever mask or length it is handed. `kind`: `facts.alibi`, "mask" for
    builders that read the 2D mask (Bloom, Falcon), "slots" for MPT's (one row only)."""
    module, name = alibi_builder(model)
    build = getattr(module, name)
    setattr(module, name, _slot_biases(build, positions) if kind == "slots" else _mask_biases(build, positions))
    try:
        yield
    finally:
        setattr(module, name, build)


def _mask_biases(build, positions: torch.Tensor):
    """Bloom's and Falcon's `build_alibi_tensor` returning [b * h, 1, K] biases for keys at `positions` [b, K]."""
    def biases(attention_mask, num_heads: int, dtype: torch.dtype) -> torch.Tensor:
        rows, keys = positions.shape  # a key's position is below its slot's index: the table covers them all
        table = build(torch.ones((1, keys), dtype=torch.long, device=positions.device), num_heads, dtype)  # [h, 1, K]
        picked = table.reshape(num_heads, keys)[:, positions.clamp(0, keys - 1)]  # [h, b, K]
        return picked.transpose(0, 1).reshape(rows * num_heads, 1, keys)
    return biases


def _slot_biases(build, positions: torch.Tensor):
    """MPT's `build_mpt_alibi_tensor` returning [h, 1, K] biases for keys at `positions` [1, K]: its attention takes
    the last K of a line as the keys' biases, and a line's value at index p differs from its value at 0 by p slopes
    (a shift each query's softmax ignores), so a key holding position p is biased as slot p of an unbroken cache."""
    if positions.shape[0] != 1:
        raise ValueError(f"MPT's ALiBi biases are one line for every row: {positions.shape[0]} rows were given")
    keys = positions.shape[1]

    def biases(num_heads: int, sequence_length: int, alibi_bias_max: int = 8, device=None) -> torch.Tensor:
        line = build(num_heads, max(sequence_length, keys), alibi_bias_max, device)  # [h, 1, L]
        return line[:, :, positions[0].clamp(0, line.shape[-1] - 1).to(line.device)]  # [h, 1, K]
    return biases
