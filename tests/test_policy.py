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
