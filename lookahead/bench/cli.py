"""`lookahead bench traces | e2e | index | real`: measure and predict speedups; markdown tables, optional plots.

A bad argument (``--budget 0``, ``--cost-ratio 0``, an unknown method or shape) is argparse's one-line error, exit
status 2. Bad input (an unreadable file, a bad line) gets a one-line error on stderr and the run goes on where it
can; the exit status is 1 when nothing could be measured (or a requested plot could not be written).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import real_cli
from ..arguments import DTYPES
from .arguments import cost_ratio, int_at_least, method_name, positive_int
from .methods import COST_TOKENS as DEFAULT_COST_TOKENS
from .methods import E2E_DEFAULT, REPLAY_DEFAULT


def add_parser(sub) -> None:
    """Add the `bench` command and its subcommands to the console script's subparsers."""
    bench = sub.add_parser("bench", help="measure and predict speedups: traces (model-free), e2e (wall clock), index, "
                                                 "real (a real model)")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    _traces_parser(kinds.add_parser("traces", help="tokens per forward and predicted speedup, model-free replay"))
    _e2e_parser(kinds.add_parser("e2e", help="wall-clock generation: greedy, HF prompt lookup, lookahead"))
    _index_parser(kinds.add_parser("index", help="microseconds per step of every index against tokens held"))
    real_cli.add_parser(kinds)


def _source_args(p) -> None:
    p.add_argument("files", nargs="*", metavar="FILE.jsonl",
                   help="traces: one JSON object per line with prompt/output (text or token ids); none: code edits "
                        "from the git history of --repo")
    p.add_argument("--tokenizer", default=None,
                   help="folder with vocab.json + merges.txt, a tokenizer.json, or a hub id (default: UTF-8 bytes)")
    p.add_argument("--repo", default=".", help="git repository whose edit history makes the default traces")
    p.add_argument("--max-commits", type=positive_int, default=20,
                   help="newest commits of --repo to read (default 20: some 70 file edits here, a table in well under a "
                        "minute whose figures match 40 commits' to 0.01 tokens/forward; raise it for the whole history)")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="also write a figure (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _traces_parser(p) -> None:
    _source_args(p)
    p.add_argument("--methods", "--modes", nargs="+", type=method_name, default=list(REPLAY_DEFAULT), metavar="METHOD",
                   help=f"methods to replay (lookahead.bench.methods; default {' '.join(REPLAY_DEFAULT)})")
    p.add_argument("--budget", type=positive_int, default=10, help="draft tokens per step (default 10)")
    p.add_argument("--tree-budget", type=positive_int, default=32, help="nodes per step of tree drafts (default 32)")
    p.add_argument("--cost-ratio", type=cost_ratio, nargs="+", default=[1.1],
                   help="cost of a --cost-tokens-token forward relative to a 1-token one (default 1.1, a GPU at "
                        "batch 1; `bench e2e` measures it); linear in between and beyond")
    p.add_argument("--cost-tokens", type=int_at_least(2), default=DEFAULT_COST_TOKENS,
                   help=f"forward size the cost ratio refers to (default {DEFAULT_COST_TOKENS}: last token + 10 "
                        "drafts)")
    p.add_argument("--hf-exact", action="store_true", help="call transformers' get_candidates (slow on long contexts)")
    p.set_defaults(func=run_traces)


def _e2e_parser(p) -> None:
    from .shapes import SHAPES

    _source_args(p)
    target = p.add_mutually_exclusive_group()
    target.add_argument("--model", default=None, help="pretrained model: local folder or hub id")
    target.add_argument("--shape", default=None, choices=list(SHAPES),
                        help="random-weight Llama (default gpt2-small)")
    p.add_argument("--synthetic", action="store_true", help="random prompts with repeated spans instead of traces")
    p.add_argument("--force", action=argparse.BooleanOptionalAction, default=None,
                   help="force the recorded outputs (default: yes for --shape, no for --model)")
    p.add_argument("--methods", nargs="+", type=method_name, default=list(E2E_DEFAULT), metavar="METHOD",
                   help=f"methods that generate (lookahead.bench.methods; default {' '.join(E2E_DEFAULT)})")
    p.add_argument("--batch", type=positive_int, nargs="+", default=[1], help="batch sizes (default 1), e.g. 1 4 16")
    p.add_argument("--prompts", type=positive_int, default=4,
                   help="prompts per batch size (at least the largest batch)")
    p.add_argument("--max-prompt", type=positive_int, default=2048, help="skip traces with longer prompts (tokens)")
    p.add_argument("--max-new", type=positive_int, default=128, help="new tokens per prompt (default 128)")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="timed calls of each method on each batch, in turns (default 1; the median counts)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="fp32", choices=DTYPES)
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    p.set_defaults(func=run_e2e)


