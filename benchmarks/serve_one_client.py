"""`lookahead serve` at one client against `lookahead.generate` on the same prompts and model: seconds per new token.

The server runs in its own process (`python -m lookahead serve`, as `serve.py` starts it); `generate` runs in this
one, with as many torch threads. They take turns, prompt by prompt (a streamed greedy request, then the same chat
prompt through `lookahead.generate`, its default call), never at once; a round warms both up first. A request's
time is the client's, from sending to the last chunk (HTTP, tokenizing and detokenizing included); a call's time is
`generate`'s. No `prediction` is sent (the server would draft from it and `generate` cannot), so both draft from the
same prompt.

    python benchmarks/serve_one_client.py --workloads summarization code-edit --per-workload 3 --rounds 2
"""
from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import time

import openai
import torch
from serve import DATA, free_port, jobs, start

import lookahead
from lookahead import models


def served_whole(client, model: str, messages, max_tokens: int) -> tuple:
    begin = time.perf_counter()
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0)
    return time.perf_counter() - begin, r.usage.completion_tokens, r.choices[0].message.content, None


def served(client, model: str, messages, max_tokens: int) -> tuple:
    """(seconds, new tokens, text) of one streamed greedy request."""
    begin = time.perf_counter()
    parts, usage = [], None
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    forwards = (getattr(usage, "lookahead", None) or {}).get("forwards")
    return time.perf_counter() - begin, usage.completion_tokens, "".join(parts), forwards


def generated(model, tok, messages, max_tokens: int, cache_implementation=None) -> tuple:
    """(seconds, new tokens, text) of `lookahead.generate` on the same chat prompt."""
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True).input_ids
    ids = ids.to(model.device)
    begin = time.perf_counter()
    out, stats = lookahead.generate(model, ids, max_new_tokens=max_tokens, return_stats=True,
                                    cache_implementation=cache_implementation)
    seconds = time.perf_counter() - begin
    new = out[0, ids.shape[1]:].tolist()
    if tok.eos_token_id in new:
        new = new[: new.index(tok.eos_token_id)]
    return seconds, len(new), tok.decode(new, skip_special_tokens=True), stats.forward_passes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--workloads", nargs="+", default=["summarization", "code-edit"])
    p.add_argument("--per-workload", type=int, default=3)
    p.add_argument("--max-prompt", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="timed rounds after a warm-up round (default 2)")
    p.add_argument("--whole", action="store_true", help="ask for whole answers, not streamed ones")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--cache-implementation", choices=("static", "dynamic"), default=None,
                   help="both sides' cache (default: each its own choice, the same: static with CUDA graphs on CUDA)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, tok, _ = models.load(args.model, device=args.device, dtype=args.dtype)
    work = jobs(args.workloads, args.per_workload, args.max_prompt, tok, DATA)
    port = free_port()
    server = start("lookahead", argparse.Namespace(model=args.model, threads=args.threads, device=args.device,
                                                   dtype=args.dtype, cache_implementation=args.cache_implementation),
                   port)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=1800)
    name = client.models.list().data[0].id
    rows, same = {}, 0
    try:
        for r in range(args.rounds + 1):
            for i, (workload, messages, _) in enumerate(work):
                s = (served_whole if args.whole else served)(client, name, messages, args.max_tokens)
                g = generated(model, tok, messages, args.max_tokens, args.cache_implementation)
                if r:
                    rows.setdefault(workload, []).append((s, g))
                    same += s[2] == g[2]
    finally:
        server.terminate()
        server.wait(timeout=60)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"{args.model}, {args.threads} torch threads each, {args.max_tokens} new tokens at most, "
          f"{len(work)} prompts x {args.rounds} rounds; {platform.processor() or platform.machine()}; "
          f"commit {commit}; same text {same} of {sum(map(len, rows.values()))}\n")
    print("| workload | generate ms/token | serve ms/token | serve / generate | forwards: generate, serve |\n"
          "| --- | ---: | ---: | ---: | ---: |")
    for workload, pairs in list(rows.items()) + [("all", [x for v in rows.values() for x in v])]:
        g = sum(x[1][0] for x in pairs) / sum(x[1][1] for x in pairs) * 1e3
        s = sum(x[0][0] for x in pairs) / sum(x[0][1] for x in pairs) * 1e3
        ratios = [(x[0][0] / x[0][1]) / (x[1][0] / x[1][1]) for x in pairs]
        forwards = (sum(x[1][3] for x in pairs), sum(x[0][3] or 0 for x in pairs))
        print(f"| {workload} | {g:.1f} | {s:.1f} | {s / g:.2f} (median per prompt {statistics.median(ratios):.2f}) | "
              f"{forwards[0]}, {forwards[1]} |")


if __name__ == "__main__":
    main()
