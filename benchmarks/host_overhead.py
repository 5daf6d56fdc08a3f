"""Host time per decoding step outside the model's forward (issue 12, item 2): transformers greedy against
lookahead's chains and trees, batch 1, 8 and 16, a tiny random-weight Llama (GPT-2 vocabulary) forced to replay
recorded code edits, one CPU thread, methods in turns in the same run. Harness: ``lookahead.bench.host``.

    python benchmarks/host_overhead.py                    # code-edit traces of benchmarks/.cache/gpu-traces
    python benchmarks/host_overhead.py --batch 1 --repeats 5
    python benchmarks/host_overhead.py --cold           # what one small operation costs right after a forward
    python benchmarks/host_overhead.py --vocab 1024     # a forward that leaves the host's caches warm (as on a GPU)
    python benchmarks/host_overhead.py --vocab 1024 --batch 1 --floor   # + the least host work of any such step
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from lookahead.bench import host
from lookahead.bench.arguments import method_name, positive_int
from lookahead.bench.e2e import SHAPES, random_model, synthetic_traces
from lookahead.bench.traces_io import read_traces

TRACES = Path(__file__).resolve().parent / ".cache" / "gpu-traces" / "code-edit.jsonl"
EOS, VOCAB = 50256, 50257


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=TRACES,
                        help="JSONL of token traces (default: the code edits `python benchmarks/gpu.py --export` "
                             "writes; random prompts with repeated spans when missing)")
    parser.add_argument("--batch", type=positive_int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--prompts", type=positive_int, default=4, help="prompts timed one by one at batch 1")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--max-new", type=positive_int, default=128)
    parser.add_argument("--shape", choices=list(SHAPES), default="tiny")
    parser.add_argument("--methods", nargs="+", type=method_name, default=list(host.METHODS), metavar="METHOD")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    parser.add_argument("--vocab", type=positive_int, default=VOCAB,
                        help="vocabulary of the model; a small one (e.g. 1024: the traces' ids folded into it) makes "
                             "a forward that leaves the host's caches warm, as a GPU's forward does")
    parser.add_argument("--floor", type=positive_int, nargs="?", const=15, default=None, metavar="WIDTH",
                        help="also time `floor` at batch 1: the least host work of a speculative step (a free drafter "
                             "that is always right, WIDTH draft tokens a step, default 15; see lookahead.bench.host)")
    parser.add_argument("--cold", action="store_true",
                        help="only time small host operations right after a forward and again at once")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.cold:
        print(f"| operation | us right after a {args.shape} forward over 11 tokens | us repeated at once |\n"
              "| --- | ---: | ---: |")
        for name, after, again in host.cold_costs(random_model(args.shape, VOCAB, EOS)):
            print(f"| {name} | {after:.1f} | {again:.1f} |")
        return 0
    traces, errors = read_traces(args.traces) if args.traces.exists() else ([], [f"{args.traces}: not found"])
    if not traces:
        print(f"note: {errors[0] if errors else 'no traces'}; random prompts with repeated spans instead",
              file=sys.stderr)
        traces = synthetic_traces(max(args.batch + [args.prompts]), 384, args.max_new, VOCAB - 1)
    eos = EOS if args.vocab == VOCAB else args.vocab - 1
    if args.vocab != VOCAB:
        traces = host.folded(traces, args.vocab)
    model = random_model(args.shape, args.vocab, eos)
    rows = host.run_host(model, traces, eos, tuple(args.batch), args.prompts, args.repeats, args.max_new,
                         tuple(args.methods), log=lambda line: print(line, file=sys.stderr, flush=True),
                         floor_width=args.floor)
    print(f"\nHost time per step outside the forward, random-weight {args.shape} Llama, vocabulary {args.vocab}, CPU, "
          f"torch threads {torch.get_num_threads()}, at most {args.max_new} new tokens, {args.repeats} rounds "
          "(median, min-max)\n")
    print(host.markdown(rows))
    print("\nWhere the host time falls (median round; ms)\n")
    print(host.split_markdown(rows))
    return 1 if any(r.mismatches for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
