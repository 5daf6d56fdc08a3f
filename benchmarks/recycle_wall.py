"""Where merged trees' wall time goes against the suffix tree's on this CPU (issue 28): SmolLM2-135M-Instruct, fp32,
greedy, 128 new tokens, default policy, M cold at each call; the two methods' whole calls in turns in one process
(a warm-up round, then `--rounds` rounds, the order alternated), summed over the rounds.

Per workload: seconds, forwards, nodes verified per forward, the wall time of each forward after the prefill (the
model's own, `timing.ForwardTimer`: neither the argmax nor the recycling top-k is in it), the same at equal widths
(merged ÷ tree, each width's median weighted by the merged trees' forwards at it) and the rest of a step
(`Call.host_seconds_per_step`): drafting, acceptance, the argmax, the top-k and M's update.

    python benchmarks/recycle_wall.py --workloads spec-bench/roleplay spec-bench/writing --prompts 3
"""
from __future__ import annotations

import contextlib
import itertools

import numpy as np
import torch

from lookahead import generate
from lookahead.bench.real_report import LITTLE_TO_COPY
from lookahead.bench.real_workloads import load
from lookahead.bench.timing import ForwardTimer, rotations, timed_call
from lookahead.model.causal import CausalLM
from recycle_accounting import setup

METHODS = {"tree": {"lookup": "suffix", "draft": "tree"}, "merged": {"lookup": "suffix+recycle", "draft": "tree"}}


@contextlib.contextmanager
def recorded_widths(into: list):
    """Inside the block every verification forward appends its width (the nodes it verifies) to `into`."""
    original = CausalLM.verify

    def recorded(self, last, batch, stats):
        into.append(batch.width)
        return original(self, last, batch, stats)

    CausalLM.verify = recorded
    try:
        yield
    finally:
        CausalLM.verify = original


def measure(model, prompts: list, rounds: int, max_new: int) -> dict:
    """Per method, over `rounds` rounds: seconds, forwards, host seconds besides the forwards after the prefill, and
    [(width, seconds)] of those forwards."""
    totals = {name: {"seconds": 0.0, "forwards": 0, "host": 0.0, "steps": []} for name in METHODS}
    timer = ForwardTimer("cpu")
    handles = timer.attach(model)
    try:
        for round_, order in enumerate(rotations(list(METHODS), rounds + 1)):  # round 0 warms up
            for ids, name in itertools.product(prompts, order):
                widths = []
                with recorded_widths(widths), torch.inference_mode():
                    call = timed_call(lambda: generate(model, ids, max_new_tokens=max_new, **METHODS[name]), timer)
                if round_:
                    if call.forwards != len(widths) + 1:
                        raise RuntimeError(f"{call.forwards} forwards timed for {len(widths)} steps and a prefill")
                    t = totals[name]
                    t["seconds"] += call.seconds
                    t["forwards"] += call.forwards
                    t["host"] += call.host_seconds_per_step * len(widths)
                    t["steps"] += zip(widths, call.durations[1:])
    finally:
        for handle in handles:
            handle.remove()
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
    rest = {k: 1e3 * v["host"] / max(len(steps[k]), 1) for k, v in totals.items()}
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
