"""The decode loop: draft from an index, verify every draft token in one target forward, keep what the target agrees with.

References: Leviathan et al., "Fast Inference from Transformers via Speculative Decoding" (2023); Saxena, "Prompt
Lookup Decoding" (2023); Miao et al., "SpecInfer" (2024) for trees. Greedy verification is exact: the output equals
plain greedy decoding token for token. Sampling verification is exact in distribution.

`generate` checks lookahead's own arguments and hands the rest to `model.generate` with `decode` as its decoding loop
(transformers' `custom_generate`), so the generation config, logits processors, stopping criteria and encoder outputs
are prepared by transformers exactly as for its own loops. A step, the same for chains and trees, greedy and sampling:

    draft (each row's index, sized by the policy) -> cut (what a processor forbids) -> verify (one forward)
    -> score (processors, each position with its own prefix) -> accept (the rule) -> update the sizing
    -> commit (the cache keeps the accepted path) -> advance (append, stop, drop finished rows)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import _validate as V
from .calibrate import budget, draft_cost
from .fused import fused as fused_loop
from .index.build import row_indexes
from .index.draft import Draft
from .outputs import Recorder
from .processing import Scorer, Stopper, Streamer, max_new_tokens as _max_new
from .settings import (GenerationStats, Settings, check_supported, eos_override, hf_kwargs, make_settings,
                       refuse_assistant, with_stop_strings)
from .sizing import make_sizing
from .targets import make_target
from .verify.batch import DraftBatch, to_device
from .verify.rules import acceptance_rule

__all__ = ["GenerationStats", "decode", "generate"]


@dataclass
class _Rows:
    """Decoding state of the rows still running; entry i of each field belongs to original row `ids[i]`."""

    ids: list
    prompts: torch.Tensor  # [b, P] what precedes the new tokens: the left-padded prompt (decoder start for seq2seq)
    last: np.ndarray  # [b] newest token, not yet in the cache
    indexes: list  # [b] each row's index (None: nothing is drafted)


@dataclass
class _Run:
    """What one call applies at every step besides the model."""

    scorer: Scorer
    stopper: Stopper
    accept: object  # (DraftBatch, scores [b, N+1, V]) -> Verdict
    sizing: object  # ChainSizing | TreeSizing: draft(indexes, rooms) -> drafts; update(batch, verdict)
    streamer: Streamer
    recorder: Recorder | None
    stats: GenerationStats
    sampling: bool = False  # do_sample: speculative sampling instead of greedy acceptance
    forwards: int = 0  # forwards so far (the prefill's included): each running row took part in all of them


def generate(
    model,
    input_ids,
    *,
    attention_mask=None,
    lookup: str = "ngram",
    max_ngram: int = 4,
    min_ngram: int = 1,
    num_draft_tokens: int | None = None,
    draft_cost: float | tuple | str | None = None,
    draft: str = "chain",
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
            longest match of any length, adaptive drafts) or "none" (plain decoding).
        max_ngram, min_ngram: longest and shortest suffix the index matches.
        num_draft_tokens: most draft tokens verified per row and step, at most 1024 (0 disables drafting).
            Default: 10; on a static step (`cache_implementation`, below) as many as the padded width that holds 10
            does (15), since the step computes that width anyway. A static step verifies at most 63: more is cut to
            63, with a warning.
        draft_cost: what verification costs, as a fraction of a one-token forward: the cost of one more verified
            token, or a pair (overhead of any multi-token forward, cost per token); drafts and trees are only as
            large as the acceptance seen so far pays for (`lookahead.policy`), then every row drafts up to the
            columns the step computes anyway (the widest row's draft, a static step's width). "auto" measures the
            cost of every draft size on this machine once per model (about 40 forwards,
            `lookahead.calibrate.measure_draft_cost`, which also returns a curve to pass here). Default: "auto" for
            a greedy call on a CPU, (0.8, 0.08) for a sampling one (fixed, so that a seed always writes the same
            text), (0, 0.02) on an accelerator. 0 always drafts `num_draft_tokens` when there is a match.
        draft: "chain" (one continuation) or "tree" (several continuations verified together in one forward with a
            tree attention mask; needs lookup="suffix" and a decoder-only model; greedy or sampling).
        max_draft_nodes: most tree nodes verified per row and step (draft="tree"), at most 1024. Default: 32; on a
            static step as many as the padded width that holds 32 does (63), and at most 63.
        memory: a `lookahead.Memory` that outlives calls: its earlier prompts and outputs are drafted from, and
            this call's prompts and outputs are added to it.
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
            call the dynamic cache. `disable_compile=True`: no compilation and no graphs (`lookahead.static`).

    Returns:
        LongTensor [batch, length + new] (prompt then new tokens); with `return_dict_in_generate=True` the
        transformers output class (`sequences`, `scores`, `logits`) with `lookahead_stats` added. With
        return_stats, `(output, stats)`.

    Raises:
        TypeError: model is not a Hugging Face LM with a KV cache, or ids are not integers.
        ValueError: empty input, ids outside the vocabulary, mismatched mask, bad lookup settings, a max_new_tokens
            past the model's position limit, or an argument lookahead cannot honour (beam search, an assistant
            model, ...), named in the message.

    Example:
        >>> out = generate(model, tok("def f(x):", return_tensors="pt").input_ids, max_new_tokens=64)
        >>> out = generate(model, ids, do_sample=True, temperature=0.7, top_p=0.9, generator=0)
    """
    V.check_model(model)
    settings = make_settings(lookup=lookup, max_ngram=max_ngram, min_ngram=min_ngram, num_draft_tokens=num_draft_tokens,
                             draft_cost=draft_cost, draft=draft, max_draft_nodes=max_draft_nodes, memory=memory,
                             documents=documents, tokenizer=tokenizer, generator=generator, streamer=streamer,
                             eos=eos_override(eos_token_id))
    if max_new_tokens is not None:
        V.check_int("max_new_tokens", max_new_tokens, 1)
    if pad_token_id is not None:
        V.check_int("pad_token_id", pad_token_id, 0, V.vocab_size(model) - 1)
    refuse_assistant(generate_kwargs.get("assistant_model"))
    input_ids, attention_mask = V.check_inputs(model, input_ids, attention_mask)
    kwargs = hf_kwargs(dict(generate_kwargs), max_new_tokens, eos_token_id, pad_token_id, logits_processor)
    kwargs["stopping_criteria"] = with_stop_strings(stopping_criteria, kwargs, tokenizer)
    out = model.generate(input_ids, attention_mask=attention_mask, custom_generate=decode, lookahead=settings, **kwargs)
    return (out, settings.stats) if return_stats else out


