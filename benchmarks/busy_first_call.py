"""A first call made on a busy CPU must not switch drafting off for later calls on a quiet one (issue 48).

Three fresh processes, each one default `lookahead.generate` call of SmolLM2-135M-Instruct on a code edit (rename a
parameter in a short file, `EDIT`), 2 torch threads:

1. busy: a fresh lookahead cache (``XDG_CACHE_HOME``) while two busy loops hold the CPU: the call measures its cost
   curve under load;
2. after: a new process on the cache the busy one left, the machine quiet again;
3. quiet: a fresh cache on the quiet machine (the reference).

Printed: each call's tokens per forward and seconds; the target is `after` >= 0.8 x `quiet`.

    python benchmarks/busy_first_call.py
    PYTHONPATH=/some/other/checkout python benchmarks/busy_first_call.py     # another commit's library
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


EDIT = ("Rename the parameter `values` to `samples` in this code and return the whole file:\n```python\n"
        "def mean(values):\n    return sum(values) / len(values)\n\n\n"
        "def variance(values):\n    m = mean(values)\n    return sum((v - m) ** 2 for v in values) / len(values)\n\n\n"
        "def spread(values):\n    return max(values) - min(values)\n```")


def child(max_new: int) -> dict:
    import torch

    import lookahead
    from lookahead.runtime import jit as _jit
    from lookahead.demo import load

    torch.set_num_threads(2)
    model, tok, _ = load("smollm2", "cpu")
    messages = [{"role": "user", "content": EDIT}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    start = time.perf_counter()
    with _jit.compiled():  # the kernels' tier is not what this measures
        _, stats = lookahead.generate(model, ids, max_new_tokens=max_new, return_stats=True)
    return {"tokens_per_forward": stats.tokens_per_forward, "seconds": time.perf_counter() - start,
            "new_tokens": stats.new_tokens}


def run(cache: str, max_new: int) -> dict:
    env = dict(os.environ, XDG_CACHE_HOME=cache)
    out = subprocess.run([sys.executable, __file__, "--child", "--max-new", str(max_new)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new", type=int, default=160)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.max_new)))
        return
    busy_cache, quiet_cache = tempfile.mkdtemp(prefix="busy-"), tempfile.mkdtemp(prefix="quiet-")
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        busy = run(busy_cache, args.max_new)
    finally:
        for loop in loops:
            loop.kill()
    time.sleep(2)
    after = run(busy_cache, args.max_new)
    quiet = run(quiet_cache, args.max_new)
    for name, r in (("busy (first call, two busy loops)", busy), ("after (new process, same cache, quiet)", after),
                    ("quiet (fresh cache, quiet)", quiet)):
        print(f"{name:42s} {r['tokens_per_forward']:.2f} tokens/forward  {r['seconds']:.2f} s  "
              f"({r['new_tokens']} tokens)")
    print(f"after / quiet: {after['tokens_per_forward'] / quiet['tokens_per_forward']:.0%} of the tokens per forward "
          f"(target >= 80%)")


if __name__ == "__main__":
    main()
