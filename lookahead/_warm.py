"""The background compiler of `lookahead._jit`: ``python -m lookahead._warm MARKER`` compiles the kernels of each
kind of call in `_jit.KINDS` into numba's cache (one short call each on the bundled model), most common first,
listing each kind in MARKER as soon as it is compiled; at the lowest CPU priority, one process at a time. Without
MARKER it does the same in the foreground, for this install's marker: a benchmark runs it before it starts servers,
so that they time numba's kernels."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import threading
from pathlib import Path

import torch

from . import _jit, models
from .generate import generate


def compile_kinds(path: Path, kinds=_jit.KINDS) -> None:
    """Compile the kernels of each kind of call not yet listed in the marker at `path`, listing each when done
    (after another process's compiler, if one runs: a lock beside the marker)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = list(json.loads(path.read_text())) if path.exists() else []
        if all(list(kind) in done for kind in kinds):
            return
        torch.set_num_threads(1)
        model, tok, _ = models.load(models.default_model_path())
        g = torch.Generator().manual_seed(0)
        for kind in kinds:
            if list(kind) not in done:
                _serve(model, tok, g) if kind == _jit.SERVED else _call(model, kind, g)
                done.append(list(kind))
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(done))
                tmp.replace(path)


def _serve(model, tok, g: torch.Generator) -> None:
    """`lookahead serve`'s loop with numba's kernels (it runs in the context that made it) over rows of chains, trees
    and sampling joined into one batch."""
    from .serve.engine import Engine
    from .serve.row import Drafting, Row, Sampling

    with _jit.compiled():
        engine = Engine(model).start()
    done = threading.Semaphore(0)
    rows = [Row(torch.randint(3, 500, (40,), generator=g).numpy(), 16, (), sampling, drafting, tok,
                emit=lambda event: event[0] == "done" and done.release())
            for sampling, drafting in [(Sampling(), Drafting()), (Sampling(), Drafting(lookup="suffix", draft="tree")),
                                       (Sampling(0.8, seed=0), Drafting())]]
    try:
        for row in rows:
            row.prompt[20:36] = row.prompt[2:18]  # something to copy
            engine.submit(row)
        for _ in rows:
            done.acquire()
    finally:
        engine.stop()


def _call(model, kind: tuple, g: torch.Generator) -> None:
    """One short call of `kind` (lookup, draft, rows, cache, decoding) with numba's kernels."""
    lookup, draft, rows, cache, decoding = kind
    ids = torch.randint(3, 500, (rows, 48), generator=g)
    ids[:, 24:40] = ids[:, 4:20]  # something to copy
    mask = torch.ones_like(ids)
    mask[1:, :3] = 0  # a left-padded batch
    options = {"cache_implementation": "static"} if cache == "static" else {}
    with _jit.compiled():
        generate(model, ids, attention_mask=mask, lookup=lookup, draft=draft, max_new_tokens=24,
                 do_sample=decoding == "sample", **options)


if __name__ == "__main__":  # python -m lookahead._warm [MARKER]: without MARKER, in the foreground (benchmarks)
    if len(sys.argv) == 1:
        compile_kinds(_jit.marker())
        sys.exit(0)
    with contextlib.suppress(AttributeError, OSError):
        os.nice(19)
    try:
        compile_kinds(Path(sys.argv[1]))
    finally:  # the cache folder `_jit` made for it (its cost curves, measured beside a user's call)
        scratch = Path(os.environ.get("XDG_CACHE_HOME", ""))
        if scratch.name.startswith(_jit.SCRATCH):
            shutil.rmtree(scratch, ignore_errors=True)
