"""The decoding steps a GPU run of `gpu.py` takes, counted on this CPU: the same recorded workloads forced on a tiny
random-weight Llama (steps depend on the drafts, not on the model's size), the accelerator's default draft_cost
(0, 0.02), the static step's widths uncompiled (1, 2, 4, ..., the CUDA default) and compiled (1, 4, 16, 64). Three
drafting rules: "10/32, unfilled" (num_draft_tokens=10, max_draft_nodes=32, drafts not filled: an ablation that
switches the fill off by patching `StaticCausalLM.padded`), "10/32, filled" (the same budgets) and "default" (both
unset: on a static step as many as its width for 10 tokens and 32 nodes holds, 15 and 63).

    python benchmarks/gpu_steps.py                      # traces of benchmarks/.cache/gpu-traces (gpu.py --export)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from lookahead import generate
from lookahead.model import static
from lookahead.bench.e2e import left_pad, random_model
from lookahead.bench.forcing import ForcedOutputs
from lookahead.bench.traces_io import read_traces

TRACES = Path(__file__).resolve().parent / ".cache" / "gpu-traces"
EOS = 50256
METHODS = {"lookahead-ngram": dict(lookup="ngram"), "lookahead-suffix-tree": dict(lookup="suffix", draft="tree")}
WIDTHS = {"uncompiled": static.WIDTHS, "compiled": static.COMPILED_WIDTHS}


GIVEN = dict(num_draft_tokens=10, max_draft_nodes=32)  # the defaults of the GPU run in RESULTS.md
RULES = {"10/32, unfilled": GIVEN, "10/32, filled": GIVEN, "default": {}}


def steps(model, forced, traces, rows, rule: str, widths: tuple, max_new: int, **kwargs) -> int:
    """Forwards after the prefill of one call over `rows` (the batch's steps)."""
    ids, mask = left_pad([traces[i][0] for i in rows], EOS, model.device)
    forced.reset()
    unfilled = staticmethod(lambda n: 0) if rule == "10/32, unfilled" else None
    kwargs = {**kwargs, **RULES[rule]}
    with _patched(static, "WIDTHS", widths), _patched(static.StaticCausalLM, "padded", unfilled):
        _, stats = generate(model, ids, attention_mask=mask, max_new_tokens=max_new, eos_token_id=EOS,
                            pad_token_id=EOS, draft_cost=(0.0, 0.02), cache_implementation="static",
                            return_stats=True, **kwargs)
    return stats.forward_passes - 1


class _patched:
    def __init__(self, owner, name: str, value):
        self.owner, self.name, self.value = owner, name, value

    def __enter__(self):
        self.old = self.owner.__dict__[self.name]
        if self.value is not None:
            setattr(self.owner, self.name, self.value)

    def __exit__(self, *exc):
        setattr(self.owner, self.name, self.old)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=TRACES, help="folder of gpu.py --export")
    parser.add_argument("--workloads", nargs="+", default=["code-edit", "summarization", "no-copy"])
    parser.add_argument("--max-new", type=int, default=128)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = random_model("tiny", EOS + 1, EOS)
    print("| workload | widths | method | " + " | ".join(f"batch {b}: {r}" for b in ("1 (2 prompts)", "16") for r in RULES)
          + " |\n| --- | --- | --- |" + " ---: |" * 2 * len(RULES))
    for workload in args.workloads:
        traces, errors = read_traces(args.traces / f"{workload}.jsonl")
        if len(traces) < 16:
            print(f"skipped {workload}: {errors[0] if errors else 'fewer than 16 traces'}", file=sys.stderr)
            continue
        forced = ForcedOutputs(traces, EOS, model.device)
        hook = forced.attach(model)
        for widths, sizes in WIDTHS.items():
            for name, kwargs in METHODS.items():
                cells = [sum(steps(model, forced, traces, [i], rule, sizes, args.max_new, **kwargs) for i in (0, 1))
                         for rule in RULES]
                cells += [steps(model, forced, traces, list(range(16)), rule, sizes, args.max_new, **kwargs)
                          for rule in RULES]
                print(f"| {workload} | {widths} | {name} | " + " | ".join(map(str, cells)) + " |", flush=True)
        hook.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
