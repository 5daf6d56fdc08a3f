"""Sparse attention whose indexer picks the keys (DeepSeek-V3.2's DSA and its kin): each query of a verification forward
picks what it picks decoding alone (`lookahead.model.indexer`), drafts partly accepted and rejected give
model.generate's tokens through chains, trees, the static cache, batches and the server, and the indexer's keys follow
every change of the cache's slots."""
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import families as F
import lookahead
from lookahead.model.indexer import decoding_order, indexers, pick_alone
from test_recurrent import corrupted

FAMILIES = ["deepseek_v32", "glm_moe_dsa", "hy_v4", "axk2"]


def _model(name):
    if name not in F.causal_types():
        pytest.skip(f"transformers has no {name}")
    return F.tiny_model(name)


def _alone(scores: torch.Tensor, visible: torch.Tensor, k: int) -> list:
    """Per (row, query), the set of keys a top k over just its visible keys picks (decoding alone)."""
    picks = []
    for row in range(scores.shape[0]):
        for q in range(scores.shape[1]):
            keys = visible[row, q].nonzero()[:, 0]
            top = torch.topk(scores[row, q, keys][None, None], min(k, len(keys)), dim=-1).indices[0, 0]
            picks.append(set(keys[top].tolist()))
    return picks


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(2, 6), st.integers(1, 12), st.integers(1, 10), st.integers(0, 2**31 - 1))
def test_each_query_picks_from_the_keys_it_sees_alone(rows, queries, cached, k, seed):
    """For index scores [b, S, T] with many exact ties (ReLU zeros) and keys masked by left padding and causality,
    each query's picks are a top k over its own visible keys (as decoding alone ranks them), then keys it cannot see
    where it sees fewer than k; a row whose queries see everything gets torch's own top k."""
    g = torch.Generator().manual_seed(seed)
    t = cached + queries
    scores = torch.relu(torch.randn((rows, queries, t), generator=g)).round(decimals=1)  # ties: zeros and repeats
    pads = torch.randint(0, cached, (rows,), generator=g)
    key = torch.arange(t)
    visible = (key[None, None] >= pads[:, None, None]) & (key[None, None] <= cached + torch.arange(queries)[None, :, None])
    masked = scores.masked_fill(~visible, float("-inf"))
    k = min(k, t)
    values, picked = pick_alone(masked, k)
    assert picked.shape == (rows, queries, k) and torch.equal(values, masked.gather(-1, picked))
    want = _alone(masked, visible, k)
    for i, (row, q) in enumerate((r, q) for r in range(rows) for q in range(queries)):
        n = int(visible[row, q].sum())
        mine = picked[row, q].tolist()
        assert set(mine[:min(k, n)]) == want[i]
        assert not any(visible[row, q, mine[min(k, n):]])  # the filler: keys the query does not see
        assert len(set(mine)) == k


@pytest.mark.parametrize("cached", [1, 3, 5])
def test_a_step_whose_last_columns_are_padding_is_no_prefill(cached):
    """A verification step padded to a wider width (the static cache's 64 columns): its padding columns see the
    committed keys and themselves, fewer keys than the step has queries, as a prefill's last query would; each
    query still picks from its own keys, not from what the padding column sees."""
    g = torch.Generator().manual_seed(cached)
    chain, queries = 4, 8
    t = cached + queries
    key, q = torch.arange(t), torch.arange(queries)[:, None]
    column = key[None, :] - cached  # the step column of each key (negative: committed)
    visible = (column < 0) | ((column <= q) & (q < chain)) | (column == q)  # [S, T] chain causal, padding alone
    scores = torch.relu(torch.randn((1, queries, t), generator=g)).round(decimals=1)
    masked = scores.masked_fill(~visible[None], float("-inf"))
    picked = pick_alone(masked, 2).indices
    want = _alone(masked, visible[None], 2)
    assert [set(picked[0, i].tolist()) for i in range(queries)] == want


def test_an_unmasked_forward_is_torchs_own_top_k():
    scores = torch.relu(torch.randn(2, 3, 9))
    assert torch.equal(pick_alone(scores, 4).indices, torch.topk(scores, 4, dim=-1).indices)


@pytest.mark.parametrize("name", FAMILIES)
def test_partly_accepted_drafts_give_generate_tokens(name):
    """Drafts from a document that agrees with greedy's output except at every fifth token are accepted up to the
    change and rejected there, as chains and as trees, in the dynamic cache and the static one: the rejected tokens'
    indexer keys leave with them, and the tokens are model.generate's."""
    model = _model(name)
    ids = F.prompt()
    want = F.reference(model, ids)
    for kwargs in ({}, {"lookup": "suffix", "draft": "tree"}, {"cache_implementation": "static"},
                   {"cache_implementation": "static", "num_draft_tokens": 40}):  # 64 columns, 23 of them padding
        out, stats = lookahead.generate(model, ids, documents=[corrupted(want)], draft_cost=0, max_new_tokens=F.NEW,
                                        min_new_tokens=F.NEW, return_stats=True, **kwargs)
        assert out[0, ids.shape[1]:].tolist() == want.tolist(), kwargs
        assert stats.accepted_tokens >= F.NEW // 3 and stats.draft_tokens - stats.accepted_tokens >= 4, kwargs


