"""`benchmarks/recycle_accounting.py`: recycled nodes' gain against their cost, recorded from the fused steps."""
import importlib.util
import pathlib

import pytest
import torch

from lookahead import models

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "recycle_accounting.py"


@pytest.fixture(scope="module")
def accounting():
    spec = importlib.util.spec_from_file_location("recycle_accounting", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
