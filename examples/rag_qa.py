"""RAG question answering: the top passage goes in the prompt, every retrieved passage goes to lookahead's index.

`documents=` lets the model copy from passages it is not shown (no prompt cost): drafts come from them, and the
answer is still exactly what plain greedy decoding writes. Offline, a random-weight Llama stands in (junk answers).
"""
import gzip
import json
import time
from pathlib import Path

import torch
import transformers as T

import lookahead

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
SHARED = Path(__file__).resolve().parents[2] / "shared"
QUESTIONS = 2
MAX_NEW_TOKENS = 96


def load():
    try:
        return (T.AutoModelForCausalLM.from_pretrained(MODEL, local_files_only=True).eval(),
                T.AutoTokenizer.from_pretrained(MODEL, local_files_only=True))
    except OSError:
        tok = T.AutoTokenizer.from_pretrained(SHARED / "data" / "tokenizers" / "gpt2")
        config = T.LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                               num_attention_heads=4, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
        torch.manual_seed(0)
        return T.LlamaForCausalLM(config).eval(), tok


def questions():
    with gzip.open(SHARED / "data" / "rag" / "nq-open-oracle.jsonl.gz", "rt") as f:
        for line, _ in zip(f, range(QUESTIONS)):
            row = json.loads(line)
            yield row["question"], [f"{c['title']}\n{c['text']}" for c in row["ctxs"]]


model, tok = load()
for question, passages in questions():
    prompt = f"Answer from the passage, quoting it.\n\nPassage: {passages[0]}\n\nQuestion: {question}\n\nAnswer:"
    ids = tok(prompt, return_tensors="pt").input_ids
    t0 = time.perf_counter()
    plain = model.generate(ids, do_sample=False, max_new_tokens=MAX_NEW_TOKENS)
    t1 = time.perf_counter()
    out, stats = lookahead.generate(model, ids, max_new_tokens=MAX_NEW_TOKENS, documents=passages, tokenizer=tok,
                                    return_stats=True)
    t2 = time.perf_counter()
    print(f"Q: {question}\nA: {tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)[:300]}")
    print(f"identical: {torch.equal(out, plain)}, {stats.tokens_per_forward:.2f} tokens/forward, "
          f"plain {t1 - t0:.2f}s, lookahead {t2 - t1:.2f}s\n")
