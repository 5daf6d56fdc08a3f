"""The decode loop: draft from an index, verify every draft token in one target forward, keep what the target agrees with.

References: Leviathan et al., "Fast Inference from Transformers via Speculative Decoding" (2023); Saxena, "Prompt
Lookup Decoding" (2023). Greedy verification is exact: the output equals plain greedy decoding token for token.
"""
from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass

import numpy as np
import torch

from . import _validate as V
from .index import NgramIndex
from .policy import DraftLength
from .verify import greedy_accept, new_cache, rollback, select_rows


@dataclass
class GenerationStats:
    """Counters of one `generate` call. `row_forwards` counts each batch row once per forward it took part in."""

    forward_passes: int = 0
    row_forwards: int = 0
    new_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def tokens_per_forward(self) -> float:
        """New tokens a row gains per target forward pass (1.0 for plain decoding)."""
        return self.new_tokens / max(self.row_forwards, 1)

    @property
    def acceptance_rate(self) -> float:
        """Fraction of proposed draft tokens that the target accepted."""
        return self.accepted_tokens / max(self.draft_tokens, 1)

    def as_dict(self) -> dict:
        return {**asdict(self), "tokens_per_forward": self.tokens_per_forward, "acceptance_rate": self.acceptance_rate}


@dataclass
class _Rows:
    """Decoding state of the rows still running; entry i of each field belongs to original row `ids[i]`."""

    ids: list
    prompts: torch.Tensor  # [b, P] the (left-padded) prompts
    mask: torch.Tensor  # [b, S] which cache slots each row attends to
    pos: np.ndarray  # [b] position id of the row's next token
    last: np.ndarray  # [b] newest token, not yet in the cache
    indexes: list


def generate(
    model,
    input_ids,
    *,
    attention_mask=None,
    lookup: str = "ngram",
    max_ngram: int = 4,
    min_ngram: int = 1,
    num_draft_tokens: int = 10,
    draft_cost: float | None = None,
    max_new_tokens: int = 128,
    eos_token_id=None,
    pad_token_id=None,
    logits_processor=None,
    return_stats: bool = False,
):
    """Greedy generation that returns exactly what `model.generate(do_sample=False)` returns, in fewer forwards.

    Args:
        model: a Hugging Face causal LM (`AutoModelForCausalLM`).
        input_ids: LongTensor [batch, length] (or [length]); left-pad rows of different lengths.
        attention_mask: [batch, length] of 0/1, 0 on padding. Default: all ones.
        lookup: "ngram" (draft from an `NgramIndex` over prompt and output) or "none" (plain decoding).
        max_ngram, min_ngram: longest and shortest suffix the index matches.
        num_draft_tokens: most draft tokens verified per row and step (0 disables drafting).
        draft_cost: cost of verifying one more token, as a fraction of a one-token forward; drafts are only as long
            as the acceptance seen so far pays for (`lookahead.policy.DraftLength`). Default: 0.1 on CPU, 0.02 on
            an accelerator. 0 always drafts `num_draft_tokens` when there is a match.
        max_new_tokens: most tokens generated per row.
        eos_token_id: int or list of ints that end a row. Default: the model's generation config.
        pad_token_id: fills rows that ended early. Default: generation config, else the first eos id.
        logits_processor: a `LogitsProcessorList` (or any `f(input_ids, scores) -> scores`), applied at every
            verified position with that position's own prefix, as `model.generate` applies it.
        return_stats: also return a `GenerationStats`.

    Returns:
        LongTensor [batch, length + new] (prompt then new tokens), or `(sequences, stats)` with return_stats.

    Raises:
        TypeError: model is not a causal LM with a KV cache, or ids are not integers.
        ValueError: empty input, ids outside the vocabulary, mismatched mask, bad lookup settings, or a
            max_new_tokens that runs past the model's position limit.

    Example:
        >>> out = generate(model, tok("def f(x):", return_tensors="pt").input_ids, max_new_tokens=64)
    """
    V.check_model(model)
    V.check_lookup(lookup)
    V.check_int("max_ngram", max_ngram, 1)
    V.check_int("min_ngram", min_ngram, 1)
    if min_ngram > max_ngram:
        raise ValueError(f"min_ngram must be <= max_ngram, got min_ngram={min_ngram} > max_ngram={max_ngram}")
    V.check_int("num_draft_tokens", num_draft_tokens, 0)
    V.check_int("max_new_tokens", max_new_tokens, 1)
    if draft_cost is not None and not (isinstance(draft_cost, (int, float)) and draft_cost >= 0):
        raise ValueError(f"draft_cost must be a number >= 0 or None, got {draft_cost!r}")
    input_ids, attention_mask = V.check_inputs(model, input_ids, attention_mask)
    V.check_length(model, attention_mask, max_new_tokens)
    eos = _eos_ids(model, eos_token_id)
    pad = _pad_id(model, pad_token_id, eos)

    def make_index():
        return NgramIndex(max_ngram, min_ngram) if lookup == "ngram" and num_draft_tokens > 0 else None

    stats = GenerationStats()
    with torch.inference_mode():
        cost = draft_cost if draft_cost is not None else _default_cost(model)
        outs = _decode(model, input_ids, attention_mask, make_index, num_draft_tokens, cost, max_new_tokens, eos,
                       stats, _Scorer(logits_processor, pad))
    sequences = _assemble(input_ids, outs, pad)
    return (sequences, stats) if return_stats else sequences