def decode(model, input_ids, logits_processor, stopping_criteria, generation_config, lookahead: Settings | None = None,
           inputs_tensor=None, **model_kwargs):
    """The decoding loop, as transformers calls a `custom_generate` callable (see `lookahead.custom_generate`).

    Args:
        model, input_ids [B, L] (decoder input for encoder-decoders), logits_processor, stopping_criteria,
        generation_config, inputs_tensor (the encoder input), **model_kwargs: as prepared by `model.generate`.
        lookahead: lookahead's `Settings` (default ones when None).

    Returns:
        LongTensor [B, L + new], or an output object (`lookahead.outputs`) with return_dict_in_generate.
    """
    settings = lookahead if lookahead is not None else make_settings()
    check_supported(generation_config, model_kwargs)
    V.check_draft_shape(model, settings.draft)
    eos = settings.eos if settings.eos is not None else _ids(generation_config.eos_token_id)
    pad = _ids(generation_config.pad_token_id) or eos[:1] or (0,)
    max_new = _max_new(stopping_criteria, input_ids.shape[1])
    target = make_target(model, input_ids, inputs_tensor, model_kwargs, max_new, generation_config, settings.widest())
    cost = draft_cost(model, settings, bool(generation_config.do_sample))
    settings = settings.resolved(_widths(target, cost), target.most)  # unset budgets fill what costs no more
    run = _make_run(model, input_ids.shape[0], logits_processor, stopping_criteria, generation_config, settings, eos,
                    max_new, cost, target.argmax)
    V.check_documents(model, settings.documents, settings.memory)
    sources = target.sources()
    rows = _Rows(list(range(len(sources))), input_ids, np.zeros(len(sources), np.int64),
                 row_indexes(settings.lookup, settings.max_ngram, settings.min_ngram, sources, settings.documents,
                             settings.memory, settings.num_draft_tokens))
    if settings.streamer is not None:  # transformers never sees it, so it did not put the prompt
        settings.streamer.put(input_ids.cpu())
    try:
        with torch.inference_mode():
            outs = _decode(target, rows, run, max_new)
    finally:  # a failed call still ends the streamer, so that a thread reading it does not wait forever
        run.streamer.end()
    settings.stats.new_tokens_by_row = [len(o) for o in outs]
    settings.stats.new_tokens = sum(settings.stats.new_tokens_by_row)
    if settings.memory is not None:
        for source, out in zip(sources, outs):
            settings.memory.add_tokens(np.concatenate([source.cpu().numpy(), np.asarray(out, dtype=np.int64)]))
    sequences = _assemble(input_ids, outs, pad[0])
    if not generation_config.return_dict_in_generate:
        return sequences
    return run.recorder.output(sequences, sequences.shape[1] - input_ids.shape[1], pad[0], settings.stats,
                               model_kwargs.get("encoder_outputs"))


