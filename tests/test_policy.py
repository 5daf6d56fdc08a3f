"""DraftLength: drafts as long as the acceptance seen so far pays for."""
import numpy as np

from lookahead.decode.policy import DraftLength, as_cost, step_cost


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
    from lookahead.decode.policy import row_cost

    assert row_cost((0.8, 0.08), 1) == (0.8, 0.08)
    overhead, per_token = row_cost((0.8, 0.08), 8)
    assert overhead == 0.0 and per_token > 0.08
    policy = DraftLength(10, (0.8, 0.08))
    assert policy.choose(np.array([1] * 8))[0] < policy.choose(np.array([1]))[0]


def test_a_measured_cost_curve_is_never_cheaper_for_fewer_drafts():
    """A k-token draft can always be padded to more tokens, so the curve is the cheapest cost of any k' >= k."""
    from lookahead.decode.policy import CostCurve

    curve = CostCurve([1.0, 1.9, 2.3, 1.6, 1.8, 2.0])
    assert curve.costs.tolist() == [1.0, 1.6, 1.6, 1.6, 1.8, 2.0]
    assert step_cost(curve, np.array([0, 2, 7])).tolist() == [1.0, 1.6, curve(5) + 2 * curve.slope]
    assert curve.slope > 0 and all(v >= 0 for v in curve.linear())
    # on such a machine the policy drafts 3 tokens rather than 1 or 2 whenever it drafts at all
    policy = DraftLength(5, curve)
    assert set(policy.choose(np.array([1, 4, 8])).tolist()) <= {0, 3, 4, 5}


def test_tree_calibration_follows_the_acceptance_seen():
    from lookahead.decode.policy import TreeCalibration

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
    from lookahead.decode.policy import CostCurve

    with pytest.raises(ValueError, match="at least 2 positive costs"):
        CostCurve([1.0])
    with pytest.raises(ValueError, match="at least 2 positive costs"):
        CostCurve([1.0, -2.0])


# The sizing kernels (lookahead.decode._policy_kernels) against the plain numpy rules they replaced.

from hypothesis import given, settings, strategies as st  # noqa: E402

from lookahead.decode import _policy_kernels as K  # noqa: E402
from lookahead.decode.sizing import best_size, first_path  # noqa: E402
from lookahead.decode.policy import TreeCalibration, _BUCKETS  # noqa: E402
from lookahead.verify import tree as T  # noqa: E402


def _reference_lengths(policy: DraftLength, matches: np.ndarray, costs: np.ndarray) -> np.ndarray:
    q = policy.acceptance()[np.searchsorted(_BUCKETS, matches, side="right") - 1, None]
    k = np.arange(policy.max_tokens + 1)[None, :]
    best = np.argmax(np.cumsum(np.where(k > 0, q ** k, 1.0), axis=1) / costs[None, :], axis=1)
    return np.where(matches > 0, best, 0)


@st.composite
def best_first_trees(draw, max_nodes: int = 12):
    """(parents, non-increasing probs) of a tree whose parents come before their children."""
    n = draw(st.integers(0, max_nodes))
    parents = np.array([draw(st.integers(-1, j - 1)) for j in range(n)], dtype=np.int64)
    probs = np.sort(np.array(draw(st.lists(st.floats(0, 1), min_size=n, max_size=n))))[::-1].copy()
    return parents, probs


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.lists(st.integers(0, 40), min_size=1, max_size=6), st.integers(0, 10),
                                st.integers(0, 10)), max_size=8),
       cost=st.sampled_from([0.1, (0.8, 0.05), (0.0, 0.02)]), batch=st.integers(1, 4))
def test_draft_length_kernels_match_the_numpy_rule(steps, cost, batch):
    """After any history of steps the chosen lengths are the argmax of expected tokens per cost, bucket by bucket."""
    from lookahead.decode.policy import row_cost

    policy = DraftLength(10, cost)
    costs = step_cost(row_cost(policy.cost, batch), np.arange(11))
    for matches, drafted, accepted in steps:
        matches = np.array((matches * batch)[:batch], dtype=np.int64)
        chosen = policy.choose(matches)
        assert chosen.tolist() == _reference_lengths(policy, matches, costs).tolist()
        n = len(matches)
        policy.update(matches, np.full(n, drafted), np.full(n, min(accepted, drafted)))


