"""Tree drafts and memory across calls: still exactly greedy's tokens."""
import numpy as np
import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from lookahead import Memory, generate
from lookahead.decode.sizing import best_size
from lookahead.verify import tree as T
from lookahead.model.cache import keep_slots
from models import CONFIGS, repeated_prompt, tiny_model
from test_generate import left_padded


def test_ancestry_and_depth_of_a_small_tree():
    """Columns see the root, their ancestors and themselves; depth counts edges from the root."""
    parents = np.array([[-1, 0, -1, 1]])
    seen, depth = T.ancestry(parents)
    assert depth.tolist() == [[0, 1, 2, 1, 3]]
    assert seen[0, 4].tolist() == [True, True, True, False, True]
    assert seen[0, 3].tolist() == [True, False, False, True, False]


def test_greedy_tree_accept_follows_the_target_down_the_tree():
    """The target's argmax picks the branch at each depth; the bonus token comes after the last accepted node."""
    tokens, parents, sizes = T.pack_trees([(np.array([5, 6, 7, 8]), np.array([-1, 0, -1, 1])),
                                           (np.array([9]), np.array([-1]))])
    targets = np.array([[5, 6, 0, 0, 0], [4, 0, 0, 0, 0]])  # row 0: 5 then 6 then (after 6) 0 != 8
    paths, bonus = T.greedy_tree_accept(tokens, parents, sizes, targets)
    assert paths == [[0, 1], []] and bonus.tolist() == [0, 4]
    assert T.path_slots(paths).tolist() == [[0, 1, 2], [0, 0, 0]]


def test_keep_slots_packs_the_accepted_path():
    from transformers import DynamicCache

    cache = DynamicCache()
    keys = torch.arange(2 * 6, dtype=torch.float).reshape(2, 1, 6, 1)
    cache.update(keys, keys.clone(), 0)
    keep_slots(cache, 2, torch.tensor([[0, 3], [0, 1]]))
    assert cache.layers[0].keys[:, 0, :, 0].tolist() == [[0, 1, 2, 5], [6, 7, 8, 9]]


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_tree_drafts_match_greedy(arch):
    """Batch of one and a left-padded batch of three, tree drafts of up to 16 nodes."""
    model = tiny_model(arch)
    ids = repeated_prompt(0, 40)[None]
    expected = model.generate(ids, do_sample=False, max_new_tokens=48)
    assert torch.equal(generate(model, ids, lookup="suffix", draft="tree", max_draft_nodes=16, max_new_tokens=48),
                       expected)
    batch, mask = left_padded([30, 17, 41])
    expected = model.generate(batch, attention_mask=mask, do_sample=False, max_new_tokens=32)
    out = generate(model, batch, attention_mask=mask, lookup="suffix", draft="tree", max_new_tokens=32)
    assert torch.equal(out, expected)


def test_tree_drafts_on_the_pretrained_model_accept_more_per_forward(stories_model):
    story = stories_model.generate(torch.tensor([[1]]), do_sample=False, max_new_tokens=80)
    prompt = torch.cat([story, story[:, 1:30]], dim=1)
    expected = stories_model.generate(prompt, do_sample=False, max_new_tokens=100)
    out, stats = generate(stories_model, prompt, lookup="suffix", draft="tree", max_new_tokens=100,
                          draft_cost=0.0, return_stats=True)
    assert torch.equal(out, expected)
    chain, chain_stats = generate(stories_model, prompt, lookup="suffix", max_new_tokens=100, draft_cost=0.0,
                                  return_stats=True)
    assert torch.equal(chain, expected)
    assert stats.tokens_per_forward > max(2.0, chain_stats.tokens_per_forward)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_paths_off_the_first_one_are_packed_and_the_first_one_moves_nothing(stories_model, monkeypatch, cache):
    """A step that accepts its tree's first nodes in order keeps their keys and values where they are; one that
    accepts another branch packs it behind the root. This story takes both kinds of step, and stays greedy's (in the
    unfused loop, whose verdicts this reads; tests/test_fused.py checks the fused one on the same story)."""
    import sys

    from lookahead.verify.batch import Verdict

    monkeypatch.setattr(sys.modules["lookahead.decode.loop"], "fused_loop", lambda *args: None)
    kinds, in_place = [], Verdict.in_place.fget

    def recorded(verdict) -> bool:  # what each step that accepted a tree node decided
        answer = in_place(verdict)
        if any(map(len, verdict.paths or [])):
            kinds.append(answer)
        return answer

    monkeypatch.setattr(Verdict, "in_place", property(recorded))
    story = stories_model.generate(torch.tensor([[1]]), do_sample=False, max_new_tokens=80)
    prompt = torch.cat([story, story[:, 1:30]], dim=1)
    expected = stories_model.generate(prompt, do_sample=False, max_new_tokens=100)
    # draft_cost=0 verifies whole trees: which steps take an off-first path does not hang on a measured cost curve
    out = generate(stories_model, prompt, lookup="suffix", draft="tree", max_new_tokens=100, cache_implementation=cache,
                   draft_cost=0.0)
    assert torch.equal(out, expected)
    assert True in kinds and False in kinds


