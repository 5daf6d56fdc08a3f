"""A Memory through generate: what each call stores, on every kind of model and return shape, and what it refuses."""
import numpy as np
import pytest
import torch

import lookahead
from lookahead import Memory, generate
from models import repeated_prompt, tiny_model
from test_seq2seq import padded_sources, tiny_bart


def held(memory: Memory) -> list:
    """The pieces the memory holds, as lists."""
    return [piece.tolist() for piece in (memory.documents() or [[]])[0]]


def test_memory_stores_each_row_without_padding():
    """Left padding and the pad tokens after an early eos are not stored; prompt and new tokens are."""
    model = tiny_model("llama")
    ids = torch.stack([repeated_prompt(0, 30), repeated_prompt(1, 30)])
    ids[1, :10] = 0
    mask = (torch.arange(30)[None] >= torch.tensor([[0], [10]])).long()
    memory = Memory(10_000)
    out = generate(model, ids, attention_mask=mask, max_new_tokens=12, memory=memory, eos_token_id=[2, 40])
    pieces = held(memory)
    for row, (seq, m) in enumerate(zip(out, mask)):
        new = seq[30:].tolist()
        stop = next((j + 1 for j, t in enumerate(new) if t in (2, 40)), len(new))
        assert pieces[row] == seq[:30][m.bool()].tolist() + new[:stop]


def test_memory_stores_every_returned_sequence():
    """num_return_sequences=3 stores three sequences, each the prompt and its own sample."""
    model = tiny_model("gpt_neox")
    ids = repeated_prompt(0, 20)[None]
    memory = Memory(10_000)
    out = generate(model, ids, do_sample=True, num_return_sequences=3, generator=0, max_new_tokens=10,
                   memory=memory, eos_token_id=[])
    assert held(memory) == out.tolist()


def test_memory_with_an_encoder_decoder_keeps_the_output():
    """BART: the call returns its output and stores the source and the decoder's tokens."""
    model = tiny_bart()
    ids, mask = padded_sources([12, 7])
    memory = Memory(10_000)
    out = generate(model, ids, attention_mask=mask, max_new_tokens=8, memory=memory)
    assert torch.equal(out, model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=8))
    assert len(held(memory)) == 2 and held(memory)[1][:7] == ids[1, :7].tolist()


def test_a_memory_from_a_larger_vocabulary_is_refused():
    """Ids the model does not have would crash its embedding mid-generation: refused before the first forward."""
    memory = Memory(10_000)
    memory.add_tokens(np.array([5, 6, 500]))
    with pytest.raises(ValueError, match="memory holds token ids up to 500, outside the model's vocabulary"):
        generate(tiny_model("llama"), torch.tensor([[5, 6, 7]]), max_new_tokens=4, memory=memory)


def test_memory_through_model_generate():
    """plugin(memory=...) stores what model.generate returned, as lookahead.generate would."""
    model = tiny_model("llama")
    ids = repeated_prompt(3, 25)[None]
    memory = Memory(10_000)
    out = model.generate(ids, custom_generate=lookahead.plugin(memory=memory), max_new_tokens=6, eos_token_id=None)
    assert held(memory) == out.tolist()