@settings(max_examples=80, deadline=None)
@given(tree=best_first_trees(), seen=st.lists(st.integers(0, 20), min_size=12, max_size=12),
       cost=st.sampled_from([0.05, (0.8, 0.08), (0.0, 0.3)]))
def test_tree_size_kernel_matches_the_calibrated_rule(tree, seen, cost):
    """The tree's first n nodes maximizing calibrated expected tokens per cost: the rule's n, or where sizes tie
    exactly in real arithmetic (calibrated 0.3 per node at 0.3 per node of cost), one whose value equals the best to
    rounding (the kernel sums the gains in another order)."""
    parents, probs = tree
    cal = TreeCalibration()
    cal.seen[:] = seen
    cal.accepted[:] = np.array(seen) // 2
    costs = np.asarray(step_cost(as_cost(cost), np.arange(len(probs) + 1)), dtype=float)
    got, want = K.tree_size(probs, cal.EDGES, cal.accepted, cal.seen, cal.prior, costs), best_size(cal(probs), cost)
    values = (1.0 + np.concatenate([[0.0], np.cumsum(cal(probs))])) / costs
    assert got == want or abs(values[got] - values[want]) <= 1e-12 * values[want]


@settings(max_examples=150, deadline=None)
@given(tree=best_first_trees(), count=st.integers(0, 14), least=st.integers(0, 14), depth=st.integers(0, 6),
       whole=st.booleans())
def test_tree_pick_verifies_the_paying_nodes_and_the_chain_floor(tree, count, least, depth, whole):
    """A step verifies the tree's first `count` nodes, its first path `depth` deep (only the path, not the nodes
    valued above its end; with `whole`, those too), then more first nodes up to `least` in all; the picked nodes
    form a tree (every parent picked) whose first path is the same chain."""
    from lookahead.index.draft import Draft

    parents, probs = tree
    n = len(parents)
    path = first_path(parents, depth)
    first = max(min(count, n), path[-1] + 1 if whole and path else 0)
    with_first = lambda c: set(range(c)) | set(path)  # noqa: E731
    most = max(len(with_first(first)), min(least, n))
    c = max(c for c in range(first, n + 1) if c == first or len(with_first(c)) <= most)
    pick, scratch = np.empty(n, np.int64), np.empty(n, np.int64)
    total = K.tree_pick(parents, count, least, depth, whole, pick, scratch)
    assert pick[:total].tolist() == sorted(with_first(c))
    assert all(parents[j] < 0 or parents[j] in set(pick[:total].tolist()) for j in pick[:total])
    taken = Draft(np.arange(n) + 100, parents, probs).take(pick[:total])
    assert [taken.tokens[j] - 100 for j in first_path(taken.parents, depth)] == path
    out = [np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n)]
    K.pack_picked(np.arange(n) + 100, parents, probs, pick, total, *out, np.empty(n, np.int64))
    assert out[0][:total].tolist() == taken.tokens.tolist() and out[1][:total].tolist() == taken.parents.tolist()
    assert out[2][:total].tolist() == taken.probs.tolist()


