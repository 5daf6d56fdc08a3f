"""Memory across calls: the tenth request of an agent or a batch job can copy from the first nine."""
from __future__ import annotations

from collections import deque

import numpy as np
import torch


class Memory:
    """Earlier prompts and outputs, bounded in tokens; the oldest are evicted first.

    Pass the same object to every call: `generate(..., memory=mem)` drafts from what the memory holds (as if it
    were extra documents, but with `lookup="suffix"` a copy prefers the call's own documents and prompt) and adds
    the call's prompts and outputs to it afterwards.

    Args:
        max_tokens: most tokens held (>= 1).

    Example:
        >>> mem = Memory(max_tokens=100_000)
        >>> for ids in requests:
        ...     out = generate(model, ids, lookup="suffix", memory=mem)
    """

    def __init__(self, max_tokens: int = 65536):
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self._items: deque = deque()
        self._size = 0

    def __len__(self) -> int:
        """Tokens held."""
        return self._size

    def __repr__(self) -> str:
        return f"Memory(max_tokens={self.max_tokens}, held={self._size} tokens in {len(self._items)} pieces)"

    def add_tokens(self, tokens) -> None:
        """Remember one sequence of token ids (its tail if it alone exceeds max_tokens)."""
        arr = np.asarray(tokens.cpu() if isinstance(tokens, torch.Tensor) else tokens, dtype=np.int64)[-self.max_tokens:]
        if arr.size == 0:
            return
        self._items.append(arr)
        self._size += arr.size
        while self._size > self.max_tokens:
            self._size -= self._items.popleft().size

    def add(self, sequences: torch.Tensor, attention_mask: torch.Tensor, pad_token_id=None) -> None:
        """Remember each row of a `generate` result: its prompt (without padding) and its new tokens."""
        prompt_len = attention_mask.shape[1]
        for row, mask in zip(sequences, attention_mask):
            new = row[prompt_len:]
            if pad_token_id is not None:
                keep = (new != pad_token_id).nonzero()
                new = new[: int(keep.max()) + 1] if len(keep) else new[:0]
            self.add_tokens(torch.cat([row[:prompt_len][mask.bool().to(row.device)], new]))

    def documents(self) -> list | None:
        """What the memory holds as one row's document list (``[pieces]``), None while it is empty."""
        held = list(self._items)
        return [held] if held else None
