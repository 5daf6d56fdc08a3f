"""The plugin: model.generate(custom_generate=...), pipelines, documents and return_dict_in_generate."""
import importlib

import pytest
import torch
import transformers as T

import lookahead
from conftest import SHARED
from models import repeated_prompt, tiny_model
from test_generate import left_padded

GPT2 = SHARED / "data" / "tokenizers" / "gpt2"
G = importlib.import_module("lookahead.model.causal")


@pytest.fixture(scope="module")
def model():
    return tiny_model("gpt_neox")


@pytest.fixture(scope="module")
def gpt2_model():
    """A random GPT-2 with the real GPT-2 vocabulary, so that a pipeline's tokenizer fits it."""
    config = T.GPT2Config(n_embd=16, n_layer=2, n_head=2, n_positions=256, initializer_range=0.3)
    torch.manual_seed(0)
    return T.GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def tokenizer():
    if not (GPT2 / "vocab.json").exists():
        pytest.skip(f"{GPT2} not found")
    return T.AutoTokenizer.from_pretrained(GPT2)


def test_custom_generate_matches_greedy(model):
    """One argument switches model.generate to lookahead; lookahead's options ride along with the usual ones."""
    ids, mask = left_padded([40, 22, 31])
    expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=50)
    out = model.generate(ids, attention_mask=mask, custom_generate=lookahead.custom_generate, max_ngram=3,
                         num_draft_tokens=6, max_new_tokens=50)
    assert torch.equal(out, expected)


def test_custom_generate_samples_like_generate(model):
    """The plugin and lookahead.generate run the same loop: the same seed gives the same samples."""
    ids = repeated_prompt(0, 40)[None].repeat(3, 1)
    kwargs = dict(do_sample=True, temperature=0.7, top_p=0.9, max_new_tokens=30, generator=7)
    out = model.generate(ids, custom_generate=lookahead.custom_generate, **kwargs)
    assert torch.equal(out, lookahead.generate(model, ids, **kwargs))
    assert not torch.equal(out[0], out[1])


def test_custom_generate_refuses_what_it_cannot_do(model):
    """Beam search and bad lookahead options raise errors that name them."""
    ids = repeated_prompt(0, 20)[None]
    with pytest.raises(ValueError, match="num_beams=3 asks for beam search"):
        model.generate(ids, custom_generate=lookahead.custom_generate, num_beams=3, max_new_tokens=5)
    with pytest.raises(ValueError, match="max_ngram must be >= 1, got 0"):
        model.generate(ids, custom_generate=lookahead.custom_generate, max_ngram=0, max_new_tokens=5)


def test_transformers_keeps_streamer_and_assistant_from_a_custom_loop(model):
    """Pinned against transformers 5.23: a callable custom_generate receives neither `streamer=` nor
    `assistant_model=` given to model.generate (nor `tokenizer=`), so lookahead takes them through `plugin(...)`."""
    ids = repeated_prompt(0, 20)[None]
    seen = {}

    def spy(model, input_ids, logits_processor, stopping_criteria, generation_config, streamer=None,
            assistant_model=None, tokenizer=None, **kwargs):
        seen.update(streamer=streamer, assistant_model=assistant_model, tokenizer=tokenizer)
        return input_ids

    streamer = T.TextStreamer(object())
    streamer.put = lambda value: None
    model.generate(ids, custom_generate=spy, streamer=streamer, assistant_model=model, tokenizer=object(),
                   max_new_tokens=3)
    assert seen == {"streamer": None, "assistant_model": None, "tokenizer": None}, T.__version__


def test_plugin_takes_every_option_generate_takes(model):
    """plugin() binds the same options as lookahead.generate, memory and streamer included, and checks them."""
    ids = repeated_prompt(0, 40)[None]
    memory, chunks = lookahead.Memory(1000), []

    class Streamer:
        def put(self, value):
            chunks.append(value.reshape(-1).tolist())

        def end(self):
            chunks.append(None)

    out = model.generate(ids, custom_generate=lookahead.plugin(memory=memory, streamer=Streamer(), lookup="suffix",
                                                              draft="tree"), max_new_tokens=20)
    assert torch.equal(out, model.generate(ids, do_sample=False, max_new_tokens=20))
    assert len(memory) == out.shape[1] and chunks[-1] is None and sum(chunks[:-1], []) == out[0].tolist()
    with pytest.raises(TypeError, match="unknown lookahead option 'max_gram'"):
        lookahead.plugin(max_gram=3)
    with pytest.raises(TypeError, match="memory must be a lookahead.Memory, got int"):
        lookahead.plugin(memory=1000)


