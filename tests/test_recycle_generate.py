"""Recycling lookups in `generate`: greedy output equals `model.generate` (tiny random models of several
architectures, the bundled stories260K, batches with left padding, both caches, chains and trees, a memory across
calls); sampling is exact in law; the predictions learned are kept by a `Memory`."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead import Memory, generate
from models import repeated_prompt, tiny_model
from test_fused import left_padded_rows
from test_sampling import K, N, SAMPLING, V, case, chi_square_pvalue, histogram  # noqa: F401  (the fixture)

RECYCLING = [dict(lookup="recycle"), dict(lookup="suffix+recycle"), dict(lookup="recycle", draft="tree"),
             dict(lookup="suffix+recycle", draft="tree")]


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2", "gpt_neox"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("kind", RECYCLING)
def test_greedy_equals_model_generate_on_tiny_models(arch, cache, kind):
    """A left-padded batch of three rows (one repeating a span, so copies and recycled predictions mix), run to
    max_new_tokens; draft_cost 0 verifies whole budgets."""
    model = tiny_model(arch)
    ids, mask = left_padded_rows([repeated_prompt(1, 40), repeated_prompt(2, 9), repeated_prompt(3, 25)])
    expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40)
    for cost in (0.0, None):
        out = generate(model, ids, attention_mask=mask, max_new_tokens=40, cache_implementation=cache,
                       draft_cost=cost, **kind)
        assert torch.equal(out, expected), cost


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("kind", RECYCLING)
def test_greedy_equals_model_generate_on_stories(stories_model, cache, kind):
    """The real model, a batch of ragged rows, the memory kept across three calls (its predictions warm): every
    call equals greedy's, and the warm calls take fewer forwards than the first."""
    story = stories_model.generate(torch.tensor([[1]]), do_sample=False, max_new_tokens=60)[0]
    ids, mask = left_padded_rows([story[:30], story[:12], torch.tensor([1, 403, 407])])
    expected = stories_model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=60)
    memory, forwards = Memory(0), []
    for _ in range(3):
        out, stats = generate(stories_model, ids, attention_mask=mask, max_new_tokens=60, cache_implementation=cache,
                              draft_cost=0, memory=memory, return_stats=True, **kind)
        assert torch.equal(out, expected)
        forwards.append(stats.forward_passes)
    assert forwards[-1] < forwards[0]


def test_an_eos_inside_a_recycled_draft_ends_the_row(stories_model):
    """eos ids the output reaches mid-draft: each row stops at the first, as model.generate does."""
    story = stories_model.generate(torch.tensor([[1]]), do_sample=False, max_new_tokens=50)[0].tolist()
    eos = [story[20], story[35]]
    ids = torch.tensor([story[:6]])
    expected = stories_model.generate(ids, do_sample=False, max_new_tokens=50, eos_token_id=eos, pad_token_id=0)
    for kind in RECYCLING:
        out = generate(stories_model, ids, max_new_tokens=50, eos_token_id=eos, pad_token_id=0, draft_cost=0, **kind)
        assert torch.equal(out, expected), kind


def test_the_memory_learns_the_models_predictions(stories_model):
    """After a call the memory holds the model's predictions after the tokens it verified (M's rows filled), keyed
    by model and vocabulary."""
    memory = Memory(0)
    generate(stories_model, torch.tensor([[1, 403, 407]]), max_new_tokens=30, lookup="recycle", memory=memory)
    (key, table), = memory._recycled.items()
    assert key[1] == stories_model.config.vocab_size and (table.ids[:, 0] >= 0).sum() > 10
    assert len(memory) == 0


