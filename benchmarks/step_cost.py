"""What one verification forward costs on a real model: transformers' dynamic cache and sdpa attention against the
cache and attention lookahead's calls run with (`lookahead.model.cache.GrowingLayer`: keys written in place instead
of concatenated; `lookahead.model.attention.packed_sdpa`: grouped-query heads packed instead of the cache repeated
per head; `lookahead.model.linear.packed_linears`: linear weights packed once for MKL), at several contexts and
widths. Medians of forwards in turns (each setting once per round), milliseconds;
the logits of each setting are compared with transformers' (max |difference|, argmax equal).

    python benchmarks/step_cost.py                        # SmolLM2-135M-Instruct, contexts 64 512 1800
    python benchmarks/step_cost.py --model PATH --contexts 512 --widths 1 8
"""
from __future__ import annotations

import argparse
import contextlib
import time

import numpy as np
import torch
from transformers import DynamicCache

from lookahead import models
from lookahead.model.attention import packed_attention
from lookahead.model.cache import new_cache
from lookahead.model.linear import packed_linears


@contextlib.contextmanager
def _all_three(model):
    with packed_attention(model), packed_linears(model):
        yield


SETTINGS = {  # name -> (cache factory, context the forwards run in)
    "transformers": (lambda model: DynamicCache(config=model.config), lambda model: contextlib.nullcontext()),
    "packed": (lambda model: DynamicCache(config=model.config), packed_attention),
    "packed+growing": (new_cache, packed_attention),
    "+packed weights": (new_cache, _all_three),
}


def forward_ms(model, context: int, widths, rounds: int) -> dict:
    """{(setting, width): (median ms, logits)} of forwards over `width` tokens after `context` cached ones."""
    vocab = model.get_input_embeddings().num_embeddings
    prompt = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(context))
    caches = {}
    for name, (make, attention) in SETTINGS.items():
        with attention(model):
            caches[name] = make(model)
            model(input_ids=prompt, attention_mask=torch.ones_like(prompt), past_key_values=caches[name],
                  use_cache=True, logits_to_keep=1)
    samples, logits = {}, {}
    for r in range(rounds + 1):  # the first round warms up
        for width in widths:
            step = prompt[:, :width]
            mask = torch.ones(1, context + width, dtype=torch.long)
            positions = torch.arange(context, context + width)[None]
            for name, (_, attention) in SETTINGS.items():
                with attention(model):
                    start = time.perf_counter()
                    out = model(input_ids=step, attention_mask=mask, position_ids=positions,
                                past_key_values=caches[name], use_cache=True).logits
                    seconds = time.perf_counter() - start
                caches[name].crop(-width)
                if r:
                    samples.setdefault((name, width), []).append(seconds)
                logits[name, width] = out
    return {key: (1000 * float(np.median(t)), logits[key]) for key, t in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2, a .gguf file, a folder or a hub id")
    parser.add_argument("--contexts", type=int, nargs="+", default=[64, 512, 1800])
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, _, note = models.load(args.model)
    print(f"{note}; torch threads {torch.get_num_threads()}; medians of {args.rounds} rounds, ms per forward\n")
    names = list(SETTINGS)
    print("| context | width | " + " | ".join(names) + " | last ÷ transformers | max abs diff | argmax equal |")
    print("| ---: | ---: |" + " ---: |" * len(names) + " ---: | ---: | --- |")
    with torch.inference_mode():
        for context in args.contexts:
            times = forward_ms(model, context, args.widths, args.rounds)
            for width in args.widths:
                ms = [times[n, width][0] for n in names]
                ref = times[names[0], width][1]
                diff = max(float((times[n, width][1] - ref).abs().max()) for n in names)
                same = all(torch.equal(times[n, width][1].argmax(-1), ref.argmax(-1)) for n in names)
                print(f"| {context} | {width} | " + " | ".join(f"{t:.1f}" for t in ms)
                      + f" | {ms[-1] / ms[0]:.2f} | {diff:.1e} | {'yes' if same else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
