"""The entry points: `generate` (lookahead's arguments checked, the rest handed to `model.generate`) and `decode`
(the loop as transformers calls a `custom_generate`): draft from an index, verify every draft token in one target
forward, keep what the target agrees with.

References: Leviathan et al., "Fast Inference from Transformers via Speculative Decoding" (2023); Saxena, "Prompt
Lookup Decoding" (2023); Miao et al., "SpecInfer" (2024) for trees. Greedy verification is exact: the output equals
plain greedy decoding token for token. Sampling verification is exact in distribution.

`generate` checks lookahead's own arguments and hands the rest to `model.generate` with `decode` as its decoding loop
(transformers' `custom_generate`), so the generation config, logits processors, stopping criteria and encoder outputs
are prepared by transformers exactly as for its own loops. The step itself is `lookahead.decode.loop`; the room each
part lives in is in docs/architecture.md.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from . import _validate as V
from .runtime.jit import kind_of, tier
from .decode.calibrate import draft_cost, free_widths
from .decode.fallback import one_row_at_a_time, plain_generate
from .decode.loop import Rows, assemble, make_run, run_loop, token_ids
from .decode.policy import CostCurve
from .decode.processing import max_new_tokens as _max_new
from .decode.recycling import table_for
from .decode.settings import (OPTIONS, GenerationStats, Settings, check_supported, eos_override, hf_kwargs,
                              make_settings, refuse_assistant, with_stop_strings)
from .index.build import RECYCLING, row_indexes
from .model import make_target
from .model.attention import packed_attention
from .model.facts import ModelFacts
from .model.indexer import decoding_order
from .model.linear import packed_linears
from .model.recurrent import stepping
from .model.static import compiles_on_cpu

__all__ = ["GenerationStats", "decode", "generate"]


def generate(
    model,
    input_ids,
    *,
    attention_mask=None,
    lookup: str = OPTIONS["lookup"],
    max_ngram: int = OPTIONS["max_ngram"],
    min_ngram: int = OPTIONS["min_ngram"],
    num_draft_tokens: int | None = None,
    draft_cost: float | tuple | str | None = None,
    draft: str = OPTIONS["draft"],
    max_draft_nodes: int | None = None,
    memory=None,
    max_new_tokens: int | None = None,
    eos_token_id=None,
    pad_token_id=None,
    logits_processor=None,
    stopping_criteria=None,
    documents=None,
    tokenizer=None,
    streamer=None,
    generator=None,
    return_stats: bool = False,
    **generate_kwargs,
):
    """Generate what `model.generate` generates with the same arguments, in fewer forward passes.

    Greedy output equals `model.generate(do_sample=False)` token for token; with `do_sample=True` every token is
    distributed exactly as `model.generate` samples it.

    Args:
        model: a Hugging Face causal LM (`AutoModelForCausalLM`) or encoder-decoder (`AutoModelForSeq2SeqLM`).
        input_ids: LongTensor [batch, length] (or [length]); left-pad rows of different lengths.
        attention_mask: [batch, length] of 0/1 (or bools), 0 on padding. Default: all ones.
        lookup: "ngram" (draft from an `NgramIndex` over documents, prompt and output), "suffix" (a `SuffixIndex`:
            longest match of any length, adaptive drafts), "recycle" (Token Recycling: what the target itself
            predicted after each token at earlier steps, `lookahead.index.recycle`), "suffix+recycle" (the suffix
            tree's likely copies, the rest of the budget recycled predictions) or "none" (plain decoding). The
            recycled predictions are learned from every forward's top-k and kept across calls by `memory`.
        max_ngram, min_ngram: longest and shortest suffix the index matches.
        num_draft_tokens: most draft tokens verified per row and step, at most 1024 (0 disables drafting).
            Default: 10; on a static step (`cache_implementation`, below) as many as the padded width that holds 10
            does (15), since the step computes that width anyway. A static step verifies at most 63: more is cut to
            63, with a warning.
        draft_cost: what verification costs, as a fraction of a one-token forward: the cost of one more verified
            token, or a pair (overhead of any multi-token forward, cost per token); drafts and trees are only as
            large as the acceptance seen so far pays for (`lookahead.decode.policy`), then every row drafts up to the
            columns the step computes anyway (the widest row's draft, a static step's width, or at batch 1 on a
            measured curve the cheapest width at or above it). "auto" measures the cost of the draft sizes on this
            machine once per model (about 60 forwards, `lookahead.decode.calibrate.measure_draft_cost`, which also
            returns a curve to pass here). Default:
            "auto" for a greedy call of a decoder-only model on a CPU, (0.8, 0.08) for a sampling one (fixed, so that
            a seed always writes the same text), (0, 0.02) on an accelerator. 0 always drafts `num_draft_tokens`
            when there is a match.
        draft: "chain" (one continuation) or "tree" (several continuations verified together in one forward with a
            tree attention mask; needs lookup="suffix", "recycle" or "suffix+recycle" and a decoder-only model;
            greedy or sampling).
        max_draft_nodes: most tree nodes verified per row and step (draft="tree"), at most 1024. Default: 32; on a
            static step as many as the padded width that holds 32 does (63), and at most 63.
        memory: a `lookahead.Memory` that outlives calls: its earlier prompts and outputs are drafted from, and
            this call's prompts and outputs are added to it (with a recycling lookup, the target's predictions too).
        max_new_tokens: most tokens generated per row. Default: 128, unless `generation_config` or `max_length`
            sets a length.
        eos_token_id: int or list of ints that end a row ([] for none). Default: the generation config's.
        pad_token_id: fills rows that ended early. Default: generation config, else the first eos id.
        logits_processor: a `LogitsProcessorList` (or one `f(input_ids, scores) -> scores`), applied at every
            verified position with that position's own prefix, as `model.generate` applies it.
        stopping_criteria: a `StoppingCriteriaList`, checked after every accepted token.
        documents: retrieved passages to draft from without putting them in the prompt: a list of strings (with
            `tokenizer`) or token id sequences, shared by all rows, or one such list per row.
        tokenizer: turns string documents and `stop_strings` into token ids.
        streamer: a `TextStreamer` / `TextIteratorStreamer` (batch of one); it gets each step's accepted tokens.
        generator: a `torch.Generator` or an int seed for sampling. Default: torch's global generator.
        return_stats: also return a `GenerationStats`.
        **generate_kwargs: whatever `model.generate` accepts: `generation_config`, `do_sample` (default False:
            greedy, even when the model's generation config samples), `temperature`,
            `top_k`, `top_p`, `min_p`, `typical_p`, `repetition_penalty`, `no_repeat_ngram_size`, `bad_words_ids`,
            `suppress_tokens`, `min_new_tokens`, `stop_strings`, `max_time`, `num_return_sequences` (sampling),
            `return_dict_in_generate`, `output_scores`, `output_logits`, ... The KV cache follows transformers'
            names: `cache_implementation="static"` preallocates it and, on CUDA, compiles the step
            (`compile_config`, default transformers' `CompileConfig()`) and captures it as CUDA graphs;
            `"dynamic"` keeps transformers' dynamic cache; unset, a CUDA call on a tested decoder-only
            architecture with full attention takes the static cache with CUDA graphs, uncompiled, and every other
            call the dynamic cache. `disable_compile=True`: no compilation and no graphs (`lookahead.model.static`).

    Returns:
        LongTensor [batch, length + new] (prompt then new tokens); with `return_dict_in_generate=True` the
        transformers output class (`sequences`, `scores`, `logits`) with `lookahead_stats` added. With
        return_stats, `(output, stats)`.

    Raises:
        TypeError: model is not a Hugging Face LM with a KV cache, or ids are not integers.
        ValueError: empty input, ids outside the vocabulary, mismatched or right-padded mask, bad lookup settings,
            a max_new_tokens past the model's position limit, an argument lookahead cannot honour (beam search, an
            assistant model, ...), or an option the model's layers cannot take exactly (trees or the static cache
            over recurrent layers or MPT's ALiBi, a compiled static step over ALiBi, weights on the meta device),
            named in the message, before any forward.

    Warns:
        FallbackWarning: lookahead cannot draft over the model's layers yet (recurrent layers it does not follow,
            a cache class of the model's own, no KV cache at all: GPT-1, XLNet): the call ran model.generate's own
            decoding (the same tokens, no speedup) and `stats.fallback` says why (`lookahead.decode.fallback`).

    Example:
        >>> out = generate(model, tok("def f(x):", return_tensors="pt").input_ids, max_new_tokens=64)
        >>> out = generate(model, ids, do_sample=True, temperature=0.7, top_p=0.9, generator=0)
    """
    uncached = V.check_model(model, fallback=True)  # why a transformers LM without a KV cache cannot draft, or None
    facts = ModelFacts.of(model)
    settings = make_settings(lookup=lookup, max_ngram=max_ngram, min_ngram=min_ngram, num_draft_tokens=num_draft_tokens,
                             draft_cost=draft_cost, draft=draft, max_draft_nodes=max_draft_nodes, memory=memory,
                             documents=documents, tokenizer=tokenizer, generator=generator, streamer=streamer,
                             eos=eos_override(eos_token_id))
    if max_new_tokens is not None:
        V.check_int("max_new_tokens", max_new_tokens, 1)
    if pad_token_id is not None:
        V.check_int("pad_token_id", pad_token_id, 0, facts.vocab - 1)
    refuse_assistant(generate_kwargs.get("assistant_model"))
    input_ids, attention_mask = V.check_inputs(facts, input_ids, attention_mask)
    kwargs = hf_kwargs(dict(generate_kwargs), max_new_tokens, eos_token_id, pad_token_id, logits_processor)
    kwargs["stopping_criteria"] = with_stop_strings(stopping_criteria, kwargs, tokenizer)
    reason = uncached or V.layers_refusal(facts)  # before model.generate, which builds the model's cache
    if reason is not None:  # layers lookahead cannot draft over yet: model.generate's own decoding, said
        out = plain_generate(model, input_ids, attention_mask, kwargs, settings, reason)
        return (out, settings.stats) if return_stats else out
    apart = V.rows_apart(facts, model) if input_ids.shape[0] > 1 else None
    if apart is not None:  # rows that cannot share one cache: each alone, said
        if kwargs.get("return_dict_in_generate"):
            raise ValueError(f"return_dict_in_generate=True is not supported for a batch of {input_ids.shape[0]} rows "
                             f"on {facts.name}: {apart}, so its rows run one at a time; pass one row at a time "
                             f"(input_ids of batch 1) or leave return_dict_in_generate unset")
        if streamer is not None:
            raise ValueError(f"streamer= supports a batch of one row, as transformers' streamers do; got "
                             f"{input_ids.shape[0]}")
        seed = torch.Generator(input_ids.device).manual_seed(generator) if isinstance(generator, int) else generator

        rest, new = dict(generate_kwargs), max_new_tokens
        if new is None and "max_length" in rest:  # the batch's length, its padding included: as new tokens
            new = rest.pop("max_length") - input_ids.shape[1]

        def run_row(ids, docs):  # one row alone, every other argument as given
            return generate(model, ids, lookup=lookup, max_ngram=max_ngram, min_ngram=min_ngram,
                            num_draft_tokens=num_draft_tokens, draft_cost=draft_cost, draft=draft,
                            max_draft_nodes=max_draft_nodes, memory=memory, max_new_tokens=new,
                            eos_token_id=eos_token_id, pad_token_id=pad_token_id, logits_processor=logits_processor,
                            stopping_criteria=stopping_criteria, documents=docs, tokenizer=tokenizer, generator=seed,
                            return_stats=True, **rest)

        out = one_row_at_a_time(run_row, input_ids, attention_mask, settings, apart, _pad(model, kwargs, settings))
        return (out, settings.stats) if return_stats else out
    static = (kwargs.get("cache_implementation") or getattr(model.generation_config, "cache_implementation", None))
    V.check_compressed(facts, settings.draft, static == "static", input_ids.shape[0])  # before transformers builds a
    # static cache it has no layers for
    out = model.generate(input_ids, attention_mask=attention_mask, custom_generate=decode, lookahead=settings, **kwargs)
    return (out, settings.stats) if return_stats else out


def _pad(model, kwargs: dict, settings: Settings) -> int:
    """The id that pads rows which ended early: as `decode` chooses it (the pad id, else the first eos, else 0)."""
    config = kwargs.get("generation_config") or model.generation_config
    eos = settings.eos if settings.eos is not None else token_ids(kwargs.get("eos_token_id", config.eos_token_id))
    return (token_ids(kwargs.get("pad_token_id", config.pad_token_id)) or eos[:1] or (0,))[0]


def decode(model, input_ids, logits_processor, stopping_criteria, generation_config, lookahead: Settings | None = None,
           inputs_tensor=None, **model_kwargs):
    """The decoding loop, as transformers calls a `custom_generate` callable (see `lookahead.custom_generate`).

    Args:
        model, input_ids [B, L] (decoder input for encoder-decoders), logits_processor, stopping_criteria,
        generation_config, inputs_tensor (the encoder input), **model_kwargs: as prepared by `model.generate`.
        lookahead: lookahead's `Settings` (default ones when None).

    Returns:
        LongTensor [B, L + new], or an output object (`lookahead.decode.outputs`) with return_dict_in_generate.
    """
    linears = contextlib.nullcontext() if compiles_on_cpu(generation_config) else packed_linears(model)
    settings = lookahead if lookahead is not None else make_settings()
    kind = kind_of(settings.lookup, settings.draft, input_ids.shape[0],
                   getattr(generation_config, "cache_implementation", None) == "static",
                   bool(generation_config.do_sample))
    # without copying the cache per head, nor the weights per forward; the kernels compiled, or their Python twins
    # while numba compiles them in the background (`lookahead.runtime.jit`)
    with packed_attention(model), linears, tier(kind), stepping(model), decoding_order(model):
        return _decode(model, input_ids, logits_processor, stopping_criteria, generation_config, settings,
                       inputs_tensor, **model_kwargs)


def _decode(model, input_ids, logits_processor, stopping_criteria, generation_config, settings, inputs_tensor,
            **model_kwargs):
    uncached = V.check_model(model, fallback=True)  # the plugin path: transformers calls this loop on any LM
    if uncached is not None:
        raise ValueError(f"{uncached}; use model.generate")
    facts = ModelFacts.of(model)  # what the target, the policies and the checks need to know of the model
    V.check_layers(facts)  # first: a state-space model's cache cannot even say its length
    check_supported(generation_config, model_kwargs)
    V.check_draft_shape(facts, settings.draft)
    if not facts.encoder_decoder:  # its attention_mask is the encoder's, which may pad on either side
        V.check_left_padded(model_kwargs.get("attention_mask"))
    V.check_recurrent(facts, settings.draft, generation_config, model, input_ids.shape[0])
    V.check_alibi(facts, generation_config, input_ids.shape[0])
    V.check_compressed(facts, settings.draft, getattr(generation_config, "cache_implementation", None) == "static",
                       input_ids.shape[0])
    eos = settings.eos if settings.eos is not None else token_ids(generation_config.eos_token_id)
    pad = token_ids(generation_config.pad_token_id) or eos[:1] or (0,)
    max_new = _max_new(stopping_criteria, input_ids.shape[1])
    target = make_target(model, facts, input_ids, inputs_tensor, model_kwargs, max_new, generation_config,
                         settings.widest())
    cost = draft_cost(model, facts, settings, bool(generation_config.do_sample))
    settings = settings.resolved(free_widths(target, cost), target.most)  # unset budgets fill what costs no more
    if isinstance(cost, CostCurve) and input_ids.shape[0] == 1 and hasattr(target, "pad_to"):
        target.pad_to(cost.pads_within(settings.widest()))  # to the widths that cost least (measured at batch 1)
    recycled = _recycled(model, facts, settings)
    run = make_run(facts, input_ids.shape[0], logits_processor, stopping_criteria, generation_config, settings, eos,
                   max_new, cost, target.argmax, recycled)
    V.check_documents(facts, settings.documents, settings.memory)
    sources = target.sources()
    rows = Rows(target, list(range(len(sources))), np.zeros(len(sources), np.int64), prompts=input_ids,
                indexes=row_indexes(settings.lookup, settings.max_ngram, settings.min_ngram, sources,
                                    settings.documents, settings.memory, settings.num_draft_tokens, recycled))
    if settings.streamer is not None:  # transformers never sees it, so it did not put the prompt
        settings.streamer.put(input_ids.cpu())
    try:
        with torch.inference_mode():
            outs = run_loop(rows, run, max_new)
    finally:  # a failed call still ends the streamer, so that a thread reading it does not wait forever
        run.streamer.end()
        if hasattr(target, "close"):
            target.close(settings.stats)
    settings.stats.new_tokens_by_row = [len(o) for o in outs]
    settings.stats.new_tokens = sum(settings.stats.new_tokens_by_row)
    if settings.memory is not None:
        for source, out in zip(sources, outs):
            settings.memory.add_tokens(np.concatenate([source.cpu().numpy(), np.asarray(out, dtype=np.int64)]))
    sequences = assemble(input_ids, outs, pad[0])
    if not generation_config.return_dict_in_generate:
        return sequences
    return run.recorder.output(sequences, sequences.shape[1] - input_ids.shape[1], pad[0], settings.stats,
                               model_kwargs.get("encoder_outputs"))


def _recycled(model, facts: ModelFacts, settings: Settings):
    """A recycling call's predictions after each token: the memory's, kept for this model and vocabulary across
    calls, or new ones for this call; None for other lookups (or when nothing is drafted)."""
    if settings.lookup not in RECYCLING or settings.num_draft_tokens == 0:
        return None
    return table_for(model, facts, settings.memory)