def _decode(model, input_ids, mask, make_index, k, draft_cost, max_new, eos, stats, scorer) -> list:
    """Run the loop; return the new tokens of each row."""
    cache = new_cache(model)
    first = _prefill(model, cache, input_ids, mask, stats, scorer)
    outs = [[] for _ in range(input_ids.shape[0])]
    positions = mask.sum(-1).cpu().numpy()
    rows = _Rows(list(range(len(outs))), input_ids, mask, positions, first, [make_index() for _ in outs])
    for i, index in enumerate(rows.indexes):
        if index is not None:
            index.extend(input_ids[i][mask[i].bool()])
    done = _append(rows, outs, [[int(t)] for t in first], max_new, eos)
    rows = _drop(cache, rows, done)
    policy = DraftLength(k, draft_cost)
    while rows.ids:
        drafts, lens, matches = _propose(rows, outs, policy, max_new)
        logits = _verify(model, cache, rows, drafts, lens, stats)  # [b, D+1, V]
        targets = scorer(logits, rows, outs, drafts).argmax(-1).cpu().numpy()  # the one host-device sync
        accepted = greedy_accept(drafts, lens, targets)
        policy.update(matches, lens, accepted)
        _commit(cache, rows, accepted)
        gained = [list(drafts[i, :a]) + [targets[i, a]] for i, a in enumerate(accepted)]
        stats.draft_tokens += int(lens.sum())
        stats.accepted_tokens += int(accepted.sum())
        rows.pos += accepted + 1
        done = _append(rows, outs, gained, max_new, eos)
        rows = _drop(cache, rows, done)
    stats.new_tokens = sum(len(o) for o in outs)
    return outs


def _prefill(model, cache, input_ids, mask, stats, scorer) -> np.ndarray:
    position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    kwargs = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
    logits = model(
        input_ids=input_ids, attention_mask=mask, position_ids=position_ids, past_key_values=cache, use_cache=True,
        **kwargs,
    ).logits
    stats.forward_passes += 1
    stats.row_forwards += input_ids.shape[0]
    return scorer.at(input_ids, logits[:, -1]).argmax(-1).cpu().numpy()


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


def _verify(model, cache, rows: _Rows, drafts, lens, stats) -> torch.Tensor:
    """One forward over [last token, drafts] of every row; returns the logits after each of them."""
    b, d = drafts.shape
    device = rows.mask.device
    tokens = torch.from_numpy(np.concatenate([rows.last[:, None], drafts], axis=1)).to(device)
    step_mask = torch.from_numpy(np.arange(d + 1)[None, :] <= lens[:, None]).to(device, rows.mask.dtype)
    positions = torch.from_numpy(rows.pos[:, None] + np.arange(d + 1)[None, :]).to(device)
    logits = model(
        input_ids=tokens, attention_mask=torch.cat([rows.mask, step_mask], dim=1), position_ids=positions,
        past_key_values=cache, use_cache=True,
    ).logits  # [b, D+1, V]
    stats.forward_passes += 1
    stats.row_forwards += b
    return logits


