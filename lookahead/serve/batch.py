"""`ServingLM`: the loop's `CausalLM` whose batch rows come and go while it runs.

A request is prefilled alone (its own `ServingLM`, exactly as `model.generate` prefills it), then `join`s the
running batch: both caches are left-padded to one length (the padding masked out, each row keeping its own position
ids), so every row attends to exactly its own tokens. Rows leave with `keep`; slots that no row sees any more are
dropped from the front (`trim`), so that a batch that never empties does not grow without end.
"""
from __future__ import annotations

import numpy as np
import torch

from ..model.cache import drop_leading, join_rows
from ..model.causal import CausalLM
from ..model.griffin import BlockStates

TRIM_LEAST = 64  # leading slots unseen by every row worth copying the cache to drop


class ServingLM(CausalLM):
    """A `CausalLM` whose rows can join (`join`) and leave (`keep`) between steps.

    Args:
        model, facts: as `CausalLM`.
        input_ids: [1, P] one request's prompt (every token real).
    """

    def __init__(self, model, facts, input_ids: torch.Tensor):
        super().__init__(model, facts, input_ids, torch.ones_like(input_ids))

    @property
    def rows(self) -> int:
        return len(self.pos)

    def join(self, other: "ServingLM") -> None:
        """Append `other`'s rows (prefilled, not yet stepped) to this batch, behind its rows."""
        width = max(self.width, other.width)
        join_rows(self.cache, other.cache, width - self.width, width - other.width)
        if isinstance(self.states, BlockStates):  # states on the modules (RecurrentGemma): held per batch, joined
            self.states.join(other.states)
        other.close()  # its recurrent modules' hooks: this batch's follow the joined rows
        slots = torch.zeros((self.rows + other.rows, 2 * width + 64), dtype=self._slots.dtype,
                            device=self._slots.device)
        slots[: self.rows, width - self.width: width] = self.mask
        slots[self.rows:, width - other.width: width] = other.mask
        self._slots, self.width = slots, width
        self.pos = np.concatenate([self.pos, other.pos])

    def keep(self, rows: list) -> None:
        """Keep only the batch rows `rows`, then drop the leading slots none of them sees."""
        super().keep(rows)
        self.trim()

    def trim(self) -> None:
        """Drop the leading cache slots that no row sees, when there are at least `TRIM_LEAST` (and a quarter of
        the cache) of them: the copy costs about one step."""
        seen = np.flatnonzero(self.mask.any(0).cpu().numpy())
        first = int(seen[0]) if len(seen) else self.width
        if first < max(TRIM_LEAST, self.width // 4):
            return
        drop_leading(self.cache, first)
        self._slots = self._slots[:, first:].clone()
        self.width -= first
