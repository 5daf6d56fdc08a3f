"""`lookahead serve` under load: 1, 4 and 16 concurrent clients on real workloads, against the same server with
`"lookup": "none"` and against `transformers serve` on the same model (the anchor users would pick).

Each server runs in its own process (`python -m lookahead serve`, `transformers serve`); the clients are the `openai`
package, streaming (time to first token, per-token latency), greedy (temperature 0: every server writes the same
text, checked: `mismatches` counts answers that differ from the first mode's). Workloads from ../shared/data (read,
never copied): summarization (CNN/DM), rag (NQ with its gold passage), code-edit (CanItEdit: the original file is
sent as the `prediction`), agent (mini-swe-agent turns), spec-bench/<category>. `transformers serve` cannot load the
GGUF file offline by its hub-name syntax, so the model is dequantized once into a folder (`--hf-folder`) that it
loads: the same weights the lookahead server dequantizes from the GGUF file.

    python benchmarks/serve.py --clients 1 --workloads summarization rag code-edit agent
    python benchmarks/serve.py --clients 16 --modes lookahead none --per-workload 4
    python benchmarks/serve.py --clients 1 --workloads code-edit --modes lookahead no-prediction none
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
MODES = ("lookahead", "lookahead-tree", "no-prediction", "none", "transformers", "transformers-cb")
SERVER = {"lookahead": "lookahead", "lookahead-tree": "lookahead", "no-prediction": "lookahead", "none": "lookahead",
          "transformers": "transformers", "transformers-cb": "transformers-cb"}  # mode -> the server it asks


def _rows(path: Path):
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def conversations(workload: str, data: Path):
    """(messages, prediction or None) of a workload, in file order (`lookahead.bench.real_workloads`' prompts)."""
    user = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    if workload == "summarization":
        for row in _rows(data / "summarization/cnndm_frank.jsonl"):
            yield user(f"Summarize this article.\n\n{row['article']}"), None
    elif workload == "rag":
        for row in _rows(data / "rag/nq-open-oracle.jsonl.gz"):
            passage = next((c for c in row["ctxs"] if c.get("isgold")), row["ctxs"][0])
            yield user(f"Answer the question using the passage.\n\nPassage: {passage['title']}\n{passage['text']}\n\n"
                       f"Question: {row['question']}"), None
    elif workload == "code-edit":
        for row in _rows(data / "code-edit/canitedit_105.jsonl"):
            yield user(f"{row['instruction_descriptive']}\n\n```python\n{row['before']}```\n\nReturn the whole edited "
                       f"file."), f"```python\n{row['before']}```"
    elif workload == "agent":
        for row in _rows(data / "agent/mini-swe-agent_gemini-3-pro_swebench-verified.jsonl.gz"):
            messages = [{"role": m["role"], "content": str(m["content"])} for m in row["messages"]]
            turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
            if len(turns) > 1:
                yield messages[: turns[1]], None
    elif workload.startswith("spec-bench/"):
        for row in _rows(data / "spec-bench/question.jsonl"):
            if row["category"] == workload.split("/", 1)[1]:
                yield user(row["turns"][0]), None
    else:
        raise ValueError(f"unknown workload {workload!r}")


def jobs(workloads: list, per_workload: int, max_prompt: int, tokenizer, data: Path) -> list:
    """[(workload, messages, prediction)]: the first `per_workload` conversations of each that fit `max_prompt`."""
    from lookahead.serve.app import chat_ids

    out = []
    for workload in workloads:
        kept = 0
        for messages, prediction in conversations(workload, data):
            if len(chat_ids(tokenizer, messages)) <= max_prompt:  # as the server tokenizes
                out.append((workload, messages, prediction))
                kept += 1
                if kept == per_workload:
                    break
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(mode: str, args, port: int) -> subprocess.Popen:
    """The server of a mode, in its own process; returns once it answers."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    if mode.startswith("transformers"):
        cmd = ["transformers", "serve", str(args.hf_folder), "--device", args.device, "--dtype",
               {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[args.dtype], "--port",
               str(port), "--host", "127.0.0.1", "--log-level", "warning"]
        if args.continuous_batching or mode == "transformers-cb":
            cmd.append("--continuous-batching")
    else:
        cmd = [sys.executable, "-m", "lookahead", "serve", "--model", args.model, "--port", str(port),
               "--threads", str(args.threads), "--log-level", "warning", "--device", args.device, "--dtype",
               args.dtype]
        if args.cache_implementation:
            cmd += ["--cache-implementation", args.cache_implementation]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    import httpx

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{mode} server exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{mode} server did not answer within 600 s")


def ask(client, model: str, job, mode: str, max_tokens: int, tokenizer) -> dict:
    """One streamed greedy request: its text, tokens, time to first token, per-token latency and total time."""
    workload, messages, prediction = job
    extra = {}
    if mode == "none":
        extra["lookahead"] = {"lookup": "none"}
    elif mode.startswith("lookahead") and prediction is not None:
        extra["prediction"] = {"type": "content", "content": prediction}
    if mode == "lookahead-tree":  # a per-request option: suffix trees
        extra["lookahead"] = {"lookup": "suffix", "draft": "tree"}
    options = {"stream_options": {"include_usage": True}} if not mode.startswith("transformers") else {}
    start = time.perf_counter()
    first = last = None
    parts, usage = [], None
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                                stream=True, extra_body=extra or None, **options):
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            now = time.perf_counter()
            first = first or now
            last = now
            parts.append(chunk.choices[0].delta.content)
    end = time.perf_counter()
    text = "".join(parts)
    tokens = usage.completion_tokens if usage is not None else len(tokenizer(text, add_special_tokens=False)
                                                                    ["input_ids"])
    return {"workload": workload, "text": text, "tokens": tokens, "seconds": end - start,
            "ttft": (first or end) - start, "tpot": ((last - first) / max(tokens - 1, 1)) if first else 0.0,
            "forwards": (getattr(usage, "lookahead", None) or {}).get("forwards") if usage is not None else None}


def level(url: str, model: str, work: list, mode: str, clients: int, max_tokens: int, tokenizer) -> dict:
    """Every job of `work` through `clients` concurrent clients: per-request records and the totals."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=1800)
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        records = list(pool.map(lambda job: ask(client, model, job, mode, max_tokens, tokenizer), work))
    wall = time.perf_counter() - start
    return {"mode": mode, "clients": clients, "wall": wall, "records": records}


def summary(run: dict) -> dict:
    r = run["records"]
    tokens = sum(x["tokens"] for x in r)
    pct = lambda key, q: float(np.percentile([x[key] for x in r], q))  # noqa: E731
    return {"mode": run["mode"], "clients": run["clients"], "requests": len(r), "req_per_s": len(r) / run["wall"],
            "tok_per_s": tokens / run["wall"], "latency_p50": pct("seconds", 50), "ttft_p50": pct("ttft", 50),
            "ttft_p99": pct("ttft", 99), "tpot_p50": pct("tpot", 50), "tpot_p99": pct("tpot", 99),
            "by_workload": {w: float(np.mean([x["seconds"] for x in r if x["workload"] == w]))
                            for w in dict.fromkeys(x["workload"] for x in r)}}


def dequantized(model: str, folder: Path) -> Path:
    """A folder holding the model's dequantized weights and tokenizer, for `transformers serve` (made once)."""
    if (folder / "config.json").is_file():
        return folder
    from lookahead import models

    hf_model, tok, _ = models.load(model)
    hf_model.config.quantization_config = None
    hf_model.hf_quantizer = None
    del hf_model.config.quantization_config
    hf_model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--hf-folder", type=Path, default=Path("/tmp/smollm2-hf"),
                   help="the dequantized model for transformers serve (written once if missing)")
    p.add_argument("--workloads", nargs="+", default=["summarization", "rag", "code-edit", "agent"])
    p.add_argument("--per-workload", type=int, default=2)
    p.add_argument("--max-prompt", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--modes", nargs="+", choices=MODES, default=["lookahead", "none", "transformers"])
    p.add_argument("--threads", type=int, default=2, help="torch threads of every server")
    p.add_argument("--device", default="cpu", help="every server's device (default cpu)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--cache-implementation", choices=("static", "dynamic"), default=None,
                   help="lookahead serve's cache (default: its own choice: static with CUDA graphs on CUDA)")
    p.add_argument("--continuous-batching", action="store_true", help="transformers serve --continuous-batching")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--output", type=Path, default=None, help="JSON lines of the summaries and records")
    p.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                   help="at 1 client: every mode's server up at once, each prompt asked of each mode in turn, ROUNDS "
                        "times (drift in the machine's speed falls on every mode alike)")
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    if any(m.startswith("transformers") for m in args.modes):
        dequantized(args.model, args.hf_folder)
    tokenizer = AutoTokenizer.from_pretrained(dequantized(args.model, args.hf_folder))
    # the servers time numba's kernels, not their Python twins beside a background compiler (`lookahead.runtime.jit`)
    subprocess.run([sys.executable, "-m", "lookahead.warm"], cwd=ROOT, check=True)
    base = jobs(args.workloads, args.per_workload, args.max_prompt, tokenizer, args.data)
    print(f"# {len(base)} prompts, {args.max_tokens} new tokens, threads {args.threads}, load "
          f"{os.getloadavg()[0]:.2f}, {platform.processor() or platform.machine()}", flush=True)
    if args.interleave:
        return interleaved(args, base, tokenizer)
    texts, rows = {}, []  # texts[clients][job number]: the first mode's answer
    for mode in args.modes:
        numbered = [(i, j) for i, j in enumerate(base) if mode != "no-prediction" or j[2] is not None]
        work = [j for _, j in numbered]
        if not work:
            continue
        port = free_port()
        proc = start(mode, args, port)
        model = str(args.hf_folder) if mode.startswith("transformers") else args.model
        url = f"http://127.0.0.1:{port}"
        try:
            level(url, model, work[:1], mode, 1, 8, tokenizer)  # warm-up
            for clients in args.clients:
                count = max(clients, len(work))
                batch, keys = [work[k % len(work)] for k in range(count)], [numbered[k % len(work)][0]
                                                                            for k in range(count)]
                run = level(url, model, batch, mode, clients, args.max_tokens, tokenizer)
                s = summary(run)
                ref = texts.setdefault(clients, {})
                for key, record in zip(keys, run["records"]):
                    ref.setdefault(key, record["text"])
                s["mismatches"] = sum(ref[key] != r["text"] for key, r in zip(keys, run["records"]))
                s["load"] = os.getloadavg()[0]
                print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items()
                                  if k != "by_workload"}), flush=True)
                print("  per request (s):", {w: round(v, 2) for w, v in s["by_workload"].items()}, flush=True)
                rows.append({"summary": s, "records": run["records"]})
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    if args.output is not None:
        with open(args.output, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


def interleaved(args, base: list, tokenizer) -> int:
    """1 client, every mode's server up at once; for each round and prompt, each mode in turn. Prints each mode's
    mean seconds per request by workload, and each mode's geometric mean speedup over the others per request."""
    servers, procs = {}, []
    try:
        for server in dict.fromkeys(SERVER[m] for m in args.modes):
            port = free_port()
            procs.append(start(server, args, port))
            servers[server] = f"http://127.0.0.1:{port}"
        name = lambda mode: str(args.hf_folder) if mode.startswith("transformers") else args.model  # noqa: E731
        for mode in args.modes:
            level(servers[SERVER[mode]], name(mode), base[:1], mode, 1, 8, tokenizer)  # warm-up
        records = {m: [] for m in args.modes}
        for _ in range(args.interleave):
            for job in base:
                texts = set()
                for mode in args.modes:
                    r = level(servers[SERVER[mode]], name(mode), [job], mode, 1, args.max_tokens, tokenizer)
                    records[mode].append(r["records"][0])
                    texts.add(r["records"][0]["text"])
                if len(texts) > 1:
                    print(f"  texts differ on a {job[0]} prompt", flush=True)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)
    print(f"# interleaved, {args.interleave} rounds, load {os.getloadavg()[0]:.2f}")
    workloads = list(dict.fromkeys(r["workload"] for r in records[args.modes[0]]))
    for mode in args.modes:
        mean = {w: float(np.mean([r["seconds"] for r in records[mode] if r["workload"] == w])) for w in workloads}
        ttft = float(np.median([r["ttft"] for r in records[mode]]))
        tpot = float(np.median([r["tpot"] for r in records[mode]]))
        print(f"{mode}: s per request {json.dumps({w: round(v, 2) for w, v in mean.items()})}, TTFT p50 {ttft:.2f} s, "
              f"TPOT p50 {tpot * 1000:.0f} ms", flush=True)
    first = args.modes[0]
    for other in args.modes[1:]:
        ratios = {w: float(np.exp(np.mean([np.log(b["seconds"] / a["seconds"]) for a, b in
                                           zip(records[first], records[other]) if a["workload"] == w])))
                  for w in workloads}
        rounded = {w: round(v, 2) for w, v in ratios.items()}
        print(f"{first} vs {other} (geometric mean per request): {json.dumps(rounded)}")
    if args.output is not None:
        with open(args.output, "a") as f:
            f.write(json.dumps({"interleaved": records}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
