"""Draft quality on traces: lookahead's lookup modes and Hugging Face's prompt lookup, replayed model-free.

Each method makes a fresh drafter per trace; tree methods are replayed with ``propose_tree``. ``replay_all`` gives
tokens per forward, acceptance, draft tokens per step and the speedup they predict for a forward-cost ratio.

Example::

    results = replay_all(replay_methods(), {"git": traces})
    print(markdown(results, cost_ratios=[1.1]))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .peers import PromptLookup
from .replay import DEFAULT_COST_TOKENS, ReplayStats, predicted_speedup, replay_dataset


@dataclass(frozen=True)
class Method:
    """A drafter to replay: ``make(trace)`` returns a fresh one; ``tree`` replays ``propose_tree(budget)``."""

    key: str
    label: str
    make: Callable
    tree: bool = False


def suffix_index_class():
    """``lookahead.index.SuffixIndex``, or None while it is not importable."""
    try:
        from ..index import SuffixIndex
    except ImportError:
        return None
    return SuffixIndex


def replay_methods(budget: int = 10, tree_budget: int = 32, hf_exact: bool = False) -> list:
    """Every method available here, in table order: lookahead's modes first, then HF prompt lookup.

    Args:
        budget: draft tokens per step (HF's ``num_output_tokens``).
        tree_budget: nodes per step of tree drafts.
        hf_exact: HF rows call transformers' ``get_candidates`` (slow on long contexts) instead of its rule in numba.
    """
    from ..index import NgramIndex

    methods = [Method("ngram", "lookahead ngram", lambda trace: NgramIndex(max_ngram=4, min_ngram=1))]
    suffix = suffix_index_class()
    if suffix is not None:
        methods += [Method("suffix", "lookahead suffix", lambda trace: suffix()),
                    Method("suffix-tree", f"lookahead suffix tree ({tree_budget} nodes)", lambda trace: suffix(), True)]
    methods += [
        Method("hf", "HF prompt lookup (ngram 2)", lambda trace: PromptLookup(2, budget, hf_exact)),
        Method("hf4", "HF prompt lookup (ngram 4)", lambda trace: PromptLookup(4, budget, hf_exact)),
    ]
    return methods


def select(methods: list, keys) -> list:
    """The methods named by ``keys`` (all when None), in table order.

    Raises:
        ValueError: a key names no available method.
    """
    if keys is None:
        return methods
    known = {m.key for m in methods}
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise ValueError(f"unknown mode {unknown[0]!r}; available: {', '.join(sorted(known))}")
    return [m for m in methods if m.key in set(keys)]


def replay_all(methods: list, datasets: dict, budget: int = 10, tree_budget: int = 32, progress=None) -> dict:
    """``{(method label, dataset): ReplayStats}`` for every method on every dataset (``{name: traces}``).

    ``progress(iterable, desc=...)`` wraps each replay's traces (e.g. ``tqdm``).
    """
    results = {}
    for method in methods:
        for name, traces in datasets.items():
            bar = (lambda xs, d=f"{method.key} {name}": progress(xs, desc=d, leave=False)) if progress else None
            results[method.label, name] = replay_dataset(method.make, traces, tree_budget if method.tree else budget,
                                                         method.tree, bar)
    return results


def markdown(results: dict, cost_ratios=(1.1,), cost_tokens: int = DEFAULT_COST_TOKENS) -> str:
    """One row per (dataset, method): tokens per forward, acceptance, draft tokens per step, predicted speedups."""
    heads = [f"predicted speedup (cost ratio {r:g})" for r in cost_ratios]
    lines = ["| dataset | method | tokens/forward | acceptance | draft tokens/step | " + " | ".join(heads) + " |",
             "| --- | --- | ---: | ---: | ---: |" + " ---: |" * len(heads)]
    labels, names = list(dict.fromkeys(k[0] for k in results)), list(dict.fromkeys(k[1] for k in results))
    for label, name in [(label, name) for name in names for label in labels if (label, name) in results]:
        stats: ReplayStats = results[label, name]
        cells = [f"{predicted_speedup(stats, r, cost_tokens):.2f}x" for r in cost_ratios]
        lines.append(f"| {name} | {label} | {stats.tokens_per_forward:.2f} | {stats.acceptance_rate:.2f} | "
                     f"{stats.drafted_per_step:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
