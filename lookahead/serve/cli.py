"""`lookahead serve`: the parser. Imports nothing heavy: the server is built only when the command runs."""
from __future__ import annotations

import sys

from ..arguments import non_negative_int, positive_int


def add_parser(sub) -> None:
    """Add the `serve` command to the console script's subparsers."""
    p = sub.add_parser("serve", help="an OpenAI-compatible server with continuous batching (pip install "
                                     "\"lookahead[serve]\")",
                       description="Serve a model over OpenAI's API (/v1/chat/completions, /v1/completions, "
                                   "/v1/models, /health, /metrics): one decoding loop batches every request; a "
                                   "request's `prediction` and `lookahead` options steer its drafts.")
    p.add_argument("--model", default=None,
                   help="folder, hub id, .gguf file, smollm2 or gemma3 (default: the bundled stories260K)")
    p.add_argument("--served-model-name", default=None, help="the id clients name (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="(default 127.0.0.1)")
    p.add_argument("--port", type=non_negative_int, default=8000, help="(default 8000; 0: any free port)")
    p.add_argument("--memory", type=non_negative_int, default=0, metavar="TOKENS",
                   help="a server-wide Memory of this many tokens: each request drafts from earlier prompts and "
                        "answers (default 0: none)")
    p.add_argument("--max-tokens", type=positive_int, default=256,
                   help="new tokens of a chat request that sets no max_tokens (default 256)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, ... (default cpu)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32", help="(default fp32)")
    p.add_argument("--cache-implementation", choices=("static", "dynamic"), default=None,
                   help="static: every request in a preallocated slot cache, its steps CUDA graphs on CUDA (compiled "
                        "with static); dynamic: transformers' dynamic cache (default: as lookahead.generate chooses: "
                        "static with CUDA graphs on CUDA for the architectures tested there, else dynamic)")
    p.add_argument("--max-model-len", type=positive_int, default=None, metavar="TOKENS",
                   help="with the static cache, the most tokens of a request, prompt and answer: the slots each row "
                        "holds (default: the model's position limit, at most 4096)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch CPU threads (default: torch's, one per core; never chosen from the load of the moment)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: this process; ray: --replicas model replicas behind Ray Serve "
                        "(pip install \"lookahead[ray]\")")
    p.add_argument("--replicas", type=positive_int, default=1, help="model replicas with --engine ray (default 1)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=_serve, parser=p)


def _serve(args) -> int:
    if args.engine == "local" and args.replicas != 1:
        args.parser.error("--replicas needs --engine ray")
    try:
        from . import server
        if args.engine == "ray":
            from .ray_engine import run
        else:
            run = server.serve
    except ImportError as error:
        print(f"lookahead serve: error: {error.name or error} is not installed: pip install \"lookahead[serve]\"",
              file=sys.stderr)
        return 2
    try:
        server.configure(args)
        return run(args)
    except (ValueError, ImportError) as error:
        print(f"lookahead serve: error: {error}", file=sys.stderr)
        return 2
