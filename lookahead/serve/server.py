"""Building a server (model, engine, app) and running it with uvicorn: in the foreground (`lookahead serve`) or in
a thread on an ephemeral port (`Running`: the tests and benchmarks/serve.py)."""
from __future__ import annotations

import logging
import signal
import threading
import time

import uvicorn

from .. import models
from ..index.memory import Memory
from .app import Served, make_app
from .engine import Engine
from .metrics import Metrics

logger = logging.getLogger("lookahead.serve")


def build(model: str | None = None, device: str = "cpu", dtype: str = "fp32", memory: int = 0,
          max_tokens: int = 256, name: str | None = None, loaded: tuple | None = None,
          cache_implementation: str | None = None, max_model_len: int | None = None, start: bool = True):
    """(FastAPI app, its `Served`) for a model, its engine started in a thread of its own (`start=False`: not
    started; `Engine.run` runs it in the caller's thread).

    Args:
        model: what `lookahead.models.load` takes (default: the bundled stories260K).
        device, dtype: where and in what precision the model runs.
        memory: tokens of a server-wide `lookahead.Memory` every request drafts from (0: none).
        max_tokens: the default most new tokens of a chat request.
        name: the model id clients name (default: the model argument, or "stories260K").
        loaded: (model, tokenizer) already loaded, instead of loading `model`.
        cache_implementation, max_model_len: the engine's cache ("static", "dynamic"; None: as `generate` chooses)
            and, with the static cache, the most tokens of a request (`Engine`).

    Raises:
        ValueError: the model cannot be loaded or served (one line).
    """
    if loaded is None:
        hf_model, tokenizer, _ = models.load(model or models.default_model_path(), device=device, dtype=dtype)
    else:
        hf_model, tokenizer = loaded
    metrics = Metrics()
    engine = Engine(hf_model, Memory(memory) if memory else None, metrics,
                    cache_implementation=cache_implementation, max_model_len=max_model_len)
    if start:
        engine.start()
    served = Served(name or model or "stories260K", tokenizer, engine, metrics, max_tokens)
    return make_app(served), served


class Running:
    """A uvicorn server in a thread, on `host` and an ephemeral port unless `port` is given; `url` is its base URL.

    Example:
        >>> with Running(app) as server:
        ...     client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.url = None

    def __enter__(self) -> "Running":
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.server.config.host}:{self.server.config.port}")
            time.sleep(0.02)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def configure(args) -> None:
    """What every `lookahead serve` engine sets first: the log (`lookahead`, at --log-level), torch's threads, and
    an allocator that keeps the memory it frees (`runtime.malloc`: the steps' tensors then reuse it rather than
    fault in fresh pages)."""
    import torch

    from ..runtime.malloc import keep_freed_memory

    keep_freed_memory()

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    log = logging.getLogger("lookahead")
    log.addHandler(handler)
    log.setLevel(args.log_level.upper())
    if args.threads is not None:
        torch.set_num_threads(args.threads)


def serve(args) -> int:
    """`lookahead serve --engine local`: build the server and run it until interrupted; its log names what runs,
    then each request's tokens, forwards and drafts (`configure` first). The decoding loop runs in this thread, the
    one that loaded the model, and uvicorn in another (`Engine.run` says why)."""
    import torch

    app, served = build(args.model, args.device, args.dtype, args.memory, args.max_tokens, args.served_model_name,
                        cache_implementation=args.cache_implementation, max_model_len=args.max_model_len,
                        start=False)
    engine = served.engine
    logger.info("lookahead serve: %s (%s, %s parameters) on %s in %s, %d CPU threads (%s), memory %s, engine %s, "
                "%s, http://%s:%d/v1", served.name, engine.facts.name,
                f"{sum(p.numel() for p in engine.model.parameters()) / 1e6:.1f}M", engine.facts.device,
                str(engine.facts.dtype).replace("torch.", ""), torch.get_num_threads(),
                "--threads" if args.threads is not None else "torch's default: one per core",
                f"{args.memory} tokens" if args.memory else "none", args.engine, engine.cache_name, args.host,
                args.port)
    signal.signal(signal.SIGTERM, _interrupted)  # as Ctrl-C: the loop closes its rows, uvicorn stops
    try:
        with Running(app, args.host, args.port, args.log_level) as running:
            engine.run()
            if engine.error is not None:  # the loop failed: the server answers that (503) until interrupted
                running.thread.join()
    except KeyboardInterrupt:
        pass
    return 0


def _interrupted(signum, frame):
    raise KeyboardInterrupt
