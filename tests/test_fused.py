"""The fused steps (`lookahead.decode.fused`) take the unfused loop's steps: the same tokens, drafts and forwards."""
import sys

import numpy as np
import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor, StoppingCriteriaList

from lookahead import Memory, generate, models
from lookahead.decode import fused
from models import repeated_prompt, tiny_model


@pytest.fixture(scope="module")
def stories():
    """The bundled stories260K model (fp32): real text, whose greedy output copies long spans of itself."""
    return models.load(models.default_model_path())[0]


@pytest.fixture
def runs(monkeypatch):
    """Counts the fused loops' calls, by kind."""
    calls = []
    original = fused._Fused.run_rows

    def counted(self, rows, outs, *prefill):
        calls.append((type(self).__name__, len(rows.ids)))
        return original(self, rows, outs, *prefill)

    monkeypatch.setattr(fused._Fused, "run_rows", counted)
    return calls


def _both(monkeypatch, model, ids, **kwargs) -> tuple:
    """((tokens, stats) fused, (tokens, stats) with the fused loop turned off)."""
    fused = generate(model, ids, return_stats=True, **kwargs)
    with monkeypatch.context() as m:
        m.setattr(sys.modules["lookahead.decode.loop"], "fused_loop", lambda *args: None)
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


TREES, SUFFIX = dict(lookup="suffix", draft="tree"), dict(lookup="suffix")
MERGED = dict(lookup="suffix+recycle", draft="tree")
KINDS = {(None, None): "FusedChains", ("suffix", None): "FusedSuffixChains", ("suffix", "tree"): "FusedTrees",
         ("suffix+recycle", "tree"): "FusedRecycleTrees"}


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("kwargs", [dict(), dict(num_draft_tokens=3), dict(draft_cost=0.0), dict(max_ngram=2),
                                    dict(max_new_tokens=7), dict(draft_cost=(0.8, 0.08), num_draft_tokens=40),
                                    TREES, dict(TREES, max_draft_nodes=5), dict(TREES, draft_cost=0.0),
                                    dict(TREES, max_new_tokens=7), dict(TREES, draft_cost=(0.8, 0.08)),
                                    SUFFIX, dict(SUFFIX, num_draft_tokens=3), dict(SUFFIX, draft_cost=0.0),
                                    MERGED, dict(MERGED, max_draft_nodes=5), dict(MERGED, draft_cost=0.0),
                                    dict(MERGED, draft_cost=(0.8, 0.08))])
def test_fused_steps_are_the_unfused_steps(stories, monkeypatch, runs, cache, kwargs):
    """A batch of three real-text rows that finish at different steps, chains and trees: greedy's tokens, and the
    unfused loop's forwards, drafts and acceptances."""
    ids, mask = _story_batch(stories)
    kwargs = dict(max_new_tokens=60, cache_implementation=cache, attention_mask=mask) | kwargs
    fused, plain = _both(monkeypatch, stories, ids, **kwargs)
    expected = stories.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=kwargs["max_new_tokens"])
    assert torch.equal(plain[0], expected)
    _same(fused, plain)
    assert runs and runs[0] == (KINDS[kwargs.get("lookup"), kwargs.get("draft")], 3)


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("picks", [(25, 33), ()])
@pytest.mark.parametrize("kind", [{}, SUFFIX, TREES, MERGED])
def test_an_eos_inside_an_accepted_draft_ends_the_row_there(stories, monkeypatch, cache, picks, kind):
    """eos ids that the story reaches in the middle of copied spans: each row stops at the first one, as
    model.generate does, rows of one batch at different steps; with no eos id at all, every row runs to its limit."""
    ids, mask = _story_batch(stories)
    story = stories.generate(ids[:1], do_sample=False, max_new_tokens=40)[0, ids.shape[1]:].tolist()
    eos = [story[i] for i in picks]
    kwargs = dict(max_new_tokens=40, cache_implementation=cache, attention_mask=mask, eos_token_id=eos, **kind)
    fused, plain = _both(monkeypatch, stories, ids, **kwargs)
    expected = stories.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, eos_token_id=eos,
                                pad_token_id=eos[0] if eos else 0)
    assert torch.equal(fused[0], expected)
    _same(fused, plain)
    assert (min(fused[1].new_tokens_by_row) < 40) == bool(eos)


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("kind", [{}, SUFFIX, TREES, MERGED])
@pytest.mark.parametrize("limit", [1, 2])
def test_the_prefills_token_is_taken_by_the_fused_step(stories, monkeypatch, runs, cache, kind, limit):
    """The fused loop takes each row's first token, the prefill's: a row whose first token is an eos id, or whose
    limit is one token, is done there (the fused loop's first call returns it), as in the unfused loop."""
    ids, mask = _story_batch(stories)
    first = stories.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=1)[:, -1].tolist()
    eos = [first[1]] if first[1] not in (first[0], first[2]) else []
    kwargs = dict(max_new_tokens=limit, cache_implementation=cache, attention_mask=mask, eos_token_id=eos, **kind)
    fused, plain = _both(monkeypatch, stories, ids, **kwargs)
    expected = stories.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=limit, eos_token_id=eos,
                                pad_token_id=eos[0] if eos else 0)
    assert eos and torch.equal(fused[0], expected)
    _same(fused, plain)
    assert fused[1].new_tokens_by_row[1] == 1 and fused[1].forwards_by_row[1] == 1
    assert runs[0] == (KINDS[kind.get("lookup"), kind.get("draft")], 3)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("kind", [{}, SUFFIX, TREES, MERGED])
