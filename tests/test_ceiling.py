"""The copy ceilings of lookahead.bench.oracles against a plain-Python reference."""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from lookahead.bench.oracles import AnchoredOracle, HindsightOracle, anchored_copy_kernel


def naive_anchored(context: list, target: list, longest_only: bool) -> int:
    """Best copy of ``target`` after an occurrence of ``context[-1]``, from the definition."""
    def suffix_match(i):
        m = 1
        while m <= i and m < 64 and context[i - m] == context[-1 - m]:
            m += 1
        return m

    def copied(i):
        virtual = context + target  # a copy past the end reads what it has just copied
        length = 0
        while length < len(target) and virtual[i + 1 + length] == target[length]:
            length += 1
        return length

    anchors = [i for i in range(len(context) - 1) if context[i] == context[-1]]
    if longest_only and anchors:
        top = max(suffix_match(i) for i in anchors)
        anchors = [i for i in anchors if suffix_match(i) == top]
    return max((copied(i) for i in anchors), default=0)


tokens = st.lists(st.integers(0, 3), min_size=1, max_size=40)


@given(tokens, tokens)
def test_anchored_kernel_matches_reference(context, target):
    """The kernel finds the same best copy as the definition, for both anchor sets."""
    for longest_only in (False, True):
        got = anchored_copy_kernel(np.array(context, np.int32), np.array(target, np.int32), longest_only)
        assert got == naive_anchored(context, target, longest_only)


@given(tokens, tokens)
def test_longest_suffix_ceiling_is_below_last_token_ceiling(context, target):
    """Restricting anchors to the longest suffix can only lower the ceiling."""
    ctx, tgt = np.array(context, np.int32), np.array(target, np.int32)
    assert anchored_copy_kernel(ctx, tgt, True) <= anchored_copy_kernel(ctx, tgt, False)


def test_overlapping_copy_extrapolates_a_period():
    """After "1 2 1 2", the anchor at the first 2 copies 1 2 1 2 ... through its own draft."""
    assert anchored_copy_kernel(np.array([1, 2, 1, 2], np.int32), np.array([1, 2, 1, 2, 1], np.int32), False) == 5


def test_oracles_draft_what_they_can_copy():
    """The hindsight oracle copies from anywhere; the anchored ceiling only after an occurrence of the last token."""
    output = np.array([7, 8, 9, 4])
    hindsight, anchored = HindsightOracle(output), AnchoredOracle(output, longest=False)
    for oracle in (hindsight, anchored):
        oracle.extend([7, 8, 9, 3, 5])
    assert hindsight.propose(4).tolist() == [7, 8, 9]
    assert anchored.propose(4).tolist() == []
