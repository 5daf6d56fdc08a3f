"""Grouped-query attention for verification forwards without copying the KV cache.

transformers' sdpa attention, for a model whose query heads share key/value heads (grouped-query attention: Llama 3,
Qwen2, SmolLM2, Mistral, ...), packs the heads of a single query but expands the keys and values to every query
head (`repeat_kv`: a copy of the layer's whole cache) when several queries attend with a mask, which is what every
verification forward does. On a CPU at a long context that copy is a large part of the step: on SmolLM2-135M after
1,800 tokens a forward over 8 tokens took 105 ms with it and 90 ms without (benchmarks/RESULTS.md, "Step cost").

`packed_sdpa` runs those forwards the way transformers runs a single query: the queries of each key/value head
become one sequence [b, kv heads, groups * q, d] and only the mask is repeated, so each query row meets the same
keys, values, mask and scale as before (the same arithmetic; the kernel may block the rows differently, so results
can differ in the last bits, as any multi-token forward does from a one-token one: exact on SmolLM2, within 2e-5 of
the logits on stories260K). Every other case (one query, a prefill, no groups, a bias, a soft cap, sinks,
dropout) goes to transformers' own function. `packed_attention(model)` switches a model that runs sdpa to it for the
duration of a call and switches it back after.
"""
from __future__ import annotations

import contextlib

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "lookahead_sdpa"


def packed_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' `sdpa_attention_forward`, with several queries of a grouped-query layer packed per key/value
    head instead of the keys and values repeated per query head. query [b, H, q, d], key/value [b, G, S, d]; returns
    (output [b, q, H, d], None) as transformers' function does."""
    if not _packable(module, query, key, value, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    b, heads, q, d = query.shape
    groups = key.shape[1]
    reps = heads // groups
    packed = query.reshape(b, groups, reps * q, d)  # head h = g * reps + r: rows (r, q) of group g
    mask = attention_mask.repeat(1, 1, reps, 1)  # [b or 1, 1, reps * q, S]: the same rows for each r
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, heads, q, value.shape[-1]).transpose(1, 2).contiguous(), None


def _packable(module, query, key, value, mask, dropout, kwargs) -> bool:
    """Whether a forward is the case `packed_sdpa` packs: several queries after cached ones, a 4D mask shared by the
    heads, groups of query heads per key/value head, and nothing transformers would add to the scores."""
    q, s = query.shape[2], key.shape[2]
    groups = getattr(module, "num_key_value_groups", 1)
    return (groups > 1 and 1 < q < s and mask is not None and mask.dim() == 4 and mask.shape[1] == 1
            and query.shape[1] == key.shape[1] * groups and key.shape[-1] == value.shape[-1] and not dropout
            and all(kwargs.get(k) is None for k in ("position_bias", "softcap", "s_aux", "sinks")))


AttentionInterface.register(NAME, packed_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks transformers builds for sdpa, unchanged


@contextlib.contextmanager
def packed_attention(model):
    """Run `model` with `packed_sdpa` inside the block when it runs transformers' sdpa with grouped-query
    attention on a CPU (unchanged otherwise); its attention implementation is set back when the block ends, also
    on an error."""
    config = model.config
    before = getattr(config, "_attn_implementation", None)
    if not _grouped(config) or before != "sdpa" or model.device.type != "cpu" or not _settable(model):
        yield
        return
    model.set_attn_implementation(NAME)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def _grouped(config) -> bool:
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None)
    kv = getattr(text, "num_key_value_heads", None)
    return bool(heads and kv and kv < heads)


def _settable(model) -> bool:
    can = getattr(model, "_can_set_attn_implementation", None)
    return callable(can) and bool(can()) and hasattr(model, "set_attn_implementation")