def test_return_dict_in_generate(model):
    """The transformers output class, with scores and logits equal to model.generate's, plus lookahead_stats."""
    ids, mask = left_padded([40, 22])
    kwargs = dict(attention_mask=mask, max_new_tokens=40, return_dict_in_generate=True, output_scores=True,
                  output_logits=True, eos_token_id=None)
    expected = model.generate(ids, do_sample=False, **kwargs)
    out = model.generate(ids, custom_generate=lookahead.custom_generate, **kwargs)
    assert isinstance(out, T.generation.GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, expected.sequences)
    assert torch.allclose(torch.stack(out.scores), torch.stack(expected.scores), atol=1e-4)
    assert torch.allclose(torch.stack(out.logits), torch.stack(expected.logits), atol=1e-4)
    assert out.lookahead_stats.accepted_tokens > 0
    transition = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    assert transition.shape == (2, 40) and torch.isfinite(transition).all()


def test_documents_give_drafts_without_entering_the_prompt(model):
    """A passage given only as a document is copied from (many drafts accepted); the output does not change."""
    ids = torch.randint(3, 96, (1, 30), generator=torch.Generator().manual_seed(3))
    plain, base = lookahead.generate(model, ids, max_new_tokens=60, eos_token_id=[], return_stats=True)
    passage = [5, 9] + plain[0, 30:].tolist() + [7]
    out, stats = lookahead.generate(model, ids, max_new_tokens=60, eos_token_id=[], documents=[passage],
                                    return_stats=True)
    assert torch.equal(out, plain)
    assert stats.forward_passes < base.forward_passes / 2


def test_documents_per_row_and_as_strings(gpt2_model, tokenizer):
    """One document list per row goes to that row's index only; strings are tokenized with tokenizer=."""
    ids, mask = left_padded([30, 24])
    plain, base = lookahead.generate(gpt2_model, ids, attention_mask=mask, max_new_tokens=40, eos_token_id=[],
                                     return_stats=True)
    texts = [tokenizer.decode(row[ids.shape[1]:]) for row in plain]
    docs = [[texts[0], "unrelated"], [texts[1]]]
    out, stats = lookahead.generate(gpt2_model, ids, attention_mask=mask, max_new_tokens=40, eos_token_id=[],
                                    documents=docs, tokenizer=tokenizer, return_stats=True)
    assert torch.equal(out, plain) and stats.forward_passes < base.forward_passes / 2
    plugin = lookahead.plugin(documents=docs, tokenizer=tokenizer)
    assert torch.equal(gpt2_model.generate(ids, attention_mask=mask, max_new_tokens=40, custom_generate=plugin), plain)


def test_documents_outside_the_vocabulary_are_refused(model):
    with pytest.raises(ValueError, match=r"documents must hold token ids in \[0, 96\) .* got an id 500"):
        lookahead.generate(model, repeated_prompt(0, 20)[None], max_new_tokens=5, documents=[[3, 500]])


def test_text_generation_pipeline(gpt2_model, tokenizer, monkeypatch):
    """pipeline("text-generation") gives the same text through lookahead, by helper or by one generate argument."""
    verified = []
    verify = G.CausalLM.verify
    monkeypatch.setattr(G.CausalLM, "verify", lambda self, *a: verified.append(1) or verify(self, *a))
    text = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
    plain = T.pipeline("text-generation", model=gpt2_model, tokenizer=tokenizer)
    expected = plain(text, max_new_tokens=30, do_sample=False)
    assert not verified
    fast = lookahead.pipeline("text-generation", model=gpt2_model, tokenizer=tokenizer)
    assert fast(text, max_new_tokens=30, do_sample=False) == expected and verified
    one_arg = T.pipeline("text-generation", model=gpt2_model, tokenizer=tokenizer,
                         custom_generate=lookahead.custom_generate, max_ngram=3)
    assert one_arg(text, max_new_tokens=30, do_sample=False) == expected
    per_call = plain(text, max_new_tokens=30, do_sample=False, custom_generate=lookahead.custom_generate)
    assert per_call == expected
