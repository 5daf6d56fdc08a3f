"""Two tiers for lookahead's numba kernels, so that a fresh install's first call does not wait for the compiler.

Compiling the kernels a default call needs takes numba 10-20 s on a 2-core CPU, once per machine (then they load
from numba's cache in well under a second). Every kernel is plain Python that numba compiles, so until numba's cache
holds them a call runs their Python source as it is (a *twin*: the same function over the same arrays; the drafts,
the accepted tokens and the output are the same, only the host's part of a step is slower), while a background
process compiles them at low priority on the CPU the call leaves free (`python -m lookahead.warm`). That process
belongs to the program that started it and ends with it (what it compiled so far stays in numba's cache, kernel by
kernel); `lookahead warm` compiles everything ahead, in the foreground, for images and CI. When the kernels of a
kind of call are compiled their kind goes into a marker file beside numba's cache, and the next call of that kind
in any process runs compiled. Deleting numba's cache (or a new `NUMBA_CACHE_DIR`, a changed kernel file, another
numba) leaves no marker, so the tiers always follow the cache. ``LOOKAHEAD_COMPILE=now`` (an environment variable,
`setting`; default ``background``) starts no process: a call compiles the kernels it needs in its own process and
waits for them, as numba does on its own.

Callers bind a module's kernels once per function call with `kernels(module)` (``kern = kernels(_kernels)``, then
``kern.step(...)``: the module itself, or its twins); `tier(kind)` wraps a call and decides for everything inside
it. Outside a call, and in processes that asked for it (`compiled`), the kernels are numba's. An index's `propose` and
`extend`, a few microseconds each, call their kernel's compiled entry (`entry`), which skips numba's typing of every
argument at every call.
"""
from __future__ import annotations

import atexit
import contextlib
import contextvars
import functools
import hashlib
import importlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

# the kinds of call the background process compiles, most common first: (lookup, draft, rows, cache, decoding);
# SERVED: `lookahead serve`'s loop (rows of chains, trees and sampling joined into one batch)
SERVED = ("ngram", "chain", 2, "dynamic", "served")
KINDS = (("ngram", "chain", 1, "dynamic", "greedy"), SERVED, ("ngram", "chain", 2, "dynamic", "greedy"),
         ("suffix", "tree", 1, "dynamic", "greedy"), ("suffix", "chain", 1, "dynamic", "greedy"),
         ("suffix", "tree", 2, "dynamic", "greedy"), ("suffix+recycle", "tree", 1, "dynamic", "greedy"),
         ("suffix+recycle", "tree", 2, "dynamic", "greedy"), ("recycle", "tree", 1, "dynamic", "greedy"),
         ("ngram", "chain", 1, "dynamic", "sample"), ("ngram", "chain", 1, "static", "greedy"),
         ("suffix", "tree", 1, "static", "greedy"),
         ("ngram", "chain", 2, "static", "greedy"))  # a static batch: `generate`'s default on CUDA
SCRATCH = "lookahead-jit-"  # the prefix of the background compiler's own cache folder
_TWINS: contextvars.ContextVar = contextvars.ContextVar("lookahead_twins", default=None)  # None: numba's kernels
_COMPILED: contextvars.ContextVar = contextvars.ContextVar("lookahead_compiled", default=False)
# the modules of kernels that callers bind with `kernels` (the kernels they call are found from these)
KERNEL_MODULES = ("lookahead.index._kernels", "lookahead.index._suffix_build", "lookahead.index._suffix_draft",
                  "lookahead.index._recycle_kernels", "lookahead.decode._fused_kernels",
                  "lookahead.decode._fused_recycle", "lookahead.decode._policy_kernels", "lookahead.verify._kernels",
                  "lookahead.model._kernels")
_STARTED: list = []  # the background process this process started, if any
_WANTED: list = []  # a call ran the twins because its kernels were not compiled: start the background compiler


def kernels(module: types.ModuleType):
    """The kernels of `module` for the call running here: the module itself (numba's kernels), or a namespace of
    their Python twins inside a call that `tier` gave the twins. Bound once per function call (``k =
    kernels(_kernels)``, then ``k.step(...)``), never read per access: a step calls it a few times, not per kernel."""
    twins = _TWINS.get()
    if twins is None:
        return module
    if _WANTED and not _STARTED:  # at the first kernel a call needs: after what it timed (`calibrate`)
        _start_background()
    return twins[module.__name__]


