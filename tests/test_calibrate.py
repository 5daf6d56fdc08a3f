"""measure_draft_cost: the cost of each draft size, measured from real forward timings."""
import numpy as np
import torch

from lookahead.decode.calibrate import forward_times, measure_draft_cost
from models import tiny_model


def test_forward_times_cover_the_sizes_and_the_cost_is_a_fraction():
    model = tiny_model("llama")
    times = forward_times(model, sizes=(1, 4), context=16, repeats=2)
    assert set(times) == {1, 4} and all(t > 0 for t in times.values())
    cost = measure_draft_cost(model, context=16, max_tokens=8)
    assert cost.costs.shape == (9,) and cost.costs[0] == 1.0
    assert np.all(np.diff(cost.costs) >= 0)  # padding a draft is always possible: never cheaper to verify more
    overhead, per_token = cost.linear()
    assert overhead >= 0.0 and per_token >= 0.0


def test_auto_cost_is_measured_once_per_model_and_decodes_losslessly():
    from lookahead import generate
    from lookahead.decode.calibrate import _MEASURED

    model = tiny_model("llama")
    ids = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4, 1, 2]])
    want = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(generate(model, ids, draft_cost="auto", max_new_tokens=12), want)
    curves = dict(_MEASURED[model])
    assert len(curves) == 1
    assert torch.equal(generate(model, ids, draft_cost="auto", max_new_tokens=12), want)
    assert _MEASURED[model] == curves  # the second call reuses the measurement


def test_auto_cost_stays_inside_a_learned_position_table():
    """GPT-2 with 256 positions, and a draft budget of 600 with 1024 positions: calibration fits the table."""
    import transformers as T
    from lookahead import generate

    for positions, budget in ((256, 10), (1024, 600)):
        config = T.GPT2Config(vocab_size=96, n_embd=16, n_layer=1, n_head=2, n_positions=positions, bos_token_id=1,
                              eos_token_id=2)
        torch.manual_seed(0)
        model = T.GPT2LMHeadModel(config).eval()
        ids = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4, 1, 2]])
        want = model.generate(ids, max_new_tokens=8, do_sample=False)
        assert torch.equal(generate(model, ids, draft_cost="auto", num_draft_tokens=budget, max_new_tokens=8), want)
