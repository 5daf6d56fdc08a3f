"""Tables, the targets' check and the plot of `lookahead bench real` (rows from `real.Bench`).

Example::

    print(speed_table(rows)); print(ratio_table(rows)); print(targets(rows))
"""
from __future__ import annotations

from .real import GREEDY, HF_LOOKUP, Row, geomean, spec_bench_means, speedups
from .real_workloads import is_spec_bench

LABELS = {GREEDY: "greedy", HF_LOOKUP: "HF prompt lookup", "lookahead-ngram": "lookahead ngram",
          "lookahead-suffix": "lookahead suffix", "lookahead-suffix-tree": "lookahead suffix tree",
          "lookahead-recycle-tree": "lookahead recycle tree",
          "lookahead-suffix-recycle-tree": "lookahead suffix+recycle tree"}
SPEC_BENCH_ROW = "Spec-Bench (geomean)"
HEADLINE = ("summarization", "rag", "code-edit", "agent")  # the workloads held to 1.4x HF prompt lookup's speedup


def label(method: str) -> str:
    return LABELS.get(method, method)


def _workloads(rows: list) -> list:
    return list(dict.fromkeys(r.workload for r in rows))


def _others(rows: list) -> list:
    return [m for m in dict.fromkeys(r.method for r in rows) if m != GREEDY]


