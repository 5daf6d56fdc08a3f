"""`benchmarks/recycle_accounting.py`: recycled nodes' gain against their cost, recorded from the fused steps."""
import numpy as np
import pytest
import torch

from lookahead import models


@pytest.fixture(scope="module")
def accounting(benchmark_script):
    return benchmark_script("recycle_accounting")


def test_the_ledger_records_every_verified_step_and_changes_nothing(accounting):
    """The hooked call writes greedy's tokens; every verification step is recorded; recycled nodes add cost and
    tokens (stories260K repeats little, so M's walk gains some), never more tokens than the accepted drafts."""
    model = models.load(models.default_model_path())[0]
    ids = torch.tensor([[1, 403, 261, 139, 352]])
    ledger, original = accounting.Ledger(), accounting.fused.FusedRecycleTrees._step
    out, stats = accounting.account(model, ids, ledger, max_new_tokens=120, draft_cost=(0.2, 0.02))
    assert torch.equal(out, model.generate(ids, do_sample=False, max_new_tokens=120))
    tokens, cost, copy_tokens, copy_cost = ledger.sums
    assert tokens > copy_tokens >= 1 and cost > copy_cost > 0
    assert tokens - copy_tokens <= stats.accepted_tokens  # tokens owed to recycled nodes were accepted drafts
    assert tokens - stats.accepted_tokens == stats.forward_passes - 1  # one token more per step: every step recorded
    assert accounting.fused.FusedRecycleTrees._step is original  # the hook is gone
    # every recorded step is paired with the suffix tree's pick at its position; a pick gains at least the target's
    # own token and costs at least a one-token forward
    steps = stats.forward_passes - 1
    assert np.allclose(ledger.pairs[:2], ledger.sums[:2])
    assert ledger.pairs[2] >= steps and ledger.pairs[3] >= steps
    assert len(ledger.calls) == 1 and np.allclose(ledger.calls[0][0], ledger.pairs)


def test_a_tree_gains_its_longest_path_along_the_text_and_the_target_s_token(accounting):
    tokens, parents = [5, 6, 7, 8], [-1, 0, -1, 2]  # 5 -> 6 and 7 -> 8
    assert accounting.tree_gain(tokens, parents, 4, [5, 6, 9]) == 3
    assert accounting.tree_gain(tokens, parents, 4, [7, 8, 9, 9]) == 3
    assert accounting.tree_gain(tokens, parents, 4, [7, 1]) == 2
    assert accounting.tree_gain(tokens, parents, 4, [9, 5]) == 1
    assert accounting.tree_gain(tokens, parents, 4, [5, 6]) == 2  # the text ends: no more than it holds
    assert accounting.tree_gain(tokens, parents, 0, [5, 6]) == 1  # an empty tree
