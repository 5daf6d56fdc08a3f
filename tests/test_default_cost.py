"""The default verification cost: measured for greedy calls on a CPU, a fixed line for sampling calls; unset budgets
widen to what the measured curve prices the same."""
from types import SimpleNamespace

import torch

from lookahead import generate
from lookahead.decode.calibrate import _MEASURED, budget, default_cost, draft_cost
from lookahead.decode.policy import CostCurve
from lookahead.decode.settings import make_settings
from lookahead.target.facts import ModelFacts
from models import repeated_prompt, tiny_model


def test_a_greedy_cpu_call_measures_the_cost_once_and_stays_lossless():
    """With no draft_cost, a greedy call on a CPU measures the model's curve on first use and reuses it."""
    model = tiny_model("llama", seed=3)
    ids = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4, 1, 2]])
    want = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(generate(model, ids, max_new_tokens=12), want)
    curves = dict(_MEASURED[model])
    assert len(curves) == 1 and isinstance(next(iter(curves.values())), CostCurve)
    assert torch.equal(generate(model, ids, max_new_tokens=12), want)
    assert _MEASURED[model] == curves


def test_sampling_keeps_the_fixed_line_and_accelerators_their_own():
    """A sampling call on a CPU gets (0.8, 0.08) without measuring anything, an accelerator (0, 0.02); a given
    cost wins."""
    model = tiny_model("llama", seed=4)
    facts = ModelFacts.of(model)
    assert default_cost(facts) == "auto" and default_cost(facts, sampling=True) == (0.8, 0.08)
    assert draft_cost(model, facts, make_settings(), sampling=True) == (0.8, 0.08)
    assert draft_cost(model, facts, make_settings(draft_cost=(0.1, 0.2))) == (0.1, 0.2)
    assert model not in _MEASURED
    on_gpu = SimpleNamespace(device=torch.device("cuda"), encoder_decoder=False)
    assert default_cost(on_gpu) == default_cost(on_gpu, sampling=True) == (0.0, 0.02)


def test_budget_widens_to_the_end_of_a_cost_plateau():
    """An unset budget widens to the widest draft a measured curve prices no higher; lines and numbers keep it."""
    curve = CostCurve([1.0, 1.2, 1.3, 2.5, 2.2, 2.2, 2.4])  # enveloped: 1.0, 1.2, 1.3, 2.2, 2.2, 2.2, 2.4
    assert [budget(curve, n) for n in range(7)] == [0, 1, 2, 5, 5, 5, 6]
    assert budget(curve, 9) == 9 and budget((0.8, 0.08), 10) == 10 and budget(0.1, 3) == 3


def test_an_unset_num_draft_tokens_drafts_what_the_curve_prices_the_same():
    """With a flat curve of 21 sizes and no num_draft_tokens, chains draft up to 20 tokens; given, 10 stays 10."""
    model = tiny_model("llama", seed=5)
    model.generation_config.eos_token_id = None  # the whole 24 tokens, whatever the model writes
    ids = repeated_prompt(7, 60)[None]
    widths = []
    hook = model.register_forward_pre_hook(lambda m, a, k: widths.append(k["input_ids"].shape[1]), with_kwargs=True)
    try:
        want = model.generate(ids, max_new_tokens=24, do_sample=False)
        widths.clear()
        assert torch.equal(generate(model, ids, max_new_tokens=24, draft_cost=CostCurve([1.0] * 21)), want)
        assert 11 < max(widths[1:]) <= 21  # wider than 10 drafts: as far as the index's copy reaches
        widths.clear()
        generate(model, ids, max_new_tokens=24, draft_cost=CostCurve([1.0] * 21), num_draft_tokens=10)
        assert max(widths[1:]) == 11
    finally:
        hook.remove()
