"""What each attention layer of a model attends to: every earlier position (full attention), the last `window`
positions (sliding window: Mistral, Gemma 2/3, gpt-oss, Phi-3, ...) or the positions of its own chunk (chunked
attention: Llama 4), read from transformers' own account of a config's layers (`get_layer_types_and_kwargs`, the
one its caches are built from), so that a verification forward can give each kind of layer its own mask.

A model's forward takes either one 4D mask for every layer or, when its layers are of several kinds, a dict of them
keyed by kind (transformers' `causal_mask_mapping`); `LayerKinds.masks` builds whichever it takes from one
`allowed` [b, Q, K] (what full attention sees: the cache slots a row kept, and in the step each node's ancestors)
and the position of every key and query, so that windows follow positions (a tree's depths, a batch's holes), not
cache slots.
"""
from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass

import torch

FULL, SLIDING, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"
WINDOWED = (SLIDING, CHUNKED)


@dataclass(frozen=True)
class LayerKinds:
    """The kinds of attention a model's layers run, and each windowed kind's size.

    Example:
        >>> kinds = LayerKinds.of(gemma3.config)
        >>> kinds.per_layer[:6], kinds.sizes
        (('sliding_attention', ..., 'full_attention'), {'sliding_attention': 512})
    """

    per_layer: tuple  # each layer's kind, as transformers names it ("full_attention", "sliding_attention", ...)
    sizes: dict  # windowed kind -> its window (sliding) or chunk (chunked), in positions
    by_slot: int | None = None  # the window of layers that cut it themselves from a band of slots (GPT-Neo's
    # "local"), which lookahead hands them by position (`local.by_position`)

    @classmethod
    def of(cls, config) -> "LayerKinds":
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        kinds, kwargs = _layer_types(text)
        sizes = {}
        for kind, extra in zip(kinds, kwargs):
            size = extra.get("sliding_window")
            if kind in WINDOWED and isinstance(size, int) and size > 0:
                sizes.setdefault(kind, size)
        local = "local" in (getattr(text, "attention_layers", None) or ())  # GPT-Neo: a window of its own
        return cls(tuple(kinds), sizes, getattr(text, "window_size", None) if local else None)

    @property
    def windowed(self) -> bool:
        """Whether any layer attends to a window or a chunk rather than to every earlier position."""
        return bool(self.sizes)

    @property
    def mixed(self) -> bool:
        """Whether the attention layers are of several kinds (the model then takes a dict of masks)."""
        return len({k for k in self.per_layer if k in (FULL, *WINDOWED)}) > 1

    def smallest(self) -> int | None:
        """The narrowest window or chunk of any layer (None: every layer attends to every earlier position)."""
        return min(self.sizes.values()) if self.sizes else None

    def masks(self, allowed: torch.Tensor, key_pos: torch.Tensor, query_pos: torch.Tensor, dtype: torch.dtype,
              views: dict | None = None):
        """The attention mask(s) of a forward: `allowed` [b, Q, K] bool (what full attention sees), `key_pos`
        [b, K] and `query_pos` [b, Q] the positions of every key and query; `views`: kind -> (allowed, key_pos)
        over that kind's own keys, where its layers keep other slots (a static cache's ring). Returns one additive
        mask [b, 1, Q, K] for a model whose layers are all of one kind, else a dict kind -> that kind's mask."""
        views = views or {}
        masks = {}
        for kind, size in self.sizes.items():
            seen, pos = views.get(kind, (allowed, key_pos))
            masks[kind] = additive(seen & _sees(kind, size, pos, query_pos), dtype)
        if not self.mixed:
            return next(iter(masks.values()))
        masks[FULL] = additive(allowed, dtype)
        for kind in self.per_layer:  # recurrent layers: no padding inside a step to mask
            masks.setdefault(kind, None)
        return masks


def check_windows_in_masks(model, kinds: LayerKinds) -> None:
    """Raise ValueError, before any forward, for `cache_implementation="static"` on a model whose config names a
    sliding window or chunk that its forward's masks do not apply (Moshi builds full causal masks; transformers' own
    generate windows it only through its sliding cache layers, after an unwindowed prefill): the static cache,
    whose masks apply each layer's window from the prompt on, would give other tokens."""
    if kinds.windowed and not _builds_window_masks(type(model)):
        raise ValueError(f"cache_implementation='static' is not supported for {type(model).__name__}: its config "
                         f"names a window of {kinds.smallest()} tokens that its forward's attention masks do not "
                         f"apply (transformers windows it only through its dynamic cache); leave "
                         f"cache_implementation unset")