def test_indexes_that_grow_during_the_call(monkeypatch, arch, kind):
    """A document and a prompt just short of an index's first capacity (1,024 tokens): a step finds no room, the
    kernels stop, the indexes grow, and the step goes on as the unfused loop's does."""
    model = tiny_model(arch)
    ids = repeated_prompt(1, 40)[None]
    document = torch.cat([repeated_prompt(2, 500), repeated_prompt(3, 478)]).numpy()
    kwargs = dict(max_new_tokens=40, cache_implementation="static", max_ngram=8, draft_cost=0.0, documents=[document],
                  **kind)
    fused, plain = _both(monkeypatch, model, ids, **kwargs)
    assert torch.equal(fused[0], model.generate(ids, do_sample=False, max_new_tokens=40))
    _same(fused, plain)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_fused_trees_pack_paths_off_the_first_one(stories, monkeypatch, cache):
    """A story whose tree steps accept the first nodes in order (committed as a chain: nothing moves) and other
    branches (their paths packed): both kinds in the fused loop, and greedy's tokens."""
    kinds, verdict = [], fused.FusedTrees._verdict

    def recorded(self, batch, s):
        out = verdict(self, batch, s)
        kinds.append(out.in_place)
        return out

    monkeypatch.setattr(fused.FusedTrees, "_verdict", recorded)
    story = stories.generate(torch.tensor([[1]]), do_sample=False, max_new_tokens=80)
    prompt = torch.cat([story, story[:, 1:30]], dim=1)
    expected = stories.generate(prompt, do_sample=False, max_new_tokens=100)
    # draft_cost=0 verifies whole trees: which steps take an off-first path does not hang on a measured cost curve
    out = generate(stories, prompt, max_new_tokens=100, cache_implementation=cache, draft_cost=0.0, **TREES)
    assert torch.equal(out, expected)
    assert True in kinds and False in kinds


@pytest.mark.parametrize("kind", [{}, SUFFIX, TREES, MERGED])
def test_documents_and_memory_are_drafted_from(stories, monkeypatch, runs, kind):
    """Rows whose indexes start from documents and a memory's earlier outputs (copies of its index; for merged
    trees its predictions too); each loop gets a memory of its own, since a call adds to it."""
    ids, mask = _story_batch(stories, (0, 30))

    kwargs = dict(max_new_tokens=50, attention_mask=mask, documents=[ids[0, -30:].numpy()], **kind)

    def memory():
        held = Memory()
        generate(stories, ids[:1, -20:], max_new_tokens=50, memory=held, lookup=kwargs.get("lookup", "ngram"))
        return held

    fused = generate(stories, ids, return_stats=True, memory=memory(), **kwargs)
    with monkeypatch.context() as m:
        m.setattr(sys.modules["lookahead.decode.loop"], "fused_loop", lambda *args: None)
        plain = generate(stories, ids, return_stats=True, memory=memory(), **kwargs)
    _same(fused, plain)
    assert runs


