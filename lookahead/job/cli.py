"""`lookahead generate INPUT.jsonl --output OUT.jsonl`: the parser and what the command does with its arguments."""
from __future__ import annotations

import sys

from ..arguments import DTYPES, non_negative_int, positive_float, positive_int, probability
from .._checks import DRAFTS, LOOKUPS, TREE_LOOKUPS


def add_parser(sub) -> None:
    """Add the `generate` command to the console script's subparsers."""
    p = sub.add_parser("generate", help="generate for every line of a JSONL file (resumable; local or Ray)",
                       description="Generate for every line of INPUT.jsonl ({\"id\", \"prompt\" | \"messages\" | "
                                   "\"input_ids\", \"documents\"}) and append one line per input line to --output; a "
                                   "rerun skips the ids already written.")
    p.add_argument("input", metavar="INPUT.jsonl")
    p.add_argument("--output", required=True, metavar="OUT.jsonl", help="appended to; '-' for stdout (no resume)")
    p.add_argument("--model", default=None,
                   help="folder, hub id, .gguf file, smollm2 or gemma3 (default: the bundled stories260K)")
    p.add_argument("--lookup", choices=LOOKUPS, default="ngram", help="what drafts come from (default ngram)")
    p.add_argument("--draft", choices=DRAFTS, default="chain",
                   help="tree needs --lookup suffix, recycle or suffix+recycle")
    p.add_argument("--max-new-tokens", type=positive_int, default=128, help="per line (default 128)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="lines per generate call (default 8)")
    p.add_argument("--memory", type=non_negative_int, default=0, metavar="TOKENS",
                   help="a Memory of this many tokens shared by the lines a worker handles (default 0: none)")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when present)")
    p.add_argument("--dtype", choices=DTYPES, default="fp32", help="(default fp32)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch CPU threads (default: as many as the cores no other process is using, as `lookahead "
                        "demo` picks them; the summary says how many)")
    p.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=positive_float, default=1.0, help="with --do-sample (default 1.0)")
    p.add_argument("--top-p", type=probability, default=1.0, help="with --do-sample (default 1.0)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="sampling seed (with each batch's first id)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: this process; ray: Ray Data over --workers replicas (pip install \"ray[data]\")")
    p.add_argument("--address", default=None, help="Ray cluster to join, e.g. auto (default: start a local one)")
    p.add_argument("--workers", type=positive_int, default=1, help="model replicas with --engine ray (default 1)")
    p.add_argument("--print-text", action="store_true", help="also print each line's id and text to stdout")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_generate, parser=p)


def _generate(args) -> int:
    from .driver import run

    if args.draft == "tree" and args.lookup not in TREE_LOOKUPS:
        args.parser.error("--draft tree needs --lookup suffix, recycle or suffix+recycle")
    if args.engine == "local" and (args.address is not None or args.workers != 1):
        args.parser.error("--address and --workers need --engine ray")
    try:
        summary = run(args.input, args.output, args.model, engine=args.engine, lookup=args.lookup, draft=args.draft,
                      max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, memory=args.memory,
                      do_sample=args.do_sample, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                      device=args.device, dtype=args.dtype, threads=args.threads, address=args.address,
                      workers=args.workers,
                      progress=False if args.no_progress else None, echo=sys.stdout if args.print_text else None)
    except (ValueError, ImportError) as error:
        print(f"lookahead generate: error: {error}", file=sys.stderr)
        return 2
    return 1 if summary.failed else 0
