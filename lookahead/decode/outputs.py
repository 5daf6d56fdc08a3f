"""`return_dict_in_generate=True`: transformers' output classes, with the lookahead statistics added."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerateEncoderDecoderOutput


@dataclass
class LookaheadDecoderOnlyOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus `lookahead_stats` (a `lookahead.GenerationStats`)."""

    lookahead_stats: object = None


@dataclass
class LookaheadEncoderDecoderOutput(GenerateEncoderDecoderOutput):
    """`GenerateEncoderDecoderOutput` plus `lookahead_stats` (a `lookahead.GenerationStats`)."""

    lookahead_stats: object = None


class Recorder:
    """Keeps the processed scores and raw logits of every emitted token of each row, when the caller asked for them."""

    def __init__(self, batch_size: int, scores: bool, logits: bool):
        self.want_scores, self.want_logits = scores, logits
        self.scores = [[] for _ in range(batch_size)]
        self.logits = [[] for _ in range(batch_size)]

    def add(self, row: int, scores: torch.Tensor, logits: torch.Tensor) -> None:
        """Record [n, V] scores and logits for the next n tokens of original row `row`."""
        if self.want_scores:
            self.scores[row].extend(scores.float().unbind(0))
        if self.want_logits:
            self.logits[row].extend(logits.float().unbind(0))

    def output(self, sequences: torch.Tensor, width: int, pad: int, stats, encoder_outputs=None):
        """The output object; steps after a row finished put all mass on pad_token_id, as its sequence does."""
        fields = dict(
            sequences=sequences,
            scores=_steps(self.scores, width, pad) if self.want_scores else None,
            logits=_steps(self.logits, width, pad) if self.want_logits else None,
            lookahead_stats=stats,
        )
        if encoder_outputs is None:
            return LookaheadDecoderOnlyOutput(**fields)
        return LookaheadEncoderDecoderOutput(**fields)


def _steps(per_row: list, width: int, pad: int) -> tuple:
    """Per-row lists of [V] tensors -> a tuple of `width` tensors [B, V], one per generation step."""
    sample = next(t for row in per_row for t in row)
    filler = torch.full_like(sample, float("-inf"))
    filler[pad] = 0.0
    return tuple(torch.stack([row[t] if t < len(row) else filler for row in per_row]) for t in range(width))
