"""`benchmarks/real_ceiling.py`: the hindsight bound's two pieces, what each position's draft gets accepted and the
cheapest way to write an output drafting at most that."""
import pytest

from lookahead.decode.policy import CostCurve


@pytest.fixture(scope="module")
def ceiling(benchmark_script):
    return benchmark_script("real_ceiling")


@pytest.mark.parametrize("index_kind", ["suffix", "ngram"])
def test_a_copied_output_is_accepted_to_its_end_and_novel_tokens_not_at_all(ceiling, index_kind):
    """An output that repeats the prompt's tail: each position's chain follows the copy to the output's end (the
    chains are capped at 32); tokens the prompt never held get nothing accepted."""
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 3, 4]
    output = [5, 6, 7, 8, 9, 10, 11, 12, 90, 91]
    acc = ceiling.accepted(prompt, output, tree=False, index_kind=index_kind)
    assert len(acc) == len(output)
    assert acc[1:8] == [7, 6, 5, 4, 3, 2, 1]  # after 5: 6..12 match, then the prompt's 3 is not the output's 90
    assert acc[8:] == [0, 0]
    tree = ceiling.accepted(prompt, output, tree=True, index_kind=index_kind)  # trees: the suffix index either way
    assert tree[1:8] == [7, 6, 5, 4, 3, 2, 1]


def test_the_shortest_path_drafts_what_the_curve_prices_best(ceiling):
    """With every width costing one forward the bound takes the longest accepted draft at each step; with drafts
    costing more than the tokens they add it drafts nothing (one forward per token)."""
    acc = [3, 2, 1, 0, 3, 2, 1, 0]
    assert ceiling.shortest(acc, CostCurve([1.0, 1.0, 1.0, 1.0])) == pytest.approx(2.0)  # 4 tokens a forward
    assert ceiling.shortest(acc, CostCurve([1.0, 2.5, 4.0, 5.5])) == pytest.approx(8.0)  # greedy's 8 forwards
    assert ceiling.shortest([0] * 5, CostCurve([1.0, 1.0])) == pytest.approx(5.0)