@settings(max_examples=80, deadline=None)
@given(trees=st.lists(best_first_trees(), min_size=1, max_size=3), data=st.data())
def test_tree_record_kernel_matches_the_calibration_and_chain_floor(trees, data):
    """A tree step records every node in its calibration bin (accepted when on the path), in one calibration every
    row shares or in each row's own ([rows, bins] tables, the server's rows), and how far the accepted path followed
    the chain floor."""
    tokens, parents, sizes = T.pack_trees([(np.arange(len(p)), p) for p, _ in trees])
    probs = np.zeros(tokens.shape)
    paths, depths = [], []
    for i, (p, pr) in enumerate(trees):
        probs[i, : len(pr)] = pr
        node, path = -1, []  # an accepted path: any walk down from the root
        while (children := np.flatnonzero(p == node).tolist()) and data.draw(st.booleans()):
            node = data.draw(st.sampled_from(children))
            path.append(node)
        paths.append(path)
        depths.append(data.draw(st.integers(0, 6)))
    own = data.draw(st.booleans())  # each row its own calibration
    cal, ref = TreeCalibration(), TreeCalibration()
    rows = [TreeCalibration() for _ in trees]
    tables = (np.zeros((len(trees), len(cal.EDGES))), np.zeros((len(trees), len(cal.EDGES)))) if own else cal.counts
    floors, followed = np.zeros(len(trees), np.int64), np.zeros(len(trees), np.int64)
    K.tree_record(parents, sizes, probs, np.array(depths, np.int64), T.path_slots(paths),
                  np.array([len(p) for p in paths], np.int64), cal.EDGES, *tables, floors, followed,
                  np.zeros(tokens.shape[1], np.bool_))
    for i, (p, pr) in enumerate(trees):
        on_path = np.zeros(len(pr), bool)
        on_path[paths[i]] = True
        ref.update(pr, on_path)
        rows[i].update(pr, on_path)
        if own:
            assert tables[1][i].tolist() == rows[i].seen.tolist() and tables[0][i].tolist() == rows[i].accepted.tolist()
        chain = first_path(p, depths[i])
        assert floors[i] == len(chain)
        assert followed[i] == next((j for j, (a, b) in enumerate(zip(chain, paths[i])) if a != b),
                                   min(len(chain), len(paths[i])))
    if not own:
        assert cal.seen.tolist() == ref.seen.tolist() and cal.accepted.tolist() == ref.accepted.tolist()


def test_chains_fill_the_columns_their_forward_computes_anyway():
    """Every row with a match drafts as many tokens as the step's widest draft (or its width) verifies anyway, at
    most max_tokens and its room; a row without a match drafts nothing."""
    from lookahead.index import NgramIndex
    from lookahead.decode.sizing import ChainSizing

    strong, weak, none = NgramIndex(), NgramIndex(), NgramIndex()
    strong.extend(list(range(1, 14)) * 2 + [1, 2, 3])
    weak.extend([5, 6, 7, 8, 9, 10, 11, 12, 5])  # a one-token match
    none.extend([1, 2, 3])
    sizing = ChainSizing(10, (0.8, 0.08))
    for _ in range(30):  # one-token matches were never accepted: on its own the policy drafts nothing for them
        sizing.length.update(np.array([1]), np.array([4]), np.array([0]))
    rooms = np.full(3, 100)
    plain = sizing.draft([strong, weak, none], rooms)
    filled = sizing.draft([strong, weak, none], rooms, padded=lambda n: n)
    assert len(plain[1]) == len(plain[2]) == 0 < len(plain[0])
    assert len(filled[1]) == len(filled[0]) == len(plain[0]) and len(filled[2]) == 0
    assert filled[1].tokens.tolist() == weak.propose(len(plain[0])).tolist()
    assert [len(d) for d in sizing.draft([strong, weak, none], rooms, padded=lambda n: 15)] == [
        10, len(weak.propose(10)), 0]
    assert len(sizing.draft([strong, weak], np.array([100, 2]), padded=lambda n: n)[1]) == 2


def test_trees_fill_the_nodes_their_forward_computes_anyway():
    """Tree rows keep as many nodes as the step verifies anyway (their own trees permitting), at most max_nodes."""
    from lookahead.index import SuffixIndex
    from lookahead.decode.sizing import TreeSizing

    rows = [SuffixIndex() for _ in range(2)]
    rows[0].extend(list(range(1, 30)) * 3 + [1, 2, 3])
    rows[1].extend([5, 6, 7, 5, 8, 9, 5, 6, 5])
    sizing = TreeSizing(16, 10, (0.8, 0.08))
    plain = sizing.draft(rows, np.full(2, 100))
    filled = sizing.draft(rows, np.full(2, 100), padded=lambda n: n)
    widest = max(len(d) for d in plain)
    assert [len(d) for d in filled] == [min(widest, len(rows[i].propose_tree(16))) for i in range(2)]
    assert all(len(d) <= 16 for d in sizing.draft(rows, np.full(2, 100), padded=lambda n: 40))


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 12)), min_size=1, max_size=64),
       cost=st.sampled_from([(0.0, 0.05), (0.8, 0.05), (0.0, 0.5), (0.1, 0.0)]), least=st.integers(0, 4))
