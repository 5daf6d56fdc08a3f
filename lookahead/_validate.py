"""Argument checks for the public API: each error names the argument, what was expected and what came."""
from __future__ import annotations

import torch

from ._checks import check_int  # noqa: F401  (re-exported: one integer check for the whole package)
from .model.facts import ModelFacts, forward_parameters


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


def check_inputs(facts: ModelFacts, input_ids, attention_mask) -> tuple[torch.Tensor, torch.Tensor]:
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
    vocab = facts.vocab
    real = input_ids[attention_mask.bool()]
    if real.numel() and (real.min() < 0 or real.max() >= vocab):
        raise ValueError(
            f"input_ids must lie in [0, {vocab}) (the model's vocabulary), got ids from {int(real.min())} "
            f"to {int(real.max())}"
        )
    return input_ids.to(facts.device), attention_mask.to(facts.device)


def check_documents(facts: ModelFacts, documents, memory=None) -> None:
    """Raise ValueError if a document (per-row lists of int arrays) or the memory holds an id outside the model's
    vocabulary: a draft copied from it would crash the model's embedding."""
    vocab = facts.vocab
    top = max((int(d.max()) for row in documents or [] for d in row if d.size), default=-1)
    if top >= vocab:
        raise ValueError(f"documents must hold token ids in [0, {vocab}) (the model's vocabulary), got an id {top}")
    top = -1 if memory is None else memory.max_token_id
    if top >= vocab:
        raise ValueError(f"memory holds token ids up to {top}, outside the model's vocabulary [0, {vocab}): "
                         f"it was filled by another model; use one Memory per tokenizer")


def check_draft_shape(facts: ModelFacts, draft: str) -> None:
    """Raise ValueError for draft="tree" on an encoder-decoder (its decoder takes positions from the cache length)."""
    if draft == "tree" and facts.encoder_decoder:
        raise ValueError(f"draft='tree' needs a decoder-only model; {facts.name} is an encoder-decoder")


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
