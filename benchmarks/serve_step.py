"""The server's decoding step against `generate`'s, in one process: milliseconds per forward and the host's share.

Greedy rows of `lookahead serve`'s `Engine` (one, or `--rows` n of the same prompt, joined in one turn), its turns run
here one after another (no HTTP, no other thread), and `lookahead.generate` on the same prompts and drafting (its
fused step; a batch of n), alternating, with the dynamic and the static cache. A forward's host time is the call's
time less the target's own forwards (`verify`, `verify_ids`, `prefill`, the static server's `prefill_row`, timed
around them): what the step does besides the model.

    python benchmarks/serve_step.py --rounds 5
    python benchmarks/serve_step.py --rounds 3 --rows 4
    python benchmarks/serve_step.py --rounds 3 --lookup suffix --draft tree
    python benchmarks/serve_step.py --rounds 3 --prediction 5 --caches dynamic   # rows with a prediction
    python benchmarks/serve_step.py --rounds 3 --temperature 0.8 --caches dynamic   # sampling rows (unfused)
    python benchmarks/serve_step.py --model smollm2 --device cuda --dtype bf16 --caches static   # on a GPU
"""
from __future__ import annotations

import argparse
import functools
import platform
import statistics
import time

import numpy as np
import torch

import lookahead
from lookahead import models
from lookahead.model.causal import CausalLM
from lookahead.model.static import StaticCausalLM
from lookahead.serve.batch import StaticServingLM
from lookahead.serve.engine import Engine, _fast
from lookahead.serve.row import Drafting, Row, Sampling

TEXT = ("Once upon a time, there was a little girl named Lily. She liked to play in the park with her dog. "
        "One day, Lily and her dog went to the park to play with a big red ball. ") * 4
FORWARDS = []  # seconds inside the target's forwards, this call
_DEPTH = [0]  # forwards inside forwards (`CausalLM.verify_ids` runs `verify`) count once


def _timed(cls, name: str) -> None:
    inner = getattr(cls, name)

    def timed(self, *args, **kwargs):
        begin = time.perf_counter()
        _DEPTH[0] += 1
        try:
            return inner(self, *args, **kwargs)
        finally:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                if self.facts.device.type == "cuda":
                    torch.cuda.synchronize()
                FORWARDS.append(time.perf_counter() - begin)

    setattr(cls, name, timed)


def served(model, tok, ids: np.ndarray, max_new: int, cache, rows: int, drafting: dict, prediction=None,
           whole: bool = False, temperature: float = 0.0) -> tuple:
    """(seconds, forwards, tokens) of `rows` rows of one prompt (greedy, or sampling at `temperature`, row k with
    seed k) through the engine's turns (the forwards: the engine's steps), each drafting from `prediction` (token
    ids) if given; `whole`: answers sent whole (their text decoded at their end), else streamed."""
    engine = Engine(model, cache_implementation=cache, max_model_len=len(ids) + max_new + 64)
    batch = [Row(ids, max_new, (), Sampling(temperature, seed=k), Drafting(**drafting), tok, prediction=prediction,
                 stream=not whole) for k in range(rows)]
    with torch.inference_mode(), _fast(model):
        for row in batch:
            engine.submit(row)
        begin = time.perf_counter()
        while not all(row.done for row in batch):
            engine._turn()
        seconds = time.perf_counter() - begin
    return seconds, engine.stats.forward_passes, [row.out for row in batch]


