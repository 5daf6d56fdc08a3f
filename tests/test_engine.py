"""The step both drivers take (`lookahead.decode.engine.Batch`): generate's loop over a fixed batch and the server's
engine, whose rows join and leave."""
import numpy as np
import torch

from lookahead.decode.engine import Batch
from lookahead.decode.loop import Rows
from lookahead.index.draft import Draft
from lookahead.verify.batch import DraftBatch, Verdict


class Target:
    """A target that records what the step asks of it: logits whose argmax after each column is the column's token
    + 1 (so a draft of consecutive tokens is accepted)."""

    def __init__(self):
        self.calls = []

    def verify(self, last, batch, stats):
        self.calls.append(("verify", last.tolist(), batch.width))
        tokens = np.concatenate([last[:, None], batch.tokens], axis=1)
        return torch.nn.functional.one_hot(torch.as_tensor(tokens + 1), 64).float()

    def verify_ids(self, last, batch, stats):
        self.calls.append(("verify_ids", last.tolist(), batch.width))
        return np.concatenate([last[:, None], batch.tokens], axis=1) + 1

    def commit(self, batch, verdict):
        self.calls.append(("commit", verdict.counts.tolist()))

    def keep(self, rows):
        self.calls.append(("keep", rows))


def greedy(batch: DraftBatch, logits: torch.Tensor) -> Verdict:
    """Chains: the drafts that agree with the argmax, then the argmax after them."""
    best = logits.argmax(-1).numpy()
    counts = np.array([int(np.cumprod(batch.tokens[i, :n] == best[i, :n]).sum()) for i, n in enumerate(batch.sizes)])
    return Verdict(counts, best[np.arange(len(counts)), counts])


def test_a_step_verifies_accepts_commits_and_moves_each_row_on():
    """One forward over [last, draft] of every row, the driver's rule over its logits, then the commit; each row's
    newest token is the one after its accepted drafts; rows admitted later step with the others."""
    target = Target()
    batch = Batch(target)
    batch.admit("a", 3)
    batch.admit("b", 10)
    assert batch.rows == ["a", "b"] and batch.last.tolist() == [3, 10] and not batch.settled
    drafted = DraftBatch.pack([Draft.chain(np.array([4, 5, 9]), 1), Draft.chain(np.array([20]), 1)], True)
    seen = []
    logits, verdict = batch.step(drafted, lambda d, lg: seen.append(lg.shape) or greedy(d, lg), None)
    assert [c[0] for c in target.calls] == ["verify", "commit"] and seen == [(2, 4, 64)]
    assert verdict.counts.tolist() == [2, 0]  # "a" keeps 4, 5 and gets 6; "b" gets 11
    assert verdict.gained(drafted) == [[4, 5, 6], [11]] and batch.last.tolist() == [6, 11] and batch.settled


def test_a_step_on_the_targets_argmax_alone_is_the_same_step():
    """With `ids` (the fused step's way) the forward gives the target's argmax [b, N+1] on the host instead of
    logits; the driver's acceptance reads that, and the commit and each row's newest token are as before."""
    target = Target()
    batch = Batch(target)
    batch.admit("a", 3)
    batch.admit("b", 10)
    drafted = DraftBatch.pack([Draft.chain(np.array([4, 5, 9]), 1), Draft.chain(np.array([20]), 1)], True)

    def accept(d, ids):
        counts = np.array([int(np.cumprod(d.tokens[i, :n] == ids[i, :n]).sum()) for i, n in enumerate(d.sizes)])
        return Verdict(counts, ids[np.arange(2), counts])

    ids, verdict = batch.step(drafted, accept, None, ids=True)
    assert [c[0] for c in target.calls] == ["verify_ids", "commit"] and ids.shape == (2, 4)
    assert verdict.gained(drafted) == [[4, 5, 6], [11]] and batch.last.tolist() == [6, 11] and batch.settled


def test_retiring_rows_drops_them_from_the_cache_but_never_asks_for_no_rows():
    """`retire` hands back the rows that left and keeps the others in order (their cache rows too); when none is
    left the cache is not asked to keep an empty batch. The loop's `Rows` cut their prompts and indexes with them."""
    target = Target()
    rows = Rows(target, [0, 1, 2], np.array([5, 6, 7]), prompts=torch.arange(6).reshape(3, 2), indexes=["x", "y", "z"])
    assert rows.retire([False, False, False]) == [] and target.calls == []
    assert rows.retire([True, False, False]) == [0]
    assert target.calls == [("keep", [1, 2])]
    assert rows.ids == [1, 2] and rows.last.tolist() == [6, 7] and rows.indexes == ["y", "z"]
    assert rows.prompts.tolist() == [[2, 3], [4, 5]]
    assert rows.retire([True, True]) == [1, 2] and target.calls == [("keep", [1, 2])]
    assert rows.ids == [] and rows.last.shape == (0,) and rows.prompts.shape == (0, 2) and rows.indexes == []
