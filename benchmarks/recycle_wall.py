"""Where merged trees' wall time goes against the suffix tree's on this CPU (issue 28): SmolLM2-135M-Instruct, fp32,
greedy, 128 new tokens, default policy, M cold at each call; the two methods' whole calls in turns in one process
(a warm-up round, then `--rounds` rounds, the order alternated), summed over the rounds.

Per workload: seconds, forwards, nodes verified per forward, the wall time of each forward (the target's own, timed
around `CausalLM.verify`, which `verify_ids` calls too: neither the argmax nor the recycling top-k is in it), the
same at equal widths (merged ÷ tree, each width's median weighted by the merged trees' forwards at it) and the rest
of a step: drafting, acceptance, the argmax, the top-k and M's update (a call's setup spread over its steps).

    python benchmarks/recycle_wall.py --workloads spec-bench/roleplay spec-bench/writing --prompts 3
"""
from __future__ import annotations

import contextlib
import time

import numpy as np
import torch

from lookahead import generate
from lookahead.bench.real_report import LITTLE_TO_COPY
from lookahead.bench.real_workloads import load
from lookahead.target.causal import CausalLM
from recycle_accounting import setup

METHODS = {"tree": {"lookup": "suffix", "draft": "tree"}, "merged": {"lookup": "suffix+recycle", "draft": "tree"}}


@contextlib.contextmanager
def timed_forwards(into: list):
    """Inside the block every verification forward appends (its width, its seconds) to `into`."""
    original = CausalLM.verify

    def timed(self, last, batch, stats):
        start = time.perf_counter()
        out = original(self, last, batch, stats)
        into.append((batch.width, time.perf_counter() - start))
        return out

    CausalLM.verify = timed
    try:
        yield
    finally:
        CausalLM.verify = original


def measure(model, prompts: list, rounds: int, max_new: int) -> dict:
    """Per method: seconds, forwards, prefill seconds and [(width, seconds)] of its forwards over `rounds` rounds."""
    totals = {name: {"seconds": 0.0, "forwards": 0, "prefill": 0.0, "steps": []} for name in METHODS}
    for round_ in range(rounds + 1):  # round 0 warms up
        for ids in prompts:
            for name in (list(METHODS) if round_ % 2 else list(METHODS)[::-1]):
                steps = []
                with timed_forwards(steps), torch.inference_mode():
                    start = time.perf_counter()
                    _, stats = generate(model, ids, max_new_tokens=max_new, return_stats=True, **METHODS[name])
                    seconds = time.perf_counter() - start
                if round_:
                    t = totals[name]
                    t["seconds"] += seconds
                    t["forwards"] += stats.forward_passes
                    t["prefill"] += stats.seconds.get("prefill", 0.0)
                    t["steps"] += steps
    return totals


def same_width(tree: np.ndarray, merged: np.ndarray) -> float:
    """Merged ÷ tree forward time at equal widths: each width's medians, weighted by the merged forwards at it."""
    num = den = 0.0
    for width in np.unique(merged[:, 0]):
        mine, theirs = merged[merged[:, 0] == width, 1], tree[tree[:, 0] == width, 1]
        if len(theirs) >= 3 and len(mine) >= 3:
            num += len(mine) * np.median(mine)
            den += len(mine) * np.median(theirs)
    return num / den if den else float("nan")


def row(name: str, totals: dict) -> str:
    t, m = totals["tree"], totals["merged"]
    steps = {k: np.array(v["steps"], dtype=float).reshape(-1, 2) for k, v in totals.items()}
    forward = {k: steps[k][:, 1].sum() for k in steps}
    rest = {k: 1e3 * (v["seconds"] - v["prefill"] - forward[k]) / max(len(steps[k]), 1) for k, v in totals.items()}
    width, ms = {k: v[:, 0].mean() for k, v in steps.items()}, {k: 1e3 * v[:, 1].mean() for k, v in steps.items()}
    return (f"| {name} | {t['seconds']:.2f}, {m['seconds']:.2f} | {t['seconds'] / m['seconds']:.3f} | "
            f"{t['forwards']}, {m['forwards']} | {width['tree']:.2f}, {width['merged']:.2f} | "
            f"{ms['tree']:.1f}, {ms['merged']:.1f} | "
            f"{same_width(steps['tree'], steps['merged']):.3f} | {rest['tree']:.2f}, {rest['merged']:.2f} |")


def main(argv=None) -> None:
    args, model, tokenizer = setup(argv, __doc__, list(LITTLE_TO_COPY), 3, rounds=3)
    print("| workload | seconds: tree, merged | tree ÷ merged | forwards | nodes per forward | ms per forward | "
          "at equal widths, merged ÷ tree | ms per step besides the forward |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.workloads:
        prompts = [torch.as_tensor(item.input_ids)[None] for item in load([name], tokenizer, args.prompts)[name]]
        print(row(name, measure(model, prompts, args.rounds, args.max_new)), flush=True)


if __name__ == "__main__":
    main()
