"""`lookahead.job.run`: check the input, skip what the output already holds, generate batch by batch, append and
flush each batch's lines as they come, report bad lines; the local engine runs here, the Ray engine in `ray_engine`."""
from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

from tqdm import tqdm

from .._checks import check_int
from .lines import done_ids, read_input
from .worker import ModelSpec, Options, Worker, batches, describe

ENGINES = ("local", "ray")


@dataclass
class Summary:
    """What one run did."""

    written: int = 0  # lines generated and written
    skipped: int = 0  # lines the output already held
    failed: int = 0  # bad lines and lines whose batch failed
    new_tokens: int = 0
    forwards: int = 0  # forward passes summed over lines (a batch forward counts once per line in it)
    seconds: float = 0.0  # generation time, model loading excluded
    threads: int | None = None  # torch threads the local engine generated with (None: the Ray engine's workers)
    threads_chosen: bool = False  # picked from the free cores (`lookahead.runtime.threads.choose_threads`), not given

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def lines_per_second(self) -> float:
        return self.written / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / max(self.forwards, 1)

    def __str__(self) -> str:
        return (f"{self.written} lines written, {self.skipped} already done, {self.failed} failed; {self.new_tokens} "
                f"new tokens in {self.seconds:.1f} s ({self.tokens_per_second:.1f} tokens/s, "
                f"{self.tokens_per_forward:.2f} tokens per forward){self._threads()}")

    def _threads(self) -> str:
        if self.threads is None:
            return ""
        how = "the cores no other process was using" if self.threads_chosen else "as given"
        return f"; {self.threads} torch thread{'s' if self.threads > 1 else ''} ({how})"


def run(input, output, model=None, *, engine: str = "local", lookup: str = "ngram", draft: str = "chain",
        max_new_tokens: int = 128, batch_size: int = 8, memory: int = 0, do_sample: bool = False,
        temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, device: str | None = None, dtype: str = "fp32",
        threads: int | None = None, address: str | None = None, workers: int = 1, logits_processor=None,
        progress: bool | None = None, echo=None, errors=None) -> Summary:
    """Generate for every line of a JSONL file and append one JSON line per input line to `output`.

    Input lines: `{"id": ..., "prompt": "..."}`, or `"messages": [...]` (chat template), or `"input_ids": [...]`;
    optional `"documents": [...]` (strings or token id lists, drafted from, as `generate(documents=)`). Without "id"
    the line number is the id. Output lines: id, text (new tokens, special tokens skipped), output_ids, new_tokens,
    forwards, tokens_per_forward. Lines whose id `output` already holds are skipped (a killed job resumes).

    Args:
        input: path of the JSONL input.
        output: path of the JSONL output (appended to), or "-" for stdout (no resume).
        model: a folder or hub id, or a picklable callable `() -> (model, tokenizer)`. Default: the bundled
            stories260K (`lookahead.models`).
        engine: "local" (this process) or "ray" (Ray Data: needs `pip install "ray[data]"`).
        lookup, draft, max_new_tokens, do_sample, temperature, top_p: as `lookahead.generate`; `seed` seeds each
            batch's sampling (with its first id).
        batch_size: lines per `generate` call, grouped by prompt length.
        memory: tokens of a `lookahead.Memory` shared by the lines one worker handles (0: none).
        device: "cpu", "cuda", ... Default: CUDA when present. dtype: "fp32", "bf16" or "fp16".
        threads: torch threads of the local engine, restored afterwards. Default: as many as the cores no other
            process is using now (`lookahead.runtime.threads.choose_threads`, as `lookahead demo`): torch's one thread per
            core against a busy core made a 5-prompt job 4x slower. The summary says what was used.
        address, workers: the Ray cluster (None: start a local one) and the number of model replicas (engine="ray").
        logits_processor: passed to every `generate` call (e.g. `lookahead.bench.ForcedReplay`).
        progress: show a progress bar (default: when stderr is a terminal).
        echo: a text stream that also gets "[id] text" for every line written (e.g. sys.stdout).
        errors: where bad lines and the summary go (default sys.stderr), one line each: `INPUT:LINE: reason`.

    Returns:
        a `Summary`; `summary.failed` counts bad lines and lines whose batch failed.

    Raises:
        ValueError: a setting out of range, an unknown engine, an unreadable input or output, a model that cannot be
            loaded, threads below 1. TypeError: threads not an int. ImportError: engine="ray" without Ray installed (the message says how to install it).

    Example:
        >>> summary = run("prompts.jsonl", "out.jsonl", max_new_tokens=64, lookup="suffix")
        >>> summary.failed, summary.tokens_per_forward
    """
    options = Options(lookup, draft, max_new_tokens, batch_size, memory, do_sample, temperature, top_p, seed)
    if threads is not None:
        check_int("threads", threads, 1)
    ray_engine = _ray_engine(workers) if _engine(engine) == "ray" else None
    with _torch_threads(threads if ray_engine is None else None, ray_engine is None) as used:
        summary = _run(input, output, ray_engine, options, ModelSpec(model, device, dtype), address, workers,
                       logits_processor, progress, echo, sys.stderr if errors is None else errors, used)
    return summary