def generated(model, tok, ids: np.ndarray, max_new: int, cache, rows: int, drafting: dict,
              temperature: float = 0.0) -> tuple:
    """(seconds, forwards, tokens) of `lookahead.generate` on a batch of `rows` copies of the prompt (sampling at
    `temperature` if not 0, seeded)."""
    sampling = {"do_sample": True, "temperature": temperature} if temperature else {}
    torch.manual_seed(0)
    begin = time.perf_counter()
    out, stats = lookahead.generate(model, torch.as_tensor(ids)[None].repeat(rows, 1).to(model.device),
                                    max_new_tokens=max_new, return_stats=True, cache_implementation=cache, **drafting,
                                    **sampling)
    return time.perf_counter() - begin, stats.forward_passes, out[:, len(ids):].tolist()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="what lookahead.models.load takes (default: the bundled stories260K)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--max-new", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5, help="timed rounds after a warm-up round (default 5)")
    p.add_argument("--rows", type=int, default=1, help="greedy rows of the same prompt in one batch (default 1)")
    p.add_argument("--lookup", default="ngram", choices=("ngram", "suffix", "recycle", "suffix+recycle"))
    p.add_argument("--draft", default="chain", choices=("chain", "tree"),
                   help="tree: with --lookup suffix or a recycling one")
    p.add_argument("--caches", nargs="+", choices=("dynamic", "static"), default=["dynamic", "static"])
    p.add_argument("--prediction", type=int, default=0, metavar="N",
                   help="the served rows draft from a prediction: the answer with every N-th token changed (0: "
                        "none; `generate`, which takes none, runs without)")
    p.add_argument("--temperature", type=float, default=0.0, help="rows sample at this temperature (default 0: "
                   "greedy); sampling rows take the general step in both, and their tokens differ (other seeds)")
    p.add_argument("--whole", action="store_true", help="the served rows answer whole, as a request without "
                   "`stream` (their text decoded once, at their end); default: streamed, decoded as they grow")
    args = p.parse_args()
    model, tok, _ = models.load(args.model or models.default_model_path(), device=args.device, dtype=args.dtype)
    ids = np.asarray(tok(TEXT)["input_ids"], dtype=np.int64)
    for cls in (CausalLM, StaticCausalLM):
        for name in ("verify", "verify_ids", "prefill"):
            _timed(cls, name)
    _timed(StaticServingLM, "prefill_row")  # the static server prefills each row alone, into its one-row state
    runs, drafting, prediction = {}, {"lookup": args.lookup, "draft": args.draft}, None
    if args.prediction:
        answer = generated(model, tok, ids, args.max_new, args.caches[0], 1, drafting)[2][0]
        prediction = np.array([t if (i + 1) % args.prediction else (t + 1) % len(tok) for i, t in enumerate(answer)])
    for r in range(args.rounds + 1):
        for cache in args.caches:
            for who, run in (("serve engine", functools.partial(served, prediction=prediction, whole=args.whole,
                                                                temperature=args.temperature)),
                             ("generate", functools.partial(generated, temperature=args.temperature))):
                FORWARDS.clear()
                seconds, forwards, out = run(model, tok, ids, args.max_new, cache, args.rows, drafting)
                if r:
                    runs.setdefault((cache, who), []).append((seconds, forwards, sum(FORWARDS), out))
    print(f"{model.config.model_type}, {args.device}, {args.dtype}, {torch.get_num_threads()} threads, {len(ids)} "
          f"prompt tokens, {args.rows} row(s), {args.lookup} {args.draft}s, {args.max_new} new, {args.rounds} rounds"
          f"{f', served with a prediction wrong every {args.prediction}th token' if args.prediction else ''}"
          f"{f', sampling at temperature {args.temperature}' if args.temperature else ''}; "
          f"{platform.processor() or platform.machine()}")
    print("| cache | step | ms per forward | host us per forward | forwards | same tokens as generate |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for cache in args.caches:
        want = runs[(cache, "generate")][0][3]
        for who in ("serve engine", "generate"):
            rows = runs[(cache, who)]
            ms = statistics.median(s / f for s, f, _, _ in rows) * 1e3
            host = statistics.median((s - t) / f for s, f, t, _ in rows) * 1e6
            same = "n/a (sampled)" if args.temperature else "yes" if all(out == want for *_, out in rows) else "no"
            print(f"| {cache} | {who} | {ms:.2f} | {host:.0f} | {rows[0][1]} | {same} |")


if __name__ == "__main__":
    main()
