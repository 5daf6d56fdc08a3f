"""Logits processors, stopping criteria and streamers applied to multi-token steps exactly as plain decoding applies them.

Plain decoding calls each processor once per token with the whole sequence so far; a verification step scores D + 1
positions at once, so each position gets the prefix it would have had (the row's tokens plus the drafts before it),
and a step that accepts several tokens is checked for a stop after each of them.
"""
from __future__ import annotations

import numpy as np
import torch
import transformers.generation.logits_process as LP
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from ..verify.batch import DraftBatch


def _classes(*names) -> tuple:
    return tuple(getattr(LP, n) for n in names if hasattr(LP, n))


# Processors that forbid tokens (-inf) from the prefix alone, whatever the logits: a draft token they forbid would be
# rejected anyway, so it is cut before the forward. Other processors are not probed (a forbidden draft token is then
# rejected by verification: correct, only slower), since probing costs a call per draft position.
_MAY_FORBID = _classes(
    "NoRepeatNGramLogitsProcessor", "EncoderNoRepeatNGramLogitsProcessor", "NoBadWordsLogitsProcessor",
    "SequenceBiasLogitsProcessor", "SuppressTokensLogitsProcessor", "SuppressTokensAtBeginLogitsProcessor",
    "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "PrefixConstrainedLogitsProcessor",
    "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor",
)
# Processors that read only the scores, never input_ids: a trailing run of them is applied once to all positions.
_PREFIX_FREE = _classes(
    "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper", "TypicalLogitsWarper",
    "EpsilonLogitsWarper", "EtaLogitsWarper", "LogitNormalization", "InfNanRemoveLogitsProcessor",
)
# Processors that index the batch by row (encoder ids, prefix_allowed_tokens_fn(batch_id, ...)): they must see rows
# at their original places even after finished rows left the batch, or when only some rows are scored.
_BATCH_INDEXED = _classes(
    "EncoderRepetitionPenaltyLogitsProcessor", "EncoderNoRepeatNGramLogitsProcessor", "PrefixConstrainedLogitsProcessor",
)


def _indexes_rows(processor, batch_size: int) -> bool:
    """Whether `processor` holds per-row state: a known row-indexed class, or any tensor attribute with one entry per
    row (repetition_penalty's per-row prompt padding, ...). A false positive only costs time, never correctness."""
    if isinstance(processor, _BATCH_INDEXED):
        return True
    return batch_size > 1 and any(isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch_size
                                  for v in getattr(processor, "__dict__", {}).values())


class Scorer:
    """Applies logits processors at each verified position with that position's own prefix as `input_ids`.

    Args:
        processors: a `LogitsProcessorList`, a list of `f(input_ids, scores) -> scores`, or None.
        batch_size: rows of the original batch (for processors that index rows).
    """

    def __init__(self, processors, batch_size: int):
        processors = list(processors or [])
        split = len(processors)
        while split > 0 and isinstance(processors[split - 1], _PREFIX_FREE):
            split -= 1
        self.by_prefix, self.prefix_free = processors[:split], processors[split:]
        self.forbidding = [p for p in processors if isinstance(p, _MAY_FORBID)]
        self.batch_size, self.vocab_size = batch_size, None
        self.row_indexed = {id(p) for p in processors if _indexes_rows(p, batch_size)}

    @property
    def active(self) -> bool:
        """Whether any processor changes the scores (without one, the scores are the logits)."""
        return bool(self.by_prefix or self.prefix_free)

    def __call__(self, logits: torch.Tensor, rows, outs, batch) -> torch.Tensor:
        """Processed float32 scores [b, N+1, V] from raw logits [b, N+1, V] (left unchanged) of a `DraftBatch`'s
        forward: column c is scored with the row's tokens and the drafts on the path to c as its prefix. Without
        processors the logits themselves, in the model's dtype (their argmax is the same; no copy)."""
        self.vocab_size = logits.shape[-1]
        if not (self.by_prefix or self.prefix_free):
            return logits
        scores = logits.float()
        scores = scores.clone() if scores.data_ptr() == logits.data_ptr() else scores
        heads = _heads(rows, outs) if self.by_prefix else None
        for c in range(scores.shape[1]) if self.by_prefix else ():
            for idx, at, prefix in _prefixes(heads, batch.paths(c), np.arange(len(rows.ids))):
                scores[at, c] = self._apply(self.by_prefix, prefix, scores[at, c], [rows.ids[i] for i in idx])
        flat = scores.reshape(-1, scores.shape[-1])  # [b * (N+1), V]
        for p in self.prefix_free:
            flat = p(flat.new_zeros((flat.shape[0], 1), dtype=torch.long), flat)
        return flat.reshape(scores.shape)

    def cut(self, drafts: list, rows, outs, chain: bool) -> list:
        """The drafts without the nodes a processor forbids from the prefix alone (and without their subtrees)."""
        if not self.forbidding:
            return drafts
        batch = DraftBatch.pack(drafts, chain)
        if not batch.sizes.any():
            return drafts
        heads = _heads(rows, outs)
        banned = np.zeros(batch.tokens.shape, dtype=bool)
        x = torch.from_numpy(batch.tokens).to(rows.prompts.device)
        for j in range(batch.width):
            paths = [p[:-1] for p in batch.paths(1 + j)]  # node j's prefix: the path to its parent
            for idx, at, prefix in _prefixes(heads, paths, np.flatnonzero(batch.sizes > j)):
                flat = prefix.new_zeros((len(idx), self.vocab_size), dtype=torch.float32)
                probe = self._apply(self.forbidding, prefix, flat, [rows.ids[i] for i in idx])
                banned[idx, j] = (probe.gather(1, x[at, j:j + 1])[:, 0] <= torch.finfo(torch.float32).min).cpu().numpy()
        return [d if not banned[i].any() else d.prune(banned[i, : len(d)]) for i, d in enumerate(drafts)]

    def _apply(self, processors, input_ids, scores, row_ids: list) -> torch.Tensor:
        for p in processors:
            if len(row_ids) < self.batch_size and id(p) in self.row_indexed:
                scores = _at_original_rows(p, input_ids, scores, row_ids, self.batch_size)
            else:
                scores = p(input_ids, scores)
        return scores


