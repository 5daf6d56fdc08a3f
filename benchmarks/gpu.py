"""GPU benchmark (issue 12): transformers greedy (eager, static + compiled), its prompt lookup and lookahead's
methods, eager and with cache_implementation="static", on a random-weight Llama-3.2-1B-shaped model in bf16 forced
on the device to replay recorded outputs (code edit, summarization, nothing to copy), batch 1 and 16, 512-token
contexts. Harness: ``lookahead.bench.gpu``; tables and targets printed, markdown and JSON written to --out.

The GPU machine has no ../shared/data: export the traces first (here), carry the folder, then run one command:

    python benchmarks/gpu.py --export                      # writes benchmarks/.cache/gpu-traces/*.jsonl (gitignored)
    python benchmarks/gpu.py --out /tmp/gpu                # on the GPU machine: 452 s on an H100
    python benchmarks/gpu.py --out /tmp/gpu --batch 1 --profile   # + where each lookahead step's host time goes
    python benchmarks/gpu.py --device cpu --shape tiny --dtype fp32 --batch 1 2 --max-new 16 --out /tmp/cpu  # smoke
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from lookahead.runtime import jit as _jit
from lookahead.bench import gpu
from lookahead.bench.arguments import method_name, positive_int
from lookahead.bench.e2e import DTYPES, SHAPES, random_model
from lookahead.bench.traces_io import read_traces

TRACES = Path(__file__).resolve().parent / ".cache" / "gpu-traces"
WORKLOADS = ("code-edit", "summarization", "no-copy")
EOS, VOCAB = 50256, 50257  # GPT-2's <|endoftext|>: never inside the recorded texts


def export(folder: Path, count: int, context: int, data_dir) -> None:
    """Write `count` traces per workload (prompts of at most `context` tokens) as JSONL token ids."""
    from traces import export_jsonl, workload

    folder.mkdir(parents=True, exist_ok=True)
    for name in WORKLOADS:
        traces = workload(name, data_dir, count, context, 256)
        export_jsonl(traces, folder / f"{name}.jsonl")
        print(f"{folder / name}.jsonl: {len(traces)} traces")


def load(folder: Path, names) -> dict:
    workloads = {}
    for name in names:
        traces, errors = read_traces(folder / f"{name}.jsonl")
        for line in errors:
            print(f"gpu.py: {line}", file=sys.stderr)
        if traces:
            workloads[name] = traces
    return workloads


def parse_args(argv=None) -> argparse.Namespace:
    plan = gpu.Plan()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export", action="store_true", help="write the traces to --traces (needs ../shared/data)")
    parser.add_argument("--traces", type=Path, default=TRACES, help=f"trace folder (default {TRACES})")
    parser.add_argument("--out", type=Path, default=None, help="folder for gpu.md and gpu.json")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--methods", nargs="+", type=method_name, default=list(plan.methods), metavar="METHOD")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", choices=list(SHAPES), default="1b")
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--batch", type=positive_int, nargs="+", default=list(plan.batches))
    parser.add_argument("--prompts", type=positive_int, default=plan.prompts_at_1, help="prompts timed at batch 1")
    parser.add_argument("--repeats", type=positive_int, default=plan.repeats, help="timed rounds (median, min-max)")
    parser.add_argument("--context", type=positive_int, default=plan.context, help="prompt width (left padding)")
    parser.add_argument("--max-new", type=positive_int, default=plan.max_new)
    parser.add_argument("--count", type=positive_int, default=16, help="--export: traces per workload")
    parser.add_argument("--data-dir", type=Path, default=None, help="--export: the shared data folder")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one call of each lookahead method at batch 1 (torch's and Python's "
                             "profilers: where the host time goes) into --out/profile-WORKLOAD-METHOD.txt")
    return parser.parse_args(argv)


def meta(args, model) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = ""
    import transformers

    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    return {"device": device, "torch": torch.__version__, "transformers": transformers.__version__,
            "commit": commit or "unknown", "shape": args.shape, "dtype": args.dtype, "threads": torch.get_num_threads(),
            "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6), "date": time.strftime("%F %T")}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.export:
        from traces import DEFAULT_DATA_DIR

        export(args.traces, args.count, args.context, args.data_dir or DEFAULT_DATA_DIR)
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.profile and args.out is None:
        print("gpu.py: --profile writes into --out: give a folder", file=sys.stderr)
        return 2
    workloads = load(args.traces, args.workloads)
    if not workloads:
        print(f"gpu.py: no traces in {args.traces}: run `python benchmarks/gpu.py --export` where ../shared/data is",
              file=sys.stderr)
        return 1
    plan = gpu.Plan(args.device, tuple(args.batch), args.prompts, args.repeats, args.context, args.max_new,
                    tuple(args.methods))
    start = time.perf_counter()
    model = random_model(args.shape, VOCAB, EOS, args.device, args.dtype)
    info = meta(args, model)
    print(f"{info['device']}: random-weight {args.shape} Llama ({info['parameters_m']}M parameters), {args.dtype}, "
          f"{', '.join(f'{n} {len(t)} traces' for n, t in workloads.items())}; model ready in "
          f"{time.perf_counter() - start:.0f}s", flush=True)

    def write(rows) -> None:  # after every workload and batch size: a run cut short keeps what it measured
        if args.out is not None:
            rows = [dataclasses.replace(r) for r in rows]
            gpu.add_ratios(rows)
            info["seconds"] = round(time.perf_counter() - start)
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "gpu.md").write_text(f"{info}\n\n{gpu.markdown(rows)}\n")
            (args.out / "gpu.json").write_text(json.dumps(gpu.as_json(rows, plan, info), indent=1))

    def profiled(workload: str, method: str, text: str) -> None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"profile-{workload}-{method}.txt").write_text(text)

    rows = gpu.run_plan(model, workloads, plan, EOS, log=lambda line: print(line, flush=True), progress=write,
                        profile=profiled if args.profile else None)
    print("\n" + gpu.markdown(rows))
    write(rows)
    if args.out is not None:
        print(f"\nwritten: {args.out / 'gpu.md'}, {args.out / 'gpu.json'}")
    print(f"total {round(time.perf_counter() - start)}s")
    return 1 if any(r.mismatches for r in rows) else 0


if __name__ == "__main__":
    with _jit.compiled():  # timings of numba's kernels, never of their Python twins
        sys.exit(main())
