"""Grouped-query verification forwards packed per key/value head (`lookahead.model.attention`)."""
import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from lookahead import generate
from lookahead.model.attention import NAME, packed_attention, packed_sdpa

from models import tiny_model


class _Layer(torch.nn.Module):
    def __init__(self, groups):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _inputs(b=2, heads=6, groups=3, q=5, s=40, d=16, seed=0, dtype=torch.float32, bool_mask=True):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(b, heads, q, d, generator=g, dtype=dtype)
    key, value = (torch.randn(b, heads // groups, s, d, generator=g, dtype=dtype) for _ in range(2))
    seen = torch.rand(b, 1, q, s, generator=g) < 0.7
    seen[..., -q:] |= torch.eye(q, dtype=torch.bool)  # every query sees itself
    mask = seen if bool_mask else torch.zeros(seen.shape, dtype=dtype).masked_fill(~seen, torch.finfo(dtype).min)
    return query, key, value, mask


@pytest.mark.parametrize("bool_mask", [True, False])
@pytest.mark.parametrize("b,heads,groups,q", [(1, 9, 3, 2), (2, 6, 3, 5), (3, 4, 2, 8), (1, 8, 8, 3)])
def test_packed_queries_attend_as_repeated_keys_do(bool_mask, b, heads, groups, q):
    """Several queries of a grouped-query layer give transformers' sdpa output (keys repeated per head)."""
    query, key, value, mask = _inputs(b, heads, groups, q, bool_mask=bool_mask, dtype=torch.float64)
    layer = _Layer(groups)
    want, _ = sdpa_attention_forward(layer, query, key, value, mask, scaling=0.25)
    got, _ = packed_sdpa(layer, query, key, value, mask, scaling=0.25)
    assert got.shape == want.shape == (b, q, heads, 16)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_mask_shared_by_the_batch_is_repeated_for_every_row():
    """A mask with batch dimension 1 serves every row, as in transformers' function."""
    query, key, value, mask = _inputs(b=3)
    layer = _Layer(3)
    want, _ = sdpa_attention_forward(layer, query, key, value, mask[:1])
    got, _ = packed_sdpa(layer, query, key, value, mask[:1])
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("case", ["one query", "prefill", "no mask", "no groups", "bias"])
def test_other_forwards_are_transformers_own(case, monkeypatch):
    """One query, a prefill, no mask, one query head per key head or a position bias go to transformers' sdpa."""
    import lookahead.model.attention as A

    query, key, value, mask = _inputs()
    groups, kwargs = 3, {}
    if case == "one query":
        query, mask = query[:, :, :1], mask[:, :, :1]
    elif case == "prefill":
        key, value, mask = key[:, :, :5], value[:, :, :5], mask[..., :5]
    elif case == "no mask":
        mask = None
    elif case == "no groups":
        key, value, groups = key.repeat_interleave(3, 1), value.repeat_interleave(3, 1), 1
    else:
        kwargs["position_bias"] = torch.zeros(1, 1, 5, 40)
    calls = []
    monkeypatch.setattr(A, "sdpa_attention_forward", lambda *a, **k: calls.append(1) or (None, None))
    packed_sdpa(_Layer(groups), query, key, value, mask, **kwargs)
    assert calls == [1]


def test_a_call_runs_packed_attention_and_sets_the_model_back():
    """During a call a grouped-query model runs the packed attention; after it, sdpa again."""
    model = tiny_model("llama")
    assert model.config._attn_implementation == "sdpa"
    seen = []
    model.register_forward_pre_hook(lambda *_: seen.append(model.config._attn_implementation))
    ids = torch.randint(3, 96, (1, 20), generator=torch.Generator().manual_seed(0))
    generate(model, ids, max_new_tokens=8)
    assert seen and set(seen) == {NAME}
    assert model.config._attn_implementation == "sdpa"
    assert all(layer.self_attn.config._attn_implementation == "sdpa" for layer in model.model.layers)


def test_the_model_is_set_back_after_an_error():
    """A call that fails inside the loop leaves the model's attention as it was."""
    model = tiny_model("qwen2")
    with pytest.raises(RuntimeError, match="boom"):
        with packed_attention(model):
            assert model.config._attn_implementation == NAME
            raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("arch,implementation", [("gpt_neox", "sdpa"), ("llama", "eager")])
def test_models_without_groups_or_sdpa_are_left_alone(arch, implementation):
    """A model without grouped-query heads, or one that runs another attention, keeps its own."""
    model = tiny_model(arch)
    model.set_attn_implementation(implementation)
    with packed_attention(model):
        assert model.config._attn_implementation == implementation
    assert model.config._attn_implementation == implementation


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "phi3", "gemma"])
@pytest.mark.parametrize("draft", ["chain", "tree"])
def test_grouped_query_models_stay_lossless(arch, draft):
    """Greedy output equals model.generate on grouped-query models, chains and trees, batches with padding."""
    from models import repeated_prompt

    model = tiny_model(arch)
    ids = torch.stack([repeated_prompt(s, 40) for s in range(2)])
    mask = torch.ones_like(ids)
    ids[1, :6], mask[1, :6] = 0, 0
    want = model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    got = generate(model, ids, attention_mask=mask, max_new_tokens=30, pad_token_id=0, lookup="suffix", draft=draft,
                   draft_cost=0)
    assert torch.equal(got, want)
