"""The dynamic cache's step kernels against their numpy formulas."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from lookahead.model import _kernels as K


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_a_chain_steps_inputs_are_its_tokens_positions_and_the_columns_each_row_sees(data):
    """`chain_inputs`: tokens are each row's last token then its draft, positions run on from the row's next one,
    and the slot mask marks the root and the row's real draft tokens, not its padding (a plain numpy reference);
    nothing else in the mask changes."""
    b, n = data.draw(st.integers(1, 6)), data.draw(st.integers(0, 9))
    buffer = np.array(data.draw(st.lists(st.integers(0, 999), min_size=b * (n + 2), max_size=b * (n + 2))),
                      dtype=np.int64).reshape(b, n + 2)
    drafts = buffer[:, :n]  # as the fused loop passes them: the first columns of a buffer
    sizes = np.array([data.draw(st.integers(0, n)) for _ in range(b)], dtype=np.int64)
    last, pos = np.arange(b, dtype=np.int64) + 7, np.array(data.draw(st.lists(st.integers(0, 300), min_size=b,
                                                                                max_size=b)), dtype=np.int64)
    start = data.draw(st.integers(0, 5))
    slots = np.full((b, start + n + 4), 9, dtype=np.int64)
    steps = np.full((2, b, n + 1), -1, dtype=np.int64)
    K.chain_inputs(last, drafts, sizes, pos, steps, slots, start)
    cols = np.arange(n + 1)
    assert np.array_equal(steps[0], np.concatenate([last[:, None], drafts], 1))
    assert np.array_equal(steps[1], pos[:, None] + cols)
    assert np.array_equal(slots[:, start:start + n + 1], (cols <= sizes[:, None]).astype(np.int64))
    assert (slots[:, :start] == 9).all() and (slots[:, start + n + 1:] == 9).all()


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_a_commit_masks_what_each_row_kept_and_moves_its_positions_past_it(data):
    """`commit_slots`: the step's first `width` slots (0: the most any row kept) are 1 up to each row's root and
    accepted drafts, 0 after; positions move past them (a plain numpy reference)."""
    b = data.draw(st.integers(1, 6))
    counts = np.array([data.draw(st.integers(0, 9)) for _ in range(b)], dtype=np.int64)
    width = data.draw(st.sampled_from([0, int(counts.max()) + 1, int(counts.max()) + 3]))
    start, pos = data.draw(st.integers(0, 5)), np.arange(b, dtype=np.int64) * 3
    slots = np.full((b, start + 16), 9, dtype=np.int64)
    got = K.commit_slots(slots, start, width, counts, pos)
    expected = width or int(counts.max()) + 1
    assert got == expected
    assert np.array_equal(slots[:, start:start + got], (np.arange(got) <= counts[:, None]).astype(np.int64))
    assert (slots[:, :start] == 9).all() and (slots[:, start + got:] == 9).all()
    assert np.array_equal(pos, np.arange(b) * 3 + counts + 1)


@given(data=st.data(), dtype=st.sampled_from(["float32", "float64", "bfloat16"]))
@settings(max_examples=60, deadline=None)
def test_a_tree_steps_inputs_are_what_the_ancestry_and_tree_mask_give(data, dtype):
    """`tree_inputs`: tokens, positions (the row's next position plus each column's depth) and the additive mask
    (the row's cache slots, then each query's ancestors and itself) equal `tree.ancestry` and `tree.tree_mask`."""
    import torch

    from lookahead.verify import tree as T

    b, n, width = data.draw(st.integers(1, 4)), data.draw(st.integers(0, 9)), data.draw(st.integers(1, 12))
    parents = np.full((b, n + 2), -1, dtype=np.int64)
    for i in range(b):
        for j in range(n):  # a parent before its child
            parents[i, j] = data.draw(st.integers(-1, j - 1))
    tokens = np.arange(b * n, dtype=np.int64).reshape(b, n) + 5
    slots = np.array(data.draw(st.lists(st.integers(0, 1), min_size=b * (width + 3), max_size=b * (width + 3))),
                     dtype=np.int64).reshape(b, width + 3)
    last, pos = np.arange(b, dtype=np.int64), np.arange(b, dtype=np.int64) * 10 + 3
    torch_dtype = getattr(torch, dtype)
    steps = np.full((2, b, n + 1), -1, dtype=np.int64)
    mask = np.full((b, 1, n + 1, width + n + 1), 7.0, dtype=np.float64 if dtype == "float64" else np.float32)
    K.tree_inputs(last, tokens, parents[:, :n], pos, slots, width, torch.finfo(torch_dtype).min, steps, mask)
    seen, depth = T.ancestry(parents[:, :n])
    expected = T.tree_mask(torch.from_numpy(slots[:, :width]), seen, torch_dtype)
    assert np.array_equal(steps[0], np.concatenate([last[:, None], tokens], 1))
    assert np.array_equal(steps[1], pos[:, None] + depth)
    assert torch.equal(torch.from_numpy(mask).to(torch_dtype), expected)


@pytest.mark.parametrize("draft", ["chain", "tree"])
@pytest.mark.parametrize("on_host", [True, False])
def test_the_dynamic_cache_matches_greedy_with_its_mask_written_in_place_or_on_the_device(monkeypatch, stories_model,
                                                                                          draft, on_host):
    """A left-padded batch of 3 real stories on the dynamic cache gives greedy's tokens, with long accepted drafts,
    whether the kernels write the step's inputs and mask in place (a CPU) or the mask is written as on an accelerator
    (`on_host` False: the CUDA paths, run on this CPU)."""
    import torch

    from lookahead import generate
    from lookahead.model.causal import CausalLM

    init = CausalLM.__init__

    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.on_host = on_host

    monkeypatch.setattr(CausalLM, "__init__", patched)
    story = stories_model.generate(torch.tensor([[1]]), do_sample=False, max_new_tokens=60)
    prompt = torch.cat([story, story[:, 1:25]], dim=1)  # the story, then its opening again: much to copy
    ids, mask = torch.zeros((3, prompt.shape[1]), dtype=torch.long), torch.zeros((3, prompt.shape[1]), dtype=torch.long)
    for i, pad in enumerate([0, 7, 3]):
        ids[i, pad:], mask[i, pad:] = prompt[0, : prompt.shape[1] - pad], 1
    expected = stories_model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40)
    out, stats = generate(stories_model, ids, attention_mask=mask, max_new_tokens=40, lookup="suffix", draft=draft,
                          cache_implementation="dynamic", return_stats=True)
    assert torch.equal(out, expected) and stats.tokens_per_forward > 1.5
