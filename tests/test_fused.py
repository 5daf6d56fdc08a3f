"""The fused step (`lookahead.fused`) takes the unfused loop's steps: the same tokens, drafts and forwards."""
import numpy as np
import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor, StoppingCriteriaList

from lookahead import Memory, generate, models
from lookahead.fused import FusedChains
from models import repeated_prompt, tiny_model


@pytest.fixture(scope="module")
def stories():
    """The bundled stories260K model (fp32): real text, whose greedy output copies long spans of itself."""
    return models.load(models.default_model_path())[0]


@pytest.fixture
def runs(monkeypatch):
    """Counts the fused loop's calls."""
    calls = []
    original = FusedChains.run_rows

    def counted(self, rows, outs):
        calls.append(len(rows.ids))
        return original(self, rows, outs)

    monkeypatch.setattr(FusedChains, "run_rows", counted)
    return calls


def _both(monkeypatch, model, ids, **kwargs) -> tuple:
    """((tokens, stats) fused, (tokens, stats) with the fused loop turned off)."""
    fused = generate(model, ids, return_stats=True, **kwargs)
    with monkeypatch.context() as m:
        m.setattr(FusedChains, "of", classmethod(lambda cls, *args: None))
        plain = generate(model, ids, return_stats=True, **kwargs)
    return fused, plain


def _same(fused, plain) -> None:
    (out, stats), (expected, expected_stats) = fused, plain
    assert torch.equal(out, expected)
    for name in ("forward_passes", "row_forwards", "draft_tokens", "accepted_tokens", "new_tokens_by_row",
                 "forwards_by_row"):
        assert getattr(stats, name) == getattr(expected_stats, name), name


def _story_batch(model, lengths=(0, 9, 23)) -> tuple:
    """A left-padded batch of a story's continuations cut at different points (rows finish at different steps)."""
    story = model.generate(torch.tensor([[1]]), do_sample=False, max_new_tokens=90)[0]
    rows = [torch.cat([story, story[1:40 - n]]) for n in lengths]
    return left_padded_rows(rows)


def left_padded_rows(rows: list) -> tuple:
    width = max(len(r) for r in rows)
    ids, mask = torch.zeros((len(rows), width), dtype=torch.long), torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    return ids, mask


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("kwargs", [dict(), dict(num_draft_tokens=3), dict(draft_cost=0.0), dict(max_ngram=2),
                                    dict(max_new_tokens=7), dict(draft_cost=(0.8, 0.08), num_draft_tokens=40)])
def test_fused_steps_are_the_unfused_steps(stories, monkeypatch, runs, cache, kwargs):
    """A batch of three real-text rows that finish at different steps: greedy's tokens, and the unfused loop's
    forwards, drafts and acceptances."""
    ids, mask = _story_batch(stories)
    kwargs = dict(max_new_tokens=60, cache_implementation=cache, attention_mask=mask) | kwargs
    fused, plain = _both(monkeypatch, stories, ids, **kwargs)
    expected = stories.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=kwargs["max_new_tokens"])
    assert torch.equal(plain[0], expected)
    _same(fused, plain)
    assert runs and runs[0] == 3


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("picks", [(25, 33), ()])
def test_an_eos_inside_an_accepted_draft_ends_the_row_there(stories, monkeypatch, cache, picks):
    """eos ids that the story reaches in the middle of copied spans: each row stops at the first one, as
    model.generate does, rows of one batch at different steps; with no eos id at all, every row runs to its limit."""
    ids, mask = _story_batch(stories)
    story = stories.generate(ids[:1], do_sample=False, max_new_tokens=40)[0, ids.shape[1]:].tolist()
    eos = [story[i] for i in picks]
    kwargs = dict(max_new_tokens=40, cache_implementation=cache, attention_mask=mask, eos_token_id=eos)
    fused, plain = _both(monkeypatch, stories, ids, **kwargs)
    expected = stories.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, eos_token_id=eos,
                                pad_token_id=eos[0] if eos else 0)
    assert torch.equal(fused[0], expected)
    _same(fused, plain)
    assert (min(fused[1].new_tokens_by_row) < 40) == bool(eos)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_indexes_that_grow_during_the_call(monkeypatch, arch):
    """A document and a prompt just short of an index's first capacity (1,024 tokens): a step finds no room, the
    kernels stop, the indexes grow, and the step goes on as the unfused loop's does."""
    model = tiny_model(arch)
    ids = repeated_prompt(1, 40)[None]
    document = torch.cat([repeated_prompt(2, 500), repeated_prompt(3, 478)]).numpy()
    kwargs = dict(max_new_tokens=40, cache_implementation="static", max_ngram=8, draft_cost=0.0, documents=[document])
    fused, plain = _both(monkeypatch, model, ids, **kwargs)
    assert torch.equal(fused[0], model.generate(ids, do_sample=False, max_new_tokens=40))
    _same(fused, plain)


