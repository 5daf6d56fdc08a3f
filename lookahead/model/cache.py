"""The only code that changes the KV cache's layout: creation, rollback of rejected drafts, dropping rows.

Rejected draft tokens cost nothing to undo: their keys/values sit at the end of the cache and are cut off.
Attention layers keep their keys and values in buffers with room to grow (`GrowingLayer`): transformers' dynamic
layer concatenates, copying the whole layer at every step. Sliding-window and chunked layers keep every slot too, as
full-attention layers do: a batch's rows hold different numbers of masked slots (rejected drafts), so which slots a
window holds differs by row; the masks cut each layer's window by position (`CausalLM`, `layers.LayerKinds`).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache, EncoderDecoderCache

from .compressed import compressed_layers, is_compressed
from . import rwkv, xlstm
from .recurrent import LinearAttentionCacheLayerMixin, recurrent_layers, select_state_rows

FOLLOWED_CACHES = ("MiniMaxCache", "xLSTMCache")  # caches of a model's own whose states lookahead follows
# (MiniMax's `linear_cache`, xLSTM's `rnn_state`: `xlstm.py`)

try:
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
except ImportError:  # older transformers: caches without layer objects
    DynamicLayer = DynamicSlidingWindowLayer = None

HEADROOM = 256  # slots a buffer grows by at least


class GrowingLayer(DynamicLayer or object):
    """transformers' `DynamicLayer` whose keys and values are views [b, h, n, d] of buffers [b, h, capacity, d]:
    a step writes its slots in place, and a buffer is copied only when it fills (to 1.5 times what it holds, plus
    `HEADROOM`). Cutting (`crop`, `keep_slots`) narrows the views; the buffers stay."""

    _room = None  # (keys, values) buffers

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, q = self.get_seq_length(), key_states.shape[-2]
        if not self._backed() or n + q > self._room[0].shape[-2]:
            self._grow(n + q, key_states, value_states)
        keys, values = self._room
        keys[..., n:n + q, :] = key_states
        values[..., n:n + q, :] = value_states
        self.keys, self.values = keys[..., :n + q, :], values[..., :n + q, :]
        return self.keys, self.values

    def _backed(self) -> bool:
        """Whether the keys and values are the first slots of the buffers (not after a method that copied them)."""
        if self._room is None:
            return False
        if self.keys.numel() == 0:
            return True
        return all(view.data_ptr() == room.data_ptr() and view.shape[:2] == room.shape[:2]
                   and view.stride() == room.stride() for view, room in zip((self.keys, self.values), self._room))

    def _grow(self, need: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        n, capacity = self.get_seq_length(), need + max(need // 2, HEADROOM)
        room = []
        for held, new in ((self.keys, key_states), (self.values, value_states)):
            buffer = new.new_empty((*new.shape[:2], capacity, new.shape[-1]))
            if n:
                buffer[..., :n, :] = held
            room.append(buffer)
        self._room = tuple(room)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the batch rows `indices`. Rows kept in their order (rows leaving a batch) move up inside the buffers,
        their held slots only: a server's batch loses rows one step after another, and a fresh copy of the buffers
        each time (as indexing makes) is fresh memory to fault in (with it, the server at 16-64 SmolLM2 rows was
        3-5% slower than plain decoding; benchmarks/RESULTS.md, "Under load"). Rows in another order: a copy."""
        n = self.get_seq_length()
        if n > 0 and self._backed():
            keep = indices.tolist()
            if all(a < b for a, b in zip(keep, keep[1:])):
                for room in self._room:
                    for j, i in enumerate(keep):  # j <= i: a row is read before any row is written over it
                        if i != j:
                            room[j, :, :n].copy_(room[i, :, :n])
                self._room = tuple(room[: len(keep)] for room in self._room)
            else:
                self._room = tuple(room[indices, ...] for room in self._room)
            self.keys, self.values = self._room[0][..., :n, :], self._room[1][..., :n, :]
        else:
            super().batch_select_indices(indices)


def new_cache(model, rows: int = 1) -> DynamicCache:
    """A dynamic cache for `model` (a batch of `rows`) whose every layer can be rolled back after a verification step.

    Encoder-decoder models get an `EncoderDecoderCache`; rollback then cuts only its decoder self-attention part.
    """
    if getattr(model.config, "is_encoder_decoder", False):
        config = model.config.get_text_config(decoder=True)
        return EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
    if rwkv.is_rwkv(model):  # no cache: its `state` (`rwkv.py`)
        return rwkv.new_state(model, rows)
    own = own_cache_class(model)
    if own is not None and own.__name__ == "xLSTMCache":  # states sized by the batch (`xlstm.py`)
        weight = next(model.parameters())
        return own(model.config, rows, dtype=weight.dtype, device=weight.device)
    if own is not None:  # MiniMax's: its linear attention states beside the KV layers
        cache = own()
        _grow_in_place(cache)
        return cache
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # older transformers: no config argument
        cache = DynamicCache()
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    for i in recurrent_layers(cache):  # recurrent states roll back from checkpoints (`recurrent.Checkpoints`), not
        # from recorded convolution inputs; a sliding-window hybrid layer records them, its attention part every slot
        if not isinstance(cache.layers[i], DynamicSlidingWindowLayer):
            cache.layers[i].record_past = False
    _grow_in_place(cache)
    return cache