class _Scorer:
    """Applies the logits processors at each verified position, with that position's prefix as input_ids."""

    def __init__(self, processor, pad: int):
        self.processor, self.pad = processor, pad

    def at(self, prefix: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores if self.processor is None else self.processor(prefix, scores)

    def __call__(self, logits, rows: _Rows, outs, drafts) -> torch.Tensor:  # [b, D+1, V] -> same
        if self.processor is None:
            return logits
        heads = [torch.cat([rows.prompts[i].cpu(), torch.tensor(outs[rid], dtype=torch.long)])
                 for i, rid in enumerate(rows.ids)]
        for j in range(logits.shape[1]):
            prefix = [torch.cat([h, torch.from_numpy(drafts[i, :j])]) for i, h in enumerate(heads)]
            logits[:, j] = self.at(_left_pad(prefix, self.pad).to(logits.device), logits[:, j])
        return logits


def _left_pad(seqs: list, pad: int) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, width - len(s):] = s
    return out


def _commit(cache, rows: _Rows, accepted: np.ndarray) -> None:
    """Keep each row's last token and accepted drafts in the cache; mask the slots of rows that accepted fewer."""
    width = int(accepted.max()) + 1
    rollback(cache, rows.mask.shape[1] + width)
    kept = torch.from_numpy(np.arange(width)[None, :] <= accepted[:, None]).to(rows.mask.device, rows.mask.dtype)
    rows.mask = torch.cat([rows.mask, kept], dim=1)


def _append(rows: _Rows, outs, gained, max_new: int, eos: tuple) -> list:
    """Append each row's gained tokens, cut at eos or max_new_tokens; return which rows are done."""
    done = []
    for i, (rid, new) in enumerate(zip(rows.ids, gained)):
        new = [int(t) for t in new[: max_new - len(outs[rid])]]
        stop = next((j for j, t in enumerate(new) if t in eos), None)
        if stop is not None:
            new = new[: stop + 1]
        outs[rid].extend(new)
        rows.last[i] = new[-1]
        if rows.indexes[i] is not None:
            rows.indexes[i].extend(new)
        done.append(stop is not None or len(outs[rid]) >= max_new)
    return done


def _drop(cache, rows: _Rows, done: list) -> _Rows:
    """Remove finished rows from the batch (and from the cache) so they cost nothing more."""
    if not any(done):
        return rows
    keep = [i for i, d in enumerate(done) if not d]
    if keep:
        select_rows(cache, torch.tensor(keep, device=rows.mask.device))
    return _Rows(
        [rows.ids[i] for i in keep], rows.prompts[keep], rows.mask[keep], rows.pos[keep], rows.last[keep], [rows.indexes[i] for i in keep]
    )


def _assemble(input_ids: torch.Tensor, outs: list, pad: int) -> torch.Tensor:
    width = max(len(o) for o in outs)
    new = torch.full((len(outs), width), pad, dtype=torch.long)
    for i, o in enumerate(outs):
        new[i, : len(o)] = torch.tensor(o, dtype=torch.long)
    return torch.cat([input_ids, new.to(input_ids.device)], dim=1)


def _eos_ids(model, eos_token_id) -> tuple:
    if eos_token_id is None:
        eos_token_id = getattr(model.generation_config, "eos_token_id", None)
    if eos_token_id is None:
        return ()
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise TypeError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
    return tuple(ids)


def _pad_id(model, pad_token_id, eos: tuple) -> int:
    if pad_token_id is None:
        pad_token_id = getattr(model.generation_config, "pad_token_id", None)
    if pad_token_id is None:
        pad_token_id = eos[0] if eos else 0
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int):
        raise TypeError(f"pad_token_id must be an int, got {pad_token_id!r}")
    return pad_token_id


def _default_cost(model) -> float:
    return 0.1 if model.device.type == "cpu" else 0.02


def _accepts(model, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters
