"""Tables of `benchmarks/recycle.py`'s JSON lines: tokens per forward per workload (new tokens over forwards, pooled
over the workload's prompts) of each method beside a baseline's, the geometric mean over the low-copy Spec-Bench
categories, the copy-heavy minimum; or wall time (the sum of the prompts' seconds) with --seconds.

    python benchmarks/recycle_table.py s64.jsonl m64.jsonl --baseline suffix-tree
    python benchmarks/recycle_table.py wall.jsonl --seconds --baseline suffix-tree
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict

LOW_COPY = ["writing", "roleplay", "reasoning", "math", "math_reasoning", "qa", "stem", "humanities"]
COPY_HEAVY = ["summarization", "cnndm", "rag", "nq_rag", "canitedit"]


def load(paths: list) -> list:
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f]
    return rows


def pooled(rows: list, seconds: bool) -> dict:
    """{method: {category: value}}: tokens per forward (new over forwards), or seconds summed over prompts."""
    sums = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for r in rows:
        s = sums[r["method"]][r["category"]]
        s[0] += r["seconds"] if seconds else r["new_tokens"]
        s[1] += 1 if seconds else (r["forwards"] or 0)
    return {m: {c: (a if seconds else a / b if b else float("nan")) for c, (a, b) in cats.items()}
            for m, cats in sums.items()}


def table(rows: list, baseline: str, seconds: bool) -> str:
    values = pooled(rows, seconds)
    methods = [baseline] + sorted(m for m in values if m != baseline)
    categories = list(dict.fromkeys(r["category"] for r in rows))
    unit = "seconds" if seconds else "tokens/forward"
    lines = [f"| workload | " + " | ".join(f"{m} ({unit})" for m in methods) + " |",
             "| --- |" + " ---: |" * len(methods)]
    ratios = defaultdict(dict)
    for c in categories:
        cells = []
        for m in methods:
            v = values[m].get(c)
            if v is None:
                cells.append("")
                continue
            ratio = v / values[baseline][c] if c in values[baseline] else float("nan")
            ratio = 1 / ratio if seconds else ratio  # > 1: better than the baseline
            ratios[m][c] = ratio
            cells.append(f"{v:.2f}" + ("" if m == baseline else f" ({ratio:.2f}x)"))
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    for name, cats in (("low-copy geomean", LOW_COPY), ("copy-heavy min", COPY_HEAVY), ("all min", categories)):
        cells = []
        for m in methods:
            got = [ratios[m][c] for c in cats if c in ratios[m]]
            if not got or m == baseline:
                cells.append("")
            elif name.endswith("geomean"):
                cells.append(f"**{math.exp(sum(map(math.log, got)) / len(got)):.3f}x**")
            else:
                worst = min(cats, key=lambda c: ratios[m].get(c, math.inf))
                cells.append(f"{ratios[m][worst]:.3f}x ({worst})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| outputs equal to the baseline's | " + " | ".join(_same(rows, m, baseline) for m in methods) + " |")
    return "\n".join(lines)


def _same(rows: list, method: str, baseline: str) -> str:
    """How many of the method's outputs equal the baseline's on the same prompt (where both runs kept their tokens;
    else the lengths are compared, marked "length")."""
    reference = {r["prompt"]: r for r in rows if r["method"] == baseline}
    mine = [r for r in rows if r["method"] == method and r["prompt"] in reference]
    if all("tokens" in r and "tokens" in reference[r["prompt"]] for r in mine):
        return f"{sum(r['tokens'] == reference[r['prompt']]['tokens'] for r in mine)}/{len(mine)}"
    return f"{sum(r['new_tokens'] == reference[r['prompt']]['new_tokens'] for r in mine)}/{len(mine)} (length)"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+")
    p.add_argument("--baseline", default="suffix-tree")
    p.add_argument("--seconds", action="store_true", help="wall time instead of tokens per forward")
    args = p.parse_args(argv)
    print(table(load(args.paths), args.baseline, args.seconds))


if __name__ == "__main__":
    main()
