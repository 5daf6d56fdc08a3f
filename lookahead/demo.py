"""`lookahead demo`: plain greedy versus lookahead on a grounded prompt (code to edit), side by side."""
from __future__ import annotations

import socket
import time

import torch

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


class CharTokenizer:
    """Printable ASCII, newline and tab as ids 3.. (0 pad, 1 bos, 2 eos): a tokenizer that needs no download."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    chars = "\n\t" + "".join(chr(c) for c in range(32, 127))
    vocab_size = 3 + len(chars)

    def encode(self, text: str) -> list:
        lookup = {c: i + 3 for i, c in enumerate(self.chars)}
        return [self.bos_token_id] + [lookup.get(c, lookup["?"]) for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[i - 3] for i in ids if 3 <= i < self.vocab_size)


def load(model_id: str, device: str):
    """(model, tokenizer, note): the requested model, or a local random-weight Llama when it cannot be loaded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for local_only in (True, False):
        if not local_only and not _hub_reachable():
            break
        try:
            tok = AutoTokenizer.from_pretrained(model_id, local_files_only=local_only)
            model = AutoModelForCausalLM.from_pretrained(model_id, local_files_only=local_only, dtype=torch.float32)
            return model.to(device).eval(), tok, f"model: {model_id}"
        except (OSError, ValueError):
            continue
    print(f"could not load {model_id} (offline?); using a local random-weight Llama built from a small config")
    return _local_model().to(device), CharTokenizer(), "model: random-weight Llama (6 layers, hidden 256), character tokens"


def _local_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=CharTokenizer.vocab_size, hidden_size=256, intermediate_size=688,
                         num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def _hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _prompt_ids(tok, device) -> torch.Tensor:
    user = f"{INSTRUCTION}\n\n```python\n{DOCUMENT}```"
    if isinstance(tok, CharTokenizer):
        return torch.tensor([tok.encode(user + "\n\n```python\n")], device=device)
    messages = [{"role": "user", "content": user}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok(text, return_tensors="pt").input_ids.to(device)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def run(model_id: str = DEFAULT_MODEL, max_new_tokens: int = 256, device: str = "cpu", max_ngram: int = 4) -> bool:
    """Run both decoders on the grounded prompt, print the comparison; return whether the outputs are identical."""
    model, tok, note = load(model_id, device)
    ids = _prompt_ids(tok, device)
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
    print(tok.decode(fast[0, ids.shape[1]:].tolist()))
    print(f"\nidentical outputs:   {'yes' if same else 'NO'}")
    print(f"forward passes:      greedy {plain_forwards}, lookahead {stats.forward_passes} "
          f"({stats.tokens_per_forward:.2f} tokens/forward, {stats.acceptance_rate:.0%} of drafts accepted)")
    print(f"tokens/s:            greedy {(plain.shape[1] - ids.shape[1]) / t_plain:.1f}, lookahead {new / t_fast:.1f}")
    print(f"speedup:             {t_plain / t_fast:.2f}x")
    return same
