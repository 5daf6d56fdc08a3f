"""Logits processors, stopping criteria, streamers and generation arguments behave as in model.generate."""
import threading

import pytest
import torch
import transformers as T

from conftest import SHARED
from lookahead import generate
from lookahead.model.facts import cache_kwarg
from models import repeated_prompt, tiny_model
from test_generate import left_padded

GPT2 = SHARED / "data" / "tokenizers" / "gpt2"


@pytest.fixture(scope="module")
def model():
    """A model that loops on its prompt, so steps accept several drafts and processors see long prefixes."""
    return tiny_model("gpt_neox")


@pytest.fixture(scope="module")
def tokenizer():
    if not (GPT2 / "vocab.json").exists():
        pytest.skip(f"{GPT2} not found")
    return T.AutoTokenizer.from_pretrained(GPT2)


class BanAfterLength(T.LogitsProcessor):
    """Forbids token `token` once the sequence is longer than `length`: its effect depends on each prefix."""

    def __init__(self, token, length):
        self.token, self.length = token, length

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] > self.length:
            scores[:, self.token] = -float("inf")
        return scores


@pytest.mark.parametrize("kwargs", [
    dict(repetition_penalty=1.3),
    dict(no_repeat_ngram_size=3),
    dict(bad_words_ids=[[27], [80, 48]]),
    dict(suppress_tokens=[80, 91], begin_suppress_tokens=[27]),
    dict(min_new_tokens=25, eos_token_id=27),
    dict(sequence_bias={(80,): -3.0, (48, 61): 2.0}),
    dict(encoder_repetition_penalty=1.5),
    dict(prefix_allowed_tokens_fn=lambda row, ids: list(range(3 + row, 96))),
])
def test_config_processors_match_model_generate(model, kwargs):
    """Greedy with processors from generation arguments equals model.generate on a left-padded batch."""
    ids, mask = left_padded([40, 25, 33])
    expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, **kwargs)
    assert torch.equal(generate(model, ids, attention_mask=mask, max_new_tokens=40, **kwargs), expected)


def test_user_processor_sees_each_position_prefix(model):
    """A processor whose effect depends on the prefix length is applied as plain decoding applies it."""
    ids, mask = left_padded([40, 30])
    full = generate(model, ids, attention_mask=mask, max_new_tokens=50)
    processors = T.LogitsProcessorList([BanAfterLength(int(full[0, 50]), 52)])
    expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=50,
                              logits_processor=processors)
    out, stats = generate(model, ids, attention_mask=mask, max_new_tokens=50, logits_processor=processors,
                          return_stats=True)
    assert torch.equal(out, expected) and stats.accepted_tokens > 10


def test_forbidden_drafts_never_reach_the_model(model):
    """Draft tokens that suppress_tokens forbids are cut before the verification forward."""
    ids = repeated_prompt(0, 40)[None]
    banned = sorted(set(ids[0, -12:].tolist()) - {0})[:4]
    fed = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"][:, 1:]), with_kwargs=True)
    try:
        out, stats = generate(model, ids, max_new_tokens=40, suppress_tokens=banned, return_stats=True)
    finally:
        hook.remove()
    assert torch.equal(out, model.generate(ids, do_sample=False, max_new_tokens=40, suppress_tokens=banned))
    assert stats.draft_tokens > 0 and not any(torch.isin(x, torch.tensor(banned)).any() for x in fed[1:])


