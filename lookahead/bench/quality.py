"""Draft quality on traces: every replayable method of `methods.METHODS`, replayed model-free.

Each method makes a fresh drafter per trace (from ``make(setup)``, called once per dataset); tree methods are
replayed with ``propose_tree``. ``replay_all`` gives tokens per forward, acceptance, draft tokens per step and the
speedup they predict for a forward-cost ratio.

Example::

    results = replay_all(resolve(REPLAY_DEFAULT), {"git": traces})
    print(markdown(results, cost_ratios=[1.1]))
"""
from __future__ import annotations

from .methods import Setup
from .replay import DEFAULT_COST_TOKENS, ReplayStats, predicted_speedup, ratio_cost, replay_dataset


def replay_all(methods: list, datasets: dict, setup: Setup = Setup(), progress=None) -> dict:
    """``{(method name, dataset): ReplayStats}`` for every method on every dataset (``{name: traces}``).

    ``progress(iterable, desc=...)`` wraps each replay's traces (e.g. ``tqdm``).
    """
    results = {}
    for method in methods:
        for name, traces in datasets.items():
            bar = (lambda xs, d=f"{method.name} {name}": progress(xs, desc=d, leave=False)) if progress else None
            budget = setup.tree_budget if method.tree else setup.budget
            results[method.name, name] = replay_dataset(method.make(setup), traces, budget, method.tree, bar)
    return results


def markdown(results: dict, cost_ratios=(1.1,), cost_tokens: int = DEFAULT_COST_TOKENS) -> str:
    """One row per (dataset, method): tokens per forward, acceptance, draft tokens per step, predicted speedups."""
    heads = [f"predicted speedup (cost ratio {r:g})" for r in cost_ratios]
    lines = ["| dataset | method | tokens/forward | acceptance | draft tokens/step | " + " | ".join(heads) + " |",
             "| --- | --- | ---: | ---: | ---: |" + " ---: |" * len(heads)]
    labels, names = list(dict.fromkeys(k[0] for k in results)), list(dict.fromkeys(k[1] for k in results))
    for label, name in [(label, name) for name in names for label in labels if (label, name) in results]:
        stats: ReplayStats = results[label, name]
        cells = [f"{predicted_speedup(stats, ratio_cost(r, cost_tokens)):.2f}x" for r in cost_ratios]
        lines.append(f"| {name} | {label} | {stats.tokens_per_forward:.2f} | {stats.acceptance_rate:.2f} | "
                     f"{stats.drafted_per_step:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
