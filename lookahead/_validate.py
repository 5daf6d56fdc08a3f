"""Argument checks for the public API: each error names the argument, what was expected and what came."""
from __future__ import annotations

import torch

from ._checks import check_int  # noqa: F401  (re-exported: one integer check for the whole package)
from .model.cache import FOLLOWED_CACHES
from .model.facts import ModelFacts, forward_parameters, rows_apart, takes_keywords, tree_refusal  # noqa: F401
# (rows_apart: re-exported for generate)
from .model.layers import COMPRESSED, KNOWN, NONE, RECURRENT, state_space
from .model.rwkv import is_rwkv


def check_model(model, fallback: bool = False) -> str | None:
    """Raise TypeError unless `model` is a Hugging Face LM (causal or encoder-decoder) that decodes with a KV cache.
    RWKV's `state` stands for a KV cache (its states are followed: `model.rwkv`). With `fallback`, a
    transformers-style LM that keeps no KV cache (GPT-1, XLNet's memories: its forward takes **kwargs) is not
    refused: returns why lookahead cannot draft on it (`lookahead.generate` then runs model.generate's own decoding,
    `decode.fallback`); else None."""
    from transformers import PreTrainedModel

    name = type(model).__name__
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"model must be a transformers PreTrainedModel (e.g. from AutoModelForCausalLM), got {name}")
    if not model.can_generate() or model.get_output_embeddings() is None:
        raise TypeError(
            f"model must be a causal language model with an LM head (AutoModelForCausalLM), got {name}"
        )
    params, reason = forward_parameters(model), None
    cache = {"cache", "past_key_values"} & params or ("state" in params and is_rwkv(model))
    if not cache or not ("use_cache" in params or takes_keywords(model)):
        if not (fallback and takes_keywords(model)):
            raise TypeError(f"model must accept a KV cache (cache= or past_key_values=) and use_cache to decode with "
                            f"a KV cache; {name} does not")
        reason = (f"{name} keeps no KV cache that lookahead can roll back after a rejected draft (its forward takes "
                  f"neither cache= nor past_key_values=)")
    if any(p.device.type == "meta" for p in model.parameters()):
        raise ValueError(f"model has weights on the 'meta' device (no data: built under init_empty_weights, or not "
                         f"loaded); load {name}'s weights (from_pretrained, or load_state_dict with assign=True) first")
    return reason


def check_layers(facts: ModelFacts) -> None:
    """Raise ValueError, before any forward, where the model's layers (`facts.layers`) cannot be decoded exactly with
    drafts (`layers_refusal`)."""
    reason = layers_refusal(facts)
    if reason is not None:
        raise ValueError(f"{reason}; use model.generate")


def layers_refusal(facts: ModelFacts) -> str | None:
    """Why the model's layers (`facts.layers`) cannot be decoded exactly with drafts, or None: recurrent or
    convolution layers lookahead does not follow, layer kinds it does not know (compressed attention), a cache class
    of the model's own. `lookahead.generate` then runs model.generate's own decoding, and says so
    (`decode.fallback`)."""
    name, kept = facts.name, [layer for layer in facts.layers if layer.kind != NONE]
    state = [layer for layer in kept if layer.kind == RECURRENT]
    if state and facts.own_cache is None and facts.recurrent:
        what = f"is a state-space model: every layer keeps a recurrent state ({_names(state)})" \
            if state_space(kept) else f"has recurrent layers ({len(state)} of {len(kept)}: {_names(state)})"
        return (f"{name} {what} that lookahead cannot take back to the accepted tokens after a rejected draft "
                f"({facts.recurrent})")
    unknown = [layer for layer in kept if layer.kind not in KNOWN]
    if unknown:
        return (f"{name} has layers of a kind lookahead does not know ({_names(unknown)}): their cache may not roll "
                f"back rejected drafts exactly")
    if facts.own_cache is not None and facts.own_cache not in FOLLOWED_CACHES:
        return (f"{name} keeps its state in a cache of its own ({facts.own_cache}), not in the KV cache lookahead "
                f"rolls back after rejected drafts")
    return None


def check_recurrent(facts: ModelFacts, draft: str, config, model, rows: int = 1) -> None:
    """Raise ValueError, before any forward, for what recurrent layers cannot verify: a tree (a state follows one
    sequence of tokens, not a tree's branches); the static cache where their states are not in transformers'
    recurrent cache layers (states on the modules, a cache class of the model's own), or sit beside a window the
    static masks do not apply (Inkling, whose window by cache slot also refuses batches of several rows), or where
    its step would be compiled or captured (the states are settled around an eager step).
    `config`: the call's generation config."""
    if facts.recurrent != "":
        return
    if draft == "tree":
        raise ValueError(f"draft='tree' is not supported for {facts.name}: {tree_refusal(facts)}, so a tree's branches "
                         f"cannot be verified in one forward; use draft='chain' (the default: exact, its states follow "
                         f"the accepted tokens)")
    from .model.griffin import griffin_blocks
    from .model.recurrent import windowed_state_layers

    if rows > 1 and windowed_state_layers(model):
        raise ValueError(f"a batch of {rows} rows is not supported for {facts.name}: its layers that keep recurrent "
                         f"states cut their sliding window by cache slot, and a batch's rows keep the slots of "
                         f"rejected drafts (masked); pass one row at a time (input_ids of batch 1)")
    if getattr(config, "cache_implementation", None) != "static":
        return

    why = ("its recurrent blocks keep their states on the modules" if griffin_blocks(model)
           else f"its recurrent states live in a cache of its own ({facts.own_cache})" if facts.own_cache
           else "its blocks keep their states in the state its forward takes, not a cache" if facts.kv == "state"
           else "its layers keep recurrent states beside a sliding window that only their own cache layers apply"
           if windowed_state_layers(model) else None)
    if why is not None:
        raise ValueError(f"cache_implementation='static' is not supported for {facts.name}: {why}, which the static "
                         f"cache does not hold; leave cache_implementation unset")
    if _compiled_static(facts, config):
        raise ValueError(f"cache_implementation='static' would compile or capture the step of {facts.name}, whose "
                         f"recurrent states lookahead settles around an eager step: pass disable_compile=True (the "
                         f"static cache, uncompiled) or leave cache_implementation unset")


