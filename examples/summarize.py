"""Summarize news articles with a summarization pipeline that runs through lookahead: one line changes.

Offline, the model falls back to a random-weight BART with the GPT-2 tokenizer from ../shared/data (its summaries are
junk; that both pipelines write the same text, and how fast, is the point).
"""
import json
import time
from pathlib import Path

import torch
import transformers as T

import lookahead
from lookahead.plugin import Summarization

MODEL = "facebook/bart-large-cnn"
SHARED = Path(__file__).resolve().parents[2] / "shared"
ARTICLES = 3
MAX_NEW_TOKENS = 60


def load():
    try:
        return (T.AutoModelForSeq2SeqLM.from_pretrained(MODEL, local_files_only=True).eval(),
                T.AutoTokenizer.from_pretrained(MODEL, local_files_only=True), MODEL)
    except OSError:
        tok = T.AutoTokenizer.from_pretrained(SHARED / "data" / "tokenizers" / "gpt2")
        config = T.BartConfig(vocab_size=len(tok), d_model=256, encoder_layers=3, decoder_layers=3,
                              encoder_ffn_dim=1024, decoder_ffn_dim=1024, forced_bos_token_id=None)
        torch.manual_seed(0)
        return T.BartForConditionalGeneration(config).eval(), tok, "random-weight BART (offline fallback)"


def articles():
    path = SHARED / "data" / "summarization" / "cnndm_frank.jsonl"
    if not path.exists():
        return ["The city council voted on Tuesday to expand the bike lane network. The council said the network "
                "will grow by 40 miles over five years, and that the bike lane network will connect every district."]
    with open(path) as f:
        return [json.loads(line)["article"] for line, _ in zip(f, range(ARTICLES))]


model, tok, name = load()
print(f"model: {name}")
# num_beams=1: lookahead decodes greedily (or samples); beam search is refused with an error, not silently changed.
plain = Summarization(model, tok, custom_generate=None, num_beams=1, max_new_tokens=MAX_NEW_TOKENS)
fast = lookahead.pipeline("summarization", model=model, tokenizer=tok, num_beams=1, max_new_tokens=MAX_NEW_TOKENS)
for article in articles():
    t0 = time.perf_counter()
    expected = plain(article)
    t1 = time.perf_counter()
    got = fast(article)
    t2 = time.perf_counter()
    print(f"\n{got[0]['summary_text'][:300]}\nidentical: {got == expected}, plain {t1 - t0:.2f}s, lookahead {t2 - t1:.2f}s")
