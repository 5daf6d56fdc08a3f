"""The dynamic cache's full-attention layers grow in place (`lookahead.model.cache.GrowingLayer`)."""
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import DynamicCache

from lookahead.model.cache import GrowingLayer, keep_slots, new_cache, rollback, select_rows
from models import CONFIGS, tiny_model

_OPS = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 300)),
    st.tuples(st.just("rollback"), st.integers(0, 40)),
    st.tuples(st.just("keep"), st.integers(1, 6)),
    st.tuples(st.just("rows"), st.integers(0, 2)),  # 0, 1: a row leaves; 2: the rows' order reversed
), min_size=1, max_size=25)


@given(_OPS, st.integers(0, 2 ** 31))
def test_a_growing_layer_holds_what_a_concatenating_one_holds(ops, seed):
    """Appends, rollbacks, packed tree commits and dropped rows leave a growing cache equal to transformers' own."""
    g = torch.Generator().manual_seed(seed)
    grown, plain = DynamicCache(), DynamicCache()
    grown.layer_class_to_replicate = GrowingLayer  # no config: layers made on the first update
    rows = 3
    for op, n in ops:
        length = plain.get_seq_length()
        if op == "append":
            keys, values = torch.randn(rows, 2, n, 4, generator=g), torch.randn(rows, 2, n, 4, generator=g)
            for cache in (grown, plain):
                out_keys, out_values = cache.update(keys, values, 0)
            assert torch.equal(out_keys, plain.layers[0].keys) and torch.equal(out_values, plain.layers[0].values)
        elif op == "rollback":
            for cache in (grown, plain):
                rollback(cache, max(length - n, 0))
        elif op == "keep" and length >= n:
            start = length - n
            slots = torch.stack([torch.randperm(n, generator=g)[: max(n // 2, 1)].sort().values
                                 for _ in range(rows)])
            for cache in (grown, plain):
                keep_slots(cache, start, slots)
        elif op == "rows" and length and rows > 1:
            keep = torch.arange(rows).flip(0) if n == 2 else torch.tensor([r for r in range(rows) if r != n % rows])
            for cache in (grown, plain):
                select_rows(cache, keep)
            rows = len(keep)
        assert grown.get_seq_length() == plain.get_seq_length()
        if plain.get_seq_length():
            assert torch.equal(grown.layers[0].keys, plain.layers[0].keys)
            assert torch.equal(grown.layers[0].values, plain.layers[0].values)


def test_appending_writes_in_place_until_the_buffer_fills():
    """A step's keys go into the buffer the earlier ones are in: no copy of the layer per step."""
    layer = GrowingLayer()
    layer.update(torch.zeros(1, 2, 100, 4), torch.zeros(1, 2, 100, 4))
    first = layer.keys.data_ptr()
    for _ in range(200):
        layer.update(torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))
    assert layer.keys.data_ptr() == first and layer.get_seq_length() == 300
    layer.update(torch.ones(1, 2, 60, 4), torch.ones(1, 2, 60, 4))  # past 100 + 256 slots: a new buffer
    assert layer.keys.data_ptr() != first and layer.keys[0, 0, :, 0].sum() == 260


def test_rows_that_leave_make_the_others_move_up_in_place():
    """A batch losing rows keeps its buffers (no fresh memory to fault in), and the next step still writes in place."""
    layer = GrowingLayer()
    keys = torch.arange(4 * 2 * 10 * 3, dtype=torch.float32).reshape(4, 2, 10, 3)
    layer.update(keys, -keys)
    first = layer.keys.data_ptr()
    layer.batch_select_indices(torch.tensor([0, 2, 3]))
    assert layer.keys.data_ptr() == first and torch.equal(layer.keys, keys[[0, 2, 3]])
    assert torch.equal(layer.values, -keys[[0, 2, 3]])
    layer.update(torch.ones(3, 2, 1, 3), torch.ones(3, 2, 1, 3))
    assert layer.keys.data_ptr() == first and torch.equal(layer.keys[:, :, :10], keys[[0, 2, 3]])


def test_full_attention_layers_grow_and_encoder_decoders_keep_theirs():
    """Every decoder-only architecture's cache gets growing layers; an encoder-decoder's stays transformers' own."""
    for arch in CONFIGS:
        cache = new_cache(tiny_model(arch))
        assert cache.layers and all(isinstance(layer, GrowingLayer) for layer in cache.layers), arch
    import transformers as T

    config = T.T5Config(vocab_size=96, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2)
    cache = new_cache(T.T5ForConditionalGeneration(config))
    assert not any(isinstance(layer, GrowingLayer) for layer in cache.self_attention_cache.layers)
