"""The only code that changes the KV cache's layout: creation, rollback of rejected drafts, dropping rows.

Rejected draft tokens cost nothing to undo: their keys/values sit at the end of the cache and are cut off.
Sliding-window layers are told to record their past so that a rollback after a verification step is possible.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache, EncoderDecoderCache


def new_cache(model) -> DynamicCache:
    """A dynamic cache for `model` whose every layer can be rolled back after a verification step.

    Encoder-decoder models get an `EncoderDecoderCache`; rollback then cuts only its decoder self-attention part.
    """
    if getattr(model.config, "is_encoder_decoder", False):
        config = model.config.get_text_config(decoder=True)
        return EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # older transformers: no config argument
        cache = DynamicCache()
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    return cache


def rollback(cache, keep: int, length: int | None = None) -> None:
    """Cut the cache back to its first `keep` slots (drops the keys/values of rejected drafts); `length`: the slots
    it holds, when the caller knows them."""
    extra = (cache.get_seq_length() if length is None else length) - keep
    assert extra >= 0, f"cannot roll a cache of {cache.get_seq_length()} slots forward to {keep}"
    cache.crop(-extra)


def keep_slots(cache, start: int, slots: torch.Tensor) -> None:
    """Keep the cache's first `start` slots, then, per row, the slots `start + slots[i]` (a [b, W] LongTensor).

    After a tree verification the accepted path is scattered among the tree's columns; this packs it behind the
    slots before the step, rewriting only the step's own slots (in place) and cropping the rest: the cost does not
    grow with the length of the cache. Rows whose path is shorter than W repeat a slot that the caller masks out.
    """
    width = slots.shape[1]
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None:
            continue
        index = slots[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
        for name in ("keys", "values"):
            states = getattr(layer, name)
            packed = states[:, :, start:].gather(2, index)  # read every kept slot before any is overwritten
            states[:, :, start:start + width] = packed
            setattr(layer, name, states[:, :, :start + width])
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = layer.keys.shape[2]


def select_rows(cache, rows: torch.Tensor) -> None:
    """Keep only the batch rows `rows` (a 1-D LongTensor of row indices) in the cache."""
    cache.batch_select_indices(rows)
