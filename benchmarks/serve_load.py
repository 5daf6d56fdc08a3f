"""The server's engine under load: output tokens per second at 1 to 64 concurrent requests, speculation on
(`lookahead serve`'s default request) against `"lookup": "none"`, in this process.

Each level submits as many greedy requests as there are clients at once (the workloads' chat prompts cycled; each
request is a `Row`, as the HTTP server makes it) to one `Engine` over SmolLM2 and waits for the last: output tokens
per second from the first submission to the last row done, prefills included, and the steps' alone (the time in
`Engine._step`, the tokens less the prefills' one a row: the prefills, the same work in both modes, take most of a
level at 16 clients and more, and their noise hides the steps'). Each step's width is the one with the most tokens
expected per unit of cost for the whole batch (`policy.batch_width`). The engine steps on this process's first
thread, as `lookahead serve`'s does (`Engine.run`); the levels are submitted from a second. The two modes take turns
level by level and round by round, so that a slower stretch of a shared machine hits both. Without HTTP and client
threads, which on this 2-core machine take the cores the engine needs (`benchmarks/serve.py` measures the whole
server).

    python benchmarks/serve_load.py --clients 1 4 16 32 64 --rounds 2
    python benchmarks/serve_load.py --workloads code-edit --prediction --clients 4 16 64 --rounds 2
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from serve import DATA, jobs

from lookahead import models
from lookahead.serve.app import chat_ids
from lookahead.runtime.malloc import keep_freed_memory
from lookahead.serve.engine import Engine
from lookahead.serve.row import Drafting, Row, Sampling


def level(engine: Engine, prompts: list, clients: int, max_new: int, lookup: str, tok, predictions=None) -> dict:
    """Submit `clients` rows at once (prompts cycled, each with its prediction from `predictions` where given), wait
    for all: tokens, seconds, the steps and their seconds."""
    done = []
    predictions = predictions or [None] * len(prompts)
    rows = [Row(prompts[k % len(prompts)], max_new, (tok.eos_token_id,), Sampling(0.0), Drafting(lookup=lookup), tok,
                prediction=predictions[k % len(prompts)], emit=lambda event: event[0] == "done" and done.append(1))
            for k in range(clients)]
    steps = []
    step = engine._step

    def logged(batch):  # how many rows the step verified, and its seconds (drafts, forward, acceptance, advance)
        b, begin = len(batch.rows), time.perf_counter()
        step(batch)
        steps.append((b, time.perf_counter() - begin))

    engine._step = logged
    start = time.perf_counter()
    for row in rows:
        engine.submit(row)
    while len(done) < clients:
        time.sleep(0.01)
    seconds = time.perf_counter() - start
    engine._step = step
    tokens = sum(len(row.out) for row in rows)
    drafted = sum(row.stats.draft_tokens for row in rows)
    accepted = sum(row.stats.accepted_tokens for row in rows)
    stepping = sum(t for _, t in steps)  # the prefills' tokens (one a row) are not the steps'
    return {"tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds, "drafted": drafted,
            "accepted": accepted, "steps": len(steps), "step_seconds": stepping,
            "step_tok_per_s": (tokens - clients) / stepping, "texts": [row.text.text for row in rows]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--workloads", nargs="+", default=["summarization", "rag", "code-edit"])
    p.add_argument("--per-workload", type=int, default=2)
    p.add_argument("--max-prompt", type=int, default=1024)
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 32, 64])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-warm", action="store_true", help="skip compiling the kernels first (the steps may then run "
                   "their Python twins: a check that the script runs, not a timing)")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--prediction", action="store_true", help="send each request's prediction (code edit: the "
                   "original file), as a client of Predicted Outputs does, in both modes (\"lookup\": \"none\" "
                   "drafts nothing from it)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as `lookahead serve` does first (`server.configure`)
    # the engine times numba's kernels, not their Python twins beside a background compiler (`lookahead.runtime.jit`)
    if not args.no_warm:
        subprocess.run([sys.executable, "-m", "lookahead.warm"], check=True)
    model, tok, _ = models.load(args.model)
    chosen = jobs(args.workloads, args.per_workload, args.max_prompt, tok, args.data)
    prompts = [chat_ids(tok, messages) for _, messages, _ in chosen]  # as the server tokenizes
    predictions = None  # as the server tokenizes a request's prediction
    if args.prediction:
        predictions = [None if text is None else np.asarray(tok(text, add_special_tokens=False)["input_ids"],
                                                            dtype=np.int64) for _, _, text in chosen]
    engine = Engine(model)
    print(f"# {len(prompts)} prompts, {args.max_new} new tokens, {args.threads} threads, load "
          f"{os.getloadavg()[0]:.2f}, {platform.processor() or platform.machine()}", flush=True)
    results, failed = {}, []

    def drive() -> None:  # the levels, from a second thread: the engine steps on this process's first thread
        try:
            level(engine, prompts, 2, 8, "ngram", tok)  # warm-up
            for r in range(args.rounds):
                for clients in args.clients:
                    for lookup in (("ngram", "none") if r % 2 == 0 else ("none", "ngram")):
                        out = level(engine, prompts, clients, args.max_new, lookup, tok, predictions)
                        results.setdefault((clients, lookup), []).append(out)
                        print(f"round {r + 1} clients {clients:3d} {lookup:6s}: {out['tok_per_s']:6.2f} tok/s, "
                              f"{out['tokens']} tokens in {out['seconds']:.1f} s, {out['steps']} steps in "
                              f"{out['step_seconds']:.1f} s ({out['step_tok_per_s']:.2f} tok/s), drafted "
                              f"{out['drafted']}, accepted {out['accepted']}, load {os.getloadavg()[0]:.2f}",
                              flush=True)
        except BaseException as error:  # noqa: BLE001: said after the engine stops
            failed.append(error)
        finally:
            engine.stop()

    driver = threading.Thread(target=drive, name="serve-load-clients")
    driver.start()
    engine.run()  # as `lookahead serve` runs it (`Engine.run`: OpenMP's workers wake slowly for a second thread)
    driver.join()
    if failed:
        raise failed[0]
    print("\n| clients | lookahead tok/s | `\"lookup\": \"none\"` tok/s | ratio (per round) | steps alone: ratio "
          "(per round) | same text |")
    print("| --- | --- | --- | --- | --- | --- |")
    for clients in args.clients:
        on, off = results[clients, "ngram"], results[clients, "none"]
        ratios = [a["tok_per_s"] / b["tok_per_s"] for a, b in zip(on, off)]
        stepped = [a["step_tok_per_s"] / b["step_tok_per_s"] for a, b in zip(on, off)]
        same = all(a["texts"] == b["texts"] for a, b in zip(on, off))
        print(f"| {clients} | {statistics.median(x['tok_per_s'] for x in on):.1f} | "
              f"{statistics.median(x['tok_per_s'] for x in off):.1f} | {statistics.median(ratios):.2f}x "
              f"({', '.join(f'{x:.2f}' for x in ratios)}) | {statistics.median(stepped):.2f}x "
              f"({', '.join(f'{x:.2f}' for x in stepped)}) | {same} |", flush=True)

if __name__ == "__main__":
    main()
