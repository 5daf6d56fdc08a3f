"""`Batch`: the rows that step together, and the step both of lookahead's drivers take.

`lookahead.generate`'s loop drives one batch of fixed rows (`loop.run_loop`: its `Rows` add each row's prompt and
index) until every row is done; the server's `Engine` (`serve/engine.py`) admits rows as requests arrive and retires
them as they finish. Each of their steps is this one:

    the driver drafts -> `Batch.step`: one forward over every row's [last token, draft] (the target's `verify`, or
    `verify_ids`: its argmax only), the driver's acceptance over it (greedy, speculative sampling, per row or for the
    call; the fused step's kernel), the cache keeping each row's accepted path (`commit`), each row's newest token
    moved on -> the driver advances its rows (append, stream, stop) -> `Batch.retire` drops the finished ones from
    the batch and from the cache.

The common calls of `generate` take the same step with the fused host step as their acceptance (`fused.py`: the
acceptance, stopping, index extension and the next step's draft in one kernel call).
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

    def step(self, drafted: DraftBatch, accept, stats, ids: bool = False) -> tuple:
        """One step of every row: the forward over [last token, draft] (`target.verify`: logits [b, N+1, V]; with
        `ids`, `target.verify_ids`: the target's argmax after every column [b, N+1], on the host), `accept(drafted,
        logits or ids) -> Verdict` (the driver's acceptance rule, with whatever it does around it), the cache keeping
        each row's accepted path (`target.commit`), each row's newest token moved on (the target's own after its
        accepted drafts: `verdict.bonus`). Returns (the forward's logits or ids, the verdict); each row's gained tokens
        are `verdict.gained(drafted)`."""
        out = (self.target.verify_ids if ids else self.target.verify)(self.last, drafted, stats)
        verdict = accept(drafted, out)
        self.target.commit(drafted, verdict)
        self.last[:] = verdict.bonus
        self.settled = True
        return out, verdict

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
