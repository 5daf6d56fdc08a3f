"""What the loop needs to know about a model, read once per call at the boundary (`ModelFacts.of`) and handed to the
target, the policies and the checks, instead of each layer asking the model again."""
from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass

import torch

from .layers import COMPRESSED, RECURRENT, layer_kinds, own_cache, smallest_window
from .recurrent import unsupported, windowed_state_layers
from .rwkv import is_rwkv

_PARAMETERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # forward function -> its parameter names


@dataclass(frozen=True)
class ModelFacts:
    """A model's facts as one call sees them.

    Example:
        >>> facts = ModelFacts.of(model)
        >>> facts.kv, facts.positions, facts.vocab
        ('cache', 512, 512)
    """

    name: str  # the model's class name, for messages
    kv: str  # the keyword its forward takes the KV cache by
    positions: int | None  # most positions it embeds (None: no limit)
    vocab: int  # rows of its input embedding: the ids it accepts
    encoder_decoder: bool
    model_type: str | None
    window: int | None  # the smallest sliding window or attention chunk of its (decoder's) layers, None: none has one
    device: torch.device
    dtype: torch.dtype
    devices: frozenset  # the devices `device_map` spread its weights over (empty: none)
    logits_to_keep: bool  # its forward can compute the last position's logits only
    layers: tuple = ()  # each decoder layer's kind (`layers.Layer`): full, sliding, chunked, recurrent, ...
    alibi: str | None = None  # it biases attention by distance (ALiBi): "mask" (from the 2D attention mask),
    # "slots" (from cache slots: MPT); None: no ALiBi
    own_cache: str | None = None  # the cache class its modeling module defines for itself, if any
    recurrent: str | None = None  # with recurrent layers: why their states cannot follow the accepted path ("" where
    # they can: `recurrent.Checkpoints`); None without recurrent layers

    @classmethod
    def of(cls, model) -> "ModelFacts":
        layers = layer_kinds(model)
        encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        return cls(type(model).__name__, cache_kwarg(model), position_limit(model.config),
                   model.get_input_embeddings().num_embeddings, encoder_decoder,
                   getattr(model.config, "model_type", None), smallest_window(layers),
                   model.device, model.dtype,
                   frozenset(str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()),
                   "logits_to_keep" in forward_parameters(model), layers, uses_alibi(model), own_cache(model),
                   _recurrent(model, layers))

    def last_logits_only(self) -> dict:
        """The forward keyword that computes logits at the last position only, where the model takes it."""
        return {"logits_to_keep": 1} if self.logits_to_keep else {}


def _recurrent(model, layers) -> str | None:
    """`ModelFacts.recurrent`: None without recurrent layers, else why their states cannot be followed ("": they
    can)."""
    if not any(layer.kind == RECURRENT for layer in layers):
        return None
    return unsupported(model) or ""


def cache_kwarg(model) -> str:
    """The keyword a model's forward takes its KV cache by: "cache" (transformers 5.24 on; `past_key_values` is
    deprecated there), else "past_key_values"; RWKV's "state" (`rwkv.py`)."""
    params = forward_parameters(model)
    if "cache" not in params and "past_key_values" not in params and "state" in params and is_rwkv(model):
        return "state"
    return "cache" if "cache" in params else "past_key_values"


def takes_keywords(model) -> bool:
    """Whether `model.forward` takes arbitrary keywords (`**kwargs`), through which it may take `use_cache`."""
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def forward_parameters(model) -> frozenset:
    """The names of the parameters `model.forward` takes, kept per forward function (weakly: a wrapped forward is
    freed with its model), since `inspect.signature` costs tens of microseconds."""
    forward = model.forward
    key = getattr(forward, "__func__", forward)
    try:
        return _PARAMETERS[key]
    except KeyError:
        names = _PARAMETERS[key] = frozenset(inspect.signature(forward).parameters)
        return names
    except TypeError:  # a forward that takes no weak reference: asked every time
        return frozenset(inspect.signature(forward).parameters)


def alibi_builder(model) -> tuple | None:
    """(the model's modeling module, the name of its `build_*alibi_tensor`: Bloom's and Falcon's
    `build_alibi_tensor`, MPT's `build_mpt_alibi_tensor`), or None."""
    import sys

    module = sys.modules.get(type(model).__module__)
    name = next((name for name, f in vars(module or object).items()
                 if name.startswith("build_") and name.endswith("alibi_tensor") and callable(f)), None)
    return None if name is None else (module, name)


def uses_alibi(model) -> str | None:
    """How the model biases attention by distance (ALiBi: Bloom; Falcon with `alibi=True`; MPT with
    `attn_config.alibi`), where its modeling module builds the biases (`build_*alibi_tensor`) and the config does not
    turn them off: "mask" when they are built from the 2D attention mask (each key's position among the slots a row
    sees), "slots" when from the cache length (MPT); None without ALiBi."""
    found = alibi_builder(model)
    if found is None:
        return None
    build = getattr(*found)
    config = model.config
    for holder in (config, getattr(config, "attn_config", None)):
        flag = holder.get("alibi") if isinstance(holder, dict) else getattr(holder, "alibi", None)
        if isinstance(flag, bool) and not flag:
            return None
        if isinstance(flag, bool):
            break
    try:
        from_mask = "attention_mask" in inspect.signature(build).parameters
    except (TypeError, ValueError):
        from_mask = False
    return "mask" if from_mask else "slots"


def position_limit(config):
    """The model's most positions (max_position_embeddings or its equivalent: MPT's max_seq_len, ...), or None."""
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "max_seq_len", "n_ctx",
                 "seq_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def rows_apart(facts: ModelFacts, model) -> str | None:
    """Why the rows of a batch cannot share one cache on `model` (`generate` runs each row alone instead:
    `decode.fallback.one_row_at_a_time`; the server steps each row in a batch of its own), or None."""
    if any(layer.kind == COMPRESSED for layer in facts.layers):
        return f"{facts.name}'s compressed attention layers count their entries once for every row"
    if facts.alibi == "slots":
        return (f"{facts.name} builds its ALiBi biases from cache slots, one line for every row (a row's padding and "
                f"rejected slots would count as distance)")
    if facts.recurrent == "" and windowed_state_layers(model):
        return (f"{facts.name}'s layers that keep recurrent states cut their sliding window by cache slot (a row's "
                f"padding and rejected slots would count as distance)")
    return None


def tree_refusal(facts: ModelFacts) -> str | None:
    """Why a tree's branches cannot be verified in one forward on this model (its layers carry state along one
    sequence of tokens), or None: `generate` refuses `draft="tree"` with it, the server a request's tree."""
    if facts.recurrent == "":
        return "its recurrent layers carry one state along one sequence of tokens"
    if any(layer.kind == COMPRESSED for layer in facts.layers):
        return "its compressed attention folds a row's tokens in order, a window at a time, into one entry"
    return None
