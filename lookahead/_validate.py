"""Argument checks for the public API: each error names the argument, what was expected and what came."""
from __future__ import annotations

import inspect
import weakref

import torch

from ._checks import check_int  # noqa: F401  (re-exported: one integer check for the whole package)

LOOKUPS = ("ngram", "suffix", "none")


def check_model(model) -> None:
    """Raise TypeError unless `model` is a Hugging Face LM (causal or encoder-decoder) that decodes with a KV cache."""
    from transformers import PreTrainedModel

    name = type(model).__name__
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"model must be a transformers PreTrainedModel (e.g. from AutoModelForCausalLM), got {name}")
    if not model.can_generate() or model.get_output_embeddings() is None:
        raise TypeError(
            f"model must be a causal language model with an LM head (AutoModelForCausalLM), got {name}"
        )
    params = forward_parameters(model)
    if not {"cache", "past_key_values"} & params or "use_cache" not in params:
        raise TypeError(f"model must accept a KV cache (cache= or past_key_values=) and use_cache to decode with a KV "
                        f"cache; {name} does not")


def cache_kwarg(model) -> str:
    """The keyword a model's forward takes its KV cache by: "cache" (transformers 5.24 on; `past_key_values` is
    deprecated there), else "past_key_values"."""
    return "cache" if "cache" in forward_parameters(model) else "past_key_values"


_PARAMETERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # forward function -> its parameter names


def forward_parameters(model) -> frozenset:
    """The names of the parameters `model.forward` takes, kept per forward function (weakly: a wrapped forward is
    freed with its model), since `inspect.signature` costs tens of microseconds and every call asks."""
    forward = model.forward
    key = getattr(forward, "__func__", forward)
    try:
        return _PARAMETERS[key]
    except KeyError:
        names = _PARAMETERS[key] = frozenset(inspect.signature(forward).parameters)
        return names
    except TypeError:  # a forward that takes no weak reference: asked every time
        return frozenset(inspect.signature(forward).parameters)


def check_lookup(lookup: str) -> str:
    if lookup not in LOOKUPS:
        raise ValueError(f"lookup must be one of {', '.join(map(repr, LOOKUPS))}, got {lookup!r}")
    return lookup


def check_inputs(model, input_ids, attention_mask) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (input_ids, attention_mask) as LongTensors [B, L] on the model's device."""
    input_ids = _as_batch("input_ids", input_ids)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    else:
        attention_mask = _as_batch("attention_mask", attention_mask, numbers=True)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, "
                f"got {tuple(attention_mask.shape)}"
            )
        if ((attention_mask != 0) & (attention_mask != 1)).any():
            raise ValueError("attention_mask must hold only 0 and 1 (or False and True)")
        attention_mask = attention_mask.long()
        if (attention_mask.sum(-1) == 0).any():
            raise ValueError("attention_mask has a row with no token to attend to (all zeros)")
    vocab = vocab_size(model)
    real = input_ids[attention_mask.bool()]
    if real.numel() and (real.min() < 0 or real.max() >= vocab):
        raise ValueError(
            f"input_ids must lie in [0, {vocab}) (the model's vocabulary), got ids from {int(real.min())} "
            f"to {int(real.max())}"
        )
    device = model.device
    return input_ids.to(device), attention_mask.to(device)


def check_length(model, attention_mask: torch.Tensor, max_new_tokens: int) -> None:
    """Raise ValueError if the longest row would run past the model's position limit."""
    limit = position_limit(model.config)
    longest = int(attention_mask.sum(-1).max())
    if limit is not None and longest + max_new_tokens > limit:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} with a prompt of {longest} tokens exceeds the model's position limit "
            f"of {limit} tokens (max_position_embeddings); lower max_new_tokens to at most {max(limit - longest, 0)}"
        )


def check_documents(model, documents, memory=None) -> None:
    """Raise ValueError if a document (per-row lists of int arrays) or the memory holds an id outside the model's
    vocabulary: a draft copied from it would crash the model's embedding."""
    vocab = vocab_size(model)
    top = max((int(d.max()) for row in documents or [] for d in row if d.size), default=-1)
    if top >= vocab:
        raise ValueError(f"documents must hold token ids in [0, {vocab}) (the model's vocabulary), got an id {top}")
    top = -1 if memory is None else memory.max_token_id
    if top >= vocab:
        raise ValueError(f"memory holds token ids up to {top}, outside the model's vocabulary [0, {vocab}): "
                         f"it was filled by another model; use one Memory per tokenizer")


def check_draft_shape(model, draft: str) -> None:
    """Raise ValueError for draft="tree" on an encoder-decoder (its decoder takes positions from the cache length)."""
    if draft == "tree" and getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(f"draft='tree' needs a decoder-only model; {type(model).__name__} is an encoder-decoder")


def vocab_size(model) -> int:
    """Rows of the model's input embedding: the ids it accepts."""
    return model.get_input_embeddings().num_embeddings


def position_limit(config):
    """The model's most positions (max_position_embeddings or its equivalent), or None."""
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _as_batch(name: str, value, numbers: bool = False) -> torch.Tensor:
    """value as a LongTensor [batch, length]; bools and floats too when `numbers` (an attention mask)."""
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{name} must be a LongTensor or a nested list of ints, got {type(value).__name__}") from err
    if value.dtype.is_complex or (not numbers and (value.dtype.is_floating_point or value.dtype == torch.bool)):
        raise TypeError(f"{name} must hold integers (a LongTensor), got dtype {value.dtype}")
    if value.dim() == 1:
        value = value.unsqueeze(0)
    if value.dim() != 2:
        raise ValueError(f"{name} must have shape [batch, length], got {tuple(value.shape)}")
    if value.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(value.shape)}")
    return value if numbers else value.long()
