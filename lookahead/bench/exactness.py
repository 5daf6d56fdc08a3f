"""Exactness of greedy speculative decoding in fp32, bf16 and fp16: how many outputs differ from the model's own
greedy `model.generate(do_sample=False)` in the same dtype, where they first differ, and how near a tie the target
was there.

In exact arithmetic a verification forward over k tokens computes the same logits as k one-token forwards, so greedy
speculative decoding writes greedy's tokens. In floating point the two orders of summation round differently; where
the top two logits are closer than that rounding, the argmax can flip and the outputs part. fp32 rounds at ~1e-7,
bf16 at ~1e-2 (8 bits of mantissa), fp16 at ~1e-3: transformers' own prompt lookup is exposed exactly as lookahead is.

Example::

    rows = measure(model_path, prompts=story_prompts(tokenizer), dtypes=("fp32", "bf16"))
    print(markdown(rows))
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .e2e import DTYPES, generate_with
from .methods import resolve

METHODS = ("lookahead-ngram", "lookahead-suffix", "lookahead-suffix-tree", "hf-prompt-lookup-2")
_OPENINGS = [
    "Once upon a time, there was a little {who} named {name}. {name} loved to play",
    "One day, {name} the {who} went to the park. At the park, {name} saw",
    "{name} had a red ball. {name} liked to throw the ball to",
    "There was a {who} called {name}. Every morning {name} would",
    "{name} and {pos} mom went to the store. At the store, {name} wanted",
    "It was a sunny day. {name} the {who} wanted to go outside and",
    "{name} found a big box in the garden. Inside the box,",
    "Once upon a time, {name} was sad because {pos} toy was broken. {name}",
    "{name} liked to help. One day {name} saw a bird that",
    "In a small house lived a {who} named {name}. {name} was very",
    "{name} wanted a cookie. {name} asked {pos} mom, \"Can I have",
    "The {who} named {name} was scared of the dark. One night,",
]
_WHO = [("girl", "Lily", "her"), ("boy", "Tom", "his"), ("dog", "Max", "his")]


def story_prompts(encode, count: int = 36) -> list:
    """`count` short story openings (TinyStories style: stories260K's training text), as token ids via `encode`."""
    texts = [o.format(who=w, name=n, pos=p) for w, n, p in _WHO for o in _OPENINGS][:count]
    return [list(encode(t)) for t in texts]


@dataclass
class Row:
    """One method in one dtype over all prompts."""

    dtype: str
    method: str
    prompts: int = 0
    divergent: int = 0
    first: list = field(default_factory=list)    # first divergent new-token index of each divergent output
    gap: list = field(default_factory=list)      # fp32 logit gap (greedy's token - the method's) there
    gap_dtype: list = field(default_factory=list)  # the same gap computed in the dtype
    tokens: int = 0
    forwards: int = 0  # lookahead's forwards (0 for transformers' methods)


def _load(path, dtype: str, device="cpu"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype]).to(device).eval()


def _gap(model, prefix: list, a: int, b: int) -> float:
    """logit[a] - logit[b] after `prefix`, from one full forward of `model`."""
    with torch.inference_mode():
        logits = model(torch.tensor([prefix], device=model.device)).logits[0, -1].float()
    return float(logits[a] - logits[b])


def measure(path, prompts: list, dtypes=("fp32", "bf16", "fp16"), methods=METHODS, max_new: int = 64,
            eos: int | None = None, draft_cost=None, device="cpu") -> list:
    """Rows for every dtype and method: each prompt alone (batch 1, no padding), compared token for token with
    `model.generate(do_sample=False)` of the same model in the same dtype. `draft_cost` goes to lookahead (None: its
    default; 0: draft whenever there is a match, as often as prompt lookup does). Every model runs on `device`."""
    reference32 = _load(path, "fp32", device)
    eos = int(reference32.generation_config.eos_token_id if eos is None else eos)
    rows = []
    for dtype in dtypes:
        model = _load(path, dtype, device)
        greedy = [_new(model, resolve(["hf-greedy"])[0], p, max_new, eos)[0] for p in prompts]
        for method in resolve(methods, need="generate"):
            row = Row(dtype, method.name, len(prompts))
            for prompt, want in zip(prompts, greedy):
                got, stats = _new(model, method, prompt, max_new, eos, draft_cost)
                row.tokens += len(got)
                row.forwards += stats.forward_passes if stats is not None else 0
                j = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), None)
                if j is None and len(got) == len(want):
                    continue
                j = min(len(got), len(want)) if j is None else j
                row.divergent += 1
                row.first.append(j)
                if j < min(len(got), len(want)):
                    row.gap.append(_gap(reference32, prompt + want[:j], want[j], got[j]))
                    row.gap_dtype.append(_gap(model, prompt + want[:j], want[j], got[j]))
            rows.append(row)
    return rows


def _new(model, method, prompt: list, max_new: int, eos: int, draft_cost=None) -> tuple:
    ids = torch.tensor([prompt], device=model.device)
    out, stats = generate_with(method, model, ids, torch.ones_like(ids), max_new, eos, draft_cost=draft_cost)
    return out[0, len(prompt):].tolist(), stats


def _stat(values: list, fmt: str) -> str:
    if not values:
        return "—"
    return f"{np.median(values):{fmt}} ({np.min(values):{fmt}} to {np.max(values):{fmt}})"


def markdown(rows: list) -> str:
    """One row per (dtype, method): outputs that differ from greedy, where and how near a tie."""
    lines = ["| dtype | method | differ from greedy | first divergent token: median (min to max) | logit gap there, "
             "fp32: median (min to max) | logit gap there, same dtype | tokens/forward |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        tpf = f"{r.tokens / r.forwards:.2f}" if r.forwards else "—"
        lines.append(f"| {r.dtype} | {r.method} | {r.divergent}/{r.prompts} | {_stat(r.first, '.0f')} | "
                     f"{_stat(r.gap, '.2g')} | {_stat(r.gap_dtype, '.2g')} | {tpf} |")
    return "\n".join(lines)