def test_documents_and_memory_are_drafted_from(stories, monkeypatch, runs):
    """Rows whose indexes start from documents and a memory's earlier outputs (copies of its index); each loop gets
    a memory of its own, since a call adds to it."""
    ids, mask = _story_batch(stories, (0, 30))

    def memory():
        held = Memory()
        generate(stories, ids[:1, -20:], max_new_tokens=50, memory=held)
        return held

    kwargs = dict(max_new_tokens=50, attention_mask=mask, documents=[ids[0, -30:].numpy()])
    fused = generate(stories, ids, return_stats=True, memory=memory(), **kwargs)
    with monkeypatch.context() as m:
        m.setattr(FusedChains, "of", classmethod(lambda cls, *args: None))
        plain = generate(stories, ids, return_stats=True, memory=memory(), **kwargs)
    _same(fused, plain)
    assert runs


@pytest.mark.parametrize("kwargs", [
    dict(do_sample=True, generator=0), dict(lookup="suffix"), dict(lookup="suffix", draft="tree"),
    dict(lookup="none"), dict(num_draft_tokens=0), dict(repetition_penalty=1.2),
    dict(logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.1)])),
    dict(stopping_criteria=StoppingCriteriaList([lambda ids, scores, **kw: torch.zeros(len(ids), dtype=bool)])),
    dict(return_dict_in_generate=True, output_scores=True)])
def test_only_plain_greedy_chains_are_fused(stories, runs, kwargs):
    """Sampling, suffix indexes, trees, processors, criteria and recorded scores take the unfused loop."""
    generate(stories, torch.tensor([[1, 403, 407]]), max_new_tokens=8, **kwargs)
    assert not runs


def test_plain_calls_are_fused(stories, runs):
    """The default call and a static one run the fused loop."""
    for cache in ("static", "dynamic"):
        generate(stories, torch.tensor([[1, 403, 407]]), max_new_tokens=8, cache_implementation=cache)
    assert runs == [1, 1]


def test_draft_kernel_fills_what_the_step_computes():
    """The draft kernel's sizes against ChainSizing.draft's for random policies, matches and rooms."""
    from numba import typed

    from lookahead import _fused_kernels as K
    from lookahead.index import NgramIndex
    from lookahead.policy import _BUCKETS
    from lookahead.sizing import ChainSizing

    rng = np.random.default_rng(0)
    widths = (1, 2, 4, 8, 16, 32, 64)
    for trial in range(200):
        r, max_tokens, max_new = int(rng.integers(1, 5)), int(rng.integers(1, 40)), int(rng.integers(2, 60))
        sizing = ChainSizing(max_tokens, (0.8, 0.08) if trial % 2 else 0.02)
        sizing.length.accepted[:] = rng.uniform(0.1, 20, len(_BUCKETS))
        indexes = []
        for _ in range(r):
            ix = NgramIndex(int(rng.integers(1, 5)))
            ix.extend(rng.integers(0, 6, int(rng.integers(1, 80))))
            indexes.append(ix)
        lens = rng.integers(0, max_new, r)
        padded = (lambda n: 0) if trial % 7 == 0 else (lambda n: next(w for w in widths if w > n) - 1)
        expected = sizing.draft(indexes, max_new - 1 - lens, padded)
        drafts, ints = np.full((r, max_tokens), 7), [np.zeros(r, dtype=np.int64) for _ in range(3)]
        pads, policy = np.array([padded(n) for n in range(max_tokens + 1)]), sizing.length
        widest = K.draft(typed.List([ix._hist for ix in indexes]), typed.List([ix._state for ix in indexes]), lens,
                         max_new, max_tokens, pads, _BUCKETS, policy.accepted, policy.rejected, policy.version,
                         *policy.tables(r), drafts, *ints)
        assert ints[0].tolist() == [len(d) for d in expected]
        assert widest == max((len(d) for d in expected), default=0)
        for k, d in enumerate(expected):
            assert drafts[k, :len(d)].tolist() == d.tokens.tolist()
            assert not drafts[k, len(d):widest].any()