def check_compressed(facts: ModelFacts, draft: str, static: bool, rows: int) -> None:
    """Raise ValueError, before any forward, for what compressed attention layers (DeepSeek-V4's HCA and CSA,
    `model.compressed`) cannot verify: a tree (a window folds a row's tokens in order, siblings included), a batch of
    several rows (one count of compressed entries for every row; transformers' own padded batch differs from each
    row alone too), the static cache (`static`: its slots hold no compressor state; transformers' own static cache
    cannot be built for these layers)."""
    if not any(layer.kind == COMPRESSED for layer in facts.layers):
        return
    name = facts.name
    if draft == "tree":
        raise ValueError(f"draft='tree' is not supported for {name}: {tree_refusal(facts)}, so a tree's branches "
                         f"cannot share a forward; use draft='chain' (the default: exact)")
    if rows > 1:
        raise ValueError(f"a batch of {rows} rows is not supported for {name}: its compressed attention layers count "
                         f"their entries once for every row; pass one row at a time (input_ids of batch 1)")
    if static:
        raise ValueError(f"cache_implementation='static' is not supported for {name}: its compressed attention "
                         f"layers keep their buffers and entries in their own cache layers, which the static cache "
                         f"does not hold; leave cache_implementation unset")


def check_alibi(facts: ModelFacts, config, rows: int) -> None:
    """Raise ValueError, before any forward, for what ALiBi biases (`facts.alibi`) cannot take: a compiled static
    step (the biases are set around an eager one); where the biases are one line for every row (MPT: "slots"), a
    batch of several rows (a row's padding and rejected slots would count as distance). Trees and eager static steps
    run with each key biased by its own position (`model.alibi`). `config`: the call's generation config."""
    if not facts.alibi:
        return
    name = facts.name
    if getattr(config, "cache_implementation", None) == "static" and _compiled_static(facts, config):
        raise ValueError(f"cache_implementation='static' would compile the step of {name}, whose ALiBi biases "
                         f"lookahead sets around an eager step: pass disable_compile=True (the static cache, "
                         f"uncompiled) or leave cache_implementation unset")
    if facts.alibi == "slots" and rows > 1:
        raise ValueError(f"{name} builds its ALiBi biases from cache slots, one line for every row, so in a batch of "
                         f"{rows} rows the padding and the slots a row rejected would count as distance: pass one "
                         f"row at a time (input_ids of batch 1)")


def _compiled_static(facts: ModelFacts, config) -> bool:
    """Whether a static-cache call's step would be compiled or captured as CUDA graphs (a compile_config, or CUDA),
    which `disable_compile=True` turns off (`model.static.static_mode`)."""
    compiled = getattr(config, "compile_config", None) is not None or facts.device.type == "cuda"
    return compiled and not getattr(config, "disable_compile", False)


def _names(layers) -> str:
    """'linear_attention x3, conv' for a list of layers."""
    counts = {}
    for layer in layers:
        counts[layer.name] = counts.get(layer.name, 0) + 1
    return ", ".join(name if n == 1 else f"{name} x{n}" for name, n in counts.items())


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
        if not facts.encoder_decoder:  # an encoder reads its whole input: padding on either side
            check_left_padded(attention_mask)
    vocab = facts.vocab
    real = input_ids[attention_mask.bool()]
    if real.numel() and (real.min() < 0 or real.max() >= vocab):
        raise ValueError(
            f"input_ids must lie in [0, {vocab}) (the model's vocabulary), got ids from {int(real.min())} "
            f"to {int(real.max())}"
        )
    return input_ids.to(facts.device), attention_mask.to(facts.device)


def check_left_padded(attention_mask) -> None:
    """Raise ValueError unless every row of `attention_mask` [B, L] (0/1) pads on the left only (None: no padding)."""
    if attention_mask is None or attention_mask.dim() != 2:
        return
    right = (attention_mask[:, 1:] < attention_mask[:, :-1]).any(-1)  # a 0 after a 1
    if right.any():
        raise ValueError(f"attention_mask must pad on the left (zeros before each row's tokens), got padding after "
                         f"the tokens of row {int(right.nonzero()[0, 0])}: pad on the left "
                         f"(tokenizer.padding_side = 'left')")


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
