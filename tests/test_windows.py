"""Sliding-window and chunked attention: every layer gets a mask of its own kind, cut by position, so chains, trees,
left-padded batches and the static cache give `model.generate`'s tokens on models whose windows are far narrower
than the call (16 tokens here, 60 new after a 70-token prompt)."""
import pytest
import torch
import transformers as T

from lookahead import generate
from lookahead.model.layers import CHUNKED, FULL, SLIDING, LayerKinds

from models import VOCAB, repeated_prompt

_SMALL = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=None, pad_token_id=0, hidden_size=32,
              intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
              max_position_embeddings=512, initializer_range=0.3)
WINDOWED = {  # every layer sliding; sliding and full layers mixed; chunked and full layers mixed
    "mistral": lambda: T.MistralConfig(sliding_window=16, **_SMALL),
    "gemma3": lambda: T.Gemma3TextConfig(sliding_window=16, layer_types=[SLIDING, FULL], **_SMALL),
    "llama4": lambda: T.Llama4TextConfig(attention_chunk_size=16, layer_types=[CHUNKED, FULL], num_local_experts=2,
                                         intermediate_size_mlp=64, **_SMALL),
}
CALLS = {
    "chain": {},
    "tree": dict(lookup="suffix", draft="tree"),
    "recycled tree": dict(lookup="suffix+recycle", draft="tree"),
    "static chain": dict(cache_implementation="static"),
    "static tree": dict(cache_implementation="static", lookup="suffix", draft="tree"),
}
NEW = 60


def _model(name: str):
    torch.manual_seed(0)
    return T.AutoModelForCausalLM.from_config(WINDOWED[name]()).eval()


def _prompt() -> torch.Tensor:
    """70 ids whose spans repeat far apart (further than a window), so drafts are accepted and rejected."""
    first = repeated_prompt(1, 40)
    return torch.cat([first, first[5:25], repeated_prompt(2, 10)])[None]


@pytest.fixture(scope="module", params=sorted(WINDOWED))
def windowed(request):
    model, ids = _model(request.param), _prompt()
    return model, ids, model.generate(ids, do_sample=False, max_new_tokens=NEW, pad_token_id=0)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_windowed_models_give_greedy_tokens(windowed, call):
    """Chains, trees and the static cache on windowed layers equal `model.generate` token for token."""
    model, ids, expected = windowed
    assert torch.equal(generate(model, ids, max_new_tokens=NEW, **CALLS[call]), expected)


@pytest.mark.parametrize("call", ["chain", "tree", "static chain"])
def test_windowed_left_padded_batches_give_each_rows_greedy_tokens(windowed, call):
    """In a left-padded batch the rows keep different numbers of masked slots (rejected drafts); windows follow
    each row's positions, so each row equals greedy on its own unpadded prompt."""
    model, ids, expected = windowed
    short = ids[:, 12:]
    batch = torch.zeros((2, ids.shape[1]), dtype=torch.long)
    batch[0], batch[1, 12:] = ids[0], short[0]
    mask = torch.ones_like(batch)
    mask[1, :12] = 0
    out = generate(model, batch, attention_mask=mask, max_new_tokens=NEW, **CALLS[call])
    alone = model.generate(short, do_sample=False, max_new_tokens=NEW, pad_token_id=0)
    assert torch.equal(out[0], expected[0]) and torch.equal(out[1, 12:], alone[0])


@pytest.mark.parametrize("name", ["mistral", "gemma3"])
def test_the_static_cache_keeps_a_ring_for_sliding_layers(name):
    """On the static cache a sliding layer keeps its window plus the widest step (a ring of 128 slots for a window
    of 16), not the call's 512: a 280-token prompt wraps it; chains, trees and a left-padded batch still give greedy's
    tokens."""
    import lookahead.model.static as S

    model, ids = _model(name), torch.cat([_prompt()] * 4, dim=1)
    short = ids[:, 40:]
    expected = model.generate(ids, do_sample=False, max_new_tokens=NEW, pad_token_id=0)
    for options in ({}, dict(lookup="suffix", draft="tree")):
        out = generate(model, ids, max_new_tokens=NEW, cache_implementation="static", **options)
        assert torch.equal(out, expected), options
    state = S._STATES[model][-1]
    assert state.ring == 128 and state.cache.slots >= 512
    assert state.cache.kv.shape[1] == sum(kind != SLIDING for kind in state.kinds.per_layer)  # rings aside
    batch = torch.zeros((2, ids.shape[1]), dtype=torch.long)
    batch[0], batch[1, 40:] = ids[0], short[0]
    mask = torch.ones_like(batch)
    mask[1, :40] = 0
    out = generate(model, batch, attention_mask=mask, max_new_tokens=NEW, cache_implementation="static")
    alone = model.generate(short, do_sample=False, max_new_tokens=NEW, pad_token_id=0)
    assert torch.equal(out[0], expected[0]) and torch.equal(out[1, 40:], alone[0])


def test_layer_kinds_come_from_the_layers_in_force():
    """Each layer's kind and each windowed kind's size, as transformers' caches read them; a config's window that is
    not in force (Qwen2 without use_sliding_window) makes no windowed layer."""
    kinds = LayerKinds.of(WINDOWED["gemma3"]())
    assert kinds.per_layer == (SLIDING, FULL) and kinds.sizes == {SLIDING: 16} and kinds.mixed
    assert LayerKinds.of(WINDOWED["llama4"]()).sizes == {CHUNKED: 16}
    assert not LayerKinds.of(T.Qwen2Config(sliding_window=16, use_sliding_window=False)).windowed


def test_slot_windowed_layers_get_their_windows_by_position():
    """GPT-Neo's local layers cut their window themselves, from a band of cache slots: lookahead hands them bands by
    position (`model.local`), so trees (siblings share a depth), the static cache (its whole buffer of slots) and a
    left-padded batch (padding and the slots of rejected drafts), drafting from a document wrong at every fifth
    token, give model.generate's tokens on each row's own prompt, with a window of 16 behind 40-token prompts."""
    from test_recurrent import corrupted

    config = T.GPTNeoConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, window_size=16,
                            attention_types=[[["global", "local"], 1]], max_position_embeddings=512,
                            initializer_range=0.3, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model, ids = T.GPTNeoForCausalLM(config).eval(), _prompt()
    expected = model.generate(ids, do_sample=False, max_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
    documents = [corrupted(expected[0, ids.shape[1]:])]
    for kwargs in ({}, dict(lookup="suffix", draft="tree"), dict(cache_implementation="static"),
                   dict(cache_implementation="static", lookup="suffix", draft="tree")):
        out, stats = generate(model, ids, max_new_tokens=NEW, eos_token_id=[], documents=documents, draft_cost=0,
                              return_stats=True, **kwargs)
        assert torch.equal(out, expected), kwargs
        assert stats.draft_tokens - stats.accepted_tokens >= 4, kwargs  # rejections: slots apart from positions
    short = ids[:, 12:]
    batch = torch.cat([ids, torch.cat([torch.zeros_like(ids[:, :12]), short], 1)])
    mask = torch.ones_like(batch)
    mask[1, :12] = 0
    want = model.generate(short, do_sample=False, max_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
    for kwargs in ({}, dict(cache_implementation="static")):
        out = generate(model, batch, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[], pad_token_id=0,
                       documents=[documents, [corrupted(want[0, short.shape[1]:])]], draft_cost=0, **kwargs)
        assert torch.equal(out[0], expected[0]), kwargs
        assert torch.equal(out[1, ids.shape[1]:], want[0, short.shape[1]:]), kwargs
