"""measure_draft_cost: a non-negative cost fitted from real forward timings."""
from lookahead.calibrate import forward_times, measure_draft_cost
from models import tiny_model


def test_forward_times_cover_the_sizes_and_the_cost_is_a_fraction():
    model = tiny_model("llama")
    times = forward_times(model, sizes=(1, 4), context=16, repeats=2)
    assert set(times) == {1, 4} and all(t > 0 for t in times.values())
    cost = measure_draft_cost(model, context=16, max_tokens=8)
    overhead, per_token = cost
    assert overhead >= 0.0 and per_token >= 0.0