def _heads(rows, outs) -> list:
    """Each row's sequence so far (its left-padded prompt, then its new tokens) as a 1-D tensor."""
    device = rows.prompts.device
    return [torch.cat([rows.prompts[i], torch.tensor(outs[rid], dtype=torch.long, device=device)])
            for i, rid in enumerate(rows.ids)]


def _prefixes(heads: list, paths: list, rows: np.ndarray):
    """`rows` grouped by prefix length (head + path): (positions, the same as a tensor, their prefixes [n, L]).

    Rows of one group have sequences of equal length, so a group needs no padding that length-aware processors
    (min_new_tokens, ...) would miscount.
    """
    lengths = np.array([len(heads[i]) + len(paths[i]) for i in rows], dtype=np.int64)
    device = heads[0].device if heads else "cpu"
    for n in np.unique(lengths):
        idx = rows[lengths == n]
        at = torch.from_numpy(idx).to(device)
        tails = [torch.as_tensor(np.asarray(paths[i], dtype=np.int64), device=device) for i in idx]
        yield idx, at, torch.stack([torch.cat([heads[i], tail]) for i, tail in zip(idx, tails)])


def _at_original_rows(processor, input_ids, scores, row_ids: list, batch_size: int) -> torch.Tensor:
    """Call a row-indexed processor on a full-size batch (absent rows filled with a copy of the first) and keep ours."""
    at = torch.tensor(row_ids, device=input_ids.device)
    full_ids = input_ids[:1].expand(batch_size, -1).clone()
    full_scores = scores[:1].expand(batch_size, -1).clone()
    full_ids[at], full_scores[at] = input_ids, scores
    return processor(full_ids, full_scores)[at]


class Stopper:
    """Finds the token at which plain decoding would stop: an eos id, the length limit, or a stopping criterion.

    Args:
        criteria: a `StoppingCriteriaList` (its max-length and eos criteria are handled natively), or None.
        eos: ids that end a row.
        max_new: most new tokens per row.
    """

    def __init__(self, criteria, eos: tuple, max_new: int):
        self.eos, self.max_new = frozenset(eos), max_new
        self.criteria = [c for c in (criteria or []) if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]

    def keep(self, prompt: torch.Tensor, out: list, new: list, scores) -> tuple:
        """(tokens of `new` to keep, whether the row is done) for a row with `out` generated after `prompt`
        (`prompt` and `scores` are read only by the stopping criteria: None without any)."""
        new = new[: self.max_new - len(out)]
        if not self.criteria and self.eos.isdisjoint(new):  # most steps: no stop inside them
            return new, len(out) + len(new) >= self.max_new
        for j, t in enumerate(new):
            if t in self.eos or self._criteria_met(prompt, out, new[: j + 1], scores, j):
                return new[: j + 1], True
        return new, len(out) + len(new) >= self.max_new

    def _criteria_met(self, prompt, out, new, scores, j) -> bool:
        if not self.criteria:
            return False
        seq = torch.cat([prompt, torch.tensor(out + new, dtype=torch.long, device=prompt.device)])[None]
        row_scores = None if scores is None else scores[j][None]
        return any(bool(c(seq, row_scores).any()) for c in self.criteria)


def max_new_tokens(criteria, input_len: int):
    """New tokens allowed by the `MaxLengthCriteria` in `criteria` for inputs of `input_len` tokens, or None."""
    limits = [c.max_length for c in (criteria or []) if isinstance(c, MaxLengthCriteria)]
    return min(limits) - input_len if limits else None


class Streamer:
    """Feeds a transformers streamer (`TextStreamer`, `TextIteratorStreamer`, ...) the accepted tokens of each step."""

    def __init__(self, streamer, batch_size: int):
        if streamer is not None and batch_size != 1:
            raise ValueError(f"streamer= supports a batch of one row, as transformers' streamers do; got {batch_size}")
        self.streamer = streamer

    def put(self, tokens) -> None:
        if self.streamer is not None and len(tokens):
            self.streamer.put(torch.tensor(tokens, dtype=torch.long))

    def end(self) -> None:
        if self.streamer is not None:
            self.streamer.end()
