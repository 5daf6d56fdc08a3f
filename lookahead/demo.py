"""`lookahead demo`: plain greedy versus lookahead on a grounded prompt (code to edit, or a story to retell)."""
from __future__ import annotations

import time

import torch

from . import models
from .generate import generate

DEFAULT_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"

INSTRUCTION = "Rename the function `mean` to `average` and add a docstring. Return the whole file."
DOCUMENT = '''import math


def mean(values):
    total = 0.0
    for value in values:
        total += value
    return total / len(values)


def variance(values):
    m = mean(values)
    return sum((value - m) ** 2 for value in values) / len(values)


def stddev(values):
    return math.sqrt(variance(values))


if __name__ == "__main__":
    data = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]
    print("mean", mean(data), "variance", variance(data), "stddev", stddev(data))
'''


STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she "
         "saw a big, red ball. She wanted to play with it, but it was too high. Lily asked her mom, \"Can you help me "
         "get the ball?\" Her mom smiled and said, \"Yes, Lily. Let's get it together.\" They got the ball and Lily "
         "was very happy. She played with the ball all day. The next day, Lily told her dad what happened. She said, "
         "\"Dad, I saw a big, red ball.")


def load(model_id: str, device: str):
    """(model, tokenizer, note). Only a hub id that cannot be downloaded (offline) falls back to stories260K.

    Raises:
        ValueError: a missing folder, a folder without a model or tokenizer, a hub id the hub refuses (one line).
    """
    return models.load(model_id, device=device, fallback=True)


def _prompt_ids(tok, device) -> torch.Tensor:
    """A chat model edits code; a base model (no chat template, e.g. stories260K) retells a story it just read."""
    if getattr(tok, "chat_template", None):
        messages = [{"role": "user", "content": f"{INSTRUCTION}\n\n```python\n{DOCUMENT}```"}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = STORY
    return tok(text, return_tensors="pt").input_ids.to(device)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def run(model_id: str = DEFAULT_MODEL, max_new_tokens: int = 256, device: str = "cpu", max_ngram: int = 4) -> bool:
    """Run both decoders on the grounded prompt, print the comparison; return whether the outputs are identical."""
    model, tok, note = load(model_id, device)
    ids = _prompt_ids(tok, device)
    limit = getattr(model.config, "max_position_embeddings", None)
    if isinstance(limit, int) and ids.shape[1] + max_new_tokens > limit:
        raise ValueError(f"max_new_tokens={max_new_tokens} with the demo's prompt of {ids.shape[1]} tokens exceeds the "
                         f"model's limit of {limit} positions; use at most {max(limit - ids.shape[1], 1)}")
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with torch.inference_mode():
            generate(model, ids, max_new_tokens=8)  # warm up kernels and caches for both runs
            calls.clear()
            plain, t_plain = _timed(lambda: model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens))
            plain_forwards = len(calls)
            (fast, stats), t_fast = _timed(lambda: generate(model, ids, max_ngram=max_ngram,
                                                             max_new_tokens=max_new_tokens, return_stats=True))
    finally:
        hook.remove()
    new = fast.shape[1] - ids.shape[1]
    same = torch.equal(plain, fast)
    print(f"{note}; prompt {ids.shape[1]} tokens, {new} new tokens\n")
    print(tok.decode(fast[0, ids.shape[1]:].tolist(), skip_special_tokens=True))
    print(f"\nidentical outputs:   {'yes' if same else 'NO'}")
    print(f"forward passes:      greedy {plain_forwards}, lookahead {stats.forward_passes} "
          f"({stats.tokens_per_forward:.2f} tokens/forward, {stats.acceptance_rate:.0%} of drafts accepted)")
    print(f"tokens/s:            greedy {(plain.shape[1] - ids.shape[1]) / t_plain:.1f}, lookahead {new / t_fast:.1f}")
    print(f"speedup:             {t_plain / t_fast:.2f}x")
    return same