def _index_parser(p) -> None:
    from .index_speed import SIZES

    _source_args(p)
    p.add_argument("--sizes", type=positive_int, nargs="+", default=list(SIZES), help="tokens held (default 1k to 1M)")
    p.add_argument("--steps", type=positive_int, default=500,
                   help="timed steps per size (HF prompt lookup: at most 100)")
    p.add_argument("--torch-threads", type=positive_int, default=1,
                   help="torch threads for HF prompt lookup (default 1)")
    p.set_defaults(func=run_index)


def error(message: str) -> None:
    """One line on stderr."""
    print(f"lookahead bench: {message}", file=sys.stderr, flush=True)


def _progress(args):
    if args.no_progress:
        return None
    from tqdm import tqdm

    return lambda xs, **kw: tqdm(xs, file=sys.stderr, dynamic_ncols=True, **kw)


def load_datasets(args, tokenizer) -> dict:
    """``{name: traces}`` from the files given, else from the git history of ``--repo``; errors printed, not raised."""
    from .git_traces import git_traces
    from .traces_io import read_traces

    datasets = {}
    for path in args.files:
        traces, errors = read_traces(path, tokenizer)
        for message in errors:
            error(message)
        if traces:
            datasets[_dataset_name(path, datasets)] = traces
    if args.files:
        return datasets
    try:
        traces = git_traces(args.repo, tokenizer, max_commits=args.max_commits)
    except ValueError as reason:
        error(f"{reason} (give trace files, or --repo a git repository)")
        return {}
    if not traces:
        error(f"{args.repo}: no text file was modified in the last {args.max_commits} commits")
        return {}
    return {f"git:{Path(args.repo).resolve().name}": traces}


def _dataset_name(path: str, taken: dict) -> str:
    name = Path(path).name
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name if name not in taken else f"{name}#{len(taken)}"


def _tokenizer(args):
    from .traces_io import load_tokenizer

    try:
        return load_tokenizer(args.tokenizer)
    except ValueError as reason:
        error(str(reason))
        return None


def _describe(datasets: dict, tokenizer) -> None:
    for name, traces in datasets.items():
        print(f"{name}: {len(traces)} traces, {sum(len(p) for p, _ in traces)} prompt and "
              f"{sum(len(o) for _, o in traces)} output tokens ({tokenizer.name})")


def run_traces(args) -> int:
    """`lookahead bench traces`: replay every method on every dataset, print the table (and plot)."""
    from . import quality
    from .methods import Setup, resolve

    try:
        methods = resolve(args.methods, need="replay")
    except ValueError as reason:
        error(str(reason))
        return 1
    tokenizer = _tokenizer(args)
    datasets = load_datasets(args, tokenizer) if tokenizer is not None else {}
    if not datasets:
        error("nothing to measure")
        return 1
    _describe(datasets, tokenizer)
    setup = Setup(args.budget, args.tree_budget, args.hf_exact)
    results = quality.replay_all(methods, datasets, setup, _progress(args))
    print(f"\nModel-free replay, draft budget {args.budget} (tree: {args.tree_budget} nodes); predicted speedup = "
          f"tokens/forward over the cost of verifying 1 + k tokens, a {args.cost_tokens}-token forward costing "
          f"the ratio given\n")
    print(quality.markdown(results, args.cost_ratio, args.cost_tokens))
    if args.plot:
        values = {key: stats.tokens_per_forward for key, stats in results.items()}
        return _plot("tokens_per_forward", values, [m.name for m in methods], list(datasets), args.plot,
                     "tokens per target forward (model-free replay)")
    return 0


def _plot(kind: str, *plot_args) -> int:
    from . import plot

    try:
        getattr(plot, kind)(*plot_args)
    except ValueError as reason:
        error(str(reason))
        return 1
    print(f"\nplot written to {plot_args[-2]}")
    return 0


def run_index(args) -> int:
    """`lookahead bench index`: µs per step of every index at each context size, over a context of real text."""
    import torch

    from . import index_speed as S

    torch.set_num_threads(args.torch_threads)  # HF's get_candidates: torch's pool contends with other work
    sizes = sorted(set(args.sizes))
    tokenizer = _tokenizer(args)
    datasets = load_datasets(args, tokenizer) if tokenizer is not None else {}
    need = sizes[-1] + 3 * (args.steps + 3)
    if datasets:
        _describe(datasets, tokenizer)
        pool, source = S.token_pool([t for traces in datasets.values() for t in traces], need), ", ".join(datasets)
    else:
        error("no traces: timing on a synthetic context (random ids with recurring spans)")
        pool, source = S.synthetic_pool(need), "synthetic"
    makers = S.index_makers()
    results = S.measure(makers, pool, sizes, args.steps, progress=_progress(args))
    print(f"\nMicroseconds per step: median (mean) of propose(10) + extend(3 tokens) after a context of N tokens "
          f"({source}, tiled; torch threads {args.torch_threads}; HF: transformers' get_candidates)\n")
    print(S.markdown(results, list(makers), sizes))
    if args.plot:
        return _plot("step_cost", results, list(makers), sizes, args.plot, "drafter cost per step")
    return 0