def own_cache_class(model):
    """The model's own cache class where lookahead follows its states (`FOLLOWED_CACHES`), else None."""
    import sys

    module = sys.modules.get(type(model).__module__)
    for name in FOLLOWED_CACHES:
        if module is not None and isinstance(getattr(module, name, None), type):
            return getattr(module, name)
    return None


def _grow_in_place(cache) -> None:
    """Make the cache's attention layers (full, sliding-window, chunked) `GrowingLayer`s (they hold nothing yet)."""
    if DynamicLayer is None:
        return
    layers = getattr(cache, "layers", None) or []
    for i, layer in enumerate(layers):
        if type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) and not layer.is_initialized:
            layers[i] = GrowingLayer()
    if getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:
        cache.layer_class_to_replicate = GrowingLayer


def rollback(cache, keep: int, length: int | None = None) -> None:
    """Cut the cache back to its first `keep` slots (drops the keys/values of rejected drafts); `length`: the slots
    it holds, when the caller knows them."""
    if rwkv.keeps_rwkv_state(cache):  # no slots, no count: its states are settled (`rwkv.RwkvStates`)
        return
    if xlstm.keeps_rnn_state(cache):  # no slots: its states are settled (`xlstm.LayerStates`), its count cut
        cache.seqlen_offset -= (int(cache.seqlen_offset) if length is None else length) - keep
        return
    extra = (cache.get_seq_length() if length is None else length) - keep
    assert extra >= 0, f"cannot roll a cache of {cache.get_seq_length()} slots forward to {keep}"
    if hasattr(cache, "linear_cache"):  # MiniMax's cache refuses `crop`: its KV layers are cut, its states restored
        for layer in cache.layers:
            layer.crop(-extra)
        return
    if not recurrent_layers(cache) and not compressed_layers(cache):
        cache.crop(-extra)
        return
    for layer in cache.layers:  # recurrent states are rolled back from checkpoints (`recurrent.Checkpoints`),
        # compressed layers refolded (`compressed.CompressedStates`)
        if is_compressed(layer):
            continue
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            if isinstance(layer, DynamicSlidingWindowLayer):  # a windowed hybrid layer: its attention part is cut
                # and held to its window, its count of tokens seen (which its masks read) cut with it
                DynamicSlidingWindowLayer.crop(layer, -extra)
            elif isinstance(layer, DynamicLayer):  # a hybrid layer: its attention part is cut
                DynamicLayer.crop(layer, -extra)
        elif hasattr(layer, "crop"):
            layer.crop(-extra)


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
        for name in ("keys", "values"):  # keys and values may differ in heads and head size (MLA)
            states = getattr(layer, name)
            index = slots[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[-1])
            packed = states[:, :, start:].gather(2, index)  # read every kept slot before any is overwritten
            states[:, :, start:start + width] = packed
            setattr(layer, name, states[:, :, :start + width])
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = layer.keys.shape[2]
        _each_indexer(layer, lambda keys: _packed(keys, start, slots))


def _packed(keys: torch.Tensor, start: int, slots: torch.Tensor) -> torch.Tensor:
    """An indexer's keys [b, S, d] with the slots after `start` packed as `keep_slots` packs a layer's states."""
    index = slots[:, :, None].expand(-1, -1, keys.shape[-1])
    keys[:, start:start + slots.shape[1]] = keys[:, start:].gather(1, index)
    return keys[:, :start + slots.shape[1]]


def _each_indexer(layer, change, other=None) -> None:
    """Apply `change` to a sparse-attention layer's indexer keys [b, S, d] (transformers' `DynamicIndexedLayer`),
    which follow its slots: the keys its indexer scores (`model.indexer`); and to the positions of those keys where
    the layer keeps them (`indexer_position_ids` [dims, b, S], Qwen4-Exp's; given to `change` as [b, S, dims]).
    With `other` (a layer of another cache): `change(mine, theirs)`."""
    def changed(mine, theirs):
        return change(mine) if other is None else change(mine, theirs)

    if getattr(layer, "indexer_keys", None) is not None and layer.indexer_keys.numel():
        layer.indexer_keys = changed(layer.indexer_keys, getattr(other, "indexer_keys", None))
    positions = vars(layer).get("indexer_position_ids")  # (a static cache's slot layers read theirs from the step)
    if isinstance(positions, torch.Tensor):
        theirs = getattr(other, "indexer_position_ids", None)
        layer.indexer_position_ids = changed(positions.permute(1, 2, 0),
                                             None if theirs is None else theirs.permute(1, 2, 0)).permute(2, 0, 1)


