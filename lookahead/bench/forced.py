"""Make a model's greedy choice replay a recorded output, as a logits processor (host work at every verified
position: for counting runs; timing runs use the device-side forward hook `forcing.ForcedOutputs`).

A random-weight model costs what its shape costs but writes junk; forced to the recorded output, its forward passes
are real while the acceptance pattern is that of the model that wrote the trace.
"""
from __future__ import annotations

import torch

from .forcing import distinct_prompts

__all__ = ["ForcedReplay", "distinct_prompts"]


class ForcedReplay:
    """A logits processor that puts all mass on the recorded next token of each row.

    Rows are recognised by their prompt (after any left padding), so the processor works whatever the batch order,
    with Hugging Face's `generate` as with lookahead's. Prompts that share their first `key_len` tokens are told
    apart by their whole prompt.

    Args:
        traces: (prompt_ids, output_ids) pairs of 1-D integer sequences; no prompt may be a prefix of another
            (`distinct_prompts` drops such traces).
        pad_token_id: the id used for left padding; it must not start any prompt.
        eos_token_id: forced once a recorded output is exhausted.

    Raises:
        ValueError: a prompt is empty or starts with pad_token_id, or one prompt is a prefix of another.

    Example:
        >>> forced = ForcedReplay([(prompt, output)], pad_token_id=0, eos_token_id=2)
        >>> model.generate(ids, logits_processor=LogitsProcessorList([forced]), do_sample=False)
    """

    key_len = 48

    def __init__(self, traces, pad_token_id: int, eos_token_id: int):
        self.pad, self.eos = pad_token_id, eos_token_id
        traces = [([int(t) for t in prompt], output) for prompt, output in traces]
        if any(not prompt for prompt, _ in traces):
            raise ValueError("every prompt must hold at least one token")
        self.key_len = min([ForcedReplay.key_len] + [len(prompt) for prompt, _ in traces])  # keys lie in the prompt
        self.rows = {}  # first key_len prompt tokens -> [(prompt length, prompt + output)]
        for prompt, output in traces:
            if prompt[0] == pad_token_id:
                raise ValueError(f"a prompt starts with pad_token_id={pad_token_id}; choose another pad id")
            group = self.rows.setdefault(tuple(prompt[: self.key_len]), [])
            for length, seq in group:
                if seq[: min(length, len(prompt))] == prompt[: min(length, len(prompt))]:
                    raise ValueError(f"a prompt of {len(prompt)} tokens and one of {length} tokens are prefixes of "
                                     f"one another; they cannot be told apart (see distinct_prompts)")
            group.append((len(prompt), prompt + [int(t) for t in output]))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        forced = torch.full_like(scores, -1e4)
        starts = (input_ids != self.pad).int().argmax(-1).tolist()  # first real token of each row
        for i, start in enumerate(starts):
            seq = self._sequence(input_ids[i, start:])
            pos = input_ids.shape[1] - start
            forced[i, seq[pos] if pos < len(seq) else self.eos] = 0.0
        return forced

    def _sequence(self, row: torch.Tensor) -> list:
        """The recorded prompt + output that `row` (its tokens from the first real one) follows."""
        group = self.rows[tuple(row[: self.key_len].tolist())]
        if len(group) == 1:
            return group[0][1]
        for length, seq in group:
            if len(row) >= length and row[:length].tolist() == seq[:length]:
                return seq
        raise KeyError("a row follows none of the recorded prompts")
