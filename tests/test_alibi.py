"""ALiBi families (Bloom; Falcon with alibi=True; MPT) verify trees exactly, in the dynamic and the static cache: each
key is biased by its own position, not its slot (`model/alibi.py`); drafts rejected part-way, in one row and in
left-padded batches, give model.generate's tokens; a batch of MPT rows (one bias line for all: run a row at a time)
and a compiled static
step are refused by name."""
import contextlib
import sys

import pytest
import torch
from transformers import CompileConfig, DynamicCache

import families as F
import lookahead
from lookahead.model import alibi
from lookahead.model.facts import alibi_builder
from test_recurrent import corrupted

ALIBI = ["bloom", "falcon_alibi", "mpt"]
MASK_ALIBI = ["bloom", "falcon_alibi"]  # biases from the 2D mask, per row: batches too


def _model(name):
    if name not in [n for n, *_ in F.families()]:
        pytest.skip(f"transformers has no {name}")
    return F.tiny_model(name)


@pytest.mark.parametrize("name", ALIBI)
@pytest.mark.parametrize("lookup, cache", [("suffix", None), ("suffix+recycle", None), ("suffix", "static")])
def test_partly_accepted_trees_give_generate_tokens(name, lookup, cache):
    """Trees drafted from a document that agrees with greedy's output except at every fifth token: their nodes are
    accepted up to the change, siblings and later depths rejected; the tokens are model.generate's (the static
    cache's slots too: its keys biased by the positions they hold)."""
    model = _model(name)
    ids = F.prompt()
    want = F.reference(model, ids)
    out, stats = lookahead.generate(model, ids, lookup=lookup, draft="tree", documents=[corrupted(want)],
                                    cache_implementation=cache, draft_cost=0, max_new_tokens=F.NEW,
                                    min_new_tokens=F.NEW, return_stats=True)
    assert out[0, ids.shape[1]:].tolist() == want.tolist()
    assert stats.accepted_tokens >= F.NEW // 2 and stats.draft_tokens - stats.accepted_tokens >= 4


@pytest.mark.parametrize("name", MASK_ALIBI)
@pytest.mark.parametrize("cache", [None, "static"])
def test_a_padded_batch_of_trees_biases_each_row_by_its_own_positions(name, cache):
    """Two left-padded rows of different lengths drafting trees from their own corrupted documents: each row equals
    model.generate on its own prompt (its padding counts toward no key's position)."""
    model = _model(name)
    ids, mask = F.padded_batch()
    rows = [ids[0:1], ids[1:2, 10:]]
    wants = [F.reference(model, row) for row in rows]
    documents = [[corrupted(wants[0], 4)], [corrupted(wants[1], 7)]]
    out = lookahead.generate(model, ids, attention_mask=mask, lookup="suffix", draft="tree", documents=documents,
                             cache_implementation=cache, draft_cost=0, max_new_tokens=F.NEW, min_new_tokens=F.NEW)
    for row, want in zip(out, wants):
        assert row[ids.shape[1]:].tolist() == want.tolist()


def test_biases_are_the_builders_own_values_at_each_position():
    """Within `from_positions`, the builder returns, for each key, what the model's builder gives that position from
    a 2D mask, and the builder is restored after."""
    model = _model("bloom")
    module, name = alibi_builder(model)
    build = getattr(module, name)
    positions = torch.tensor([[0, 1, 2, 3, 3, 4], [0, 0, 0, 1, 2, 2]])
    heads = model.config.n_head
    with alibi.from_positions(model, positions):
        got = getattr(module, name)(torch.ones((4, 1, 2, 6)), heads, torch.float32).reshape(2, heads, 6)
    assert getattr(module, name) is build
    line = build(torch.ones((1, 5), dtype=torch.long), heads, torch.float32).reshape(heads, 5)
    for r in range(2):
        for k in range(6):
            torch.testing.assert_close(got[r, :, k], line[:, positions[r, k]], rtol=0, atol=0)


def test_a_later_branch_is_biased_by_its_depth_not_its_slot():
    """MPT (biases from cache slots): a tree forward over x, y (x's child), z (x's child), w (z's child) after a
    cached prompt gives, at x, z and w, the logits of a plain forward over the prompt then x z w, where z sits one
    slot further than its depth; without `from_positions` it does not."""
    model = _model("mpt")
    ids, tree = F.prompt(), torch.tensor([[5, 6, 7, 8]])
    p, parent, depth = ids.shape[1], [-1, 0, 0, 2], torch.tensor([0, 1, 1, 2])
    sees = torch.eye(4, dtype=torch.bool)
    for node in range(4):
        up = parent[node]
        while up >= 0:
            sees[node, up], up = True, parent[up]
    allowed = torch.cat([torch.ones(4, p, dtype=torch.bool), sees], 1)
    mask = torch.zeros(1, 1, 4, p + 4).masked_fill(~allowed, torch.finfo(torch.float32).min)
    key_pos = torch.cat([torch.arange(p), p + depth])[None]

    def tree_logits(biased: bool) -> torch.Tensor:
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(ids, cache=cache, use_cache=True)
            with alibi.from_positions(model, key_pos, "slots") if biased else contextlib.nullcontext():
                return model(tree, attention_mask=mask, cache=cache, use_cache=True).logits[0, [0, 2, 3]]

    with torch.no_grad():
        path = model(torch.cat([ids, tree[:, [0, 2, 3]]], 1)).logits[0, p:]
    torch.testing.assert_close(tree_logits(True), path, rtol=0, atol=1e-4)
    assert (tree_logits(False) - path).abs().max() > 1e-2


def test_what_alibi_cannot_take_is_refused_by_name():
    """A compiled static step of an ALiBi model is refused, naming what works; an MPT batch (one bias line for every
    row) runs a row at a time through `lookahead.generate` (tests/test_families.py), and is refused where transformers
    calls lookahead's loop on the whole batch itself (`custom_generate`)."""
    with pytest.raises(ValueError, match=r"would compile the step of .*: pass disable_compile=True"):
        lookahead.generate(_model("bloom"), F.prompt(), max_new_tokens=8, cache_implementation="static",
                           compile_config=CompileConfig())
    with pytest.raises(ValueError, match=r"builds its ALiBi biases from cache slots, one line for every row, so in a "
                                         r"batch of 2 rows"):
        _model("mpt").generate(F.prompt().repeat(2, 1), custom_generate=lookahead.custom_generate, max_new_tokens=8)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
