"""The Ray engine: Ray Data spreads the batches over model replicas (one per worker, on a GPU when the cluster has
them); each replica loads the model once and runs the same `Worker` as the local engine.

The driver checks the lines, skips the done ones and groups them into batches first (so bad-line reports, resume and
the batches themselves are the local engine's), then iterates the results as they come and writes them itself
(appended and flushed batch by batch). Reference: Ray Data batch inference, `ds.map_batches(Predictor,
concurrency=N, num_gpus=...)` with a callable class that loads the model in `__init__`.
"""
from __future__ import annotations

import json
import logging

from .lines import Line
from .worker import ModelSpec, Options, Worker

INSTALL = 'the Ray engine needs Ray: pip install "ray[data]" (or pip install -e ".[ray]" in a checkout)'


def check_installed() -> None:
    """Raise ImportError with the install command when Ray Data cannot be imported."""
    try:
        import ray.data  # noqa: F401
    except ImportError:
        raise ImportError(INSTALL) from None


class Predictor:
    """One model replica: loads the model once, then turns each batch (one row per batch of lines) into results."""

    def __init__(self, spec: ModelSpec, options: Options, logits_processor=None):
        model, tokenizer = spec.load()
        self.worker = Worker(model, tokenizer, options, logits_processor)

    def __call__(self, rows: dict) -> dict:
        results = []
        for batch in rows["batch"]:
            results += self.worker([Line.from_json(text) for text in json.loads(batch)])
        return {"result": [json.dumps(r) for r in results]}


def results(groups: list, spec: ModelSpec, options: Options, workers: int, address: str | None,
            logits_processor=None):
    """Yield each batch's results (`Worker` results) as the replicas finish them; order may differ from `groups`.

    Args:
        groups: batches of `Line`s (`worker.batches`).
        spec: the model every replica loads.
        workers: model replicas.
        address: the cluster to join ("auto", "HOST:6379", "ray://..."); None starts a local one unless Ray is
            already initialized in this process.
    """
    import ray

    if not groups:
        return
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, logging_level="WARNING")
    wants_gpu = spec.device is None or spec.device.startswith("cuda")
    gpus = 1 if wants_gpu and ray.cluster_resources().get("GPU", 0) >= 1 else 0
    rows = [{"batch": json.dumps([line.to_json() for line in group])} for group in groups]
    context, logger = ray.data.DataContext.get_current(), logging.getLogger("ray.data")
    shown, level = context.enable_progress_bars, logger.level
    context.enable_progress_bars = False  # our own bar counts lines, and Ray's notes would break it; restored below
    logger.setLevel(logging.ERROR)
    try:
        ds = ray.data.from_items(rows, override_num_blocks=min(len(rows), 4 * workers))
        ds = ds.map_batches(Predictor, fn_constructor_kwargs=dict(spec=spec, options=options,
                                                                  logits_processor=logits_processor),
                            batch_size=1, compute=ray.data.ActorPoolStrategy(size=workers), num_gpus=gpus)
        for out in ds.iter_batches(batch_size=None, batch_format="numpy"):
            yield [json.loads(text) for text in out["result"]]
    finally:
        context.enable_progress_bars = shown
        logger.setLevel(level)
