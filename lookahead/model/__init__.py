"""The models the loop verifies with, behind one protocol (`sources`, `prefill`, `verify`, `verify_ids`, `commit`,
`keep`, `padded`, `most`, `argmax`): `CausalLM` over transformers' dynamic cache, `StaticCausalLM` over a
preallocated slot cache (with CUDA graphs), `Seq2SeqLM` for encoder-decoders; `cache` is the one module that changes
a dynamic KV cache's layout.
"""
from __future__ import annotations

import torch

from .causal import CausalLM
from .facts import ModelFacts
from .seq2seq import Seq2SeqLM
from .slot_cache import check_static
from .static import StaticCausalLM, static_mode

__all__ = ["CausalLM", "ModelFacts", "Seq2SeqLM", "StaticCausalLM", "make_target"]


def make_target(model, facts: ModelFacts, input_ids: torch.Tensor, inputs_tensor, model_kwargs: dict, max_new: int,
                config, max_width: int):
    """The model wrapped for the loop, after checking that max_new tokens fit its position limit.

    `facts` are the model's (`ModelFacts.of(model)`); `config` is the call's generation config: it chooses between
    `StaticCausalLM` (with CUDA graphs, compiled or not) and the dynamic `CausalLM` as `static.static_mode` says;
    `max_width` is the most draft tokens or nodes a row verifies per step.
    """
    if facts.encoder_decoder:
        if getattr(config, "cache_implementation", None) == "static":
            check_static(facts, 0)
        check_length(facts, torch.ones_like(input_ids), max_new)
        return Seq2SeqLM(model, facts, input_ids, inputs_tensor, model_kwargs)
    mask = model_kwargs.get("attention_mask")
    mask = torch.ones_like(input_ids) if mask is None else mask.long()
    check_length(facts, mask, max_new)
    mode = static_mode(facts, config)
    if mode is not None:
        return StaticCausalLM(model, facts, input_ids, mask, max_new, max_width, *mode,
                              keep_logits=bool(getattr(config, "return_dict_in_generate", False)))
    return CausalLM(model, facts, input_ids, mask)


def check_length(facts: ModelFacts, attention_mask: torch.Tensor, max_new_tokens: int) -> None:
    """Raise ValueError if the longest row would run past the model's position limit."""
    limit, longest = facts.positions, int(attention_mask.sum(-1).max())
    if limit is not None and longest + max_new_tokens > limit:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} with a prompt of {longest} tokens exceeds the model's position limit "
            f"of {limit} tokens (max_position_embeddings); lower max_new_tokens to at most {max(limit - longest, 0)}"
        )
