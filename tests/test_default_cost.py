"""The default verification cost: measured for greedy calls on a CPU, a fixed line for sampling calls; unset budgets
widen to what the measured curve prices the same."""
from types import SimpleNamespace

import torch

from lookahead import generate
from lookahead.decode.calibrate import _MEASURED, budget, default_cost, draft_cost
from lookahead.decode.policy import CostCurve
from lookahead.decode.settings import make_settings
from lookahead.model.facts import ModelFacts
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


def _widths_of(model, call) -> list:
    """The widths of the forwards `call()` makes after the prefill."""
    widths = []
    hook = model.register_forward_pre_hook(lambda m, a, k: widths.append(k["input_ids"].shape[1]), with_kwargs=True)
    try:
        call()
    finally:
        hook.remove()
    return widths[1:]


def test_chain_steps_pad_to_the_widths_that_cost_least():
    """On a curve where 2 and 3 tokens cost more than 4 (a CPU's row blocks), a chain step never verifies 2 or 3
    tokens but pads to 4, with filler the acceptance never reads: the output stays greedy's."""
    model = tiny_model("llama", seed=5)
    model.generation_config.eos_token_id = None
    inf = float("inf")
    curve = CostCurve([1.0, 1.9, 2.2, 1.4, inf, inf, inf, 1.5])  # k drafts: a forward over k + 1 tokens
    assert curve.pads.tolist() == [0, 3, 3, 3, 7, 7, 7, 7]
    for seed in range(4):
        ids = repeated_prompt(seed, 50)[None]
        want = model.generate(ids, max_new_tokens=30, do_sample=False)
        out = []
        widths = _widths_of(model, lambda: out.append(generate(model, ids, max_new_tokens=30, draft_cost=curve,
                                                                num_draft_tokens=7)))
        assert torch.equal(out[0], want)
        assert set(widths) <= {1, 4, 8} and widths.count(1) < len(widths)


def test_batches_and_trees_are_not_padded_past_their_drafts(monkeypatch):
    """A curve measured at batch 1 pads no batch's steps; tree steps keep the nodes they drafted."""
    from lookahead.model.causal import CausalLM

    model = tiny_model("llama", seed=5)
    model.generation_config.eos_token_id = None
    curve = CostCurve([1.0, 1.9, 2.2, 1.4, 1.6, 1.7, 1.8, 1.5])
    padded = []
    monkeypatch.setattr(CausalLM, "pad_to", lambda self, pads: padded.append(pads))
    ids = torch.stack([repeated_prompt(s, 50) for s in range(2)])
    want = model.generate(ids, max_new_tokens=20, do_sample=False)
    assert torch.equal(generate(model, ids, max_new_tokens=20, draft_cost=curve, num_draft_tokens=7), want)
    assert padded == []
    monkeypatch.undo()
    tree = _widths_of(model, lambda: generate(model, ids[:1], max_new_tokens=20, draft_cost=curve,
                                              lookup="suffix", draft="tree", max_draft_nodes=7))
    assert max(tree) <= 8


def test_the_measured_curve_times_every_width_to_8_then_every_fourth():
    """`measure_draft_cost` leaves the widths it did not time unmeasured, so that steps pad past them."""
    from lookahead.decode.calibrate import measure_draft_cost, widths

    assert widths(33) == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 28, 32, 33] and widths(5) == [1, 2, 3, 4, 5]
    curve = measure_draft_cost(tiny_model("llama"), context=32, max_tokens=14)
    assert len(curve.raw) == 15 and all(torch.isinf(torch.tensor(curve.raw[k])) for k in (8, 9, 10, 12, 13))
    assert curve.pads[8] in (11, 14) and curve.pads[12] == 14