def _decode(target, rows: _Rows, run: _Run, max_new: int) -> list:
    """Run the loop; return the new tokens of each row."""
    outs = [[] for _ in rows.ids]
    run.stats.forwards_by_row = [0] * len(outs)  # each row's, written when it finishes (`_drop`)
    clock = run.stats.clock()
    logits = target.prefill(run.stats)  # [b, 1, V]
    fused = fused_loop(target, rows, run, max_new, clock)
    if fused is not None:  # the prefill's token taken by the fused step, which drafts the first step with it
        rows = _drop(target, rows, fused.run_rows(rows, outs, logits), run)
    else:
        empty = DraftBatch.pack([Draft.empty()] * len(outs), chain=True)
        scores = run.scorer(logits, rows, outs, empty)
        rows = _advance(target, rows, outs, run, empty, run.accept(empty, scores), scores, logits)
        clock.lap("prefill")
    while rows.ids:
        if fused is not None:  # the common call: a step's host work in one kernel call, until a row is done
            rows = _drop(target, rows, fused.run_rows(rows, outs), run)
            continue
        drafts = run.sizing.draft(rows.indexes, max_new - 1 - np.array([len(outs[r]) for r in rows.ids]),
                                  target.padded)
        batch = DraftBatch.pack(run.scorer.cut(drafts, rows, outs, run.sizing.chain), run.sizing.chain)
        clock.lap("draft")
        logits = target.verify(rows.last, batch, run.stats)  # [b, N+1, V]
        clock.lap("forward")
        scores = run.scorer(logits, rows, outs, batch)  # each column scored with its own prefix
        verdict = run.accept(batch, scores)  # accepted path and next token of each row
        clock.lap("accept")
        run.sizing.update(batch, verdict)
        target.commit(batch, verdict)
        rows = _advance(target, rows, outs, run, batch, verdict, scores, logits)
        clock.lap("commit")
    clock.total()
    return outs


def _advance(target, rows: _Rows, outs, run: _Run, batch: DraftBatch, verdict, scores, logits) -> _Rows:
    """Count the step, append each row's gained tokens (accepted drafts + the target's own) and drop finished rows.

    scores/logits [b, N+1, V] are the step's; the rows' gained tokens read them along the accepted paths."""
    run.stats.draft_tokens += int(batch.sizes.sum())
    run.stats.accepted_tokens += int(verdict.counts.sum())
    run.forwards += 1
    cols = verdict.columns()
    if cols is not None and (run.recorder is not None or run.stopper.criteria):  # trees: the accepted path's columns
        at, cols = torch.arange(len(cols), device=scores.device)[:, None], to_device(cols, scores.device)
        scores, logits = scores[at, cols], logits[at, cols]
    return _drop(target, rows, _append(rows, outs, verdict.gained(batch), run, scores, logits), run)


