"""The decode loop: draft from an index, verify every draft token in one target forward, keep what the target agrees with.

References: Leviathan et al., "Fast Inference from Transformers via Speculative Decoding" (2023); Saxena, "Prompt
Lookup Decoding" (2023). Greedy verification is exact: the output equals plain greedy decoding token for token.
Sampling verification (`verify/sampling.py`, `verify/tree.py` for trees) is exact in distribution.

`generate` checks lookahead's own arguments and hands the rest to `model.generate` with `decode` as its decoding loop
(transformers' `custom_generate`), so the generation config, logits processors, stopping criteria and encoder outputs
are prepared by transformers exactly as for its own loops. A step is: draft -> forward -> acceptance rule -> commit.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch

from . import _validate as V
from .index import NgramIndex, SuffixIndex
from .outputs import Recorder
from .calibrate import measured_draft_cost
from .policy import DraftLength, TreeCalibration, as_cost, row_cost
from .processing import Scorer, Stopper, Streamer, max_new_tokens as _max_new
from .seq2seq import Seq2SeqLM
from .settings import (GenerationStats, Settings, check_supported, check_tree, eos_override, hf_kwargs,
                       make_settings, refuse_assistant, with_stop_strings)
from .verify import tree as T
from .verify.cache import keep_slots
from .verify import greedy_accept, new_cache, rollback, sample_accept, select_rows


@dataclass
class _Rows:
    """Decoding state of the rows still running; entry i of each field belongs to original row `ids[i]`."""

    ids: list
    prompts: torch.Tensor  # [b, P] what precedes the new tokens: the left-padded prompt (decoder start for seq2seq)
    last: np.ndarray  # [b] newest token, not yet in the cache
    indexes: list


@dataclass
class _Run:
    """What one call applies at every step besides the model."""

    scorer: Scorer
    stopper: Stopper
    accept: object  # (drafts [b, D], lens [b], scores [b, D+1, V]) -> (accepted [b], next token [b])
    accept_tree: object  # (tokens [b, N], parents [b, N], sizes [b], scores [b, N+1, V]) -> (paths, next token [b])
    streamer: Streamer
    recorder: Recorder | None
    stats: GenerationStats
    num_draft_tokens: int
    draft_cost: object  # (overhead, per_token) or a CostCurve, see lookahead.policy
    max_draft_nodes: int = 0  # > 0: tree drafts of at most this many nodes


def generate(
    model,
    input_ids,
    *,
    attention_mask=None,
    lookup: str = "ngram",
    max_ngram: int = 4,
    min_ngram: int = 1,
    num_draft_tokens: int = 10,
    draft_cost: float | tuple | str | None = None,
    draft: str = "chain",
    max_draft_nodes: int = 32,
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
        attention_mask: [batch, length] of 0/1, 0 on padding. Default: all ones.
        lookup: "ngram" (draft from an `NgramIndex` over documents, prompt and output), "suffix" (a `SuffixIndex`:
            longest match of any length, adaptive drafts) or "none" (plain decoding).
        max_ngram, min_ngram: longest and shortest suffix the index matches.
        num_draft_tokens: most draft tokens verified per row and step (0 disables drafting).
        draft_cost: what verification costs, as a fraction of a one-token forward: the cost of one more verified
            token, or a pair (overhead of any multi-token forward, cost per token); drafts and trees are only as
            large as the acceptance seen so far pays for (`lookahead.policy`). Default: (0.8, 0.08) on CPU,
            (0, 0.02) on an accelerator. "auto" measures the cost of every draft size on this machine once per
            model (about 40 forwards, `lookahead.calibrate.measure_draft_cost`, which also returns a curve to
            pass here). 0 always drafts `num_draft_tokens` when there is a match.
        draft: "chain" (one continuation) or "tree" (several continuations verified together in one forward with a
            tree attention mask; needs lookup="suffix" and a decoder-only model; greedy or sampling).
        max_draft_nodes: most tree nodes verified per row and step (draft="tree").
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
            `return_dict_in_generate`, `output_scores`, `output_logits`, ...

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
    settings = make_settings(lookup, max_ngram, min_ngram, num_draft_tokens, draft_cost, documents, tokenizer,
                             generator, streamer, stream_prompt=True, eos=eos_override(eos_token_id),
                             **check_tree(draft, max_draft_nodes, lookup, model))
    if memory is not None:
        settings.background = memory.documents()[0] if len(memory) else None
    if max_new_tokens is not None:
        V.check_int("max_new_tokens", max_new_tokens, 1)
    if pad_token_id is not None and (isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int)):
        raise TypeError(f"pad_token_id must be an int, got {pad_token_id!r}")
    refuse_assistant(generate_kwargs.get("assistant_model"))
    input_ids, attention_mask = V.check_inputs(model, input_ids, attention_mask)
    kwargs = hf_kwargs(dict(generate_kwargs), max_new_tokens, eos_token_id, pad_token_id, logits_processor)
    kwargs["stopping_criteria"] = with_stop_strings(stopping_criteria, kwargs, tokenizer)
    out = model.generate(input_ids, attention_mask=attention_mask, custom_generate=decode, lookahead=settings, **kwargs)
    if memory is not None:
        pad = pad_token_id if pad_token_id is not None else model.generation_config.pad_token_id
        memory.add(out if isinstance(out, torch.Tensor) else out.sequences, attention_mask, pad)
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
    settings = lookahead if lookahead is not None else Settings()
    check_supported(generation_config, model_kwargs)
    eos = settings.eos if settings.eos is not None else _ids(generation_config._eos_token_tensor)
    pad = _ids(generation_config._pad_token_tensor) or eos[:1] or (0,)
    max_new = _max_new(stopping_criteria, input_ids.shape[1])
    target = _target(model, input_ids, inputs_tensor, model_kwargs, max_new)
    run = _make_run(model, input_ids.shape[0], logits_processor, stopping_criteria, generation_config, settings, eos,
                    max_new)
    V.check_documents(model, settings.documents)
    rows = _Rows(list(range(input_ids.shape[0])), input_ids, np.zeros(input_ids.shape[0], np.int64),
                 _indexes(settings, target.sources()))
    if settings.stream_prompt and settings.streamer is not None:
        settings.streamer.put(input_ids.cpu())
    with torch.inference_mode():
        outs = _decode(target, rows, run, max_new)
    run.streamer.end()
    settings.stats.new_tokens = sum(len(o) for o in outs)
    settings.stats.new_tokens_by_row = [len(o) for o in outs]
    sequences = _assemble(input_ids, outs, pad[0])
    if not generation_config.return_dict_in_generate:
        return sequences
    return run.recorder.output(sequences, sequences.shape[1] - input_ids.shape[1], pad[0], settings.stats,
                               model_kwargs.get("encoder_outputs"))


def _decode(target, rows: _Rows, run: _Run, max_new: int) -> list:
    """Run the loop; return the new tokens of each row."""
    outs = [[] for _ in rows.ids]
    run.stats.forwards_by_row = [0] * len(outs)
    none = np.zeros((len(outs), 0), dtype=np.int64)
    logits = target.prefill(run.stats)  # [b, 1, V]
    scores = run.scorer(logits, rows, outs, none)
    _, first = run.accept(none, np.zeros(len(outs), dtype=np.int64), scores)
    rows = _advance(target, rows, outs, run, [[t] for t in first], 0, scores, logits)
    policy = DraftLength(run.num_draft_tokens, run.draft_cost)
    calibration = TreeCalibration()
    while rows.ids and run.max_draft_nodes:
        rows = _tree_step(target, rows, outs, run, max_new, calibration, policy)
    while rows.ids:
        drafts, lens, matches = _propose(rows, outs, policy, max_new)
        lens = run.scorer.cut(drafts, lens, rows, outs)  # drafts a processor forbids never reach the model
        drafts = drafts[:, : int(lens.max(initial=0))]
        logits = target.verify(rows.last, drafts, lens, run.stats)  # [b, D+1, V]
        scores = run.scorer(logits, rows, outs, drafts)
        accepted, nxt = run.accept(drafts, lens, scores)
        policy.update(matches, lens, accepted)
        target.commit(accepted)
        gained = [list(drafts[i, :a]) + [nxt[i]] for i, a in enumerate(accepted)]
        rows = _advance(target, rows, outs, run, gained, int(lens.sum()), scores, logits)
    return outs


def _advance(target, rows: _Rows, outs, run: _Run, gained: list, drafted: int, scores, logits) -> _Rows:
    """Count the step, append each row's gained tokens (accepted drafts + the target's own) and drop finished rows.

    scores/logits [b, W, V] hold the target's outputs along each row's accepted tokens."""
    run.stats.draft_tokens += drafted
    for rid in rows.ids:
        run.stats.forwards_by_row[rid] += 1
    run.stats.accepted_tokens += sum(len(g) - 1 for g in gained)
    return _drop(target, rows, _append(rows, outs, gained, run, scores, logits))


def _tree_step(target, rows: _Rows, outs, run: _Run, max_new: int, calibration: TreeCalibration,
               policy: DraftLength) -> _Rows:
    """Propose a tree per row, verify all of it in one forward, keep the longest path the target agrees with.

    Each tree is cut to the size that pays for its verification, judged by the index's node probabilities as
    calibrated against the acceptance seen so far (`calibration`, updated here), and never below what holds the
    chain `policy` would draft (its first path, as long as the chain's learned acceptance pays for; updated here)."""
    budget = [min(run.max_draft_nodes, max_new - len(outs[rid]) - 1) for rid in rows.ids]
    cost = row_cost(run.draft_cost, len(rows.ids))
    matches = np.array([ix.match_length for ix in rows.indexes], dtype=np.int64)
    trees, estimates, chains = [], [], []
    for ix, n, k in zip(rows.indexes, budget, policy.choose(matches)):
        proposal = ix.propose_tree(max(n, 0))
        tokens, parents, probs = proposal.tokens, proposal.parents, proposal.probs
        chain = T.first_path(parents, int(k))
        keep = max(T.best_size(calibration(probs), cost), chain[-1] + 1 if chain else 0)
        trees.append((tokens[:keep], parents[:keep]))
        estimates.append(probs[:keep])
        chains.append(chain)
    tokens, parents, sizes = T.pack_trees(trees)
    seen, depth = T.ancestry(parents)
    logits = target.verify_tree(rows.last, tokens, seen, depth, run.stats)  # [b, N+1, V]
    scores = _tree_scores(run.scorer, logits, rows, outs, tokens, seen)
    paths, bonus = run.accept_tree(tokens, parents, sizes, scores)
    for probs, path in zip(estimates, paths):
        on_path = np.zeros(len(probs), dtype=bool)
        on_path[path] = True
        calibration.update(probs, on_path)
    followed = [next((d for d, (a, b) in enumerate(zip(c, p)) if a != b), min(len(c), len(p)))
                for c, p in zip(chains, paths)]  # accepted tokens of each chain
    policy.update(matches, np.array([len(c) for c in chains], dtype=np.int64), np.array(followed, dtype=np.int64))
    target.commit_path(paths)
    gained = [list(tokens[i, p]) + [bonus[i]] for i, p in enumerate(paths)]
    cols = torch.from_numpy(T.path_slots(paths)).to(scores.device)  # [b, W] columns along each accepted path
    at = torch.arange(len(paths), device=scores.device)[:, None]
    return _advance(target, rows, outs, run, gained, int(sizes.sum()), scores[at, cols], logits[at, cols])


def _tree_scores(scorer: Scorer, logits, rows: _Rows, outs, tokens: np.ndarray, seen: np.ndarray) -> torch.Tensor:
    """Processed scores of every tree column, each with its own path as the prefix."""
    if not scorer.by_prefix:
        return scorer(logits, rows, outs, np.zeros((len(rows.ids), logits.shape[1] - 1), dtype=np.int64))
    cols = []
    for c in range(logits.shape[1]):
        path = [tokens[i, seen[i, c, 1:]] for i in range(len(rows.ids))]  # ancestors of column c, root excluded
        with_path = {rid: outs[rid] + [int(t) for t in path[i]] for i, rid in enumerate(rows.ids)}
        cols.append(scorer(logits[:, c:c + 1], rows, with_path, np.zeros((len(rows.ids), 0), dtype=np.int64)))
    return torch.cat(cols, dim=1)


def _propose(rows: _Rows, outs, policy: DraftLength, max_new: int) -> tuple:
    """Drafts [b, D] (padded with 0), their lengths [b] and the match lengths behind them [b].

    The policy sets each row's length from the evidence behind its match; a draft never runs past max_new_tokens.
    """
    matches = np.array([0 if ix is None else ix.match_length for ix in rows.indexes], dtype=np.int64)
    rooms = np.minimum(policy.choose(matches), [max_new - len(outs[rid]) - 1 for rid in rows.ids])
    proposals = [ix.propose(int(room)) if room > 0 else np.empty(0, np.int64) for ix, room in zip(rows.indexes, rooms)]
    lens = np.array([len(p) for p in proposals], dtype=np.int64)
    drafts = np.zeros((len(proposals), int(lens.max(initial=0))), dtype=np.int64)
    for i, p in enumerate(proposals):
        drafts[i, : len(p)] = p
    return drafts, lens, matches


class _CausalLM:
    """A decoder-only target: one cache for the batch, left padding, per-row position ids.

    A row that accepts fewer drafts than the widest row keeps the slots it rejected in the cache, masked out.
    """

    def __init__(self, model, input_ids: torch.Tensor, mask: torch.Tensor):
        self.model, self.input_ids, self.mask = model, input_ids, mask  # mask [b, S]: cache slots each row sees
        self.cache = new_cache(model)
        self.pos = mask.sum(-1).cpu().numpy()  # [b] position id of each row's next token

    def sources(self) -> list:
        return [ids[m.bool()] for ids, m in zip(self.input_ids, self.mask)]

    def prefill(self, stats) -> torch.Tensor:
        """Logits [b, 1, V] after each prompt."""
        position_ids = (self.mask.cumsum(-1) - 1).masked_fill(self.mask == 0, 1)
        kwargs = {"logits_to_keep": 1} if _accepts(self.model, "logits_to_keep") else {}
        logits = self.model(input_ids=self.input_ids, attention_mask=self.mask, position_ids=position_ids,
                            past_key_values=self.cache, use_cache=True, **kwargs).logits
        stats.add_forward(len(self.pos))
        return logits[:, -1:]

    def verify(self, last: np.ndarray, drafts: np.ndarray, lens: np.ndarray, stats) -> torch.Tensor:
        """One forward over [last token, drafts] of every row; the logits after each of them [b, D+1, V]."""
        b, d = drafts.shape
        device = self.mask.device
        tokens = torch.from_numpy(np.concatenate([last[:, None], drafts], axis=1)).to(device)
        step_mask = torch.from_numpy(np.arange(d + 1)[None, :] <= lens[:, None]).to(device, self.mask.dtype)
        positions = torch.from_numpy(self.pos[:, None] + np.arange(d + 1)[None, :]).to(device)
        logits = self.model(
            input_ids=tokens, attention_mask=torch.cat([self.mask, step_mask], dim=1), position_ids=positions,
            past_key_values=self.cache, use_cache=True,
        ).logits
        stats.add_forward(b)
        return logits

    def verify_tree(self, last: np.ndarray, tokens: np.ndarray, seen: np.ndarray, depth: np.ndarray, stats):
        """One forward over [last token, tree nodes] of every row, each node seeing only its ancestors."""
        device = self.mask.device
        inputs = torch.from_numpy(np.concatenate([last[:, None], tokens], axis=1)).to(device)
        positions = torch.from_numpy(self.pos[:, None] + depth).to(device)
        logits = self.model(input_ids=inputs, attention_mask=T.tree_mask(self.mask, seen, self.model.dtype),
                            position_ids=positions, past_key_values=self.cache, use_cache=True).logits
        stats.add_forward(len(last))
        return logits

    def commit_path(self, paths: list) -> None:
        """Keep each row's last token and accepted path in the cache, packed behind the earlier slots."""
        slots = T.path_slots(paths)  # [b, W]
        keep_slots(self.cache, self.mask.shape[1], torch.from_numpy(slots).to(self.mask.device))
        lens = np.array([len(p) for p in paths], dtype=np.int64)
        kept = np.arange(slots.shape[1])[None, :] <= lens[:, None]
        self.mask = torch.cat([self.mask, torch.from_numpy(kept).to(self.mask.device, self.mask.dtype)], dim=1)
        self.pos += lens + 1

    def commit(self, accepted: np.ndarray) -> None:
        """Keep each row's last token and accepted drafts in the cache; mask the slots of rows that accepted fewer."""
        width = int(accepted.max()) + 1
        rollback(self.cache, self.mask.shape[1] + width)
        kept = torch.from_numpy(np.arange(width)[None, :] <= accepted[:, None]).to(self.mask.device, self.mask.dtype)
        self.mask = torch.cat([self.mask, kept], dim=1)
        self.pos += accepted + 1

    def keep(self, rows: list) -> None:
        """Keep only the batch rows `rows`, so that finished rows cost nothing more."""
        select_rows(self.cache, torch.tensor(rows, device=self.mask.device))
        self.mask, self.pos = self.mask[rows], self.pos[rows]


def _append(rows: _Rows, outs, gained, run: _Run, scores, logits) -> list:
    """Append each row's gained tokens, cut where plain decoding would have stopped; return which rows are done."""
    done = []
    for i, (rid, new) in enumerate(zip(rows.ids, gained)):
        new, stop = run.stopper.keep(rows.prompts[i], outs[rid], [int(t) for t in new], scores[i])
        if run.recorder is not None:
            run.recorder.add(rid, scores[i, : len(new)], logits[i, : len(new)])
        run.streamer.put(new)
        outs[rid].extend(new)
        rows.last[i] = new[-1]
        if rows.indexes[i] is not None:
            rows.indexes[i].extend(new)
        done.append(stop)
    return done


def _drop(target, rows: _Rows, done: list) -> _Rows:
    """Remove finished rows from the batch (and from the target's cache) so they cost nothing more."""
    if not any(done):
        return rows
    keep = [i for i, d in enumerate(done) if not d]
    if keep:
        target.keep(keep)
    return _Rows([rows.ids[i] for i in keep], rows.prompts[keep], rows.last[keep], [rows.indexes[i] for i in keep])


def _target(model, input_ids, inputs_tensor, model_kwargs: dict, max_new: int):
    """The model wrapped for the loop (prefill, verify, commit, keep), after checking the length limit."""
    if getattr(model.config, "is_encoder_decoder", False):
        V.check_length(model, torch.ones_like(input_ids), max_new)
        return Seq2SeqLM(model, input_ids, inputs_tensor, model_kwargs)
    mask = model_kwargs.get("attention_mask")
    mask = torch.ones_like(input_ids) if mask is None else mask
    V.check_length(model, mask, max_new)
    return _CausalLM(model, input_ids, mask)


def _make_run(model, batch: int, processors, criteria, config, settings: Settings, eos: tuple, max_new: int) -> _Run:
    recorder = None
    if config.return_dict_in_generate:
        recorder = Recorder(batch, bool(config.output_scores), bool(config.output_logits))
    cost = _draft_cost(model, settings)
    return _Run(Scorer(processors, batch), Stopper(criteria, eos, max_new), *_rules(config, settings.generator, model),
                Streamer(settings.streamer, batch), recorder, settings.stats, settings.num_draft_tokens, cost,
                settings.max_draft_nodes if settings.draft == "tree" else 0)


def _rules(config, generator, model) -> tuple:
    """The acceptance rules for chains and trees: greedy, or speculative sampling from the processed distribution
    (one generator for both, so that every draw is independent)."""
    if not config.do_sample:
        return _greedy, _greedy_tree
    if isinstance(generator, int):
        generator = torch.Generator(device=model.device).manual_seed(generator)
    return (lambda drafts, lens, scores: sample_accept(drafts, lens, torch.softmax(scores, dim=-1), generator),
            lambda tokens, parents, sizes, scores: T.sample_tree_accept(tokens, parents, sizes,
                                                                        torch.softmax(scores, dim=-1), generator))


def _greedy(drafts: np.ndarray, lens: np.ndarray, scores: torch.Tensor) -> tuple:
    targets = scores.argmax(-1).cpu().numpy()  # [b, D+1]; the one host-device sync
    accepted = greedy_accept(drafts, lens, targets)
    return accepted, targets[np.arange(len(accepted)), accepted]


def _greedy_tree(tokens: np.ndarray, parents: np.ndarray, sizes: np.ndarray, scores: torch.Tensor) -> tuple:
    return T.greedy_tree_accept(tokens, parents, sizes, scores.argmax(-1).cpu().numpy())  # the one host-device sync


def _indexes(settings: Settings, sources: list) -> list:
    """One index per row holding the memory's tokens (as background), the row's documents, then its source tokens;
    None where nothing is drafted."""
    if settings.lookup == "none" or settings.num_draft_tokens == 0:
        return [None] * len(sources)
    make_index = {"ngram": lambda: NgramIndex(settings.max_ngram, settings.min_ngram), "suffix": SuffixIndex}
    docs = settings.documents or [[]]
    if 1 < len(docs) < len(sources) and len(sources) % len(docs) == 0:  # rows expanded by num_return_sequences
        docs = [d for d in docs for _ in range(len(sources) // len(docs))]
    if len(docs) not in (1, len(sources)):
        raise ValueError(f"documents must be one list for all rows or one list per row ({len(sources)}), "
                         f"got {len(docs)} lists")
    indexes = []
    for i, source in enumerate(sources):
        index = make_index[settings.lookup]()
        for piece in settings.background or []:
            index.extend(piece)
        if settings.background and hasattr(index, "begin_request"):
            index.begin_request()
        for doc in docs[i % len(docs)]:
            index.extend(doc)
        index.extend(source)
        indexes.append(index)
    return indexes


def _assemble(input_ids: torch.Tensor, outs: list, pad: int) -> torch.Tensor:
    width = max(len(o) for o in outs)
    new = torch.full((len(outs), width), pad, dtype=torch.long)
    for i, o in enumerate(outs):
        new[i, : len(o)] = torch.tensor(o, dtype=torch.long)
    return torch.cat([input_ids, new.to(input_ids.device)], dim=1)


def _ids(tensor) -> tuple:
    return () if tensor is None else tuple(int(t) for t in tensor.reshape(-1).tolist())


def _draft_cost(model, settings: Settings):
    """The verification cost model: as given, measured on first use ("auto"), or the device's default."""
    if settings.draft_cost is None:
        return _default_cost(model)
    if isinstance(settings.draft_cost, str):  # "auto"
        most = max(settings.num_draft_tokens, settings.max_draft_nodes if settings.draft == "tree" else 0)
        return measured_draft_cost(model, max(most, 1))
    return as_cost(settings.draft_cost)


def _default_cost(model) -> tuple:
    """(overhead, per_token) of verification as measured on a CPU (a one-token forward is a cheap matrix-vector
    product there: any multi-token forward costs ~1.8x it) and on a GPU at small batch (nearly free)."""
    return (0.8, 0.08) if model.device.type == "cpu" else (0.0, 0.02)


def _accepts(model, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters
