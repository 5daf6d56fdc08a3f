"""The `lookahead` console script."""
from __future__ import annotations

import argparse
import sys


def _demo(args) -> int:
    from . import demo

    same = demo.run(args.model, max_new_tokens=args.max_new_tokens, device=args.device, max_ngram=args.max_ngram)
    return 0 if same else 1


def build_parser() -> argparse.ArgumentParser:
    from .bench import cli as bench
    from .demo import DEFAULT_MODEL

    parser = argparse.ArgumentParser(prog="lookahead", description="Lossless n-gram speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="greedy vs lookahead on a grounded prompt: text, equality, speedup")
    demo.add_argument("--model", default=DEFAULT_MODEL, help=f"path or hub id (default {DEFAULT_MODEL})")
    demo.add_argument("--max-new-tokens", type=int, default=256)
    demo.add_argument("--max-ngram", type=int, default=4)
    demo.add_argument("--device", default="cuda" if _cuda() else "cpu")
    demo.set_defaults(func=_demo)
    bench.add_parser(sub)
    return parser


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