def test_a_batchs_width_is_the_best_bet_for_the_whole_batch(rows, cost, least):
    """The step's width maximizes the batch's expected tokens per unit of cost (every row pays for the widest row's
    columns), found by brute force; so it never expects fewer tokens per cost than plain decoding (width 0)."""
    from lookahead.decode.policy import batch_width

    chances, reach = np.array([q for q, _ in rows]), np.array([r for _, r in rows], dtype=np.int64)

    def value(w):
        gain = sum(sum(min(q, 0.999) ** j for j in range(min(w, r) + 1)) for q, r in rows)
        return gain / float(step_cost(cost, len(rows) * (max(w, least) + 1) - 1))

    widths = np.maximum(np.arange(int(reach.max()) + 1), least)
    w = batch_width(chances, reach, step_cost(cost, len(rows) * (widths + 1) - 1))
    assert 0 <= w <= max(reach.max(), 0)
    best = max(value(v) for v in range(int(reach.max()) + 1))
    assert value(w) >= best * (1 - 1e-9) and value(w) >= value(0) * (1 - 1e-9)


def test_weak_bets_in_a_full_batch_decode_plainly_and_a_strong_one_pays_for_all():
    """64 rows whose drafts are rarely accepted verify none (at a large batch a step costs what its tokens cost);
    in a batch of 2, a row that copies its prompt drafts its 8 tokens and the other fills the columns."""
    from lookahead.decode.policy import batch_width

    def line(b):
        return step_cost((0.0, 0.05), b * (np.arange(9) + 1) - 1)

    assert batch_width(np.full(64, 0.2), np.full(64, 8), line(64)) == 0
    assert batch_width(np.array([0.95, 0.1]), np.array([8, 8]), line(2)) == 8
    assert batch_width(np.full(64, 0.95), np.full(64, 8), line(64)) > 0


def test_step_times_follow_the_steps_timed():
    """Before any timing a batch's costs are the model's; a timed plain step sets their scale and a timed wider step
    what a column adds, per batch size rounded up to a power of two."""
    from lookahead.decode.policy import StepTimes

    times = StepTimes((0.0, 0.05))
    assert np.allclose(times.costs(16, 2), step_cost((0.0, 0.05), 16 * (np.arange(3) + 1) - 1))
    assert not times.drafts(16)  # a plain step first
    times.record(16, 0, 0.32, 16)  # 20 ms per row
    assert times.drafts(16)
    model = step_cost((0.0, 0.05), 16 * (np.arange(3) + 1) - 1)
    assert np.allclose(times.costs(16, 2), 0.32 * model / model[0])
    times.record(15, 2, 0.90, 45)  # 15 rows: the same bucket; 60 ms per row, 20 ms per column; 3 tokens a row
    assert np.allclose(times.costs(16, 2), 16 * (0.02 + 0.02 * np.arange(3)))
    assert np.allclose(times.costs(16, 2, least=2), 16 * 0.06)
    assert np.allclose(times.costs(4, 1), step_cost((0.0, 0.05), 4 * (np.arange(2) + 1) - 1))  # another bucket
    assert times.drafts(16)  # 45 tokens in 0.9 s against 16 in 0.32 s: drafting did not lose


def test_drafting_that_loses_stops_but_for_a_probe():
    """Where steps with drafts gave fewer tokens per second than plain steps (by `LOSS` or more: a near tie goes on
    drafting), a batch size decodes plainly, but for one step in `PROBE`, which may find drafting paying again;
    where they pay, one step in `PROBE` is plain."""
    from lookahead.decode.policy import StepTimes

    times = StepTimes((0.0, 0.05), weight=1.0)
    times.record(8, 0, 0.16, 8)  # 50 tokens per second
    times.record(8, 4, 0.48, 16)  # 33 per second
    asked = [times.drafts(8) for _ in range(2 * times.PROBE)]
    assert sum(asked) == 2 and asked[times.PROBE - 1]
    times.record(8, 4, 0.24, 40)  # a probe that paid: 167 per second
    asked = [times.drafts(8) for _ in range(times.PROBE)]
    assert sum(asked) == times.PROBE - 1
    times.record(8, 4, 0.4, 19)  # 47.5 tokens per second, 5% fewer than plain steps: within the averages' noise,
    assert times.drafts(8)  # drafting goes on
    times.record(8, 4, 0.4, 17)  # 42.5, 15% fewer: it stops
    assert not times.drafts(8)
