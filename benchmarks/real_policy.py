"""The shipped draft sizing against variants of it on a real model (SmolLM2-135M-Instruct, fp32, this CPU): whole
greedy calls of `lookahead.generate`, transformers' greedy beside them, 3 rounds in alternating orders, medians.

Variants (`--variant`):
- ``context``: the verification cost curve measured at each prompt's own context (plus 64) instead of the shipped
  ``"auto"`` curve (measured once at a 512-token context);
- ``overhead``: the shipped curve plus `--extra` one-token forwards for every step that drafts;
- ``prior``: `DraftLength`'s acceptance prior `--prior A,R` (pseudo-counts) instead of the shipped (3, 1);
- ``unpadded``: chain steps verify the drafts they hold, without padding to the width the curve prices lowest
  (`CausalLM.pad_to`);
- ``unpacked``: the model's linear layers run transformers' `nn.Linear` in every forward, not the weights packed
  for MKL (`lookahead.model.linear`), with a cost curve measured that way.

    python benchmarks/real_policy.py --variant context
    python benchmarks/real_policy.py --variant overhead --extra 0.1
    python benchmarks/real_policy.py --variant prior --prior 1,1
    python benchmarks/real_policy.py --variant unpadded --workloads spec-bench/reasoning summarization rag
    python benchmarks/real_policy.py --variant unpacked --tree --lookup suffix
"""
from __future__ import annotations

import argparse
import contextlib
import time

import numpy as np
import torch

from lookahead import generate, models
from lookahead.bench.real_workloads import load
from lookahead.decode import policy
from lookahead.decode.calibrate import measure_draft_cost, measured_draft_cost
from lookahead.model import linear
from lookahead.model.causal import CausalLM

WORKLOADS = ("spec-bench/reasoning", "spec-bench/math", "spec-bench/qa", "summarization", "code-edit")


@contextlib.contextmanager
def unpacked():
    """No model's linear layers packed inside the block."""
    shipped = linear._packs_for
    linear._packs_for = lambda model: None
    try:
        yield
    finally:
        linear._packs_for = shipped


def variant_call(args, model, ids, mask, options: dict):
    """A function that runs the variant's call on `ids` (with `generate`'s `options`)."""
    if args.variant == "context":
        cost = measure_draft_cost(model, context=ids.shape[1] + 64, max_tokens=20)
        return lambda: generate(model, ids, attention_mask=mask, max_new_tokens=args.max_new, draft_cost=cost,
                                **options)
    if args.variant == "overhead":
        costs = measured_draft_cost(model, 20).costs.copy()
        costs[1:] += args.extra
        cost = policy.CostCurve(costs)
        return lambda: generate(model, ids, attention_mask=mask, max_new_tokens=args.max_new, draft_cost=cost,
                                **options)
    if args.variant == "unpadded":
        def unpadded():
            shipped = CausalLM.pad_to
            CausalLM.pad_to = lambda self, pads: None
            try:
                return generate(model, ids, attention_mask=mask, max_new_tokens=args.max_new, **options)
            finally:
                CausalLM.pad_to = shipped
        return unpadded
    if args.variant == "unpacked":
        with unpacked():
            cost = measure_draft_cost(model, max_tokens=measured_draft_cost(model, 20).costs.size - 1)

        def plain():
            with unpacked():
                return generate(model, ids, attention_mask=mask, max_new_tokens=args.max_new, draft_cost=cost,
                                **options)
        return plain
    prior = tuple(float(x) for x in args.prior.split(","))
    shipped = policy.DraftLength.__init__.__defaults__

    def call():
        policy.DraftLength.__init__.__defaults__ = (prior,)
        try:
            return generate(model, ids, attention_mask=mask, max_new_tokens=args.max_new, **options)
        finally:
            policy.DraftLength.__init__.__defaults__ = shipped
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=("context", "overhead", "prior", "unpadded", "unpacked"), required=True)
    parser.add_argument("--extra", type=float, default=0.1, help="overhead: one-token forwards added per step")
    parser.add_argument("--prior", default="1,1", help="prior: accepted,rejected pseudo-counts")
    parser.add_argument("--lookup", default="ngram")
    parser.add_argument("--tree", action="store_true")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--max-new", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer, _ = models.load("smollm2")
    options = {"lookup": args.lookup, **({"draft": "tree"} if args.tree else {})}
    total = {"greedy": 0.0, "shipped": 0.0, "variant": 0.0}
    with torch.inference_mode():
        for workload, items in load(args.workloads, tokenizer, 1).items():
            ids = torch.as_tensor(items[0].input_ids)[None]
            mask = torch.ones_like(ids)
            calls = {"greedy": lambda: model.generate(ids, attention_mask=mask, max_new_tokens=args.max_new,
                                                      do_sample=False),
                     "shipped": lambda: generate(model, ids, attention_mask=mask, max_new_tokens=args.max_new,
                                                 **options),
                     "variant": variant_call(args, model, ids, mask, options)}
            outputs = {name: call() for name, call in calls.items()}  # warm-up; every output must be greedy's
            if any(not torch.equal(out, outputs["greedy"]) for out in outputs.values()):
                raise SystemExit(f"{workload}: an output differs from greedy's")
            seconds = {name: [] for name in calls}
            for round_ in range(3):
                for name, call in (list(calls.items()) if round_ % 2 == 0 else list(calls.items())[::-1]):
                    start = time.perf_counter()
                    call()
                    seconds[name].append(time.perf_counter() - start)
            median = {name: float(np.median(v)) for name, v in seconds.items()}
            for name in total:
                total[name] += median[name]
            print(workload, " | ".join(f"{n} {v:.2f} s ({median['greedy'] / v:.2f}x)" for n, v in median.items()),
                  flush=True)
    print(f"all: shipped {total['shipped']:.2f} s, variant {total['variant']:.2f} s: the variant is "
          f"{total['shipped'] / total['variant'] - 1:+.1%} faster")


if __name__ == "__main__":
    main()