def entry(kernel, key, args: tuple):
    """The compiled entry point of numba kernel `kernel` for arguments typed as `args` are, found once per process
    for `key`, so that a call through it skips numba's typing of every argument at every call (a `SuffixIndex`'s
    13 arrays in two tuples: 1.2 us of a call, 0.56 through its entry). The caller's `key` must tell apart every
    typing its calls can have (None where they have one): an entry takes only what it was resolved for, unchecked,
    so callers pass arrays they made themselves, of one dtype, layout and rank. A Python twin (`kernels` inside a
    call that runs the twins) is returned as it is.

    Example: ``entry(kern.suffix_chain, None, args)(*args)``."""
    found = _ENTRIES.get((kernel, key))
    if found is not None:
        return found
    if not hasattr(kernel, "overloads"):  # a Python twin, or numba off
        return kernel
    found = _ENTRIES[kernel, key] = kernel.compile(tuple(kernel.typeof_pyval(arg) for arg in args))
    return found


_ENTRIES: dict = {}  # (numba kernel, the caller's key) -> its compiled entry point (`entry`)


def interpreted() -> bool:
    """Whether the call running here uses the Python twins (its callers then pass plain lists, not typed ones)."""
    return _TWINS.get() is not None


def kind_of(lookup: str, draft: str, rows: int, static: bool, sampling: bool) -> tuple:
    """A call's kind, as `KINDS` names them."""
    return lookup, draft, 1 if rows == 1 else 2, "static" if static else "dynamic", "sample" if sampling else "greedy"


@contextlib.contextmanager
def tier(kind: tuple):
    """Run the block with numba's kernels when its kind is compiled (in numba's cache or this process), else with
    their Python twins, starting the background compiler if none runs. A block inside another keeps its tier."""
    if _TWINS.get() is not None or _COMPILED.get() or kind in _ready(kind) or not _compiling():
        yield
        return
    _WANTED.append(kind)
    with interpreted_kernels():
        yield


@contextlib.contextmanager
def compiled():
    """Run the block with numba's kernels, compiling what is not cached (as before the tiers; the test suite, the
    background compiler and timings that must not see the twins)."""
    token = _COMPILED.set(True)
    try:
        yield
    finally:
        _COMPILED.reset(token)


@contextlib.contextmanager
def interpreted_kernels():
    """Run the block with the Python twins whatever is compiled (tests compare the tiers with it)."""
    token = _TWINS.set(twins())
    try:
        with np.errstate(over="ignore"):  # numba's integers wrap silently; numpy's say so (the hashes wrap)
            yield
    finally:
        _TWINS.reset(token)


@functools.cache
def twins() -> dict:
    """module name -> a namespace of the module's names, each numba kernel replaced by its Python source bound to
    the twin namespaces (so a kernel calling another calls its twin, never the compiler); for `KERNEL_MODULES` and
    every kernel module they reach."""
    modules = _kernel_modules()
    scopes = {name: {} for name in modules}  # each twin function's globals
    made = {}  # id(kernel) -> its twin
    for name, module in modules.items():
        for value in vars(module).values():
            if _is_kernel(value) and value.py_func.__module__ == name:
                f = value.py_func
                made[id(value)] = types.FunctionType(f.__code__, scopes[name], f.__name__, f.__defaults__,
                                                     f.__closure__)
    spaces = {name: types.SimpleNamespace() for name in modules}
    by_module = {id(module): spaces[name] for name, module in modules.items()}
    for name, module in modules.items():
        scope = {k: made.get(id(v), by_module.get(id(v), v)) for k, v in vars(module).items()}
        scope.update(_OVERRIDES.get(name, {}))
        scopes[name].update(scope)
        vars(spaces[name]).update(scope)
    return spaces


def _is_kernel(value) -> bool:
    from numba.core.dispatcher import Dispatcher

    return isinstance(value, Dispatcher)


def _kernel_modules() -> dict:
    """name -> module: `KERNEL_MODULES`, and every module holding kernels that one of them names (a kernel module
    imported whole, or a kernel imported by name)."""
    found, todo = {}, [importlib.import_module(name) for name in KERNEL_MODULES]
    while todo:
        module = todo.pop()
        if module.__name__ in found:
            continue
        found[module.__name__] = module
        for value in vars(module).values():
            if _is_kernel(value):
                todo.append(sys.modules[value.py_func.__module__])
            elif isinstance(value, types.ModuleType) and any(map(_is_kernel, vars(value).values())):
                todo.append(value)
    return found