class StopAt(T.StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_stopping_criteria_stop_inside_an_accepted_draft(model):
    """A criterion that fires on an accepted draft token stops there, as plain decoding does."""
    ids = repeated_prompt(0, 40)[None]
    full, stats = generate(model, ids, max_new_tokens=80, eos_token_id=[], return_stats=True)
    assert stats.accepted_tokens > 20
    for token in sorted(set(full[0, 45:].tolist()))[:6]:
        criteria = T.StoppingCriteriaList([StopAt(token)])
        expected = model.generate(ids, do_sample=False, max_new_tokens=80, stopping_criteria=criteria)
        assert torch.equal(generate(model, ids, max_new_tokens=80, stopping_criteria=criteria), expected)


def test_stop_strings(model, tokenizer):
    """stop_strings (with a tokenizer) end the row on the token that completes the string."""
    ids = repeated_prompt(0, 40)[None]
    full = generate(model, ids, max_new_tokens=60, eos_token_id=[])
    text = tokenizer.decode(full[0, 40:])
    stop = text[30:32]
    out = generate(model, ids, max_new_tokens=60, eos_token_id=[], stop_strings=[stop], tokenizer=tokenizer)
    expected = model.generate(ids, do_sample=False, max_new_tokens=60, stop_strings=[stop], tokenizer=tokenizer)
    assert torch.equal(out, expected) and out.shape[1] < full.shape[1]
    assert tokenizer.decode(out[0, 40:]).endswith(stop)


def test_several_eos_ids_and_max_time(model):
    """A list of eos ids, and max_time that runs out at once, stop where model.generate stops."""
    ids = repeated_prompt(0, 40)[None]
    full = generate(model, ids, max_new_tokens=60, eos_token_id=[])
    eos = [int(full[0, 70]), int(full[0, 58])]
    assert torch.equal(generate(model, ids, max_new_tokens=60, eos_token_id=eos),
                       model.generate(ids, do_sample=False, max_new_tokens=60, eos_token_id=eos))
    assert generate(model, ids, max_new_tokens=60, max_time=1e-9).shape[1] == 41


def test_generation_config_is_honoured(model):
    """generation_config= sets length and processors as in model.generate; keyword arguments override it."""
    ids = repeated_prompt(1, 40)[None]
    config = T.GenerationConfig(max_new_tokens=30, do_sample=False, repetition_penalty=1.2, eos_token_id=2,
                                pad_token_id=0)
    assert torch.equal(generate(model, ids, generation_config=config),
                       model.generate(ids, generation_config=config))
    assert torch.equal(generate(model, ids, generation_config=config, max_new_tokens=12),
                       model.generate(ids, generation_config=config, max_new_tokens=12))


def test_greedy_by_default_even_when_the_model_config_samples():
    """lookahead.generate is greedy unless do_sample=True is passed, as documented."""
    model = tiny_model("llama")
    model.generation_config.do_sample, model.generation_config.temperature = True, 0.5
    ids = repeated_prompt(2, 30)[None]
    assert torch.equal(generate(model, ids, max_new_tokens=20), model.generate(ids, do_sample=False,
                                                                               max_new_tokens=20))


class Chunks(T.generation.BaseStreamer):
    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


def test_streamer_gets_every_accepted_token_in_chunks(model):
    """The prompt first, then each step's accepted tokens in order, then end()."""
    ids = repeated_prompt(0, 40)[None]
    streamer = Chunks()
    out, stats = generate(model, ids, max_new_tokens=60, streamer=streamer, return_stats=True)
    assert streamer.chunks[0] == ids[0].tolist() and streamer.ended
    assert sum(streamer.chunks[1:], []) == out[0, 40:].tolist()
    assert len(streamer.chunks) - 1 == stats.forward_passes and max(map(len, streamer.chunks[1:])) > 1


def test_text_iterator_streamer(model, tokenizer):
    """TextIteratorStreamer, read from another thread, yields the generated text (plugin path too)."""
    import lookahead

    ids = repeated_prompt(0, 40)[None]
    for call in (lambda s: generate(model, ids, max_new_tokens=40, streamer=s),
                 lambda s: model.generate(ids, custom_generate=lookahead.plugin(streamer=s), max_new_tokens=40)):
        streamer = T.TextIteratorStreamer(tokenizer, skip_prompt=True)
        result = {}
        thread = threading.Thread(target=lambda: result.update(out=call(streamer)))
        thread.start()
        text = "".join(streamer)
        thread.join()
        assert text == tokenizer.decode(result["out"][0, 40:])


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_beams=2), "num_beams=2 asks for beam search"),
    (dict(penalty_alpha=0.6, top_k=4), "penalty_alpha=0.6 asks for contrastive search"),
    (dict(guidance_scale=1.5), "guidance_scale=1.5 asks for classifier-free guidance"),
    (dict(prompt_lookup_num_tokens=3), "prompt_lookup_num_tokens=3 asks for transformers' prompt lookup"),
    (dict(output_attentions=True, return_dict_in_generate=True), "output_attentions=True"),
    (dict(output_hidden_states=True, return_dict_in_generate=True), "output_hidden_states=True"),
    (dict(stop_strings=["ab"]), "stop_strings need tokenizer="),
    (dict(documents=["some text"]), "documents given as strings need tokenizer="),
    (dict(documents=[[1.5, 2.0]]), "each document must be a string or a 1-D sequence of token ids"),
    (dict(generator="seed"), "generator must be an int, got str"),
    (dict(num_return_sequences=2), "num_return_sequences"),
])
def test_unsupported_arguments_are_refused(model, kwargs, message):
    """Arguments whose meaning lookahead cannot keep raise an error naming them."""
    with pytest.raises((ValueError, TypeError), match=message):
        generate(model, repeated_prompt(0, 20)[None], max_new_tokens=5, **kwargs)


def test_assistant_model_and_batched_streamer_are_refused(model):
    ids = repeated_prompt(0, 20)[None]
    with pytest.raises(ValueError, match="assistant_model: lookahead drafts from its n-gram index"):
        generate(model, ids, max_new_tokens=5, assistant_model=model)
    with pytest.raises(ValueError, match="streamer= supports a batch of one row"):
        generate(model, ids.repeat(2, 1), max_new_tokens=5, streamer=Chunks())
    with pytest.raises(ValueError, match="(past_key_values|cache): lookahead starts from an empty cache"):
        cache = model(ids, use_cache=True).past_key_values
        generate(model, ids, max_new_tokens=5, **{cache_kwarg(model): cache})  # the name this transformers takes


def test_a_failing_call_still_ends_the_streamer(model, monkeypatch):
    """An error inside the loop reaches the caller and the streamer is ended, so no reader waits forever."""
    import importlib

    streamer = Chunks()
    targets = importlib.import_module("lookahead.model.causal")

    def broken(self, *args):
        raise RuntimeError("forward failed")

    monkeypatch.setattr(targets.CausalLM, "verify", broken)
    with pytest.raises(RuntimeError, match="forward failed"):
        generate(model, repeated_prompt(0, 40)[None], max_new_tokens=10, streamer=streamer)
    assert streamer.ended