def speed_table(rows: list) -> str:
    """Markdown: per workload, each method's whole-call speedup over greedy and its tokens per forward."""
    ratio, methods = speedups(rows), _others(rows)
    by = {(r.workload, r.method): r for r in rows}
    lines = ["| workload | prompts | prompt tokens | new tokens | greedy tokens/s | "
             + " | ".join(f"{label(m)}: speedup (tokens/forward)" for m in methods) + " | all equal greedy |",
             "| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in methods) + " | --- |"]
    for w in _workloads(rows):
        g = by[w, GREEDY]
        cells = [f"{ratio[w, m]:.2f}x ({by[w, m].tokens_per_forward:.2f})" if (w, m) in ratio else "—"
                 for m in methods]
        same = all(by[w, m].same == by[w, m].prompts for m in methods if (w, m) in by)
        lines.append(f"| {w} | {g.prompts} | {g.prompt_tokens} | {g.new_tokens} | {g.new_tokens / g.seconds:.1f} | "
                     + " | ".join(cells) + f" | {'yes' if same else 'NO'} |")
    means = spec_bench_means(rows)
    if means:
        lines.append(f"| {SPEC_BENCH_ROW} | | | | | " + " | ".join(f"{means[m]:.2f}x" if m in means else "—"
                                                                    for m in methods) + " | |")
    return "\n".join(lines)


def ratio_table(rows: list) -> str:
    """Markdown: lookahead's speedup over HF prompt lookup's, and tokens per forward under ``draft_cost=0``."""
    ratio, methods = speedups(rows), [m for m in _others(rows) if m != HF_LOOKUP]
    by = {(r.workload, r.method): r for r in rows}
    free = [m for m in methods if any(r.method == m and r.free_forwards for r in rows)]
    lines = ["| workload | " + " | ".join(f"{label(m)} ÷ HF" for m in methods) + " | HF tokens/forward | "
             + " | ".join(f"{label(m)}, draft_cost=0" for m in free) + " |",
             "| --- | " + " | ".join("---:" for _ in [*methods, HF_LOOKUP, *free]) + " |"]
    for w in _workloads(rows):
        hf = ratio.get((w, HF_LOOKUP))
        cells = [f"{ratio[w, m] / hf:.2f}" if hf and (w, m) in ratio else "—" for m in methods]
        hf_tpf = f"{by[w, HF_LOOKUP].tokens_per_forward:.2f}" if (w, HF_LOOKUP) in by else "—"
        tpf = [f"{by[w, m].free_tokens_per_forward:.2f}" if (w, m) in by and by[w, m].free_forwards else "—"
               for m in free]
        lines.append(f"| {w} | " + " | ".join(cells) + f" | {hf_tpf} | " + " | ".join(tpf) + " |")
    means = spec_bench_means(rows)
    if HF_LOOKUP in means:
        lines.append(f"| {SPEC_BENCH_ROW} | " + " | ".join(f"{means[m] / means[HF_LOOKUP]:.2f}" if m in means
                                                           else "—" for m in methods)
                     + " | | " + " | ".join("" for _ in free) + " |")
    return "\n".join(lines)


def cpu_table(rows: list) -> str:
    """Markdown: each method's speedup over greedy in the process's CPU time, and lookahead's over HF prompt
    lookup's (with one torch thread, what other processes on the machine change least)."""
    ratio, methods = speedups(rows, "cpu_seconds"), _others(rows)
    ours = [m for m in methods if m != HF_LOOKUP]
    lines = ["| workload | " + " | ".join(label(m) for m in methods) + " | "
             + " | ".join(f"{label(m)} ÷ HF" for m in ours) + " |",
             "| --- | " + " | ".join("---:" for _ in [*methods, *ours]) + " |"]
    rows_of = {w: {m: ratio.get((w, m)) for m in methods} for w in _workloads(rows)}
    means = spec_bench_means(rows, "cpu_seconds")
    if means:
        rows_of[SPEC_BENCH_ROW] = {m: means.get(m) for m in methods}
    for w, values in rows_of.items():
        hf = values.get(HF_LOOKUP)
        cells = [f"{values[m]:.2f}x" if values[m] else "—" for m in methods]
        over = [f"{values[m] / hf:.2f}" if hf and values[m] else "—" for m in ours]
        lines.append(f"| {w} | " + " | ".join(cells) + " | " + " | ".join(over) + " |")
    return "\n".join(lines)


def targets(rows: list, method: str = "lookahead-ngram", clock: str = "seconds") -> str:
    """The issue's targets for `method`, each with its measured value and whether it is met (text lines); `clock`
    "cpu_seconds" judges the speed targets by CPU time."""
    ratio, by = speedups(rows, clock), {(r.workload, r.method): r for r in rows}
    workloads = [w for w in _workloads(rows) if (w, method) in ratio]
    if not workloads:
        return f"no rows of {method}"
    lines = []
    slowest = min(workloads, key=lambda w: ratio[w, method])
    lines.append(_check(f"no workload slower than greedy (>= 0.98x): slowest {slowest} {ratio[slowest, method]:.2f}x",
                        ratio[slowest, method] >= 0.98))
    for w in [w for w in HEADLINE if w in workloads and (w, HF_LOOKUP) in ratio]:
        over = ratio[w, method] / ratio[w, HF_LOOKUP]
        lines.append(_check(f"{w}: >= 1.4x HF prompt lookup's speedup: {over:.2f}x", over >= 1.4))
    means = spec_bench_means(rows, clock)
    if method in means and HF_LOOKUP in means:
        over = means[method] / means[HF_LOOKUP]
        lines.append(_check(f"Spec-Bench geomean: >= 1.35x HF prompt lookup's: {over:.2f}x", over >= 1.35))
    short = [w for w in workloads if (w, HF_LOOKUP) in by and by[w, method].free_tokens_per_forward is not None
             and by[w, method].free_tokens_per_forward < by[w, HF_LOOKUP].tokens_per_forward]
    if any(by[w, method].free_forwards for w in workloads):
        lines.append(_check("tokens per forward under draft_cost=0 >= HF prompt lookup's everywhere"
                            + (f": below on {', '.join(short)}" if short else ""), not short))
    return "\n".join(f"- {label(method)}: {line}" for line in lines)


TREE = "lookahead-suffix-tree"
LITTLE_TO_COPY = tuple(f"spec-bench/{c}" for c in ("writing", "roleplay", "reasoning", "math", "math_reasoning", "qa",
                                                   "stem", "humanities"))
COPY_HEAVY = ("summarization", "rag", "code-edit")


def recycle_targets(rows: list, method: str = "lookahead-suffix-recycle-tree") -> str:
    """Issue #28's targets for a recycling `method` against the suffix tree (text lines): tokens per forward under
    ``draft_cost=0`` (>= 1.25x in the geometric mean of the categories with little to copy, never below the tree's,
    >= 0.98x on copy-heavy workloads) and wall time (no workload slower than the tree's)."""
    by = {(r.workload, r.method): r for r in rows}
    both = [w for w in _workloads(rows) if (w, method) in by and (w, TREE) in by]
    if not both:
        return f"no rows of both {method} and {TREE}"
    lines = []
    free = {w: by[w, method].free_tokens_per_forward / by[w, TREE].free_tokens_per_forward for w in both
            if by[w, method].free_forwards and by[w, TREE].free_forwards}
    little = [free[w] for w in LITTLE_TO_COPY if w in free]
    if little:
        lines.append(_check(f"little-to-copy categories ({len(little)}): tokens per forward under draft_cost=0 >= "
                            f"1.25x the tree's in their geometric mean: {geomean(little):.2f}x",
                            geomean(little) >= 1.25))
    if free:
        low = min(free, key=free.get)
        floor = lambda w: 0.98 if w in COPY_HEAVY else 1.0
        below = [w for w in free if free[w] < floor(w)]
        lines.append(_check(f"tokens per forward under draft_cost=0 never below the tree's (copy-heavy >= 0.98x): "
                            f"lowest {low} {free[low]:.2f}x" + (f"; below on {', '.join(below)}" if below else ""),
                            not below))
    wall = {w: by[w, TREE].seconds / by[w, method].seconds for w in both if by[w, method].seconds > 0}
    slow = min(wall, key=wall.get)
    total = sum(by[w, TREE].seconds for w in both) / sum(by[w, method].seconds for w in both)
    lines.append(_check(f"no workload slower than the tree (wall): slowest {slow} at {wall[slow]:.2f}x the tree's "
                        f"speed; all workloads {total:.2f}x", wall[slow] >= 1.0))
    return "\n".join(f"- {label(method)}: {line}" for line in lines)


def _check(text: str, ok: bool) -> str:
    return f"{'met' if ok else 'NOT met'}: {text}"


def plot(rows: list, path: str, title: str) -> None:
    """Grouped bars of each method's speedup over greedy per workload (and the Spec-Bench geometric mean); Spec-Bench
    categories are labelled ``sb/<category>``.

    Raises:
        ValueError: matplotlib missing or the file cannot be written.
    """
    from . import plot as bench_plot

    ratio, methods = speedups(rows), _others(rows)
    short = lambda w: w.replace("spec-bench/", "sb/")
    values = {(label(m), short(w)): v for (w, m), v in ratio.items() if m != GREEDY}
    means = spec_bench_means(rows)
    for m, v in means.items():
        values[label(m), SPEC_BENCH_ROW] = v
    workloads = [short(w) for w in _workloads(rows)] + ([SPEC_BENCH_ROW] if means else [])
    bench_plot.tokens_per_forward(values, [label(m) for m in methods], workloads, path, title,
                                  ylabel="speedup over greedy (whole calls)", group_width=0.9)


def from_dicts(records: list) -> list:
    """`Row`s from the dictionaries `Row.to_dict` wrote."""
    return [Row(**record) for record in records]


__all__ = ["cpu_table", "from_dicts", "geomean", "plot", "ratio_table", "recycle_targets", "speed_table", "targets",
           "is_spec_bench"]