@pytest.mark.parametrize("kind", [dict(lookup="suffix+recycle", draft="tree"), dict(lookup="recycle")])
def test_sampling_is_exact_in_law(case, kind):
    """Joint law of the first 4 tokens under recycled drafts, trees and chains (see tests/test_sampling.py)."""
    model, prompt, probs = case
    counts, accepted = torch.zeros(V ** K, dtype=torch.double), 0
    memory = Memory(0)
    for seed in range(4):
        out, stats = generate(model, prompt.expand(N // 4, -1), max_new_tokens=K, generator=seed, draft_cost=0,
                              memory=memory, return_stats=True, **SAMPLING, **kind)
        counts += histogram(out, prompt.shape[1])
        accepted += stats.accepted_tokens
    assert counts[probs == 0].sum() == 0
    assert chi_square_pvalue(counts, probs) > 1e-3
    assert accepted > N / 8


def test_processors_and_recorded_scores_with_recycled_drafts(stories_model):
    """A repetition penalty (each column scored with its own prefix) and recorded scores over recycled trees."""
    ids = torch.tensor([[1, 403, 407, 300]])
    expected = stories_model.generate(ids, do_sample=False, max_new_tokens=30, repetition_penalty=1.3,
                                      return_dict_in_generate=True, output_scores=True)
    out = generate(stories_model, ids, max_new_tokens=30, repetition_penalty=1.3, return_dict_in_generate=True,
                   output_scores=True, lookup="suffix+recycle", draft="tree", draft_cost=0)
    assert torch.equal(out.sequences, expected.sequences)
    # a forward over several tokens rounds apart from one over one (fp32: about 2e-5 on these scores)
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(out.scores, expected.scores))


@pytest.mark.parametrize("kwargs, message", [
    (dict(draft="tree"), "draft='tree' needs lookup='suffix', 'recycle' or 'suffix\\+recycle'"),
    (dict(lookup="recycled"), "lookup must be one of 'ngram', 'suffix', 'recycle', 'suffix\\+recycle', 'none'"),
])
def test_bad_lookups_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(tiny_model("llama"), torch.tensor([[1, 2, 3]]), **kwargs)


def test_encoder_decoders_draft_recycled_chains():
    """BART and T5 (chains only): recycled drafts, alone and merged, give greedy's tokens."""
    from test_seq2seq import tiny_bart, tiny_t5

    for make in (tiny_bart, tiny_t5):
        model = make()
        ids = torch.randint(3, 90, (2, 20), generator=torch.Generator().manual_seed(0))
        expected = model.generate(ids, do_sample=False, max_new_tokens=20)
        for lookup in ("recycle", "suffix+recycle"):
            assert torch.equal(generate(model, ids, lookup=lookup, max_new_tokens=20, draft_cost=0), expected)


def test_top_k_gives_the_distributions_head():
    """`recycling.top_k`: the k most likely tokens after each column and their softmax probabilities."""
    from lookahead.decode.recycling import top_k

    logits = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(0))
    ids, probs = top_k(logits, 4)
    want = torch.softmax(logits, -1).topk(4, -1)
    assert torch.equal(ids, want.indices) and torch.allclose(probs, want.values)
    assert top_k(logits[..., :3], 4)[0].shape == (2, 3, 3)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 700), st.integers(1, 12), st.integers(0, 2**31 - 1), st.booleans())
def test_chunked_topk_finds_torch_topk(rows, vocab, k, seed, ties):
    """`chunked_topk` over chunks of 16 gives torch.topk's values, largest first, and ids that hold them (ties
    included: logits drawn from a few values), at any vocabulary and k (more than the chunks: torch's own)."""
    from lookahead.decode.recycling import chunked_topk

    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, 4, (rows, 2, vocab), generator=g).float() if ties else \
        torch.randn(rows, 2, vocab, generator=g)
    k = min(k, vocab)
    values, ids = chunked_topk(logits, k, chunk=16)
    want = logits.topk(k, dim=-1)
    assert torch.equal(values, want.values)
    assert torch.equal(logits.gather(-1, ids), values)
    assert all(len(set(r)) == k for r in ids.reshape(-1, k).tolist())  # k distinct tokens
    if not ties:
        assert torch.equal(ids, want.indices)


def test_top_k_on_a_large_vocabulary_takes_the_chunked_path():
    """Over 49,152 tokens (SmolLM2's) `top_k` gives the same head as softmax + topk, bf16 included."""
    from lookahead.decode.recycling import top_k

    logits = torch.randn(1, 9, 49152, generator=torch.Generator().manual_seed(1))
    for dtype in (torch.float32, torch.bfloat16):
        ids, probs = top_k(logits.to(dtype), 8)
        want = torch.softmax(logits.to(dtype).float(), -1).topk(8, -1)
        assert torch.equal(probs, probs.sort(-1, descending=True).values)
        assert torch.allclose(probs, want.values, rtol=1e-5)
        if dtype == torch.float32:
            assert torch.equal(ids, want.indices)
