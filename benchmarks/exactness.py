"""Exactness in fp32, bf16 and fp16 (issue 11): on the real stories260K model and 36 story openings, how many
outputs of greedy lookahead (ngram chain, suffix chain, suffix tree) and of transformers' prompt lookup differ from
`model.generate(do_sample=False)` in the same dtype, the first divergent token and the logit gap there. Batch 1, on
the CPU (or --device cuda: with --methods lookahead-ngram-static ..., the check that CUDA graphs change no token).
Harness: ``lookahead.bench.exactness``.

    python benchmarks/exactness.py
    python benchmarks/exactness.py --dtypes bf16 --prompts 12 --max-new 32
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from lookahead.bench import exactness
from lookahead.bench.arguments import method_name, positive_int
from lookahead.bench.e2e import DTYPES
from lookahead.models import STORIES260K

MODEL = STORIES260K  # the same model as ../shared/models/stories260K, shipped with the package (a GPU machine has no
# ../shared)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=MODEL, help="folder with the model and its tokenizer.json")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--methods", nargs="+", type=method_name, default=list(exactness.METHODS), metavar="METHOD")
    parser.add_argument("--prompts", type=positive_int, default=36)
    parser.add_argument("--max-new", type=positive_int, default=64)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--device", default="cpu", help="where the models run (e.g. cuda)")
    parser.add_argument("--draft-cost", type=float, default=None,
                        help="lookahead's draft_cost (default: its default; 0 drafts at every match, as prompt lookup)")
    args = parser.parse_args(argv)
    if not (args.model / "tokenizer.json").exists():
        print(f"skipped: {args.model} has no tokenizer.json (pass --model)", file=sys.stderr)
        return 1
    from tokenizers import Tokenizer

    torch.set_num_threads(args.threads)
    tokenizer = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    prompts = exactness.story_prompts(lambda text: tokenizer.encode(text).ids, args.prompts)
    rows = exactness.measure(args.model, prompts, args.dtypes, args.methods, args.max_new, draft_cost=args.draft_cost,
                              device=args.device)
    cost = "default" if args.draft_cost is None else f"{args.draft_cost:g}"
    print(f"\n{args.model.name}, {len(prompts)} prompts, at most {args.max_new} new tokens, {args.device}, batch 1, "
          "lookahead "
          f"draft_cost {cost}; compared with model.generate(do_sample=False) in the same dtype\n")
    print(exactness.markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
