"""Make a model's greedy choice replay a recorded output, so that timing runs real forwards on a real workload.

A random-weight model costs what its shape costs but writes junk; forced to the recorded output, its forward passes
are real while the acceptance pattern is that of the model that wrote the trace.
"""
from __future__ import annotations

import torch


class ForcedReplay:
    """A logits processor that puts all mass on the recorded next token of each row.

    Rows are recognised by their prompt (the first `key_len` real tokens after any left padding), so the processor
    works whatever the batch order, with Hugging Face's `generate` as with lookahead's.

    Args:
        traces: (prompt_ids, output_ids) pairs of 1-D integer sequences.
        pad_token_id: the id used for left padding; it must not start any prompt.
        eos_token_id: forced once a recorded output is exhausted.

    Example:
        >>> forced = ForcedReplay([(prompt, output)], pad_token_id=0, eos_token_id=2)
        >>> model.generate(ids, logits_processor=LogitsProcessorList([forced]), do_sample=False)
    """

    key_len = 48

    def __init__(self, traces, pad_token_id: int, eos_token_id: int):
        self.pad, self.eos = pad_token_id, eos_token_id
        self.rows = {}
        for prompt, output in traces:
            prompt = [int(t) for t in prompt]
            if prompt and prompt[0] == pad_token_id:
                raise ValueError(f"a prompt starts with pad_token_id={pad_token_id}; choose another pad id")
            key = tuple(prompt[: self.key_len])
            if key in self.rows:
                raise ValueError(f"two prompts share their first {self.key_len} tokens; they cannot be told apart")
            self.rows[key] = prompt + [int(t) for t in output]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        forced = torch.full_like(scores, -1e4)
        for i, row in enumerate(input_ids.tolist()):
            start = next(j for j, t in enumerate(row) if t != self.pad)
            seq = self.rows[tuple(row[start:start + self.key_len])]
            pos = len(row) - start
            forced[i, seq[pos] if pos < len(seq) else self.eos] = 0.0
        return forced