def _kept(items, keep):
    """`_fused_kernels.kept` on a plain list (numba's typed list needs the compiler)."""
    return [item for item, k in zip(items, keep) if k]


_OVERRIDES = {"lookahead.decode._fused_kernels": {"kept": _kept}}


@functools.cache
def marker() -> Path:
    """The file beside numba's cache of the kernels that lists the kinds of call it holds compiled; its name hashes
    what that cache depends on (numba, Python, the package's files: their sizes and modification times)."""
    import numba

    package = Path(__file__).resolve().parents[1]
    files = [[str(f.relative_to(package)), f.stat().st_size, f.stat().st_mtime_ns]
             for f in sorted(package.rglob("*.py"))]
    key = hashlib.sha256(json.dumps([numba.__version__, sys.version, sys.executable, files]).encode()).hexdigest()
    kernel = next(v for m in _kernel_modules().values() for v in vars(m).values() if _is_kernel(v))
    return Path(kernel._cache._cache_path) / f"lookahead-kernels-{key[:16]}.json"


_KNOWN: set = set()  # kinds read from the marker (kept: a kind once compiled stays so)


def _ready(kind: tuple | None = None) -> set:
    """The kinds of call whose kernels numba's cache holds, by the marker (read again while `kind`, or one of
    `KINDS`, is not listed: the background compiler lists a kind outside them too once a call waited for it)."""
    if len(_KNOWN) < len(KINDS) or (kind is not None and kind not in _KNOWN):
        try:
            _KNOWN.update(tuple(k) for k in json.loads(marker().read_text()))
        except (OSError, ValueError, TypeError):
            pass
    return _KNOWN


def setting() -> str:
    """Where kernels that numba's cache does not hold yet compile, as the environment variable LOOKAHEAD_COMPILE
    says: "background" (the default: in a process of their own while calls run the twins) or "now" (in the calling
    process, which waits for them, as numba does on its own).

    Raises:
        ValueError: LOOKAHEAD_COMPILE is set to something else.
    """
    value = os.environ.get("LOOKAHEAD_COMPILE", "background")
    if value not in ("background", "now"):
        raise ValueError(f"LOOKAHEAD_COMPILE must be 'background' (compile the kernels in a background process while "
                         f"calls run them as Python) or 'now' (compile them in the calling process), not {value!r}")
    return value


def _compiling() -> bool:
    """Whether a background compiler runs or is yet to start; False where none can run (not POSIX, no process), where
    the user asked for none (`setting`: "now"), or once this process's has ended (a kind it does not compile, or a
    cache it could not write: the call compiles)."""
    if setting() == "now":
        return False
    if not _STARTED:
        return os.name == "posix"
    return _STARTED[0] is not None and _STARTED[0].poll() is None


def _start_background() -> None:
    """Start the background compiler once per process, to end when this process ends (where another process runs
    one, it waits for it and then finds nothing left to compile)."""
    if _STARTED:
        return
    # its timings stay its own (a folder it removes when done)
    env = dict(os.environ, XDG_CACHE_HOME=tempfile.mkdtemp(prefix=SCRATCH))
    try:
        _STARTED.append(subprocess.Popen([sys.executable, "-m", "lookahead.warm", "--marker", str(marker()),
                                          "--parent", str(os.getpid()), "--first", json.dumps(_WANTED)], env=env,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL))
        # the same session as this process: Linux shares the CPU fairly between sessions (autogroups) before niceness
        # counts, so a compiler in a session of its own took a core from this one and made its torch threads wait
        # for each other (SmolLM2's one-token forward 0.9 s instead of 55 ms beside it)
    except OSError as error:  # no compiler in the background: the twins run until a call compiles in its process
        _STARTED.append(None)
        logger.info("lookahead: cannot start the kernel compiler: %s", error)
    else:
        atexit.register(_STARTED[0].terminate)  # it also ends by itself when this process is gone (`warm._follow`)
        logger.warning("lookahead: numba is compiling the kernels in the background while this program runs (once "
                       "per machine, a minute or two; `lookahead warm` does it ahead); calls run them as Python "
                       "meanwhile, with the same tokens")