def _append(rows: _Rows, outs, gained, run: _Run, scores, logits) -> list:
    """Append each row's gained tokens, cut where plain decoding would have stopped; return which rows are done."""
    done, criteria = [], bool(run.stopper.criteria)  # rows of tensors are taken only for those who read them
    for i, (rid, new) in enumerate(zip(rows.ids, gained)):
        new, stop = run.stopper.keep(rows.prompts[i] if criteria else None, outs[rid], new,
                                     scores[i] if criteria else None)
        if run.recorder is not None:
            run.recorder.add(rid, scores[i, : len(new)], logits[i, : len(new)])
        run.streamer.put(new)
        outs[rid].extend(new)
        rows.last[i] = new[-1]
        if rows.indexes[i] is not None:
            rows.indexes[i].extend(np.array(new, dtype=np.int64))
        done.append(stop)
    return done


def _drop(target, rows: _Rows, done: list, run: _Run) -> _Rows:
    """Remove finished rows from the batch (and from the target's cache) so they cost nothing more; a finished row
    took part in every forward so far."""
    if not any(done):
        return rows
    for rid, d in zip(rows.ids, done):
        if d:
            run.stats.forwards_by_row[rid] = run.forwards
    keep = [i for i, d in enumerate(done) if not d]
    if not keep:  # the call is over: slices, not the selection of no rows
        return _Rows([], rows.prompts[:0], rows.last[:0], [])
    target.keep(keep)
    return _Rows([rows.ids[i] for i in keep], rows.prompts[keep], rows.last[keep], [rows.indexes[i] for i in keep])


def _widths(target, cost):
    """n -> the most drafts a step verifying n may hold at no extra cost: a static step's padded width (its widths
    are fixed when it is built), else a wider draft that a measured cost curve says costs no more
    (`calibrate.budget`)."""
    if target.most is not None:
        return target.padded
    return lambda n: max(target.padded(n), budget(cost, n))


def _make_run(model, batch: int, processors, criteria, config, settings: Settings, eos: tuple, max_new: int,
              cost, argmax_of=None) -> _Run:
    recorder = None
    if config.return_dict_in_generate:
        recorder = Recorder(batch, bool(config.output_scores), bool(config.output_logits))
    sizing = make_sizing(settings.draft, settings.num_draft_tokens, settings.max_draft_nodes, cost)
    return _Run(Scorer(processors, batch), Stopper(criteria, eos, max_new),
                acceptance_rule(config.do_sample, settings.generator, model.device, argmax_of), sizing,
                Streamer(settings.streamer, batch), recorder, settings.stats, bool(config.do_sample))


def _assemble(input_ids: torch.Tensor, outs: list, pad: int) -> torch.Tensor:
    """[B, L + new]: the prompts, then each row's new tokens padded with `pad` (built in numpy: a fraction of torch's
    per-operation cost; on a CPU in one buffer, the prompts copied in)."""
    p, cpu = input_ids.shape[1], input_ids.device.type == "cpu"
    seqs = np.full((len(outs), (p if cpu else 0) + max(map(len, outs))), pad, dtype=np.int64)
    new = seqs[:, p:] if cpu else seqs
    for row, o in zip(new, outs):
        row[: len(o)] = o
    if cpu:
        seqs[:, :p] = input_ids.numpy()
        return torch.from_numpy(seqs)
    return torch.cat([input_ids, torch.from_numpy(seqs).to(input_ids.device)], dim=1)


def _ids(ids) -> tuple:
    """A generation config's token id field (None, an int, a list or a tensor) as a tuple of ints."""
    if ids is None:
        return ()
    return tuple(int(t) for t in (ids.reshape(-1).tolist() if isinstance(ids, torch.Tensor) else np.ravel(ids)))
