"""The default verification cost: measured for greedy calls on a CPU, a fixed line for sampling calls."""
from types import SimpleNamespace

import torch

from lookahead import generate
from lookahead.calibrate import _MEASURED, default_cost, draft_cost
from lookahead.policy import CostCurve
from lookahead.settings import make_settings
from models import tiny_model


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
    assert default_cost(model) == "auto" and default_cost(model, sampling=True) == (0.8, 0.08)
    assert draft_cost(model, make_settings(), sampling=True) == (0.8, 0.08)
    assert draft_cost(model, make_settings(draft_cost=(0.1, 0.2))) == (0.1, 0.2)
    assert model not in _MEASURED
    on_gpu = SimpleNamespace(device=torch.device("cuda"))
    assert default_cost(on_gpu) == default_cost(on_gpu, sampling=True) == (0.0, 0.02)