def _run(input, output, ray_engine, options: Options, spec: ModelSpec, address, workers, logits_processor, progress,
         echo, errors, threads: tuple) -> Summary:
    """`run` once its arguments are checked and its torch threads set (``threads``: (count, chosen) or None)."""
    loaded = spec.load() if ray_engine is None else None
    described = describe(*(loaded or _config_and_tokenizer(spec)), options.max_new_tokens)
    done, cut = (set(), False) if output == "-" else done_ids(output)
    if cut:
        print(f"{output}: removed a last line cut off by an earlier run", file=errors)
    lines, bad, skipped = read_input(input, described, done)
    with _appending(output) as stream:
        for number, reason in bad:
            print(f"{input}:{number}: {reason}", file=errors)
        summary = Summary(skipped=skipped, failed=len(bad))
        if threads is not None:
            summary.threads, summary.threads_chosen = threads
        groups = batches(lines, options.batch_size)
        if ray_engine is None:
            worker = Worker(*loaded, options, logits_processor)
            results = (worker(group) for group in groups)
        else:
            results = ray_engine.results(groups, spec, options, workers, address, logits_processor)
        _write(results, stream, input, summary, len(lines), progress, echo, errors)
    print(f"lookahead generate: {summary}", file=errors)
    return summary


@contextmanager
def _torch_threads(threads: int | None, local: bool):
    """Set torch's threads for a local run (``threads``, else `choose_threads`) and restore them; yields
    (count, chosen) or None for the Ray engine, whose workers keep their own."""
    if not local:
        yield None
        return
    import torch

    from ..runtime.threads import choose_threads

    before = torch.get_num_threads()
    count = threads if threads is not None else choose_threads()
    torch.set_num_threads(count)
    try:
        yield count, threads is None
    finally:
        torch.set_num_threads(before)


def _engine(engine: str) -> str:
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    return engine


def _ray_engine(workers):
    """The Ray engine module, once Ray is known to be installed (ImportError saying how to install it otherwise)."""
    from . import ray_engine

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    ray_engine.check_installed()
    return ray_engine


@contextmanager
def _appending(output):
    """The stream records are appended to (stdout for "-")."""
    if output == "-":
        yield sys.stdout
        return
    try:
        stream = open(output, "a", encoding="utf-8")
    except OSError as error:
        raise ValueError(f"cannot write {output}: {error.strerror}") from None
    with stream:
        yield stream


def _config_and_tokenizer(spec: ModelSpec) -> tuple:
    """What the Ray driver checks lines against, without loading the weights (a factory is called, though)."""
    if not isinstance(spec.model, str):
        return spec.model()
    from .. import models

    return models.load_config(spec.model)


def _write(results, stream, input, summary: Summary, total: int, progress, echo, errors) -> None:
    """Append each batch's records to `stream` and flush, report failed lines, update the summary and the bar."""
    shown = errors.isatty() if progress is None else progress
    bar = tqdm(total=total, unit="line", desc="generate", disable=not shown, file=errors)
    start = time.perf_counter()
    try:
        for batch in results:
            for result in batch:
                if result["error"] is not None:
                    summary.failed += 1
                    bar.write(f"{input}:{result['number']}: {result['error']}", file=errors)
                    continue
                stream.write(result["record"] + "\n")
                summary.written += 1
                summary.new_tokens += result["new_tokens"]
                summary.forwards += result["forwards"]
                if echo is not None:
                    record = json.loads(result["record"])
                    bar.write(f"[{record['id']}] {record['text']}", file=echo)
            stream.flush()
            summary.seconds = time.perf_counter() - start
            bar.update(len(batch))
            bar.set_postfix_str(f"{summary.tokens_per_second:.1f} tok/s, {summary.tokens_per_forward:.2f} tok/fwd")
    finally:
        bar.close()
