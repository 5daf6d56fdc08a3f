"""`Seq2SeqLM` (BART, T5, ...): the encoder runs once, the decoder verifies drafts (chains only).

Drafts come from the encoder input and the decoder output so far (the index holds both). These decoders take their
positions from the cache length (BART's learned positions, T5's relative buckets), not from position ids, so every
row must hold the same number of cache slots, all of them real: no masked holes as in the decoder-only loop. After a
step the cache is cut to the shortest row's verified length; a row that accepted more re-feeds its surplus at the
next step, in the same forward as its drafts (right-padded: causal attention hides the padding from real tokens).
"""
from __future__ import annotations

import numpy as np
import torch

from ..verify.rules import argmax
from .cache import new_cache, rollback, select_rows
from .causal import CausalLM
from .facts import ModelFacts


class Seq2SeqLM:
    """An encoder-decoder model wrapped for the loop: prefill, verify, commit, keep.

    Args:
        model: an `AutoModelForSeq2SeqLM`.
        facts: its `ModelFacts`.
        decoder_input_ids: [B, L] the decoder prompt (usually the start token).
        inputs_tensor: [B, S] the encoder input ids (or features, which the index cannot use).
        model_kwargs: as prepared by `model.generate`: `encoder_outputs` and the encoder `attention_mask`.
    """

    def __init__(self, model, facts: ModelFacts, decoder_input_ids: torch.Tensor, inputs_tensor, model_kwargs: dict):
        self.model, self.facts, self.prompts = model, facts, decoder_input_ids
        self.encoder_outputs = model_kwargs["encoder_outputs"]
        self.encoder_mask = model_kwargs.get("attention_mask")
        ids = inputs_tensor is not None and not inputs_tensor.is_floating_point()  # token ids, not features
        self.encoder_ids = inputs_tensor if ids else None
        if self.encoder_ids is not None and len(self.encoder_ids) < len(decoder_input_ids):  # num_return_sequences
            self.encoder_ids = self.encoder_ids.repeat_interleave(len(decoder_input_ids) // len(self.encoder_ids), 0)
        self.cache = new_cache(model)
        self.pending = [[] for _ in range(decoder_input_ids.shape[0])]  # verified tokens not in the cache, before last
        self._fed, self._start = None, 0

    padded = staticmethod(lambda n: n)  # rows pad to the widest draft (and surplus)
    most, argmax = CausalLM.most, staticmethod(argmax)

    def sources(self) -> list:
        """Per row: the encoder input's real tokens, then the decoder prompt."""
        out = []
        for i, prompt in enumerate(self.prompts):
            enc = prompt[:0] if self.encoder_ids is None else self.encoder_ids[i]
            if self.encoder_ids is not None and self.encoder_mask is not None:
                enc = enc[self.encoder_mask[i].bool()]
            out.append(torch.cat([enc, prompt]))
        return out

    def prefill(self, stats) -> torch.Tensor:
        """Logits [b, 1, V] after each decoder prompt."""
        logits = self._forward(self.prompts)
        stats.add_forward(len(self.pending))
        return logits[:, -1:]

    def verify(self, last: np.ndarray, batch, stats) -> torch.Tensor:
        """One forward over [pending, last token, drafts] of every row; the logits after last and each draft."""
        drafts, lens = batch.tokens, batch.sizes
        b, d = drafts.shape
        self._fed = [p + [int(last[i])] + drafts[i, : lens[i]].tolist() for i, p in enumerate(self.pending)]
        width = max(len(f) for f in self._fed)
        tokens = torch.zeros((b, width), dtype=torch.long)
        for i, f in enumerate(self._fed):
            tokens[i, : len(f)] = torch.tensor(f)
        self._start = self.cache.get_seq_length()
        logits = self._forward(tokens.to(self.prompts.device))  # [b, W, V]
        stats.add_forward(b)
        offsets = torch.tensor([len(p) for p in self.pending], device=logits.device)
        at = (offsets[:, None] + torch.arange(d + 1, device=logits.device)[None, :]).clamp(max=width - 1)
        return logits.gather(1, at[..., None].expand(-1, -1, logits.shape[-1]))  # [b, D+1, V]

    def commit(self, batch, verdict) -> None:
        """Cut the cache to the shortest row's verified tokens; the rest of each row's become its pending tokens."""
        verified = [len(p) + 1 + int(a) for p, a in zip(self.pending, verdict.counts)]
        shared = min(verified)
        rollback(self.cache, self._start + shared)
        self.pending = [f[shared:v] for f, v in zip(self._fed, verified)]

    def keep(self, rows: list) -> None:
        """Keep only the batch rows `rows`."""
        select_rows(self.cache, torch.tensor(rows, device=self.prompts.device))
        self.prompts = self.prompts[rows]
        self.encoder_outputs = type(self.encoder_outputs)(**{k: v[rows] for k, v in self.encoder_outputs.items()
                                                            if isinstance(v, torch.Tensor)})
        self.encoder_mask = None if self.encoder_mask is None else self.encoder_mask[rows]
        self.encoder_ids = None if self.encoder_ids is None else self.encoder_ids[rows]
        self.pending = [self.pending[i] for i in rows]

    def _forward(self, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(
            attention_mask=self.encoder_mask, decoder_input_ids=decoder_input_ids,
            encoder_outputs=self.encoder_outputs, **{self.facts.kv: self.cache}, use_cache=True,
        ).logits