@pytest.mark.parametrize("kwargs", [
    dict(do_sample=True, generator=0), dict(SUFFIX, do_sample=True, generator=0),
    dict(TREES, do_sample=True, generator=0), dict(TREES, repetition_penalty=1.2), dict(lookup="none"),
    dict(num_draft_tokens=0), dict(repetition_penalty=1.2), dict(MERGED, do_sample=True, generator=0),
    dict(lookup="recycle", draft="tree"), dict(lookup="suffix+recycle"),
    dict(logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.1)])),
    dict(stopping_criteria=StoppingCriteriaList([lambda ids, scores, **kw: torch.zeros(len(ids), dtype=bool)])),
    dict(return_dict_in_generate=True, output_scores=True)])
def test_only_plain_greedy_chains_are_fused(stories, runs, kwargs):
    """Sampling, processors, criteria, recorded scores, rows without an index, recycled trees without a suffix index
    and recycled chains take the unfused loop."""
    generate(stories, torch.tensor([[1, 403, 407]]), max_new_tokens=8, **kwargs)
    assert not runs


def test_plain_calls_are_fused(stories, runs):
    """The default call, a static one, chains and trees from suffix indexes run a fused loop."""
    for kwargs in (dict(cache_implementation="static"), dict(cache_implementation="dynamic"), SUFFIX, TREES, MERGED):
        generate(stories, torch.tensor([[1, 403, 407]]), max_new_tokens=8, **kwargs)
    assert runs == [("FusedChains", 1), ("FusedChains", 1), ("FusedSuffixChains", 1), ("FusedTrees", 1),
                    ("FusedRecycleTrees", 1)]


def test_draft_kernel_fills_what_the_step_computes():
    """The draft kernel's sizes against ChainSizing.draft's for random policies, matches and rooms."""
    from numba import typed

    from lookahead.decode import _fused_kernels as K
    from lookahead.index import NgramIndex
    from lookahead.decode.policy import _BUCKETS
    from lookahead.decode.sizing import ChainSizing

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
        widest = K._draft(typed.List([ix._hist for ix in indexes]), typed.List([ix._state for ix in indexes]), lens,
                         max_new, max_tokens, pads, _BUCKETS, *policy.counts, *policy.tables(r), np.empty(0), drafts,
                         *ints)
        assert ints[0].tolist() == [len(d) for d in expected]
        assert widest == max((len(d) for d in expected), default=0)
        for k, d in enumerate(expected):
            assert drafts[k, :len(d)].tolist() == d.tokens.tolist()
            assert not drafts[k, len(d):widest].any()


def test_the_batch_cut_chooses_the_width_batch_width_chooses():
    """The fused chain kernels' cut for a whole batch (`_batch_cut`, the server's rows) picks the width
    `policy.batch_width` picks from each row's chance (its own policy's, behind its match) and reach (its draft),
    for random policies, drafts and step costs, and cuts every draft to it; empty costs cut nothing."""
    from lookahead.decode import _fused_kernels as K
    from lookahead.decode.policy import _BUCKETS, DraftLength, Stacked, batch_width

    rng = np.random.default_rng(2)
    for trial in range(300):
        r, most = int(rng.integers(1, 7)), int(rng.integers(1, 12))
        lengths = [DraftLength(most, 0.1) for _ in range(r)]
        for length in lengths:
            length.accepted[:] = rng.uniform(0.1, 20, len(_BUCKETS))
            length.rejected[:] = rng.uniform(0.1, 20, len(_BUCKETS))
        stack = Stacked(lengths) if trial % 3 else lengths[0]  # one policy per row, or one for every row
        sizes, matches = rng.integers(0, most + 1, r), rng.integers(0, 40, r)
        widest = int(sizes.max())
        drafts = np.where(np.arange(most)[None] < sizes[:, None], 7, 0)
        costs = np.cumsum(rng.uniform(0.0, 2.0, most + 1)) + r
        chances = [(lengths[k] if trial % 3 else lengths[0]).chance(int(matches[k])) for k in range(r)]
        want = batch_width(np.array(chances), sizes, costs[:widest + 1])
        cut = sizes.copy()
        got = K._batch_cut(cut, matches, _BUCKETS, stack.counts[0], stack.counts[1], costs, drafts, widest)
        assert cut.tolist() == np.minimum(sizes, want).tolist() and got == int(cut.max())
        assert all(not drafts[k, cut[k]:widest].any() and (drafts[k, :cut[k]] == 7).all() for k in range(r))
        same = sizes.copy()
        assert K._batch_cut(same, matches, _BUCKETS, stack.counts[0], stack.counts[1], np.empty(0), drafts,
                            widest) == widest and (same == sizes).all()


