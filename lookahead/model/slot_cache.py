"""The static step's KV cache: every layer's keys and values in one preallocated buffer, written by position.

Each row owns a run of slots; a forward writes its queries' keys and values at the slots the caller names
(`SlotCache.writes`), so a rejected draft is simply overwritten by the next step and a rollback copies nothing
(reference: gpt-fast's static cache). `lookahead.model.static` runs the steps over it.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class SlotLayer(CacheLayerMixin):
    """One layer's keys and values, views into the cache's one buffer; `update` writes at the cache's `writes`."""

    is_compileable = True

    def __init__(self, cache: "SlotCache", index: int):
        super().__init__()
        self.cache, self.index = cache, index
        self.keys, self.values = cache.kv[0, index], cache.kv[1, index]
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple:
        if not self._fits(key_states, value_states):
            self.own(key_states, value_states)
        rows, slots = self.cache.rows, self.cache.writes  # [b, 1], [b, Q]
        self.keys[rows, :, slots] = key_states.transpose(1, 2)  # [b, Q, H, d] into slot order
        self.values[rows, :, slots] = value_states.transpose(1, 2)
        return self.keys, self.values

    def _fits(self, key_states: torch.Tensor, value_states: torch.Tensor) -> bool:
        """Whether the layer's buffers hold keys and values of these heads and sizes."""
        return (self.keys.shape[1::2] == key_states.shape[1::2]
                and self.values.shape[1::2] == value_states.shape[1::2])

    def own(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Give the layer buffers of its own, shaped by its first keys and values, where the config's heads and head
        size are not its (multi-head latent attention: keys of the rotary part or of nope+rope sizes, values of
        `v_head_dim` or the latent's rank); the first update is a prefill, before any step is captured."""
        b, slots = self.keys.shape[0], self.cache.slots
        self.keys = key_states.new_zeros((b, key_states.shape[1], slots, key_states.shape[-1]))
        self.values = value_states.new_zeros((b, value_states.shape[1], slots, value_states.shape[-1]))
        self.cache.own.add(self.index)

    def get_mask_sizes(self, query_length: int) -> tuple:
        return self.cache.slots, 0

    def get_seq_length(self) -> int:
        return 0  # positions and the mask come from the caller, never from the cache length

    def get_max_length(self) -> int:
        return self.cache.slots


class SlotCache(Cache):
    """Keys and values of every layer in one buffer [2, layers, b, heads, slots, head_dim].

    `writes` [b, Q] (a device tensor the caller fills before each forward) says where each query's keys go.
    """

    def __init__(self, config, batch: int, slots: int, dtype: torch.dtype, device):
        text = config.get_text_config(decoder=True)
        heads = _shared(text, "num_key_value_heads") or text.num_attention_heads
        head_dim = _shared(text, "head_dim") or text.hidden_size // text.num_attention_heads
        self.slots = slots
        self.kv = torch.zeros((2, text.num_hidden_layers, batch, heads, slots, head_dim), dtype=dtype, device=device)
        self.rows = torch.arange(batch, device=device)[:, None]
        self.writes = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.origin = torch.arange(batch, device=device)  # the call's row that each batch row holds (compaction)
        self.own = set()  # layers whose keys and values are buffers of their own (`SlotLayer.own`), not views of kv
        super().__init__(layers=[SlotLayer(self, i) for i in range(text.num_hidden_layers)])

    def batch_tensors(self) -> list:
        """(tensor, its batch dimension) of every cache tensor a step may read (`origin`: a forward hook may)."""
        return [(self.kv, 2), (self.rows, 0), (self.origin, 0)] + [(t, 0) for layer in self.layers
                                                                   for t in (layer.keys, layer.values)]

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy every layer's slots `src` [b, W] to `dst` [b, W] (all read before any is written)."""
        moved = self.kv[:, :, self.rows, :, src]  # [b, W, 2, layers, heads, d]
        self.kv[:, :, self.rows, :, dst] = moved
        for i in self.own:
            layer = self.layers[i]
            for states in (layer.keys, layer.values):
                states[self.rows, :, dst] = states[self.rows, :, src]

    def take_rows(self, old: "SlotCache", index: torch.Tensor, n: int) -> None:
        """Fill this cache's rows with the first `n` slots of `old`'s rows `index` [b] (every layer; compaction)."""
        self.kv[:, :, :, :, :n] = old.kv[:, :, index, :, :n]
        for i in old.own:
            mine, theirs = self.layers[i], old.layers[i]
            if i not in self.own:
                mine.own(theirs.keys[:1, :, :1], theirs.values[:1, :, :1])
            mine.keys[:, :, :n] = theirs.keys[index, :, :n]
            mine.values[:, :, :n] = theirs.values[index, :, :n]


def _shared(text, name: str):
    """A config value every layer shares, or None: where layers differ (Gemma 4's per-layer head sizes: transformers
    refuses the global read) the layers that differ size their buffers from their first keys (`SlotLayer.own`)."""
    try:
        return getattr(text, name, None)
    except Exception:  # noqa: BLE001 (transformers' AmbiguousGlobalPerLayerAttributeError, an AttributeError or not)
        return None


def check_static(facts, slots: int) -> None:
    """Raise ValueError where the static cache cannot hold the attention of the model (its `ModelFacts`) exactly."""
    if facts.encoder_decoder:
        raise ValueError("cache_implementation='static' needs a decoder-only model; leave cache_implementation unset "
                         f"for {facts.name}")