def test_a_padded_batch_picks_each_rows_keys_as_the_row_alone():
    """Rows of different lengths, left-padded, each get the tokens of their prompt alone (the padding is no key the
    indexer ranks), also where a row's drafts are rejected."""
    model = _model("deepseek_v32")
    ids, mask = F.padded_batch()
    rows = [ids[0:1], ids[1:2, 10:]]
    wants = [F.reference(model, row) for row in rows]
    out = lookahead.generate(model, ids, attention_mask=mask, documents=[corrupted(w) for w in wants], draft_cost=0,
                             max_new_tokens=F.NEW, min_new_tokens=F.NEW)
    assert [out[i, ids.shape[1]:].tolist() for i in range(2)] == [w.tolist() for w in wants]


def test_the_indexers_get_their_forward_back():
    """Blocks nest (a cost curve measured inside a call): each end gives the indexers the forward they had."""
    model = _model("deepseek_v32")
    found = indexers(model)
    assert found and all("forward" not in m.__dict__ for m in found)
    with decoding_order(model):
        outer = [m.forward for m in found]
        with decoding_order(model):
            assert [m.forward for m in found] != outer
        assert [m.forward for m in found] == outer
    assert all("forward" not in m.__dict__ for m in found)


def test_served_rows_pick_their_keys_on_their_own():
    """Three requests joining one batch a step apart, each drafting from a prediction wrong at every fifth token,
    decode to model.generate's tokens: joined rows keep their indexer keys, padded like their other keys."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_serve import served_family

    served_family("deepseek_v32")


V4 = {"compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}}  # windows that close
# within a step (the tiny default folds every 128 tokens for its HCA layer)


def _v4(extra=None):
    if "deepseek_v4" not in F.causal_types():
        pytest.skip("transformers has no deepseek_v4")
    return F.build("deepseek_v4", extra) if extra else F.tiny_model("deepseek_v4")


@pytest.mark.parametrize("prompt_length", [12, 33, 36, 37, 41])
def test_compressed_attention_over_several_tokens_continues_a_cached_state(prompt_length):
    """DeepSeek-V4 (compressed attention): inside `decoding_order`, a forward over six tokens from a cached prompt
    gives the logits six one-token forwards give (its indexer's top k, over entries later tokens close, breaks ReLU
    ties otherwise: 1.03 apart at one position after 36 tokens, checked)."""
    from transformers import DynamicCache

    model = _v4(V4)
    ids, more = F.prompt(length=48)[:, :prompt_length], F.prompt(length=48, seed=1)[:, :6]
    positions = torch.arange(prompt_length, prompt_length + 6)[None]
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(ids, cache=cache, use_cache=True)
        with decoding_order(model):
            many = model(more, cache=cache, use_cache=True, position_ids=positions).logits[0]
        cache = DynamicCache(config=model.config)
        model(ids, cache=cache, use_cache=True)
        one = torch.cat([model(more[:, i:i + 1], cache=cache, use_cache=True, position_ids=positions[:, i:i + 1]).logits[0]
                         for i in range(6)])
    torch.testing.assert_close(many, one, rtol=0, atol=1e-4)  # fp32 sums in another order; a tie broken: ~1


@pytest.mark.parametrize("extra", [None, V4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compressed_attention_follows_the_accepted_path(extra, seed):
    """Drafts from a document that agrees with greedy's output except at every fifth token: partly accepted,
    rejected after, and the tokens are model.generate's, with no fallback (each compressed layer's window, buffers,
    entries and overlap set back and refolded over the kept tokens: without it, or with the window alone set back,
    none of these three equal greedy's, checked)."""
    model = _v4(extra)
    ids = F.prompt(seed=seed)
    want = F.reference(model, ids)
    out, stats = lookahead.generate(model, ids, documents=[corrupted(want)], draft_cost=0, max_new_tokens=F.NEW,
                                    min_new_tokens=F.NEW, return_stats=True)
    assert out[0, ids.shape[1]:].tolist() == want.tolist()
    assert stats.fallback is None and stats.accepted_tokens >= F.NEW // 3
    assert stats.draft_tokens - stats.accepted_tokens >= 4


@pytest.mark.parametrize("kwargs, message", [
    ({"lookup": "suffix", "draft": "tree"}, r"draft='tree' is not supported for .*: its compressed attention"),
    ({"cache_implementation": "static"}, r"cache_implementation='static' is not supported for .*: its compressed"),
])
def test_what_compressed_attention_cannot_take_is_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        lookahead.generate(_v4(), F.prompt(), max_new_tokens=8, **kwargs)
