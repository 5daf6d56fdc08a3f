"""Two checkouts of lookahead on a real model (SmolLM2-135M-Instruct, fp32, this CPU): whole greedy calls of
`lookahead.generate` with each method, one process per checkout in turns (A, B, A, B, ...), so that what a process
measures once (the `draft_cost="auto"` curve, numba's compilation) and drift in the machine's speed fall on both alike.
Each process warms up every method on every workload, then times `--calls` calls of each and keeps the median.
Prints seconds, forwards and drafted nodes per workload and method, and B's speedup over A.

    git worktree add /tmp/base b60859d             # the commit before the tree floor of 295b5c4
    python benchmarks/checkouts.py /tmp/base . --rounds 2
    python benchmarks/checkouts.py /tmp/base . --methods tree merged --workloads code-edit summarization
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

METHODS = {"tree": {"lookup": "suffix", "draft": "tree"}, "merged": {"lookup": "suffix+recycle", "draft": "tree"},
           "ngram": {"lookup": "ngram"}, "suffix": {"lookup": "suffix"}}
WORKLOADS = ("spec-bench/writing", "spec-bench/roleplay", "spec-bench/reasoning", "spec-bench/qa", "summarization",
             "code-edit", "rag", "agent")


def measure(args) -> None:
    """In the child process: time the methods on the workloads with the lookahead on sys.path; print JSON."""
    import time

    import torch

    from lookahead import generate, models
    from lookahead.bench.real_workloads import load

    torch.set_num_threads(args.threads)
    model, tokenizer, _ = models.load("smollm2")
    out = {}
    with torch.inference_mode():
        for workload, items in load(args.workloads, tokenizer, 1).items():
            ids = torch.as_tensor(items[0].input_ids)[None]
            for name in args.methods:
                generate(model, ids, max_new_tokens=args.max_new, **METHODS[name])
            for name in args.methods:
                seconds, stats = [], None
                for _ in range(args.calls):
                    start = time.perf_counter()
                    _, stats = generate(model, ids, max_new_tokens=args.max_new, return_stats=True, **METHODS[name])
                    seconds.append(time.perf_counter() - start)
                out[f"{workload}|{name}"] = {"seconds": float(np.median(seconds)), "forwards": stats.forward_passes,
                                             "drafted": stats.draft_tokens}
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="checkout A (its root: the folder holding lookahead/)")
    parser.add_argument("b", help="checkout B")
    parser.add_argument("--methods", nargs="+", choices=sorted(METHODS), default=["tree", "merged"])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=2, help="processes per checkout, in turns")
    parser.add_argument("--calls", type=int, default=3, help="timed calls per method and workload in a process")
    parser.add_argument("--max-new", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return measure(args)
    runs = {"A": [], "B": []}
    for r in range(args.rounds):
        for side, root in (("A", args.a), ("B", args.b)):
            env = {**os.environ, "PYTHONPATH": str(Path(root).resolve())}
            cmd = [sys.executable, __file__, args.a, args.b, "--child", "--methods", *args.methods, "--workloads",
                   *args.workloads, "--calls", str(args.calls), "--max-new", str(args.max_new), "--threads",
                   str(args.threads)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds}: {side} done", file=sys.stderr, flush=True)
    print("| workload, method | A s | B s | B faster | A forwards | B forwards | A drafted | B drafted |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    sums = {}
    for key in runs["A"][0]:
        a, b = (float(np.mean([x[key]["seconds"] for x in runs[s]])) for s in "AB")
        fa, fb, da, db = (float(np.mean([x[key][f] for x in runs[s]])) for f in ("forwards", "drafted") for s in "AB")
        sums.setdefault(key.split("|")[1], [0.0, 0.0])
        sums[key.split("|")[1]][0] += a
        sums[key.split("|")[1]][1] += b
        print(f"| {key.replace('|', ', ')} | {a:.2f} | {b:.2f} | {a / b:.3f}x | {fa:.0f} | {fb:.0f} | {da:.0f} | {db:.0f} |")
    for name, (a, b) in sums.items():
        print(f"| all, {name} | {a:.2f} | {b:.2f} | {a / b:.3f}x | | | | |")


if __name__ == "__main__":
    main()