@functools.lru_cache(maxsize=None)
def _builds_window_masks(cls) -> bool:
    """Whether the modeling module of a model class builds sliding-window or chunked masks (transformers'
    `create_sliding_window_causal_mask`, `create_chunked_causal_mask` or a `causal_mask_mapping` by layer type)."""
    try:
        source = inspect.getsource(sys.modules[cls.__module__])
    except (KeyError, OSError, TypeError):
        return True  # no source to read: the masks are taken as the config says
    return any(name in source for name in ("create_sliding_window_causal_mask", "create_chunked_causal_mask",
                                           "causal_mask_mapping", "sliding_window_overlay"))


def _sees(kind: str, size: int, key_pos: torch.Tensor, query_pos: torch.Tensor) -> torch.Tensor:
    """[b, Q, K]: which keys a query of a `kind` layer may see by position (transformers' `sliding_window_overlay`
    and `chunked_overlay`, on positions): the last `size` positions, or those of its own chunk."""
    q, k = query_pos[:, :, None], key_pos[:, None, :]
    if kind == SLIDING:
        return q - k < size
    return torch.div(q, size, rounding_mode="floor") == torch.div(k, size, rounding_mode="floor")


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[b, Q, K] bool -> the additive 4D mask [b, 1, Q, K] attention layers take."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min)[:, None]


def _layer_types(text) -> tuple:
    """(kinds, per-layer kwargs) as transformers' caches read them; older transformers: from the config's fields."""
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        kinds, kwargs = get_layer_types_and_kwargs(text)
        return list(kinds), list(kwargs)
    except (ImportError, AttributeError, TypeError):
        pass
    kinds = getattr(text, "layer_types", None)
    layers = getattr(text, "num_hidden_layers", 0) or 0
    window, chunk = getattr(text, "sliding_window", None), getattr(text, "attention_chunk_size", None)
    if kinds is None:
        kind = SLIDING if window else CHUNKED if chunk else FULL
        kinds = [kind] * layers
    return list(kinds), [{"sliding_window": window if k == SLIDING else chunk if k == CHUNKED else None}
                         for k in kinds]

# Every decoder layer's kind, for the checks that refuse what lookahead cannot run exactly (`_validate.check_layers`):
# besides the attention kinds above, "indexed_attention" (sparse attention over keys an indexer picks: DeepSeek-V3.2's
# DSA; each query picks as it would alone: `indexer.decoding_order`), "recurrent" (a recurrent or convolution state:
# Mamba, linear attention, short convolutions; also transformers'
# "hybrid" layers that keep one beside an attention cache: a state a rejected draft has already changed), "none"
# (MoE/MLP-only layers, layers that reuse another's cache), or another name transformers gives and lookahead does not
# know (DeepSeek-V4's "heavily_compressed_attention", ...: refused, since its cache may not roll back).
INDEXED, RECURRENT, NONE = "indexed_attention", "recurrent", "none"
COMPRESSED = "compressed_attention"  # a window of keys and compressed entries (DeepSeek-V4's HCA, CSA: `compressed.py`)
KNOWN = (FULL, SLIDING, CHUNKED, INDEXED, RECURRENT, COMPRESSED, NONE)
HYBRID = ("hybrid", "hybrid_sliding")  # recurrent layer types that also keep an attention cache


@dataclass(frozen=True)
class Layer:
    """One decoder layer's kind.

    kind: one of `KNOWN` (`FULL`, `SLIDING`, ..., `RECURRENT`), or transformers' name for a type lookahead does not
        know.
    name: the layer type as transformers names it ("sliding_attention", "linear_attention", "conv", "local", ...).
    window: positions a sliding layer sees (itself included), or a chunked layer's chunk size; None otherwise.
    """

    kind: str
    name: str
    window: int | None = None


