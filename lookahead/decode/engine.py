"""`Batch`: the rows that step together, and the step both of lookahead's drivers take.

`lookahead.generate`'s loop drives one batch of fixed rows (`loop.run_loop`: its `Rows` add each row's prompt and
index) until every row is done; the server's `Engine` (`serve/engine.py`) admits rows as requests arrive and retires
them as they finish. Each of their steps is this one:

    the driver drafts -> `Batch.step`: one forward over every row's [last token, draft] (the target's `verify`),
    the driver's acceptance rule over its logits (greedy, speculative sampling, per row or for the call), the cache
    keeping each row's accepted path (`commit`), each row's newest token moved on -> the driver advances its rows
    (append, stream, stop) -> `Batch.retire` drops the finished ones from the batch and from the cache.

The common calls of `generate` run the fused host step instead (`fused.py`: acceptance, stopping and the next draft
in one kernel call), over the same target and rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..verify.batch import DraftBatch

__all__ = ["Batch"]


@dataclass
class Batch:
    """Rows that step together: one forward over one cache (`target`) verifies all their drafts.

    Entry i of `rows` and `last` is the cache's row i. `rows` are the driver's own handles: `generate`'s loop holds
    each row's place in the call, the server its `Row`s.
    """

    target: object  # CausalLM, StaticCausalLM, Seq2SeqLM; the server's ServingLM or StaticServingLM
    rows: list = field(default_factory=list)
    last: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [b] each row's newest token,
    # not yet in the cache
    settled: bool = False  # no row joined or left since the last step

    def admit(self, row, token: int) -> None:
        """A row joins behind the others (its cache row already joined the target's: `ServingLM.join`), its
        newest token `token`."""
        self.rows.append(row)
        self.last = np.append(self.last, token)
        self.settled = False

    def step(self, drafted: DraftBatch, accept, stats) -> tuple:
        """One step of every row: the forward over [last token, draft] (`target.verify`: logits [b, N+1, V]),
        `accept(drafted, logits) -> Verdict` (the driver's acceptance rule, with whatever it does around it), the
        cache keeping each row's accepted path (`target.commit`), each row's newest token moved on. Returns (logits,
        verdict, each row's gained tokens: its accepted drafts and the target's token after them)."""
        logits = self.target.verify(self.last, drafted, stats)
        verdict = accept(drafted, logits)
        self.target.commit(drafted, verdict)
        gained = verdict.gained(drafted)
        for i, new in enumerate(gained):
            self.last[i] = new[-1]
        self.settled = True
        return logits, verdict, gained

    def retire(self, done: list) -> list:
        """Drop the rows marked in `done` from the batch and from the target's cache (when none is left, the cache
        is left as it is: the driver ends or releases it); the handles of the rows dropped."""
        if not any(done):
            return []
        gone = [row for row, d in zip(self.rows, done) if d]
        keep = [i for i, d in enumerate(done) if not d]
        if keep:
            self.target.keep(keep)
        self._cut(keep)
        self.settled = False
        return gone

    def _cut(self, keep: list) -> None:
        """Keep the rows `keep` (indices, in order) of every per-row field."""
        self.rows, self.last = [self.rows[i] for i in keep], self.last[keep] if keep else self.last[:0]
