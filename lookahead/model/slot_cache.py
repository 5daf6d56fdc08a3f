"""The static step's KV cache: every layer's keys and values in one preallocated buffer, written by position.

Each row owns a run of slots; a forward writes its queries' keys and values at the slots the caller names
(`SlotCache.writes`), so a rejected draft is simply overwritten by the next step and a rollback copies nothing
(reference: gpt-fast's static cache). `lookahead.model.static` runs the steps over it.

A recurrent layer (gated delta net, Mamba, short convolution) keeps transformers' own `LinearAttentionLayer`: a state
per row, no slots (`recurrent.Checkpoints` settles it on the accepted path). A sliding-window layer keeps only a ring
of slots (`rings`: its window plus the widest step, not the whole call):
slot s lives at s mod ring, so the newest ring-many slots of a row are always there; the prefill's queries attend to
the prompt's own keys (the ring keeps its last ring-many), and a step's mask for that layer is over the ring.
"""
from __future__ import annotations

import copy

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

try:
    from transformers.cache_utils import LinearAttentionLayer
except ImportError:  # older transformers: no recurrent cache layers (no model asks for them)
    LinearAttentionLayer = None


class SlotLayer(CacheLayerMixin):
    """One layer's keys and values, views into the cache's one buffer; `update` writes at the cache's `writes`."""

    is_compileable = True
    indexer_keys = None  # [b, slots, d]: the keys a sparse-attention layer's indexer scores, or None

    def __init__(self, cache: "SlotCache", index: int, ring: int | None = None):
        super().__init__()
        self.cache, self.index, self.ring = cache, index, ring  # ring: the slots of a sliding layer (None: all)
        if ring is None:
            self.keys, self.values = cache.kv[0, cache.plain[index]], cache.kv[1, cache.plain[index]]
        else:
            b, heads, _, d = cache.kv.shape[2:]
            self.keys = cache.kv.new_zeros((b, heads, ring, d))
            self.values = cache.kv.new_zeros((b, heads, ring, d))
            cache.own.add(index)
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple:
        if not self._fits(key_states, value_states):
            self.own(key_states, value_states)
        rows, slots = self.cache.rows, self.cache.writes  # [b, 1], [b, Q]
        if self.ring is not None:
            if self.cache.prefilling:  # the prompt attends to its own keys; the ring keeps the last ring-many
                n = min(slots.shape[1], self.ring)
                self.keys[rows, :, slots[:, -n:] % self.ring] = key_states.transpose(1, 2)[:, -n:]
                self.values[rows, :, slots[:, -n:] % self.ring] = value_states.transpose(1, 2)[:, -n:]
                return key_states, value_states
            slots = slots % self.ring
        self.keys[rows, :, slots] = key_states.transpose(1, 2)  # [b, Q, H, d] into slot order
        self.values[rows, :, slots] = value_states.transpose(1, 2)
        return self.keys, self.values

    def update_indexer(self, key_states: torch.Tensor) -> torch.Tensor:
        """A sparse-attention layer's indexer keys [b, Q, d], written at the cache's `writes` as its keys are; returns
        all of them [b, slots, d] (the mask hides the slots a query does not see; `model.indexer`)."""
        if self.indexer_keys is None:  # the first update is a prefill, before any step is captured
            self.indexer_keys = key_states.new_zeros((self.keys.shape[0], self.cache.slots, key_states.shape[-1]))
            self.cache.indexed.add(self.index)
        self.indexer_keys[self.cache.rows, self.cache.writes] = key_states
        return self.indexer_keys

    @property
    def indexer_position_ids(self):
        """The position of each slot's token [dims, b, slots] (Qwen4-Exp's indexer rotates the keys of the blocks
        it pools by where they start, from a history transformers' caches grow by concatenation; here: the step's
        `SlotCache.key_positions`, the step's own tokens included), or None before the dims are known (a prefill
        reads none: its keys are its own queries')."""
        positions, dims = self.cache.key_positions, self.cache.position_dims
        return None if positions is None or dims is None else positions[None].expand(dims, -1, -1)

    @indexer_position_ids.setter
    def indexer_position_ids(self, value) -> None:  # the model's concatenation: only its number of dims is kept
        if value is not None:
            self.cache.position_dims = value.shape[0]

    def _fits(self, key_states: torch.Tensor, value_states: torch.Tensor) -> bool:
        """Whether the layer's buffers hold keys and values of these heads and sizes."""
        return (self.keys.shape[1::2] == key_states.shape[1::2]
                and self.values.shape[1::2] == value_states.shape[1::2])

    def own(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Give the layer buffers of its own, shaped by its first keys and values, where the config's heads and head
        size are not its (multi-head latent attention: keys of the rotary part or of nope+rope sizes, values of
        `v_head_dim` or the latent's rank); the first update is a prefill, before any step is captured."""
        b, slots = self.keys.shape[0], self.ring or self.cache.slots
        self.keys = key_states.new_zeros((b, key_states.shape[1], slots, key_states.shape[-1]))
        self.values = value_states.new_zeros((b, value_states.shape[1], slots, value_states.shape[-1]))
        self.cache.own.add(self.index)

    def get_mask_sizes(self, query_length: int) -> tuple:
        return self.ring or self.cache.slots, 0

    def get_seq_length(self) -> int:
        return 0  # positions and the mask come from the caller, never from the cache length

    def get_max_length(self) -> int:
        return self.ring or self.cache.slots


class SlotStateLayer(*((LinearAttentionLayer,) if LinearAttentionLayer else ()), SlotLayer):
    """A layer that keeps recurrent states beside its keys and values (Falcon-H1's parallel attention and Mamba,
    Zamba2's hybrid layers, Zaya's convolved projections): its keys and values are slots (`SlotLayer`), its states
    transformers' own (`LinearAttentionLayer`)."""

    def __init__(self, cache: "SlotCache", index: int, ring: int | None = None, number_of_states: int = 1):
        SlotLayer.__init__(self, cache, index, ring)
        LinearAttentionLayer.__init__(self, number_of_states=number_of_states)

    def lazy_initialization(self, *args, **kwargs) -> None:
        if args or kwargs.get("conv_states") is not None or kwargs.get("recurrent_states") is not None:
            LinearAttentionLayer.lazy_initialization(self, *args, **kwargs)

    get_seq_length, get_max_length, get_mask_sizes = SlotLayer.get_seq_length, SlotLayer.get_max_length, \
        SlotLayer.get_mask_sizes


class SlotCache(Cache):
    """Keys and values of every full-attention layer in one buffer [2, layers, b, heads, slots, head_dim]; a
    sliding layer's in a ring of its own (`rings`: layer index -> its slots).

    `writes` [b, Q] (a device tensor the caller fills before each forward) says where each query's keys go;
    `prefilling` is set while the prompts' forward runs.
    """

    def __init__(self, config, batch: int, slots: int, dtype: torch.dtype, device, rings: dict | None = None,
                 states: dict | None = None):
        text = config.get_text_config(decoder=True)
        rings, states, layers = dict(rings or {}), dict(states or {}), text.num_hidden_layers
        copies = loop_layers(text)  # a looped model's later loops: layers of their own, as the layers they copy
        for i, of in enumerate(copies, start=layers):
            rings.update({i: rings[of]} if of in rings else {})
            states.update({i: states[of]} if of in states else {})
        layers += len(copies)
        self.slots, self.prefilling = slots, False
        # layer -> (its number of states, whether it keeps keys and values beside them) of the layers that keep
        # recurrent states: transformers' `LinearAttentionLayer` alone (no slots), or a `SlotStateLayer`
        self.states = states
        self.plain = {i: k for k, i in enumerate(i for i in range(layers) if i not in rings
                                                 and not (i in states and not states[i][1]))}
        heads = head_dim = 1  # a state-space model: no keys or values at all
        if any(i not in states or states[i][1] for i in range(layers)):
            heads = _shared(text, "num_key_value_heads") or text.num_attention_heads
            head_dim = _shared(text, "head_dim") or text.hidden_size // text.num_attention_heads
        self.kv = torch.zeros((2, len(self.plain), batch, heads, slots, head_dim), dtype=dtype, device=device)
        self.rows = torch.arange(batch, device=device)[:, None]
        self.writes = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.origin = torch.arange(batch, device=device)  # the call's row that each batch row holds (compaction)
        self.key_positions = None  # [b, slots]: each slot's position, set before a forward where the model reads it
        self.position_dims = None  # (`SlotLayer.indexer_position_ids`)
        self.own = set()  # layers whose keys and values are buffers of their own (`SlotLayer.own`), not views of kv
        self.indexed = set()  # layers with indexer keys (`SlotLayer.update_indexer`)
        super().__init__(layers=[self._layer(i, rings.get(i)) for i in range(layers)])

    def _layer(self, i: int, ring: int | None):
        """Layer i's cache layer: slots, recurrent states alone, or both."""
        if i not in self.states:
            return SlotLayer(self, i, ring)
        number, attends = self.states[i]
        return SlotStateLayer(self, i, ring, number) if attends else LinearAttentionLayer(number_of_states=number)

    def fresh_states(self) -> None:
        """Give every recurrent layer new, empty states (before a call's prefill: as a new cache has); a layer that
        also attends keeps its slots."""
        for i, (number, attends) in self.states.items():
            layer = self.layers[i]
            if attends:
                LinearAttentionLayer.__init__(layer, number_of_states=number)
            else:
                self.layers[i] = LinearAttentionLayer(number_of_states=number)

    def batch_tensors(self) -> list:
        """(tensor, its batch dimension) of every cache tensor a step may read (`origin`: a forward hook may)."""
        return [(self.kv, 2), (self.rows, 0), (self.origin, 0)] + [(t, 0) for layer in self.layers
                                                                   if isinstance(layer, SlotLayer)
                                                                   for t in (layer.keys, layer.values)] \
            + [(self.layers[i].indexer_keys, 0) for i in sorted(self.indexed)]

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy every layer's slots `src` [b, W] to `dst` [b, W] (all read before any is written)."""
        moved = self.kv[:, :, self.rows, :, src]  # [b, W, 2, layers, heads, d]
        self.kv[:, :, self.rows, :, dst] = moved
        for i in self.own:
            layer = self.layers[i]
            to, fro = (dst, src) if layer.ring is None else (dst % layer.ring, src % layer.ring)
            for states in (layer.keys, layer.values):
                states[self.rows, :, to] = states[self.rows, :, fro]
        for i in self.indexed:
            keys = self.layers[i].indexer_keys
            keys[self.rows, dst] = keys[self.rows, src]

    def take_rows(self, old: "SlotCache", index: torch.Tensor, n: int) -> None:
        """Fill this cache's rows with the first `n` slots of `old`'s rows `index` [b] (every layer, recurrent states
        too; compaction)."""
        self._take(old, slice(None), index, n)
        for i, (_, attends) in old.states.items():
            theirs, mine = old.layers[i], self.layers[i]
            if not attends:  # a layer of states alone: a copy of old's with its rows `index` (flags and sizes too)
                mine = self.layers[i] = copy.copy(theirs)
            for name in ("conv_states", "recurrent_states", "is_conv_states_initialized",
                         "is_recurrent_states_initialized", "has_previous_state", "conv_kernel_size"):
                setattr(mine, name, dict(getattr(theirs, name)))
            mine.device, mine.dtype = theirs.device, theirs.dtype
            LinearAttentionLayer.reorder_cache(mine, index)

    def put_row(self, src: "SlotCache", row: int, n: int) -> None:
        """Copy the first `n` slots of `src`'s row 0 (a batch of one, the same layers and rings) into row `row`:
        every layer's keys and values (a ring: all of it) and indexer keys (a request prefilled alone joins a
        served batch: `serve.batch.StaticServingLM`). Layers with recurrent states are not copied."""
        self._take(src, row, 0, n)

    def _take(self, src: "SlotCache", rows, theirs_rows, n: int) -> None:
        """This cache's `rows` (an index of its batch) get the first `n` slots of `src`'s `theirs_rows`: every layer's
        keys and values (a ring: all of it) and indexer keys."""
        self.kv[:, :, rows, :, :n] = src.kv[:, :, theirs_rows, :, :n]
        self.position_dims = self.position_dims or src.position_dims  # (positions are the step's, not copied)
        for i in src.own:
            mine, theirs = self.layers[i], src.layers[i]
            if i not in self.own:
                mine.own(theirs.keys[:1, :, :1], theirs.values[:1, :, :1])
            n_i = n if mine.ring is None else mine.ring  # a ring: all of it
            mine.keys[rows, :, :n_i] = theirs.keys[theirs_rows, :, :n_i]
            mine.values[rows, :, :n_i] = theirs.values[theirs_rows, :, :n_i]
        for i in src.indexed:
            mine, theirs = self.layers[i], src.layers[i]
            if mine.indexer_keys is None:
                mine.indexer_keys = theirs.indexer_keys.new_zeros((mine.keys.shape[0], self.slots,
                                                                   theirs.indexer_keys.shape[-1]))
                self.indexed.add(i)
            mine.indexer_keys[rows, :n] = theirs.indexer_keys[theirs_rows, :n]


def loop_layers(text) -> list:
    """The cache layers a looped model (Dory: its middle layers run `n_recurrent_loops` times, each later loop
    writing its own copies of their cache layers, appended after the model's own) adds, as the index of the layer
    each copies; none for other models. The static cache makes them up front: the model copies the layers it finds
    on its first forward only where the cache has none (a deep copy of a slot layer would keep the slots of that
    forward)."""
    loops, start = getattr(text, "n_recurrent_loops", None), getattr(text, "n_input_layers", None)
    count = getattr(text, "n_recurrent_layers", None)
    if not isinstance(loops, int) or loops < 2 or not isinstance(start, int) or not isinstance(count, int) \
            or getattr(text, "recurrent_kv_cache_mode", "per_loop") != "per_loop":
        return []
    return [start + k for _ in range(loops - 1) for k in range(count)]


def _shared(text, name: str):
    """A config value every layer shares, or None: where layers differ (Gemma 4's per-layer head sizes: transformers
    refuses the global read) the layers that differ size their buffers from their first keys (`SlotLayer.own`)."""
    try:
        return getattr(text, name, None)
    except Exception:  # noqa: BLE001 (transformers' AmbiguousGlobalPerLayerAttributeError, an AttributeError or not)
        return None


def check_static(facts, slots: int, config=None) -> None:
    """Raise ValueError where the static cache cannot hold the attention of the model (its `ModelFacts` and
    `config`) exactly."""
    if facts.encoder_decoder:
        raise ValueError("cache_implementation='static' needs a decoder-only model; leave cache_implementation unset "
                         f"for {facts.name}")
    text = config.get_text_config(decoder=True) if config is not None else None
    if getattr(text, "recurrent_kv_cache_mode", None) == "last_loop" and getattr(text, "n_recurrent_loops", 1) > 1:
        raise ValueError(f"cache_implementation='static' is not supported for {facts.name} with "
                         f"recurrent_kv_cache_mode='last_loop': its earlier loops read the last loop's keys and add "
                         f"their own beside them, past what the static cache's slots and masks hold; leave "
                         f"cache_implementation unset, or use recurrent_kv_cache_mode='per_loop' (the default)")