def _random_suffix_indexes(rng, r: int, max_nodes: int) -> list:
    """r `SuffixIndex`es over random texts of 1-119 tokens from 5 ids, their scratch sized for `max_nodes`."""
    from lookahead.index import SuffixIndex

    indexes = []
    for _ in range(r):
        ix = SuffixIndex()
        ix.extend(rng.integers(0, 5, int(rng.integers(1, 120))))
        ix._buffers(max_nodes)
        indexes.append(ix)
    return indexes


def test_tree_draft_kernel_keeps_what_tree_sizing_keeps():
    """The tree draft kernel's packed trees against TreeSizing.draft's for random calibrations, texts and rooms."""
    from numba import typed

    from lookahead.decode import _fused_kernels as K
    from lookahead.decode.policy import _BUCKETS
    from lookahead.decode.sizing import TreeSizing
    from lookahead.verify.tree import pack_trees

    rng = np.random.default_rng(1)
    for trial in range(60):
        r, max_nodes, max_new = int(rng.integers(1, 5)), int(rng.integers(1, 64)), int(rng.integers(2, 80))
        sizing = TreeSizing(max_nodes, 15, (0.0, 0.02) if trial % 2 else (0.8, 0.08))
        sizing.calibration.accepted[:] = rng.uniform(0, 5, len(sizing.calibration.EDGES))
        sizing.calibration.seen[:] = sizing.calibration.accepted + rng.uniform(0, 5, len(sizing.calibration.EDGES))
        indexes = _random_suffix_indexes(rng, r, max_nodes)
        lens = rng.integers(0, max_new, r)
        padded = (lambda n: 0) if trial % 5 == 0 else (lambda n: next(w for w in (1, 2, 4, 8, 16, 32, 64) if w > n) - 1)
        expected = sizing.draft(indexes, max_new - 1 - lens, padded)
        tokens, parents, probs = np.full((r, max_nodes), 7), np.full((r, max_nodes), 7), np.full((r, max_nodes), 7.0)
        ints = [np.zeros(r, dtype=np.int64) for _ in range(4)]
        policy, cal = sizing.length, sizing.calibration
        widest = K._draft_trees(typed.List([ix._arrays for ix in indexes]), typed.List([ix._scratch for ix in indexes]),
                               lens, max_new, max_nodes, np.array([padded(n) for n in range(max_nodes + 1)]), _BUCKETS,
                               *policy.counts, *policy.tables(r), cal.EDGES,
                               *cal.counts, cal.prior, sizing.step_costs(r), tokens, parents, probs, *ints)
        want_tokens, want_parents, want_sizes = pack_trees([(d.tokens, d.parents) for d in expected])
        assert ints[0].tolist() == want_sizes.tolist() and widest == want_tokens.shape[1]
        assert (tokens[:, :widest] == want_tokens).all() and (parents[:, :widest] == want_parents).all()
        assert ints[1].tolist() == [d.match_length for d in expected]
        for k, d in enumerate(expected):
            assert np.allclose(probs[k, :len(d)], d.probs) and not probs[k, len(d):widest].any()