def layer_kinds(model) -> tuple:
    """The kind of each decoder layer of `model` (a transformers `PreTrainedModel`), in order (empty where
    transformers gives no account of its layers).

    Example:
        >>> [(layer.kind, layer.window) for layer in layer_kinds(gemma3)][:2]
        [('sliding_attention', 512), ('sliding_attention', 512)]
    """
    from .rwkv import is_rwkv, rwkv_blocks
    from .xlstm import mlstm_layers

    if is_rwkv(model):  # its blocks keep states in the `state` its forward takes (`rwkv.py`), no KV cache
        return tuple(Layer(RECURRENT, "rwkv") for _ in rwkv_blocks(model))
    if own_cache(model) == "xLSTMCache":  # its layers keep states in its own cache, which transformers' layer types
        # do not show (its config names none: they read as full attention)
        return tuple(Layer(RECURRENT, "mlstm") for _ in mlstm_layers(model))
    layers = list(config_layer_kinds(model.config))
    for i, window in _local_modules(model):  # the layers' own local window over what transformers' types say
        if i < len(layers):
            layers[i] = Layer(SLIDING, "local", window)
    return tuple(layers)


def config_layer_kinds(config) -> tuple:
    """The kind of each decoder layer, from the (text) config as transformers' caches read it."""
    try:
        from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, get_layer_types_and_kwargs
    except ImportError:  # older transformers: no per-layer account
        return ()
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    try:
        names, kwargs = get_layer_types_and_kwargs(text)
    except Exception:  # noqa: BLE001 (a config transformers cannot account for: no kinds rather than a crash)
        return ()
    return tuple(_kind(name, kw, DYNAMIC_LAYER_TYPE_MAPPING.get(name)) for name, kw in zip(names, kwargs))


def _kind(name: str, kwargs: dict, cls) -> Layer:
    """The `Layer` of a layer type `name`, its cache kwargs and transformers' dynamic cache layer class for it."""
    from transformers import cache_utils as C

    window = kwargs.get("sliding_window")
    window = int(window) if isinstance(window, int) and not isinstance(window, bool) else None
    if cls is None:
        return Layer(name, name)
    if issubclass(cls, getattr(C, "LinearAttentionCacheLayerMixin", ())):
        return Layer(RECURRENT, name, window)
    if cls.__name__ == "DummyLayer":
        return Layer(NONE, name)
    if callable(getattr(cls, "store_compression_weights", None)):
        return Layer(COMPRESSED, name, window)
    if cls is getattr(C, "DynamicSlidingWindowLayer", None):
        return Layer(CHUNKED if name == CHUNKED else SLIDING, name, window)
    if cls.__name__ == "DynamicIndexedLayer":
        return Layer(INDEXED, name)
    if cls is C.DynamicLayer:
        return Layer(FULL, name)
    return Layer(name, name)


def _local_modules(model) -> list:
    """(layer index, window) of the layers that attend locally by an `attention_layers` list ("global"/"local", the
    window `window_size`: GPT-Neo), which transformers' layer types do not show."""
    text = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    kinds, window = getattr(text, "attention_layers", None), getattr(text, "window_size", None)
    if not isinstance(kinds, (list, tuple)) or not isinstance(window, int):
        return []
    return [(i, window) for i, kind in enumerate(kinds) if kind == "local"]


def own_cache(model) -> str | None:
    """The name of a cache class the model's modeling module defines for itself (MiniMax's `MiniMaxCache`,
    xLSTM's `xLSTMCache`): the model keeps its state there, not in transformers' KV cache; None for others."""
    import sys

    from transformers.cache_utils import CacheLayerMixin

    module = sys.modules.get(type(model).__module__)
    for name, value in vars(module or object).items():
        if isinstance(value, type) and name.endswith("Cache") and value.__module__ == module.__name__ \
                and not issubclass(value, CacheLayerMixin):  # a layer class is a layer type, not a cache
            return name
    return None


def smallest_window(layers) -> int | None:
    """The smallest window of the sliding and chunked layers, None when no layer has one."""
    windows = [layer.window for layer in layers if layer.kind in WINDOWED and layer.window is not None]
    return min(windows, default=None)


def state_space(layers) -> bool:
    """Whether no layer attends: every layer that keeps anything keeps a recurrent state only (Mamba, RWKV-like),
    none a KV cache beside it (transformers' "hybrid" layers keep both)."""
    kept = [layer for layer in layers if layer.kind != NONE]
    return bool(kept) and all(layer.kind == RECURRENT and layer.name not in HYBRID for layer in kept)
