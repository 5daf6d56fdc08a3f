"""`ServingLM`: the loop's `CausalLM` whose batch rows come and go while it runs.

A request is prefilled alone (its own `ServingLM`, exactly as `model.generate` prefills it), or with the requests of as
long prompts that arrived with it, then `join`s the running batch: both caches are left-padded to one length (the
padding masked out, each row keeping its own position ids), so every row attends to exactly its own tokens. Rows leave
with `keep`; slots that no row sees any more are dropped from the front (`trim`), so that a batch that never empties
does not grow without end.
"""
from __future__ import annotations

import numpy as np
import torch

from ..model.cache import drop_leading, join_rows
from ..model.causal import CausalLM
from ..model.griffin import BlockStates
from ..model.layers import LayerKinds, check_windows_in_masks
from ..model.slot_cache import check_static
from ..model.static import COMPILED_WIDTHS, WIDTHS, StaticCausalLM, _fits, _new_state, _state, prefill_state

TRIM_LEAST = 64  # leading slots unseen by every row worth copying the cache to drop


class ServingLM(CausalLM):
    """A `CausalLM` whose rows can join (`join`) and leave (`keep`) between steps.

    Args:
        model, facts: as `CausalLM`.
        input_ids: [k, P] requests' prompts, left-padded (one request's: every token real).
        mask: [k, P] 1 on real tokens (default: all of them).
    """

    def __init__(self, model, facts, input_ids: torch.Tensor, mask: torch.Tensor | None = None):
        super().__init__(model, facts, input_ids, torch.ones_like(input_ids) if mask is None else mask)

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


class StaticServingLM(StaticCausalLM):
    """A `StaticCausalLM` whose rows come and go (`lookahead serve --cache static`; on CUDA, its steps CUDA graphs).

    Each batch row owns one row of slots, unpadded: a request is prefilled alone into a state of one row (exactly as
    `generate`'s static cache prefills it), then copied into a free batch row (`join`), whose slots 0.. hold its
    prompt and then what it commits. Rows that leave free their batch row for the next request. The batch holds a
    power of four rows: a request that finds none free moves the running rows into the next larger batch, and when
    the running rows fit a batch a quarter as large they move there (`StaticCausalLM.keep`), so each batch size is one
    set of captured graphs, replayed as rows join and leave.

    Args:
        model, facts: as `StaticCausalLM`.
        length: the most tokens of a row, its prompt and new tokens together.
        graphs, compile_config: as `StaticCausalLM`.
        prefill: a kept prefill state (`prefill_state`) of an earlier batch of this model, or None.
    """

    def __init__(self, model, facts, length: int, graphs: bool, compile_config=None, prefill=None):
        sizes = WIDTHS if compile_config is None else COMPILED_WIDTHS
        self.widths, self._fits = list(sizes), _fits(tuple(sizes))
        slots = length + self.widths[-1]  # the idle rows of a step write past their last token too
        check_static(facts, slots, model.config)
        check_windows_in_masks(model, LayerKinds.of(model.config))
        self.model, self.facts, self.device, self.length = model, facts, facts.device, length
        self.cuda = facts.device.type == "cuda"
        self.graphs = graphs and self.cuda
        self.slots, self.compile_config = slots, compile_config
        self.input_ids = self.mask = None
        self.states = None  # recurrent layers are not served from the static cache (`Engine`)
        self.keep_logits = False  # the engine reads a step's logits before the next step
        self._ids = (None, None, None, 0)
        self.pre = prefill if prefill is not None else _new_state(model, facts, 1, slots, compile_config)
        self.state = self._empty(_state(model, facts, 1, slots, compile_config))
        self.write, self.pos = np.zeros((2, 1), dtype=np.int64)
        self.active = np.zeros(0, dtype=np.int64)
        self._active = torch.from_numpy(self.active).to(self.device)
        self._joining = 0  # the prompt length of the request prefilled and not yet joined

    @staticmethod
    def _empty(state):
        """`state` with no prompt slots: each row sees exactly its slots before its next slot."""
        state.prompt_valid.zero_()
        state.start.zero_()
        return state

    @property
    def rows(self) -> int:
        return len(self.active)

    def prefill(self, stats) -> torch.Tensor:
        raise TypeError("a StaticServingLM prefills one request at a time: prefill_row")

    def prefill_row(self, input_ids: torch.Tensor, stats) -> torch.Tensor:
        """Prefill one request's prompt [1, P] (every token real) alone; the logits [1, 1, V] after it. It joins the
        batch with `join`."""
        p = input_ids.shape[1]
        if p >= self.length:
            raise ValueError(f"a prompt of {p} tokens does not fit rows of {self.length} tokens")
        logits = prefill_state(self.model, self.facts, self.pre, input_ids, torch.ones_like(input_ids))
        stats.add_forward(1)
        self._joining = p
        return logits

    def join(self) -> None:
        """Put the request `prefill_row` prefilled last into a free batch row, behind the running rows."""
        live = len(self.active)
        if live == len(self.write):  # no free row: the running rows move into a batch four times as large
            self._compact(max(4 * len(self.write), 1))
        free = np.setdiff1d(np.arange(len(self.write)), self.active)[0]
        self.state.cache.put_row(self.pre.cache, int(free), self._joining)
        self.write[free] = self.pos[free] = self._joining
        self.active = np.append(self.active, free)
        self._active = torch.from_numpy(self.active).to(self.device)

    def _every(self) -> bool:
        """Whether every batch row runs, in batch order: a request joins the batch row that was free, so the running
        rows' order may be any."""
        return np.array_equal(self.active, np.arange(len(self.write)))
