"""Compressed attention (DeepSeek-V4's HCA and CSA layers) whose cache follows the accepted path.

Each such layer attends to a sliding window of keys and to compressed entries: every `compress_rate` tokens its
compressor folds into one entry (CSA also keeps the last window's overlap slice, and its indexer a second series).
Its cache layer (`DeepseekV4HCACache`, `DeepseekV4CSACache`) keeps only the window's last `sliding_window - 1` keys,
the tokens not yet folded (a buffer), the entries and their count, and replaces them at every forward. A verification
forward over a row's last token and its draft folds the draft in too, and drops keys the row needs back when a draft
is rejected, so `DeepseekV4HCACache.crop` cannot take it back.

`CompressedStates` keeps what each layer held before a verification forward (references: a forward replaces its
tensors, never writes into them), records the forward's new keys and each compressor's inputs, and after the
verdict, where the step kept fewer tokens than it ran, puts the layers back and folds the kept tokens in again: the
window's keys are the kept ones appended, and each compressor reruns over the kept tokens' inputs from the state
before (its projections over a few tokens; the attention is not rerun). Its buffers, entries and overlap slices are
then what one forward over the kept tokens leaves, which is what decoding them one at a time leaves (the layers are
written to carry state across calls: checked in `tests/test_indexer.py`). The indexer's picks during the forward are
`indexer.decoding_order`'s. One row, chains only: the entry count is one number for every row, and a tree's nodes
would fold siblings into one window.
"""
from __future__ import annotations

import contextlib
import time

import numpy as np
import torch


def is_compressed(layer) -> bool:
    """Whether a cache layer folds tokens into compressed entries (DeepSeek-V4's HCA and CSA layers)."""
    return callable(getattr(layer, "store_compression_weights", None))


def compressed_layers(cache) -> list:
    """Indices of the cache's compressed layers (`is_compressed`)."""
    return [i for i, layer in enumerate(getattr(cache, "layers", None) or []) if is_compressed(layer)]


def compressors(model) -> list:
    """The model's compressor modules (those that fold a layer's tokens into its cache's compressed entries)."""
    return [m for m in model.modules() if type(m).__name__.endswith("Compressor") and hasattr(m, "compress_rate")]


class CompressedStates:
    """The compressed layers of `cache` kept on the accepted path of a one-row chain (`forward`, then `settle`)."""

    def __init__(self, model, cache):
        self.cache, self.layers, self.modules = cache, compressed_layers(cache), compressors(model)
        self.saved, self.keys, self.calls, self.seconds = {}, {}, [], 0.0

    @contextlib.contextmanager
    def forward(self):
        """Around a verification forward: what each layer holds kept, its new keys and the compressors' inputs
        recorded."""
        start = time.perf_counter()
        self.saved = {i: _held(vars(self.cache.layers[i])) for i in self.layers}
        self.keys, self.calls = {}, []
        hooks = [m.register_forward_pre_hook(self._called, with_kwargs=True) for m in self.modules]
        for i in self.layers:
            self.cache.layers[i].update = self._recording(i, self.cache.layers[i].update)
        self.seconds += time.perf_counter() - start
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()
            for i in self.layers:
                self.cache.layers[i].__dict__.pop("update", None)

    def _recording(self, i: int, update):
        def record(key_states, value_states, *args, **kwargs):
            self.keys[i] = key_states  # [1, 1, n, d]: the step's keys (its values are the same tensor)
            return update(key_states, value_states, *args, **kwargs)
        return record

    def _called(self, module, args, kwargs):
        self.calls.append((module, args, kwargs))

    def settle(self, keep: np.ndarray) -> None:
        """After the verdict: `keep` [1] tokens of the step stay (the root and the accepted drafts); where fewer
        than the step ran, the layers go back to what they held and fold in just those tokens."""
        start = time.perf_counter()
        k = int(keep[0])
        ran = next(iter(self.keys.values())).shape[-2] if self.keys else k
        if k < ran:
            self._refold(k)
        self.saved, self.keys, self.calls = {}, {}, []
        self.seconds += time.perf_counter() - start

    def _refold(self, k: int) -> None:
        for i in self.layers:
            layer, held = self.cache.layers[i], self.saved[i]
            layer.__dict__.update(_held(held))
            keys = torch.cat([held["keys"], self.keys[i][:, :, :k]], dim=-2)  # after the prefill: initialized
            layer.keys = keys[:, :, -layer.sliding_window + 1:]
            layer.values = layer.keys
            layer.cumulative_length = held["cumulative_length"] + k
        with torch.no_grad():
            for module, args, kwargs in self.calls:  # each compressor over the kept tokens, from the state before
                hidden, q_residual, positions, cache, layer_idx = _compressor_args(args, kwargs)
                module(hidden[:, :k], q_residual[:, :k], positions[:, :k], cache, layer_idx)

    def close(self) -> None:
        self.saved, self.keys, self.calls = {}, {}, []


_STATE = ("keys", "values", "cumulative_length", "is_initialized", "buffer_kv", "buffer_gate", "compressed_kv",
          "entry_count", "overlap_kv", "overlap_gate")


def _held(state: dict) -> dict:
    """The compressed layer's state among `state` (a layer's attributes, or what was kept of them): its tensors by
    reference (a forward replaces them), its dicts copied (a forward writes into them)."""
    return {name: dict(value) if isinstance(value, dict) else value for name, value in state.items() if name in _STATE}


def _compressor_args(args: tuple, kwargs: dict) -> tuple:
    """(hidden_states, q_residual, position_ids, cache, layer_idx) of a compressor's call."""
    names = ("hidden_states", "q_residual", "position_ids", "cache", "layer_idx")
    given = dict(zip(names, args))
    given.update({name: kwargs[name] for name in names if name in kwargs})
    return tuple(given[name] for name in names)
