"""Compiling lookahead's numba kernels ahead of the calls that need them (`lookahead.runtime.jit`).

``lookahead warm`` (`warm`) compiles the kernels of every kind of call in `jit.KINDS` into numba's cache in the
foreground, with a progress bar: run it once when building an image or a CI cache, and no call ever runs the
kernels' Python twins. Without it a call whose kernels are not compiled starts ``python -m lookahead.warm --marker
MARKER --parent PID`` in the background: the same work at the lowest CPU priority, ending when the program that
started it ends (kernels compiled so far stay in numba's cache). Each kind is one short call on the bundled model,
the kinds the program's calls wait for first, then the most common; each is listed in the marker file as soon as it
is compiled; one compiler at a time (a lock).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import torch

from . import models
from ._checks import DRAFTS, LOOKUPS, TREE_LOOKUPS
from .decode import _warm_up
from .runtime import jit as _jit
from .generate import generate


def warm(kinds=_jit.KINDS, progress: bool = True) -> list:
    """Compile the kernels of `kinds` (default: every kind of call) into numba's cache now, in this process, and
    list them in this install's marker: later calls of those kinds never run the Python twins. Returns the kinds
    compiled now (those already compiled are skipped).

    Example:
        >>> import lookahead.warm
        >>> lookahead.warm.warm()  # once per machine; `lookahead warm` from a shell
    """
    return compile_kinds(_jit.marker(), kinds, progress)


def compile_kinds(path: Path, kinds=_jit.KINDS, progress: bool = False) -> list:
    """Compile the kernels of each kind of call not yet listed in the marker at `path`, listing each when done
    (after another process's compiler, if one runs: a lock beside the marker); the kinds compiled."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = list(json.loads(path.read_text())) if path.exists() else []
        todo = [kind for kind in kinds if list(kind) not in done]
        if not todo:
            return []
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the calls are short: one thread leaves the rest of the machine alone
        try:
            _compile(path, todo, done, progress)
        finally:  # `warm()` runs in the caller's process: its threads come back
            torch.set_num_threads(threads)
        return todo


def _compile(path: Path, todo: list, done: list, progress: bool) -> None:
    """One short call of each kind in `todo` on the bundled model, listing each in the marker at `path` when done."""
    from tqdm.auto import tqdm

    model, tok, _ = models.load(models.default_model_path())
    g = torch.Generator().manual_seed(0)
    with tqdm(total=len(todo), desc="lookahead: compiling kernels", unit="kind", disable=not progress) as bar:
        for kind in todo:
            bar.set_postfix_str(" ".join(map(str, kind)))
            _warm_up.kind(*kind)  # every kernel signature a call of the kind uses (the one warm-up)
            _serve(model, tok, g) if kind == _jit.SERVED else _call(model, kind, g)
            done.append(list(kind))
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(done))
            tmp.replace(path)
            bar.update()


def _serve(model, tok, g: torch.Generator) -> None:
    """`lookahead serve`'s loop with numba's kernels (it runs in the context that made it) over rows of chains, trees,
    sampling and recycled predictions joined into one batch."""
    from .serve.engine import Engine
    from .serve.row import Drafting, Row, Sampling

    with _jit.compiled():
        engine = Engine(model).start()
    done = threading.Semaphore(0)
    rows = [Row(torch.randint(3, 500, (40,), generator=g).numpy(), 16, (), sampling, drafting, tok,
                emit=lambda event: event[0] == "done" and done.release())
            for sampling, drafting in [(Sampling(), Drafting()), (Sampling(), Drafting(lookup="suffix", draft="tree")),
                                       (Sampling(0.8, seed=0), Drafting()),
                                       (Sampling(), Drafting(lookup="suffix+recycle", draft="tree"))]]
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


def ordered(first: list) -> list:
    """`jit.KINDS`, with the kinds in `first` (lists, as JSON gives them: the kinds a program's calls waited for,
    whether or not they are in `KINDS`, such as a static batch of recycled trees) before the others; what names no
    kind of call is dropped."""
    first = [tuple(kind) for kind in first if _is_kind(kind)]
    return list(dict.fromkeys(first)) + [kind for kind in _jit.KINDS if kind not in first]


def _is_kind(kind) -> bool:
    """Whether `kind` names a kind of call (`jit.kind_of`) or the server's loop (`jit.SERVED`)."""
    if not isinstance(kind, (list, tuple)) or len(kind) != 5:
        return False
    if tuple(kind) == _jit.SERVED:
        return True
    lookup, draft, rows, cache, decoding = kind
    return (lookup in LOOKUPS and lookup != "none" and draft in DRAFTS and (draft == "chain" or lookup in TREE_LOOKUPS)
            and rows in (1, 2) and cache in ("dynamic", "static") and decoding in ("greedy", "sample"))


def _follow(parent: int) -> None:
    """End this process (SIGTERM: the scratch folder is removed) once `parent` has ended (it is then re-parented)."""
    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    threading.Thread(target=watch, daemon=True).start()


def main(argv=None) -> int:
    """``python -m lookahead.warm``: in the foreground, or as the background compiler a call started."""
    parser = argparse.ArgumentParser(prog="python -m lookahead.warm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--marker", help="the marker file to list compiled kinds in (the background compiler)")
    parser.add_argument("--parent", type=int, help="end when this process ends (the background compiler)")
    parser.add_argument("--first", type=json.loads, default=[],
                        help="the kinds to compile first, as JSON (the background compiler: the calls waiting for them)")
    args = parser.parse_args(argv)
    if args.marker is None:
        warm()
        return 0
    if args.parent is not None:
        _follow(args.parent)
    with contextlib.suppress(AttributeError, OSError):
        os.nice(19)
    with contextlib.suppress(AttributeError, OSError):  # Linux: the CPU only when nothing else wants it
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    try:
        compile_kinds(Path(args.marker), ordered(args.first))
    finally:  # the cache folder `jit` made for it (its cost curves, measured beside a user's call)
        scratch = Path(os.environ.get("XDG_CACHE_HOME", ""))
        if scratch.name.startswith(_jit.SCRATCH):
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
