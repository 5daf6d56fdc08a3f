"""Drafter cost per decoding step against the number of tokens held: one ``propose(10)`` plus one ``extend`` of 3
tokens, after a context of real text (n-grams must repeat as they do in practice).

Example::

    pool = token_pool(traces, 1_000_000 + 10_000)
    makers = index_makers()
    results = measure(makers, pool, sizes=(1_000, 32_000), steps=500)
    print(markdown(results, list(makers), (1_000, 32_000)))
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from .methods import INDEX_DEFAULT, Setup, resolve

__all__ = ["INDEX_DEFAULT", "SIZES", "index_makers", "markdown", "measure", "synthetic_pool", "token_pool"]

SIZES = (1_000, 8_000, 32_000, 128_000, 1_000_000)
# Peers that rescan the whole context every step only run where they finish in reasonable time.
MAX_SIZE = {"hf-prompt-lookup-2": 32_000, "hf-prompt-lookup-4": 32_000, "vllm-ngram": 256_000}
MAX_STEPS = {"hf-prompt-lookup-2": 100, "hf-prompt-lookup-4": 100}


def index_makers(names=INDEX_DEFAULT, external: dict | None = None) -> dict[str, Callable[[], object]]:
    """Method name -> fresh drafter (see `methods.resolve`); HF prompt lookup is transformers' own
    ``get_candidates``."""
    setup = Setup(hf_exact=True)
    return {m.name: (lambda make=m.make(setup): make(None)) for m in resolve(names, external, need="replay")}


def token_pool(traces, size: int) -> np.ndarray:
    """At least ``size`` tokens of real text: every trace's prompt then output, tiled when short."""
    parts = [np.concatenate([p, o]) for p, o in traces if len(p) + len(o)]
    if not parts:
        raise ValueError("no tokens to build a context from")
    pool = np.concatenate(parts).astype(np.int32)
    return np.tile(pool, -(-size // len(pool)))[:size]


def synthetic_pool(size: int, vocab: int = 50_000, seed: int = 0) -> np.ndarray:
    """``size`` random ids in which spans of 16 to 256 tokens recur (a stand-in for text when none is at hand)."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, vocab, size, dtype=np.int32)
    pos = 1024
    while pos < size:
        length = int(rng.integers(16, 256))
        start = int(rng.integers(0, pos - length))
        end = min(pos + length, size)
        pool[pos:end] = pool[start:start + end - pos]
        pos = end + int(rng.integers(16, 512))
    return pool


def time_steps(proposer, context: np.ndarray, stream: np.ndarray, steps: int, warmup: int = 3,
               tree: int = 0) -> np.ndarray:
    """Nanoseconds per step (``propose(10)``, or ``propose_tree(tree)`` when ``tree`` > 0, then ``extend`` of the
    next 3 tokens) after feeding ``context``."""
    proposer.extend(context)
    times = np.empty(steps, dtype=np.int64)
    for i in range(warmup + steps):
        chunk = stream[3 * i:3 * i + 3]
        start = time.perf_counter_ns()
        if tree:
            proposer.propose_tree(tree)
        else:
            proposer.propose(10)
        proposer.extend(chunk)
        if i >= warmup:
            times[i - warmup] = time.perf_counter_ns() - start
    return times


def measure(makers: dict, pool: np.ndarray, sizes, steps: int, max_size: dict | None = None,
            max_steps: dict | None = None, progress=None, tree: int = 0) -> dict:
    """``{(label, size): (median µs, mean µs)}`` for each drafter at each context size it supports.

    Args:
        makers: label -> fresh drafter.
        pool: tokens: the first ``size`` are the context, the next ``3 * (steps + 3)`` are appended step by step.
        sizes: context sizes.
        steps: timed steps per size (capped per label by ``max_steps``).
        max_size, max_steps: per-label caps (default: HF prompt lookup at 32k tokens and 100 steps, vLLM's rule at
            256k tokens).
        progress: wraps the list of (label, size) jobs (e.g. ``tqdm``).
        tree: time ``propose_tree(tree)`` instead of ``propose(10)``, for the drafters that have it (others skipped).
    """
    max_size = MAX_SIZE if max_size is None else max_size
    max_steps = MAX_STEPS if max_steps is None else max_steps
    labels = [label for label in makers if not tree or hasattr(makers[label](), "propose_tree")]
    jobs = [(label, size) for label in labels for size in sizes
            if size <= max_size.get(label, size) and size + 3 * (steps + 3) <= len(pool)]
    results = {}
    for label, size in (progress(jobs) if progress else jobs):
        times = time_steps(makers[label](), pool[:size], pool[size:], min(steps, max_steps.get(label, steps)),
                           tree=tree)
        results[label, size] = (float(np.median(times)) / 1e3, float(times.mean()) / 1e3)
    return results


def size_label(size: int) -> str:
    if size >= 1_000_000 and size % 1_000_000 == 0:
        return f"{size // 1_000_000}M"
    return f"{size // 1000}k" if size >= 1000 and size % 1000 == 0 else str(size)


def markdown(results: dict, labels, sizes) -> str:
    """Table of median (mean) microseconds per step, one row per drafter, one column per context size."""
    lines = ["| drafter | " + " | ".join(size_label(s) for s in sizes) + " |", "| --- |" + " ---: |" * len(sizes)]
    for label in labels:
        cells = [f"{results[label, s][0]:.1f} ({results[label, s][1]:.1f})" if (label, s) in results else "—"
                 for s in sizes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
