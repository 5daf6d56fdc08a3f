"""`lookahead serve --engine ray --replicas N`: N model replicas behind one endpoint with Ray Serve.

Each replica is the local server (its own model, `Engine` and FastAPI app, built in the replica: Ray Serve's deferred
ingress, `__serve_build_asgi_app__`), on a GPU when the cluster has them; Ray Serve's proxy spreads the requests over
them. The API is the same; `/metrics` answers with the metrics of the replica the request reached.
"""
from __future__ import annotations

import time

INSTALL = 'the Ray engine needs Ray Serve: pip install "ray[serve]" (or pip install -e ".[ray]" in a checkout)'


def check_installed() -> None:
    """Raise ImportError with the install command when Ray Serve cannot be imported."""
    try:
        import ray.serve  # noqa: F401
    except ImportError:
        raise ImportError(INSTALL) from None


def deployment(replicas: int, gpus: float = 0.0):
    """The Ray Serve deployment of `replicas` copies of the server (`gpus` GPUs each)."""
    from ray import serve

    @serve.deployment(num_replicas=replicas, ray_actor_options={"num_cpus": 1, "num_gpus": gpus},
                      max_ongoing_requests=256)
    @serve.ingress()
    class Replica:
        def __init__(self, options: dict, threads: int | None = None):
            self._asgi, self._served = _built_on_one_thread(options, threads)

        def __serve_build_asgi_app__(self):
            return self._asgi

    return Replica


def _built_on_one_thread(options: dict, threads: int | None) -> tuple:
    """`server.build(**options)` in a thread of its own that then runs the engine's loop (`Engine.run`): the replica
    loads, measures and steps the model on one thread, as `lookahead serve` does on its first (a second thread's
    forwards wait for their OpenMP workers); (app, served) once built.

    Raises:
        what building raised."""
    import threading

    from .server import build

    ready, box = threading.Event(), {}

    def own() -> None:
        import torch

        from ..runtime.malloc import keep_freed_memory

        keep_freed_memory()  # as `server.configure` does for `lookahead serve`
        try:
            if threads is not None:
                torch.set_num_threads(threads)
            box["built"] = build(**options, start=False)
        except BaseException as error:  # noqa: BLE001: raised again in the replica's constructor
            box["error"] = error
            return
        finally:
            ready.set()
        box["built"][1].engine.run()

    threading.Thread(target=own, name="lookahead-engine", daemon=True).start()
    ready.wait()
    if "error" in box:
        raise box["error"]
    return box["built"]


def start(replicas: int, options: dict, host: str = "127.0.0.1", port: int = 8000, address: str | None = None,
          num_cpus: int | None = None, threads: int | None = None) -> str:
    """Start (or join) Ray, run the replicas behind Ray Serve's proxy on host:port; return the base URL.

    Args:
        replicas: model replicas.
        options: `server.build`'s keyword arguments (model, device, dtype, memory, max_tokens, name).
        address: the Ray cluster to join (None: a local one, with `num_cpus` CPUs).
        threads: torch CPU threads of each replica (None: torch's default).
    """
    check_installed()
    import ray
    from ray import serve

    if not ray.is_initialized():
        ray.init(address=address, num_cpus=num_cpus, log_to_driver=False, logging_level="WARNING",
                 include_dashboard=False)
    gpus = 1.0 if ray.cluster_resources().get("GPU", 0) >= replicas and options.get("device") != "cpu" else 0.0
    if gpus:
        options = {**options, "device": "cuda"}
    serve.start(http_options={"host": host, "port": port})
    serve.run(deployment(replicas, gpus).bind(options, threads), name="lookahead", route_prefix="/")
    return f"http://{host}:{port}"


def stop() -> None:
    """Shut Ray Serve and Ray down."""
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def run(args) -> int:
    """Run `lookahead serve --engine ray` until interrupted."""
    options = dict(model=args.model, device=args.device, dtype=args.dtype, memory=args.memory,
                   max_tokens=args.max_tokens, name=args.served_model_name,
                   cache_implementation=args.cache_implementation, max_model_len=args.max_model_len)
    url = start(args.replicas, options, args.host, args.port, num_cpus=max(args.replicas, 2), threads=args.threads)
    print(f"lookahead serve: {args.replicas} replicas at {url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        stop()
