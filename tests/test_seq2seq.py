"""Encoder-decoder models (BART, T5): greedy lookahead equals model.generate token for token."""
import pytest
import torch
import transformers as T

import lookahead
from conftest import SHARED

GPT2 = SHARED / "data" / "tokenizers" / "gpt2"


def tiny_bart(vocab=96, seed=0):
    config = T.BartConfig(vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                          max_position_embeddings=256, init_std=0.3, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                          decoder_start_token_id=2, forced_bos_token_id=0, no_repeat_ngram_size=3)
    torch.manual_seed(seed)
    return T.BartForConditionalGeneration(config).eval()


def tiny_t5(seed=0):
    config = T.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                        initializer_factor=3.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    torch.manual_seed(seed)
    return T.T5ForConditionalGeneration(config).eval()


def padded_sources(lengths, seed=0, pad=1):
    """Right-padded encoder inputs of the given lengths, as a tokenizer pads them, with their mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), max(lengths)), pad)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n], mask[i, :n] = torch.randint(3, 96, (n,), generator=g), 1
    return ids, mask


@pytest.mark.parametrize("make", [tiny_bart, tiny_t5])
def test_greedy_matches_model_generate(make):
    """A padded batch whose rows accept different numbers of drafts and finish at different times."""
    model = make()
    ids, mask = padded_sources([40, 30, 35])
    expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40)
    out, stats = lookahead.generate(model, ids, attention_mask=mask, max_new_tokens=40, return_stats=True)
    assert torch.equal(out, expected) and stats.accepted_tokens > 0


class CopySource(T.LogitsProcessor):
    """Forces the decoder to copy the encoder input from position `start` on (batch of one)."""

    def __init__(self, source, start):
        self.source, self.start = source, start

    def __call__(self, input_ids, scores):
        forced = torch.full_like(scores, -1e4)
        forced[:, self.source[min(self.start + input_ids.shape[1] - 1, len(self.source) - 1)]] = 0
        return forced


@pytest.mark.parametrize("make", [tiny_bart, tiny_t5])
def test_drafts_come_from_the_encoder_input(make):
    """An output that copies the source is drafted from the encoder input: many tokens per forward."""
    model = make()
    ids, _ = padded_sources([60])
    copy = T.LogitsProcessorList([CopySource(ids[0].tolist(), 10)])
    kwargs = dict(max_new_tokens=40, logits_processor=copy, no_repeat_ngram_size=0)
    expected = model.generate(ids, do_sample=False, **kwargs)
    out, stats = lookahead.generate(model, ids, return_stats=True, **kwargs)
    assert torch.equal(out, expected) and stats.tokens_per_forward > 3


def test_sampling_runs_with_several_sequences_per_input():
    """Sampling, num_return_sequences and the plugin path work for encoder-decoders."""
    model = tiny_t5()
    ids, mask = padded_sources([20, 12], pad=0)
    out = model.generate(ids, attention_mask=mask, custom_generate=lookahead.custom_generate, do_sample=True,
                         num_return_sequences=2, max_new_tokens=15, generator=0)
    assert out.shape[0] == 4 and out.shape[1] <= 16


def test_summarization_pipeline():
    """lookahead.pipeline("summarization") gives the plain pipeline's summaries."""
    if not (GPT2 / "vocab.json").exists():
        pytest.skip(f"{GPT2} not found")
    tokenizer = T.AutoTokenizer.from_pretrained(GPT2)
    model = tiny_bart(vocab=len(tokenizer))
    text = "The cat sat on the mat. The cat sat on the mat again, and then the cat slept."
    fast = lookahead.pipeline("summarization", model=model, tokenizer=tokenizer, max_new_tokens=30)
    ids = tokenizer(text, return_tensors="pt")
    expected = tokenizer.decode(model.generate(**ids, max_new_tokens=30)[0], skip_special_tokens=True)
    assert fast(text) == [{"summary_text": expected}]
