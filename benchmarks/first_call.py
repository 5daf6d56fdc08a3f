"""What a new user waits for: the first `generate` call against a warm one, on a fresh install and in a new process
with warm caches, and the console script's --help.

Each phase is a fresh Python process (this script run with ``--child``):

- fresh install: an empty ``NUMBA_CACHE_DIR`` and an empty lookahead cache (``XDG_CACHE_HOME``: the measured cost
  curve of ``draft_cost="auto"`` is measured again). The calls run the kernels' Python twins while a background
  process compiles them (`lookahead.runtime.jit`; it ends with the process); the script then runs `lookahead warm`;
- warm caches: a new process over the caches the first phase and `lookahead warm` left;
- fresh install, compiled in the call: another empty pair of caches, the calls inside `runtime.jit.compiled()`,
  as every call was before the tiers (the kernels compile in the first call).

In each, the model is loaded, then the same default call (``lookahead.generate(model, ids, max_new_tokens=N)``, the
demo's prompt) runs twice. What the user notices is a first call's extra seconds over a warm one (the warm-caches
phase's second call), with what the imports cost (``import lookahead`` and ``lookahead.demo``, which imports
`generate`). --help is the best of three runs of ``python -m lookahead [CMD] --help``.

Example::

    python benchmarks/first_call.py --model smollm2 --threads 1
    python benchmarks/first_call.py            # the bundled stories260K
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELP = (["--help"], ["generate", "--help"], ["bench", "--help"], ["demo", "--help"])


def child(args) -> dict:
    """Load the model, run the default call twice; seconds of each step."""
    start = time.perf_counter()
    import torch

    import lookahead
    from lookahead import demo, models
    from lookahead.runtime import jit as _jit

    torch.set_num_threads(args.threads)
    imported = time.perf_counter()
    model, tok, _ = models.load(args.model)
    ids = demo._prompt_ids(tok, "cpu")
    loaded = time.perf_counter()
    calls, tiers = [], []
    for _ in range(2):
        kind = _jit.kind_of(args.lookup, "chain", 1, False, False)
        interpreted = not _jit._COMPILED.get() and kind not in _jit._ready()
        t = time.perf_counter()
        with _jit.compiled() if args.compiled else contextlib.nullcontext():
            out, stats = lookahead.generate(model, ids, lookup=args.lookup, max_new_tokens=args.max_new_tokens,
                                            return_stats=True)
        calls.append(time.perf_counter() - t)
        tiers.append("python" if interpreted and not args.compiled else "numba")
    return {"import": imported - start, "load": loaded - imported, "first": calls[0], "second": calls[1],
            "tiers": tiers, "new_tokens": int(out.shape[1] - ids.shape[1]),
            "tokens_per_forward": stats.tokens_per_forward, "marker": str(_jit.marker())}


def run_child(args, env: dict, compiled: bool = False) -> dict:
    command = [sys.executable, __file__, "--child", "--model", args.model, "--threads", str(args.threads),
               "--lookup", args.lookup, "--max-new-tokens", str(args.max_new_tokens)] + ["--compiled"] * compiled
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"child failed:\n{done.stderr}")
    result = json.loads(done.stdout.splitlines()[-1])
    result["process"] = time.perf_counter() - start
    return result


def warm_ahead(env: dict) -> tuple:
    """Run `lookahead warm` (``python -m lookahead.warm``) over the phase's caches, as an image or CI would between
    the fresh install and later processes (the background compiler a call starts ends with its program); (seconds it
    took, the kinds numba's cache held compiled before it: what the first process's compiler got done)."""
    from lookahead.runtime.jit import KINDS

    marker = next(Path(env["NUMBA_CACHE_DIR"]).rglob("lookahead-kernels-*.json"), None)
    before = len(json.loads(marker.read_text())) if marker is not None else 0
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lookahead.warm"], env=env, check=True, capture_output=True)
    return time.perf_counter() - start, f"{before} of {len(KINDS)}"


def first_requests(args, env: dict, requests: int = 3, root: Path = ROOT) -> dict:
    """`lookahead serve --model M` started on the caches of `env`: seconds until it answers, then of each of
    `requests` streamed chat requests in turn (the demo's prompt: SmolLM2 summarizes its article), 64 new tokens."""
    import httpx

    from lookahead.demo import ARTICLE

    port = _free_port()
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "lookahead", "serve", "--model", args.model, "--port", str(port),
                             "--threads", str(args.threads), "--log-level", "warning"], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.perf_counter() - start > 600:
                sys.exit("the server did not start")
            time.sleep(0.2)
        seconds = {"start": time.perf_counter() - start, "requests": []}
        body = {"model": args.model, "max_tokens": 64, "temperature": 0,
                "messages": [{"role": "user", "content": f"Summarize this article.\n\n{ARTICLE}"}]}
        for _ in range(requests):
            t = time.perf_counter()
            httpx.post(f"{url}/chat/completions", json=body, timeout=600).raise_for_status()
            seconds["requests"].append(time.perf_counter() - t)
        return seconds
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def help_seconds(argv: list) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "lookahead", *argv], cwd=ROOT, capture_output=True, check=True)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="smollm2, a folder, ... (default: the bundled stories260K)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--lookup", default="ngram", help="(default ngram, generate's default)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--no-help", action="store_true", help="skip the --help timings")
    parser.add_argument("--before", default=None, help="with --serve: also a fresh install of this commit")
    parser.add_argument("--serve", action="store_true",
                        help="instead: `lookahead serve`'s first requests on a fresh install, and after the background "
                             "compiler (and compiled in the request, as before the tiers)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    if args.model is None:
        from lookahead.models import default_model_path

        args.model = default_model_path()
    if args.serve:
        return serve_phases(args)
    phases = {}
    with tempfile.TemporaryDirectory() as fresh, tempfile.TemporaryDirectory() as before:
        env = {**os.environ, "NUMBA_CACHE_DIR": f"{fresh}/numba", "XDG_CACHE_HOME": f"{fresh}/xdg",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        phases["fresh install"] = run_child(args, env)
        warm_seconds, held = warm_ahead(env)
        phases["warm caches"] = run_child(args, env)
        env = {**env, "NUMBA_CACHE_DIR": f"{before}/numba", "XDG_CACHE_HOME": f"{before}/xdg"}
        phases["fresh install, compiled in the call"] = run_child(args, env, compiled=True)
    warm = phases["warm caches"]["second"]
    print(f"model {Path(args.model).name}, lookup={args.lookup}, {args.max_new_tokens} new tokens, "
          f"{args.threads} torch thread(s); load {os.getloadavg()[0]:.2f}; a warm call {warm:.2f} s; the fresh "
          f"process's background compiler left {held} kinds compiled; `lookahead warm` then took "
          f"{warm_seconds:.0f} s\n")
    print("| process | import s | model load s | first call s (kernels) | second call s (kernels) | first - a warm "
          "call s | start to first call's end s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in phases.items():
        print(f"| {name} | {r['import']:.1f} | {r['load']:.1f} | {r['first']:.2f} ({r['tiers'][0]}) | "
              f"{r['second']:.2f} ({r['tiers'][1]}) | {r['first'] - warm:.2f} | "
              f"{r['import'] + r['load'] + r['first']:.1f} |")
    if not args.no_help:
        print("\n| command | seconds (best of 3) |\n| --- | ---: |")
        for argv in HELP:
            print(f"| `lookahead {' '.join(argv)}` | {help_seconds(argv):.2f} |")


def serve_phases(args) -> None:
    """The server's first requests: on a fresh install, on the caches it and `lookahead warm` left,
    and, with --before REV, on a fresh install of the checkout REV (a commit before the tiers: the kernels compile in
    the first request)."""
    rows = {}
    with tempfile.TemporaryDirectory() as fresh, tempfile.TemporaryDirectory() as before:
        env = {**os.environ, "NUMBA_CACHE_DIR": f"{fresh}/numba", "XDG_CACHE_HOME": f"{fresh}/xdg"}
        rows["fresh install"] = first_requests(args, {**env, "PYTHONPATH": str(ROOT)})
        warm_ahead({**env, "PYTHONPATH": str(ROOT)})
        rows["warm caches"] = first_requests(args, {**env, "PYTHONPATH": str(ROOT)})
        if args.before:
            tree = Path(before) / "tree"
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.before], cwd=ROOT, check=True,
                           capture_output=True)
            try:
                env = {**os.environ, "NUMBA_CACHE_DIR": f"{before}/numba", "XDG_CACHE_HOME": f"{before}/xdg",
                       "PYTHONPATH": str(tree)}
                rows[f"fresh install at {args.before}"] = first_requests(args, env, root=tree)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    print(f"lookahead serve --model {Path(args.model).name}, {args.threads} thread(s), 64 new tokens; load "
          f"{os.getloadavg()[0]:.2f}\n\n| process | ready after s | request 1 s | request 2 s | request 3 s |\n"
          "| --- | ---: | ---: | ---: | ---: |")
    for name, r in rows.items():
        print(f"| {name} | {r['start']:.1f} | " + " | ".join(f"{x:.2f}" for x in r["requests"]) + " |")


if __name__ == "__main__":
    main()
