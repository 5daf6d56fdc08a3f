"""What kind each decoder layer of a model is, as the model itself runs it: the one place that reads layer kinds.

The kinds come from transformers' own account of a config's layers (`cache_utils.get_layer_types_and_kwargs`, the
layer types its caches are built from: `layer_types`, else a `sliding_window` or `attention_chunk_size` in force),
with what the attention modules say where a config field is not what the layers do (GPT-Neo's local layers, set by
`attention_layers`). A config's `sliding_window` that its layers do not use (Qwen2 with `use_sliding_window=False`,
whose `layer_types` are all full attention) is therefore no window.

Kinds:
    "full"       attends to every earlier position: a KV cache that can be cut back
    "sliding"    attends to the last `window` positions (itself included)
    "chunked"    attends to earlier positions of its own chunk of `window` positions (Llama 4)
    "indexed"    sparse attention over positions an indexer picks (DeepSeek-V3.2's DSA)
    "recurrent"  keeps a recurrent or convolution state (Mamba, linear attention, short convolutions; also layers
                 that keep one beside their attention cache): a state that a rejected draft has already changed
    "none"       keeps nothing (MoE/MLP-only layers, layers that reuse another layer's cache)
    other        a layer type transformers names and lookahead does not know (the name itself: DeepSeek-V4's
                 "heavily_compressed_attention", ...): refused, since its cache may not roll back

Example:
    >>> [(layer.kind, layer.window) for layer in layer_kinds(model)]
    [('sliding', 512), ('full', None)]
"""
from __future__ import annotations

from dataclasses import dataclass

FULL, SLIDING, CHUNKED, INDEXED, RECURRENT, NONE = "full", "sliding", "chunked", "indexed", "recurrent", "none"
WINDOWED = (SLIDING, CHUNKED)  # kinds that see a bounded span of positions
KNOWN = (FULL, SLIDING, CHUNKED, INDEXED, RECURRENT, NONE)
HYBRID = ("hybrid", "hybrid_sliding")  # recurrent layer types that also keep an attention cache


@dataclass(frozen=True)
class Layer:
    """One decoder layer's kind.

    kind: one of the module's kinds (`FULL`, `SLIDING`, ...), or transformers' name for a type lookahead does not know.
    name: the layer type as transformers names it ("sliding_attention", "linear_attention", "conv", "local", ...).
    window: positions a sliding layer sees (itself included), or a chunked layer's chunk size; None otherwise.
    """

    kind: str
    name: str
    window: int | None = None


def layer_kinds(model) -> tuple:
    """The kind of each decoder layer of `model` (a transformers `PreTrainedModel`), in order (empty where
    transformers gives no account of its layers)."""
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
    if cls is getattr(C, "DynamicSlidingWindowLayer", None):
        return Layer(CHUNKED if name == "chunked_attention" else SLIDING, name, window)
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
