"""Sampling: lookahead's tokens are distributed exactly as the target's own samples, jointly over the first tokens."""
import importlib

import numpy as np
import pytest
import torch
import transformers as T

import lookahead
from lookahead.verify import sample_accept

V, K, N = 8, 4, 4000  # vocabulary, tokens whose joint law is compared, samples
SAMPLING = dict(do_sample=True, temperature=1.2, top_k=3, repetition_penalty=1.2)
PROCESSORS = T.LogitsProcessorList([T.RepetitionPenaltyLogitsProcessor(1.2), T.TemperatureLogitsWarper(1.2),
                                    T.TopKLogitsWarper(3)])  # what model.generate builds from SAMPLING, in order


@pytest.fixture(scope="module")
def case():
    """A tiny-vocabulary model and a prompt whose repeated span makes the index draft tokens the model likes."""
    config = T.LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                           bos_token_id=None, eos_token_id=None, pad_token_id=None, initializer_range=0.5)
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(config).eval()
    base = torch.tensor([[3, 1, 4, 1, 5, 2]])
    prompt = torch.cat([model.generate(base, do_sample=False, max_new_tokens=6), base], dim=1)
    return model, prompt, exact_joint(model, prompt)


def exact_joint(model, prompt) -> torch.Tensor:
    """P(first K tokens = s) for every s in V^K (index s[0]*V^(K-1) + ...), from the processed distributions."""
    seqs = torch.cartesian_prod(*[torch.arange(V)] * K)  # [V^K, K]
    ids = torch.cat([prompt.expand(len(seqs), -1), seqs], dim=1)
    p = prompt.shape[1]
    with torch.no_grad():
        logits = model(ids).logits[:, p - 1: p - 1 + K].float()
    logp = torch.zeros(len(seqs))
    for j in range(K):
        scores = PROCESSORS(ids[:, : p + j], logits[:, j].clone())
        logp += torch.log_softmax(scores, -1).gather(1, seqs[:, j:j + 1])[:, 0]
    return logp.exp()


def histogram(sequences: torch.Tensor, prompt_len: int) -> torch.Tensor:
    new = sequences[:, prompt_len: prompt_len + K]
    codes = (new * V ** torch.arange(K - 1, -1, -1)).sum(1)
    return torch.bincount(codes, minlength=V ** K).double()


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test of counts against probs, cells expecting fewer than 5 samples pooled into one."""
    expected = probs.double() * counts.sum()
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    stat = ((obs - exp) ** 2 / exp.clamp_min(1e-12)).sum()
    return float(torch.special.gammaincc(torch.tensor((len(obs) - 1) / 2), stat / 2))


def lookahead_samples(model, prompt):
    counts, stats = torch.zeros(V ** K, dtype=torch.double), []
    for seed in range(4):
        out, st = lookahead.generate(model, prompt.expand(N // 4, -1), max_new_tokens=K, generator=seed,
                                     draft_cost=0, return_stats=True, **SAMPLING)
        counts += histogram(out, prompt.shape[1])
        stats.append(st)
    return counts, stats


def test_exact_joint_is_what_model_generate_samples(case):
    """The reference distribution is the one transformers' own sampler draws from (guards the reference itself)."""
    model, prompt, probs = case
    torch.manual_seed(0)
    out = model.generate(prompt.expand(N, -1), max_new_tokens=K, **SAMPLING)
    assert chi_square_pvalue(histogram(out, prompt.shape[1]), probs) > 1e-3


def test_lookahead_samples_the_target_distribution(case):
    """Joint law of the first 4 tokens (81 possible sequences) matches, while many drafts are accepted and rejected."""
    model, prompt, probs = case
    counts, stats = lookahead_samples(model, prompt)
    assert counts[probs == 0].sum() == 0
    assert chi_square_pvalue(counts, probs) > 1e-3
    accepted, drafted = sum(s.accepted_tokens for s in stats), sum(s.draft_tokens for s in stats)
    assert accepted > N / 8 and drafted - accepted > N / 8


def always_accept(drafts, lens, probs, generator=None):
    """Wrong: keeps every draft token."""
    nxt = torch.multinomial(probs[torch.arange(len(lens)), torch.from_numpy(lens)], 1, generator=generator)[:, 0]
    return lens.copy(), nxt.numpy()


def resample_from_p(drafts, lens, probs, generator=None):
    """Wrong: accepts with p(x), but after a rejection samples from p with the rejected x still in it."""
    d = drafts.shape[1]
    x = torch.from_numpy(drafts)
    u = torch.rand(x.shape, generator=generator)
    ok = (u < probs[:, :d].gather(-1, x[..., None])[..., 0]) & (torch.arange(d) < torch.from_numpy(lens)[:, None])
    accepted = ok.long().cumprod(1).sum(1)
    nxt = torch.multinomial(probs[torch.arange(len(lens)), accepted], 1, generator=generator)[:, 0]
    return accepted.numpy(), nxt.numpy()


@pytest.mark.parametrize("rule", [always_accept, resample_from_p])
def test_a_wrong_rule_is_caught(case, monkeypatch, rule):
    """The test has the power to see a broken acceptance rule."""
    model, prompt, probs = case
    monkeypatch.setattr(importlib.import_module("lookahead.generate"), "sample_accept", rule)
    counts, _ = lookahead_samples(model, prompt)
    assert chi_square_pvalue(counts, probs) < 1e-6


def test_sample_accept_edge_cases():
    """p(x) = 1 always accepts, p(x) = 0 never does and x is never emitted, all accepted samples the bonus token."""
    g = torch.Generator().manual_seed(0)
    probs = torch.zeros(2000, 3, 4)
    probs[:, 0] = torch.tensor([0.0, 0.5, 0.5, 0.0])  # draft 0 impossible
    probs[:, 1] = torch.tensor([0.0, 0.0, 1.0, 0.0])
    probs[:, 2] = torch.tensor([0.0, 0.0, 0.0, 1.0])
    drafts = np.tile([[0, 2]], (2000, 1))
    a, nxt = sample_accept(drafts, np.full(2000, 2), probs, g)
    assert (a == 0).all() and set(nxt.tolist()) == {1, 2}
    drafts[:, 0] = 1
    a, nxt = sample_accept(drafts, np.full(2000, 2), probs, g)
    assert set(a.tolist()) == {0, 2} and ((a == 2) == (nxt == 3)).all()
    assert abs((a == 2).mean() - 0.5) < 0.05
