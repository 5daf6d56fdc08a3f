"""Sampling: lookahead's tokens are distributed exactly as the target's own samples, jointly over the first tokens."""
import importlib

import numpy as np
import pytest
import torch
import transformers as T

import lookahead
from lookahead.verify import sample_accept, tree

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


def lookahead_samples(model, prompt, **kwargs):
    counts, stats = torch.zeros(V ** K, dtype=torch.double), []
    for seed in range(4):
        out, st = lookahead.generate(model, prompt.expand(N // 4, -1), max_new_tokens=K, generator=seed,
                                     draft_cost=0, return_stats=True, **SAMPLING, **kwargs)
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
    monkeypatch.setattr(importlib.import_module("lookahead.verify.rules"), "sample_accept", rule)
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


# Tree sampling. A fixed table of distributions, one per tree column; the law of what one step emits (the accepted
# path, then the bonus token) must be the target's own sampling down the tree, stopped at the first token off it.
TREE_V, TREE_N = 6, 20000
TREES = {  # (tokens, parents); "duplicate" repeats a sibling's token: only the first copy's subtree can be taken
    "siblings": (np.array([1, 0, 5, 2, 3, 4]), np.array([-1, -1, -1, 0, 0, 3])),
    "duplicate": (np.array([2, 2, 3, 1]), np.array([-1, -1, -1, 1])),
}


def column_probs(n_columns: int) -> np.ndarray:
    """[n_columns, TREE_V]: the root's and first child's distributions set by hand (the root gives its third child
    no mass), the others random."""
    probs = np.random.default_rng(0).random((n_columns, TREE_V)) ** 2
    probs[0] = [0.25, 0.3, 0.2, 0.15, 0.1, 0.0]
    probs[1] = [0.1, 0.1, 0.35, 0.3, 0.15, 0.0]
    return probs / probs.sum(-1, keepdims=True)


def step_law(tokens: np.ndarray, parents: np.ndarray, probs: np.ndarray, col: int = 0) -> dict:
    """P(a step emits seq) for every seq: sample x from the column; go on below the first child holding x, if any."""
    child = {}
    for j in np.flatnonzero(parents == col - 1):
        child.setdefault(int(tokens[j]), int(j))
    law = {}
    for x in np.flatnonzero(probs[col]):
        below = step_law(tokens, parents, probs, 1 + child[x]) if x in child else {(): 1.0}
        law.update({(int(x),) + seq: probs[col, x] * q for seq, q in below.items()})
    return law


def naive_tree_sample(tokens, parents, probs: np.ndarray, rng, divide=True, remove=True) -> tuple:
    """Plain-Python walk of one tree: (accepted nodes, bonus token). Wrong variants: divide=False accepts child x
    with p(x) instead of p(x) / m; remove=False samples the bonus token with the rejected children still in p."""
    path, col = [], 0
    while True:
        m, q = 1.0, probs[col].copy()
        for j in np.flatnonzero(parents == col - 1):
            if rng.random() * (m if divide else 1.0) < probs[col, tokens[j]]:
                break
            m -= probs[col, tokens[j]]
            q[tokens[j]] = 0.0 if remove else q[tokens[j]]
        else:
            return path, int(rng.choice(len(q), p=q / q.sum()))
        path.append(int(j))
        col = 1 + int(j)


def emitted(tokens: np.ndarray, path: list, bonus) -> tuple:
    return tuple(int(t) for t in tokens[path]) + (int(bonus),)


def law_pvalue(samples: list, law: dict) -> float:
    """Chi-square p-value of one-step samples against the exact law (0 when a sample is outside its support)."""
    cells = {seq: i for i, seq in enumerate(law)}
    counts = torch.zeros(len(cells) + 1, dtype=torch.double)
    for seq in samples:
        counts[cells.get(seq, len(cells))] += 1
    if counts[-1]:
        return 0.0
    return chi_square_pvalue(counts[:-1], torch.tensor(list(law.values())))


@pytest.mark.parametrize("name", sorted(TREES))
def test_sample_tree_accept_emits_the_target_law(name):
    """20000 rows of one tree: the joint law of the emitted tokens (up to 4) is sampling from the table."""
    tokens, parents = TREES[name]
    probs = column_probs(len(tokens) + 1)
    packed = tree.pack_trees([(tokens, parents)] * TREE_N)
    table = torch.from_numpy(probs).float().expand(TREE_N, -1, -1)
    paths, bonus = tree.sample_tree_accept(*packed, table, torch.Generator().manual_seed(0))
    samples = [emitted(tokens, p, x) for p, x in zip(paths, bonus)]
    assert law_pvalue(samples, step_law(tokens, parents, probs)) > 1e-3
    took = {p[0] for p in paths if p}
    assert took == ({0, 1} if name == "siblings" else {0, 2})  # never the massless child, never the second copy


@pytest.mark.parametrize("divide, remove, exact", [(True, True, True), (False, True, False), (True, False, False)])
def test_the_tree_law_test_catches_wrong_rules(divide, remove, exact):
    """The plain walk passes; accepting with p(x) rather than p(x) / m, or keeping rejected siblings in the bonus
    distribution, fails."""
    tokens, parents = TREES["siblings"]
    probs, rng = column_probs(len(tokens) + 1), np.random.default_rng(1)
    samples = [emitted(tokens, *naive_tree_sample(tokens, parents, probs, rng, divide, remove)) for _ in range(TREE_N)]
    p_value = law_pvalue(samples, step_law(tokens, parents, probs))
    assert p_value > 1e-3 if exact else p_value < 1e-6


def test_sample_tree_accept_edge_cases():
    """p(x) = 0 never accepts, p(x) = 1 always does, and rejected siblings are never the bonus token."""
    probs = torch.zeros(2000, 5, 4)
    probs[:, 0] = torch.tensor([0.0, 0.5, 0.3, 0.2])  # root: children 0 (impossible), 1, 2
    probs[:, 2] = torch.tensor([0.0, 0.0, 0.0, 1.0])  # after node 1: its child 3 is certain
    probs[:, 3:] = 0.25
    packed = tree.pack_trees([(np.array([0, 1, 2, 3]), np.array([-1, -1, -1, 1]))] * 2000)
    paths, bonus = tree.sample_tree_accept(*packed, probs, torch.Generator().manual_seed(0))
    starts = np.array([p[0] if p else -1 for p in paths])
    assert set(starts.tolist()) == {-1, 1, 2}
    assert all(p == [1, 3] for p in paths if p and p[0] == 1)
    assert (bonus[starts == -1] == 3).all()
    assert abs((starts == -1).mean() - 0.2) < 0.03 and abs((starts == 1).mean() - 0.5) < 0.04


def test_tree_drafts_sample_the_target_distribution(case, monkeypatch):
    """draft='tree' with do_sample: the joint law of the first 4 tokens matches, with later siblings accepted."""
    model, prompt, probs = case
    later_siblings, rule = [], tree.sample_tree_accept

    def counting(tokens, parents, sizes, p, generator=None):
        paths, bonus = rule(tokens, parents, sizes, p, generator)
        later_siblings.extend(int((parents[i, :j] == parents[i, j]).any()) for i, path in enumerate(paths)
                              for j in path)
        return paths, bonus

    monkeypatch.setattr(tree, "sample_tree_accept", counting)
    counts, stats = lookahead_samples(model, prompt, lookup="suffix", draft="tree")
    assert counts[probs == 0].sum() == 0
    assert chi_square_pvalue(counts, probs) > 1e-3
    accepted, drafted = sum(s.accepted_tokens for s in stats), sum(s.draft_tokens for s in stats)
    assert accepted > N / 8 and drafted - accepted > N / 8 and sum(later_siblings) > N / 20


def test_tree_drafts_with_a_wrong_rule_are_caught(case, monkeypatch):
    """The end-to-end test sees a tree rule that samples the bonus token with the rejected children still in p."""
    model, prompt, probs = case
    rng = np.random.default_rng(0)

    def keep_rejected(tokens, parents, sizes, p, generator=None):
        walks = [naive_tree_sample(tokens[i, :n], parents[i, :n], p[i].double().numpy(), rng, remove=False)
                 for i, n in enumerate(sizes)]
        return [w[0] for w in walks], np.array([w[1] for w in walks])

    monkeypatch.setattr(tree, "sample_tree_accept", keep_rejected)
    counts, _ = lookahead_samples(model, prompt, lookup="suffix", draft="tree")
    assert chi_square_pvalue(counts, probs) < 1e-6
