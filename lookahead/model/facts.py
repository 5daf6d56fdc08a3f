"""What the loop needs to know about a model, read once per call at the boundary (`ModelFacts.of`) and handed to the
target, the policies and the checks, instead of each layer asking the model again."""
from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass

import torch

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
    window: int | None  # the sliding window of its (decoder's) attention, None for full attention
    device: torch.device
    dtype: torch.dtype
    devices: frozenset  # the devices `device_map` spread its weights over (empty: none)
    logits_to_keep: bool  # its forward can compute the last position's logits only

    @classmethod
    def of(cls, model) -> "ModelFacts":
        text = model.config.get_text_config(decoder=True)
        window = getattr(text, "sliding_window", None)
        encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        return cls(type(model).__name__, cache_kwarg(model), position_limit(model.config),
                   model.get_input_embeddings().num_embeddings, encoder_decoder,
                   getattr(model.config, "model_type", None), window if isinstance(window, int) else None,
                   model.device, model.dtype,
                   frozenset(str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()),
                   "logits_to_keep" in forward_parameters(model))

    def last_logits_only(self) -> dict:
        """The forward keyword that computes logits at the last position only, where the model takes it."""
        return {"logits_to_keep": 1} if self.logits_to_keep else {}


def cache_kwarg(model) -> str:
    """The keyword a model's forward takes its KV cache by: "cache" (transformers 5.24 on; `past_key_values` is
    deprecated there), else "past_key_values"."""
    return "cache" if "cache" in forward_parameters(model) else "past_key_values"


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


def position_limit(config):
    """The model's most positions (max_position_embeddings or its equivalent), or None."""
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