def test_tree_draft_kernel_sizes_each_row_by_its_own_calibration():
    """Rows whose `TreeSizing`s are stacked (`StackedTrees`, the server's rows: [rows, bins] calibrations, [rows,
    buckets] policies) get from the tree draft kernel the trees each row's own `TreeSizing.draft` keeps alone, for
    random calibrations, policies, texts and rooms; the stack's tables are the rows' own (views)."""
    from numba import typed

    from lookahead.decode import _fused_kernels as K
    from lookahead.decode.policy import _BUCKETS
    from lookahead.decode.sizing import StackedTrees, TreeSizing

    rng = np.random.default_rng(2)
    for trial in range(40):
        r, max_nodes, max_new = int(rng.integers(2, 5)), int(rng.integers(1, 64)), int(rng.integers(2, 80))
        rows = [TreeSizing(max_nodes, 15, (0.8, 0.08)) for _ in range(r)]
        for row in rows:  # each row's own record, before and after the stack binds it
            row.calibration.accepted[:] = rng.uniform(0, 5, len(row.calibration.EDGES))
            row.calibration.seen[:] = row.calibration.accepted + rng.uniform(0, 5, len(row.calibration.EDGES))
        stack = StackedTrees(rows)
        for row in rows:
            row.length.accepted[:] = rng.uniform(0, 9, len(_BUCKETS))
            row.calibration.accepted[:] *= rng.uniform(0, 1, len(row.calibration.EDGES))
        indexes = _random_suffix_indexes(rng, r, max_nodes)
        lens = rng.integers(0, max_new, r)
        expected = [row.draft([ix], np.array([max_new - 1 - n]))[0] for row, ix, n in zip(rows, indexes, lens)]
        tokens, parents, probs = np.full((r, max_nodes), 7), np.full((r, max_nodes), 7), np.full((r, max_nodes), 7.0)
        ints = [np.zeros(r, dtype=np.int64) for _ in range(4)]
        cal = stack.calibration
        K._draft_trees(typed.List([ix._arrays for ix in indexes]), typed.List([ix._scratch for ix in indexes]), lens,
                       max_new, max_nodes, np.zeros(max_nodes + 1, np.int64), _BUCKETS, *stack.length.counts,
                       *stack.length.tables(1), cal.EDGES, *cal.counts, cal.prior, stack.step_costs(1), tokens,
                       parents, probs, *ints)
        for k, d in enumerate(expected):
            assert ints[0][k] == len(d) and tokens[k, :len(d)].tolist() == d.tokens.tolist()
            assert parents[k, :len(d)].tolist() == d.parents.tolist()


def test_the_warm_up_compiles_every_kernel_signature_a_call_uses(stories):
    """Calls of one row and of three (whose drafts are views numba types by another layout), chains and trees,
    static and dynamic, compile no kernel specialisation of the indexes, the policies, the acceptance rules or the
    fused step beyond what the one warm-up compiled for their kinds (`decode._warm_up.kind`): none waits for numba."""
    import importlib

    from lookahead.decode import _warm_up

    calls = [(kind, cache, rows) for kind in ({}, SUFFIX, TREES, MERGED) for cache in ("static", "dynamic")
             for rows in (slice(0, 1), slice(0, 3))]
    for kind, cache, rows in calls:
        _warm_up.kind(kind.get("lookup", "ngram"), kind.get("draft", "chain"), rows.stop, cache, "greedy")
    modules = [importlib.import_module(f"lookahead.{name}") for name in (
        "index._kernels", "index._suffix_build", "index._suffix_draft", "decode._policy_kernels",
        "verify._kernels", "decode._fused_kernels", "decode._fused_recycle")]
    kernels = {f"{m.__name__}.{name}": k for m in modules for name, k in vars(m).items()
               if hasattr(k, "signatures") and getattr(k, "py_func", None) is not None
               and k.py_func.__module__ == m.__name__}
    warm = {name: len(kernel.signatures) for name, kernel in kernels.items()}
    ids, mask = _story_batch(stories)
    for kind, cache, rows in calls:
        out = generate(stories, ids[rows], attention_mask=mask[rows], max_new_tokens=30, cache_implementation=cache,
                       **kind)
        assert out.shape[0] == rows.stop
    assert {name: len(kernel.signatures) for name, kernel in kernels.items()} == warm
