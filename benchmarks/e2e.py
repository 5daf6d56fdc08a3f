"""End-to-end wall clock on real workloads: plain greedy, Hugging Face prompt lookup and lookahead, same prompts.

The target is a random-weight Llama of a given shape (GPT-2-small by default: 12 layers, hidden 768, GPT-2
vocabulary) whose greedy choice is forced to replay the recorded outputs of ``../shared/data`` (``ForcedOutputs``, a
forward hook writing the recorded next tokens on the device): the forwards are real, the acceptance pattern is that
of the model that wrote the trace. The harness is
``lookahead.bench.e2e`` (``lookahead bench e2e``); this script adds the dataset loaders. Without the data folder it
falls back to random prompts with repeated spans.

    python benchmarks/e2e.py --datasets code-edit summarization no-copy --limit 8 --batch 8
    python benchmarks/e2e.py --force-replay code-edit summarization --shape 1b --dtype bf16 --device cuda \\
        --batch 1 4 16 --limit 16 --plot e2e_gpu.png
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from traces import DEFAULT_DATA_DIR, workload

from lookahead.runtime import jit as _jit
from lookahead.arguments import draft_cost
from lookahead.bench import e2e
from lookahead.bench import plot as bench_plot
from lookahead.bench.arguments import method_name, positive_int
from lookahead.bench.forcing import ForcedOutputs
from lookahead.bench.methods import E2E_DEFAULT

EOS = PAD = 50256  # GPT-2's <|endoftext|>: never inside the recorded texts
VOCAB = 50257


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", "--force-replay", dest="datasets", nargs="+",
                        default=["code-edit", "summarization", "no-copy"],
                        help="recorded outputs to force: code-edit, summarization, rag, agent, no-copy")
    parser.add_argument("--methods", nargs="+", type=method_name, default=list(E2E_DEFAULT), metavar="METHOD",
                        help=f"methods of lookahead.bench.methods that generate (default: {' '.join(E2E_DEFAULT)})")
    parser.add_argument("--shape", default="gpt2-small", choices=list(e2e.SHAPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="fp32", choices=list(e2e.DTYPES))
    parser.add_argument("--limit", type=positive_int, default=8,
                        help="prompts per dataset (at least the largest batch)")
    parser.add_argument("--batch", type=positive_int, nargs="+", default=[1], help="batch sizes; 1 is always run")
    parser.add_argument("--max-prompt", type=positive_int, default=1024)
    parser.add_argument("--max-new", type=positive_int, default=160)
    parser.add_argument("--repeats", type=positive_int, default=1,
                        help="timed calls of each method on each batch, in turns (the median counts)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--plot", default=None, help="speedup against batch size (needs matplotlib)")
    parser.add_argument("--draft-cost", type=draft_cost, default=None,
                        help="lookahead's draft_cost: 'auto' (measured once), a number or 'overhead,per_token' "
                             "(default: lookahead's default)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = sorted({1, *args.batch})
    count = max(args.limit, batches[-1])
    if args.data_dir.is_dir():
        datasets = {name: workload(name, args.data_dir, count, args.max_prompt, args.max_new) for name in args.datasets}
    else:
        print(f"note: {args.data_dir} not found; random prompts with repeated spans instead", file=sys.stderr)
        datasets = {"synthetic": e2e.synthetic_traces(count, 384, args.max_new, VOCAB - 1)}
    model = e2e.random_model(args.shape, VOCAB, EOS, args.device, args.dtype)
    from tqdm import tqdm

    try:  # one hook for the run: CUDA graphs captured by lookahead's static cache keep its tensors
        forced = ForcedOutputs([t for pairs in datasets.values() for t in pairs], EOS, model.device)
    except ValueError as reason:
        sys.exit(f"e2e.py: the datasets cannot be forced together: {reason}")
    timings = []
    for name, pairs in datasets.items():
        timings += e2e.run_e2e(model, pairs, name, args.methods, batches, EOS, True, args.max_new, tqdm,
                               args.draft_cost, args.repeats, forced)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"\nrandom-weight {args.shape} Llama ({params:.0f}M parameters), {args.device} {args.dtype}, torch threads "
          f"{torch.get_num_threads()}, recorded outputs forced, at most {args.max_new} new tokens, draft_cost "
          f"{args.draft_cost or 'default'}\n")
    print(e2e.markdown(timings))
    cost = e2e.measured_cost(model)
    print(f"\nForward cost (after 512 cached tokens, in one-token forwards): 11 tokens {cost(10):.2f}x, 33 tokens "
          f"{cost(32):.2f}x")
    print(e2e.predicted_vs_measured(datasets, timings, cost))
    if args.plot:
        points = e2e.speedup_points(timings)
        bench_plot.speedup_vs_batch(points, args.plot, f"speedup over greedy: random-weight {args.shape} Llama, "
                                    f"{args.device} {args.dtype}")
        print(f"plot written to {args.plot}")


if __name__ == "__main__":
    with _jit.compiled():  # timings of numba's kernels, never of their Python twins
        main()