def run_e2e(args) -> int:
    """`lookahead bench e2e`: time greedy, HF prompt lookup and lookahead's modes on the same prompts."""
    import torch

    from . import e2e
    from .forcing import ForcedOutputs

    if args.threads:
        torch.set_num_threads(args.threads)
    setup = _e2e_setup(args)
    if setup is None:
        return 1
    model, datasets, eos, methods, force = setup
    try:  # one hook for the run: CUDA graphs captured by lookahead's static cache keep its tensors
        forced = ForcedOutputs([t for ts in datasets.values() for t in ts], eos, model.device) if force else None
    except ValueError as reason:
        error(f"the datasets cannot be forced together: {reason}")
        return 1
    timings = []
    for name, traces in datasets.items():
        timings += e2e.run_e2e(model, traces, name, methods, args.batch, eos, force, args.max_new, _progress(args),
                               repeats=args.repeats, forced=forced)
    print(f"\nWall clock, {args.device} {args.dtype}, torch threads {torch.get_num_threads()}, "
          f"{'recorded outputs forced' if force else 'outputs written by the model'}, at most {args.max_new} new "
          f"tokens per prompt\n")
    print(e2e.markdown(timings))
    if any(t.mismatches for t in timings):
        error("some methods wrote different tokens than the first method (see 'same output')")
    cost = e2e.measured_cost(model)
    print(f"\nForward cost here (after 512 cached tokens, in one-token forwards): {DEFAULT_COST_TOKENS} tokens "
          f"{cost(DEFAULT_COST_TOKENS - 1):.2f}x, 33 tokens {cost(32):.2f}x")
    if 1 in args.batch:
        print(e2e.predicted_vs_measured(datasets, timings, cost))
    if args.plot:
        points = e2e.speedup_points(timings)
        return _plot("speedup_vs_batch", points, args.plot, f"speedup over greedy, {_target_name(args)}")
    return 0


def _target_name(args) -> str:
    return args.model or f"random-weight {args.shape or 'gpt2-small'} Llama, {args.device} {args.dtype}"


def _e2e_setup(args):
    """(model, {name: traces}, eos, methods, force), or None after printing why not."""
    from . import e2e

    target = _e2e_target(args)
    if target is None:
        return None
    model, tokenizer = target
    vocab = model.config.vocab_size if model is not None else tokenizer.vocab_size if args.tokenizer else 50257
    datasets = _e2e_workload(args, tokenizer, vocab)
    if not datasets:
        error("nothing to measure")
        return None
    _describe(datasets, tokenizer)
    if model is None:
        vocab, eos = e2e.free_id([t for traces in datasets.values() for t in traces], tokenizer.vocab_size)
        model = e2e.random_model(args.shape or "gpt2-small", vocab, eos, args.device, args.dtype)
    else:
        eos = _model_eos(model)
    params = sum(p.numel() for p in model.parameters())
    print(f"target: {_target_name(args)}, {params / 1e6:.0f}M parameters, vocabulary {model.config.vocab_size}")
    force = args.force if args.force is not None else args.model is None
    return model, datasets, eos, args.methods, force


def _e2e_target(args):
    """(pretrained model or None for a random one, tokenizer) after checking the arguments; None if they fail."""
    import torch

    from . import e2e
    from .traces_io import wrap_tokenizer

    from .methods import METHODS

    refused = [m for m in args.methods if METHODS[m].runner is None]
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        error("--device cuda: no CUDA device here")
    elif refused:
        error(f"method {refused[0]!r} does not generate (a drafter for the model-free replay only)")
    elif args.model is None:
        tokenizer = _tokenizer(args)
        return None if tokenizer is None else (None, tokenizer)
    else:
        try:
            model, tok = e2e.pretrained_model(args.model, args.device, args.dtype)
        except ValueError as reason:
            error(str(reason))
            return None
        if args.tokenizer or tok is None:
            tokenizer = _tokenizer(args)
        else:
            tokenizer = wrap_tokenizer(tok, args.model)
        return None if tokenizer is None else (model, tokenizer)
    return None


def _e2e_workload(args, tokenizer, vocab: int) -> dict:
    """{name: traces}: at most max(--prompts, largest batch) distinct prompts of at most --max-prompt tokens each
    (synthetic ones over `vocab` ids with --synthetic)."""
    from . import e2e
    from .forcing import distinct_prompts

    count = max(args.prompts, max(args.batch))
    if args.synthetic:
        return {"synthetic": e2e.synthetic_traces(count, min(384, args.max_prompt), args.max_new, vocab)}
    datasets = {}
    for name, traces in load_datasets(args, tokenizer).items():
        kept = distinct_prompts([t for t in traces if 0 < len(t[0]) <= args.max_prompt])[:count]
        if len(kept) < count:
            error(f"{name}: {len(kept)} of {len(traces)} traces have distinct prompts of at most {args.max_prompt} "
                  f"tokens (--max-prompt); {count} wanted")
        if kept:
            datasets[name] = kept
    return datasets


def _model_eos(model) -> int:
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    return int(eos) if eos is not None else model.config.vocab_size - 1