def _states_only(cache):
    """The module (`rwkv`, `xlstm`) whose `select_rows` and `join_rows` take `cache`, a cache of recurrent states
    and no slots; None for any other cache."""
    return rwkv if rwkv.keeps_rwkv_state(cache) else xlstm if xlstm.keeps_rnn_state(cache) else None


def select_rows(cache, rows: torch.Tensor) -> None:
    """Keep only the batch rows `rows` (a 1-D LongTensor of row indices) in the cache."""
    if (states := _states_only(cache)) is not None:
        states.select_rows(cache, rows)
        return
    if not recurrent_layers(cache):
        cache.batch_select_indices(rows)
        return
    for layer in cache.layers:  # transformers' recurrent layers select no rows: their states are selected here
        if not isinstance(layer, LinearAttentionCacheLayerMixin):
            layer.batch_select_indices(rows)
        elif isinstance(layer, DynamicLayer):  # a hybrid layer: its attention part too
            DynamicLayer.batch_select_indices(layer, rows)
    select_state_rows(cache, rows)


def join_rows(cache, other, pad: int, other_pad: int) -> None:
    """Append `other`'s batch rows to `cache` (a server's running batch taking a request prefilled alone), each side
    first left-padded with `pad` / `other_pad` zero slots so that both are as long; the caller masks the padding.
    Recurrent states are stacked as they are (they hold no slots).

    Both caches hold the layers of one model: full-attention or windowed (`GrowingLayer` or transformers'
    `DynamicLayer`), recurrent, or both in one layer; or xLSTM's or RWKV's states."""
    if (states := _states_only(cache)) is not None:
        states.join_rows(cache, other)
        return
    for j, state in enumerate(getattr(cache, "linear_cache", ())):  # MiniMax's linear attention states
        if isinstance(state, torch.Tensor):
            cache.linear_cache[j] = torch.cat([state, other.linear_cache[j]], dim=0)
    for layer, extra in zip(cache.layers, other.layers):
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            _join_states(layer, extra)
            if not isinstance(layer, DynamicLayer):
                continue
        if getattr(layer, "keys", None) is None:  # a layer that keeps nothing (MLP-only)
            continue
        for name in ("keys", "values"):
            setattr(layer, name, torch.cat([_left_padded(getattr(layer, name), pad),
                                            _left_padded(getattr(extra, name), other_pad)], dim=0))
        _each_indexer(layer, lambda keys, theirs: torch.cat([_left_padded(keys.unsqueeze(1), pad).squeeze(1),
                                                             _left_padded(theirs.unsqueeze(1), other_pad).squeeze(1)],
                                                            dim=0), extra)
        _unbacked(layer)


def _join_states(layer, extra) -> None:
    """Stack `extra`'s recurrent and convolution states behind `layer`'s, batch row after batch row."""
    for kind in ("conv_states", "recurrent_states"):
        states, more = getattr(layer, kind), getattr(extra, kind)
        for j, state in states.items():
            if state is not None:
                if kind == "conv_states" and layer.record_past:  # the window a next forward reads
                    size = layer.conv_kernel_size[j]
                    state, more[j] = state[..., -size:], more[j][..., -size:]
                states[j] = torch.cat([state, more[j]], dim=0)


def drop_leading(cache, n: int) -> None:
    """Drop the first `n` slots of every layer (slots that no row sees any more, after rows left the batch)."""
    if _states_only(cache) is not None:  # no slots
        return
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or (isinstance(layer, LinearAttentionCacheLayerMixin)
                                                    and not isinstance(layer, DynamicLayer)):
            continue
        layer.keys, layer.values = layer.keys[..., n:, :], layer.values[..., n:, :]
        _each_indexer(layer, lambda keys: keys[:, n:])
        _unbacked(layer)


def _left_padded(states: torch.Tensor, n: int) -> torch.Tensor:
    """states [b, h, S, d] behind n zero slots [b, h, n + S, d]."""
    if n == 0:
        return states
    return torch.cat([states.new_zeros((*states.shape[:2], n, states.shape[-1])), states], dim=2)


def _unbacked(layer) -> None:
    """A `GrowingLayer` whose keys and values were replaced copies them into new buffers at its next update."""
    if isinstance(layer, GrowingLayer):
        layer._room = None
