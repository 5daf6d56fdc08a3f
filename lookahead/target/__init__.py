"""The models the loop verifies with, behind one protocol (`sources`, `prefill`, `verify`, `verify_ids`, `commit`,
`keep`, `padded`, `most`, `argmax`): `CausalLM` over transformers' dynamic cache, `StaticCausalLM` over a
preallocated slot cache (with CUDA graphs), `Seq2SeqLM` for encoder-decoders; `cache` is the one module that changes
a dynamic KV cache's layout.
"""
from __future__ import annotations

import torch

from .. import _validate as V
from .causal import CausalLM
from .seq2seq import Seq2SeqLM
from .slot_cache import check_static
from .static import StaticCausalLM, static_mode

__all__ = ["CausalLM", "Seq2SeqLM", "StaticCausalLM", "make_target"]


def make_target(model, input_ids: torch.Tensor, inputs_tensor, model_kwargs: dict, max_new: int, config,
                max_width: int):
    """The model wrapped for the loop, after checking that max_new tokens fit its position limit.

    `config` is the call's generation config: it chooses between `StaticCausalLM` (with CUDA graphs, compiled or
    not) and the dynamic `CausalLM` as `static.static_mode` says; `max_width` is the most draft tokens or nodes a
    row verifies per step.
    """
    if getattr(model.config, "is_encoder_decoder", False):
        if getattr(config, "cache_implementation", None) == "static":
            check_static(model, 0)
        V.check_length(model, torch.ones_like(input_ids), max_new)
        return Seq2SeqLM(model, input_ids, inputs_tensor, model_kwargs)
    mask = model_kwargs.get("attention_mask")
    mask = torch.ones_like(input_ids) if mask is None else mask.long()
    V.check_length(model, mask, max_new)
    mode = static_mode(model, config)
    if mode is not None:
        return StaticCausalLM(model, input_ids, mask, max_new, max_width, *mode,
                              keep_logits=bool(getattr(config, "return_dict_in_generate", False)))
    return CausalLM(model, input_ids, mask)
