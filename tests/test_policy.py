"""DraftLength: drafts as long as the acceptance seen so far pays for."""
import numpy as np

from lookahead.policy import DraftLength, as_cost, step_cost


def test_cost_model_forms():
    assert as_cost(0.1) == (0.0, 0.1) and as_cost((0.8, 0.05)) == (0.8, 0.05)
    assert step_cost((0.8, 0.05), np.array([0, 10])).tolist() == [1.0, 2.3]


def test_rejected_drafts_shorten_and_stop_drafting():
    """Many rejections at one match length end drafting there; other lengths keep their prior."""
    policy = DraftLength(10, (0.8, 0.05))
    assert policy.choose(np.array([1]))[0] > 0
    for _ in range(20):
        policy.update(np.array([1]), np.array([4]), np.array([0]))
    assert policy.choose(np.array([1]))[0] == 0
    assert policy.choose(np.array([8]))[0] == DraftLength(10, (0.8, 0.05)).choose(np.array([8]))[0] > 0


def test_accepted_drafts_grow_to_the_maximum():
    policy = DraftLength(10, 0.1)
    for _ in range(20):
        policy.update(np.array([2]), np.array([10]), np.array([10]))
    assert policy.choose(np.array([2, 0])).tolist() == [10, 0]


def test_a_row_of_a_large_batch_pays_more_for_its_drafts():
    """In a batch the plain step is already a matrix product: drafts add compute the whole batch waits for."""
    from lookahead.policy import row_cost

    assert row_cost((0.8, 0.08), 1) == (0.8, 0.08)
    overhead, per_token = row_cost((0.8, 0.08), 8)
    assert overhead == 0.0 and per_token > 0.08
    policy = DraftLength(10, (0.8, 0.08))
    assert policy.choose(np.array([1] * 8))[0] < policy.choose(np.array([1]))[0]


def test_a_measured_cost_curve_is_never_cheaper_for_fewer_drafts():
    """A k-token draft can always be padded to more tokens, so the curve is the cheapest cost of any k' >= k."""
    from lookahead.policy import CostCurve

    curve = CostCurve([1.0, 1.9, 2.3, 1.6, 1.8, 2.0])
    assert curve.costs.tolist() == [1.0, 1.6, 1.6, 1.6, 1.8, 2.0]
    assert step_cost(curve, np.array([0, 2, 7])).tolist() == [1.0, 1.6, curve(5) + 2 * curve.slope]
    assert curve.slope > 0 and all(v >= 0 for v in curve.linear())
    # on such a machine the policy drafts 3 tokens rather than 1 or 2 whenever it drafts at all
    policy = DraftLength(5, curve)
    assert set(policy.choose(np.array([1, 4, 8])).tolist()) <= {0, 3, 4, 5}


def test_tree_calibration_follows_the_acceptance_seen():
    from lookahead.policy import TreeCalibration

    cal = TreeCalibration()
    probs = np.array([0.6, 0.3, 0.004, 0.003])
    assert np.allclose(cal(probs), probs)  # nothing seen yet: the index's estimates
    for _ in range(50):
        cal.update(np.array([0.004]), np.array([True]))  # nodes put at 0.4% were all accepted
    out = cal(probs)
    assert np.all(np.diff(out) <= 0)  # still non-increasing: the first n nodes stay the best tree of n
    assert out[2] > 0.25


def test_cost_curves_are_checked():
    import pytest
    from lookahead.policy import CostCurve

    with pytest.raises(ValueError, match="at least 2 positive costs"):
        CostCurve([1.0])
    with pytest.raises(ValueError, match="at least 2 positive costs"):
        CostCurve([1.0, -2.0])