def test_tree_drafts_with_a_prefix_dependent_processor():
    """repetition_penalty sees each node's own path as its prefix."""
    model = tiny_model("gpt_neox")
    ids = repeated_prompt(0, 40)[None]
    procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.3)])
    expected = model.generate(ids, do_sample=False, max_new_tokens=40, logits_processor=procs)
    out = generate(model, ids, lookup="suffix", draft="tree", max_new_tokens=40, logits_processor=procs)
    assert torch.equal(out, expected)


def test_memory_lets_a_later_call_copy_an_earlier_output(stories_model):
    """The same request twice: the second drafts the whole answer from memory."""
    prompt = torch.tensor([[1, 403, 407]])
    memory = Memory(max_tokens=10_000)
    first, s1 = generate(stories_model, prompt, lookup="suffix", max_new_tokens=60, memory=memory, return_stats=True)
    assert len(memory) == first.shape[1]
    second, s2 = generate(stories_model, prompt, lookup="suffix", max_new_tokens=60, memory=memory,
                          return_stats=True)
    assert torch.equal(first, second)
    assert torch.equal(second, stories_model.generate(prompt, do_sample=False, max_new_tokens=60))
    assert s2.forward_passes < s1.forward_passes / 2


def test_memory_evicts_the_oldest_tokens():
    memory = Memory(max_tokens=10)
    memory.add_tokens([1, 2, 3, 4, 5, 6])
    memory.add_tokens([7, 8, 9, 10, 11])
    assert len(memory) == 5 and memory.documents()[0][0].tolist() == [7, 8, 9, 10, 11]
    memory.add_tokens(list(range(30)))
    assert len(memory) == 10


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"draft": "tree"}, "draft='tree' needs lookup='suffix'"),
        ({"draft": "bush", "lookup": "suffix"}, "draft must be 'chain' or 'tree', got 'bush'"),
        ({"draft": "tree", "lookup": "suffix", "max_draft_nodes": 0}, "max_draft_nodes must be >= 1, got 0"),
    ],
)
def test_tree_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(tiny_model("llama"), torch.tensor([[5, 6, 7]]), max_new_tokens=4, **kwargs)


def test_memory_argument_error():
    with pytest.raises(ValueError, match="max_tokens must be >= 0, got -1"):
        Memory(max_tokens=-1)


def test_tree_size_follows_the_cost_of_verification():
    """Free verification takes every node worth anything; costly verification only the likely ones."""
    probs = np.array([0.9, 0.8, 0.5, 0.1, 0.05])
    assert best_size(probs, 0.0) == 5
    assert best_size(probs, 0.2) == 3
    assert best_size(probs, 2.0) == 0
    assert best_size(probs, (1.5, 0.0)) == 5  # a fixed overhead asks for all the gain there is
    assert best_size(probs[:1] / 2, (1.0, 0.0)) == 0  # 0.45 expected tokens do not pay a doubled forward


def test_no_draft_tokens_is_plain_decoding_for_trees_too():
    """num_draft_tokens=0 turns drafting off whatever the draft shape."""
    model = tiny_model("llama")
    ids = repeated_prompt(0, 40)[None]
    out, stats = generate(model, ids, lookup="suffix", draft="tree", num_draft_tokens=0, max_new_tokens=20,
                          return_stats=True)
    assert torch.equal(out, model.generate(ids, do_sample=False, max_new_tokens=20))
    assert stats.draft_tokens == 0 and stats.forward_passes == 20


@pytest.mark.parametrize("chain", [True, False])
def test_by_row_takes_each_rows_own_rule(chain):
    """The server's batch (`rules.by_row`): its greedy rows get what `rules.greedy` gives them as a batch of their
    own (chains and trees, rejected part-way), every other row what its own `pick` returns, in its place."""
    from lookahead.index.draft import Draft
    from lookahead.verify import rules
    from lookahead.verify.batch import DraftBatch

    vocab, rng = 12, np.random.default_rng(0)
    drafts = [Draft.chain(np.array([3, 4, 5])), Draft.chain(np.array([6])), Draft.chain(np.array([7, 8]))] if chain \
        else [Draft(np.array([3, 9, 4]), np.array([-1, -1, 0]), np.ones(3), 1),
              Draft(np.array([6, 1]), np.array([-1, 0]), np.ones(2), 1),
              Draft(np.array([7, 2, 8]), np.array([-1, 0, 0]), np.ones(3), 1)]
    batch = DraftBatch.pack(drafts, chain)
    scores = torch.from_numpy(rng.standard_normal((3, batch.width + 1, vocab))).float()
    for i, d in enumerate(drafts):  # row i's target agrees with its draft's first node, then not
        scores[i, 0, int(d.tokens[0])] = 10.0
    picked = {1: ([0], 11)}
    verdict = rules.by_row(batch, scores, np.array([0, 2]), lambda i: picked[i])
    alone = rules.greedy(DraftBatch.pack([drafts[0], drafts[2]], chain), scores[[0, 2]])
    assert verdict.counts.tolist() == [alone.counts[0], 1, alone.counts[1]]
    assert verdict.bonus.tolist() == [alone.bonus[0], 11, alone.bonus[1]]
    assert verdict.counts[0] >= 1 and verdict.counts[2] >= 1
    if not chain:
        assert verdict.paths == [alone.paths[0], [0], alone.paths[1]]
