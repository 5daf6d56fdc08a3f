"""Traces from JSONL files and tokenizers to read them with.

A trace is ``(prompt_ids, output_ids)``: a prompt and the output a model actually produced for it. One JSON object
per line, with the prompt under ``prompt`` (or ``prompt_ids``) and the output under ``output`` (or ``output_ids``,
``completion``); each is text (tokenized with the tokenizer given) or a list of token ids::

    {"prompt": "def f(x):\\n    return x\\n# rename f to g\\n", "output": "def g(x):\\n    return x\\n"}
    {"prompt_ids": [15, 7, 99], "output_ids": [7, 99, 4]}

Bad lines (not JSON, a field missing, a token id outside the vocabulary, an empty output) are reported as one-line
errors naming the file and line, and skipped; the other lines are read.
"""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from .._checks import json_object

PROMPT_FIELDS = ("prompt", "prompt_ids")
OUTPUT_FIELDS = ("output", "output_ids", "completion")
_INT32_MAX = np.iinfo(np.int32).max


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255: needs no download, so traces can be built on any machine."""

    name = "bytes (UTF-8; no --tokenizer given)"
    vocab_size = 256

    def encode(self, text: str) -> list:
        return list(text.encode("utf-8"))


class _Wrapped:
    """A tokenizers/transformers tokenizer seen as ``encode(text) -> ids`` and ``vocab_size``."""

    def __init__(self, encode, vocab_size: int, name: str):
        self.encode, self.vocab_size, self.name = encode, vocab_size, name


def load_tokenizer(spec: str | None):
    """A tokenizer with ``encode(text) -> list of ids``, ``vocab_size`` and ``name``.

    Args:
        spec: None (UTF-8 bytes), a folder with ``vocab.json`` + ``merges.txt`` (byte-level BPE, e.g. GPT-2's), a
            ``tokenizer.json`` file, or a local folder or hub id that ``transformers.AutoTokenizer`` loads.
    Raises:
        ValueError: the tokenizer cannot be loaded (the message says why).

    Example:
        >>> load_tokenizer(None).encode("hi")
        [104, 105]
    """
    if spec is None:
        return ByteTokenizer()
    path = Path(spec)
    if not path.exists() and (spec.startswith((".", "/", "~")) or spec.count("/") > 1):
        raise ValueError(f"cannot load tokenizer {spec!r}: no such file or folder")
    try:
        if path.is_dir() and (path / "vocab.json").exists() and (path / "merges.txt").exists():
            from tokenizers import ByteLevelBPETokenizer

            tok = ByteLevelBPETokenizer(str(path / "vocab.json"), str(path / "merges.txt"))
            return _Wrapped(lambda text: tok.encode(text).ids, tok.get_vocab_size(), f"byte-level BPE {spec}")
        if path.is_file():
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(path))
            return _Wrapped(lambda text: tok.encode(text, add_special_tokens=False).ids, tok.get_vocab_size(), spec)
        from transformers import AutoTokenizer

        return wrap_tokenizer(AutoTokenizer.from_pretrained(spec), spec)
    except Exception as error:  # noqa: BLE001 - any loader failure becomes one line for the user
        raise ValueError(f"cannot load tokenizer {spec!r}: {str(error).splitlines()[0] if str(error) else error!r}")


def wrap_tokenizer(tokenizer, name: str):
    """A transformers tokenizer as ``encode(text) -> ids`` (no special tokens added), ``vocab_size``, ``name``."""
    return _Wrapped(lambda text: tokenizer.encode(text, add_special_tokens=False), len(tokenizer), name)


def read_traces(path, tokenizer=None) -> tuple[list, list]:
    """Read one JSONL (or .jsonl.gz) file of traces.

    Args:
        path: the file.
        tokenizer: from ``load_tokenizer``; encodes text fields and bounds token ids (default: UTF-8 bytes for
            text, ids up to 2**31 - 1).
    Returns:
        ``(traces, errors)``: ``(prompt_ids, output_ids)`` int64 arrays for every good line, and one message
        ``"FILE:LINE: what is wrong"`` per bad line (``"FILE: ..."`` when the file cannot be read).

    Example::

        traces, errors = read_traces("traces.jsonl", load_tokenizer("../shared/data/tokenizers/gpt2"))
    """
    limit = tokenizer.vocab_size if tokenizer is not None else _INT32_MAX + 1
    tokenizer = tokenizer or ByteTokenizer()
    traces, errors = [], []
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    traces.append(parse_line(line, tokenizer, limit))
                except ValueError as error:
                    errors.append(f"{path}:{number}: {error}")
    except (OSError, UnicodeDecodeError, EOFError) as error:
        errors.append(f"{path}: cannot read: {error}")
    return traces, errors


def parse_line(line: str, tokenizer, id_limit: int) -> tuple[np.ndarray, np.ndarray]:
    """One JSONL line as ``(prompt_ids, output_ids)``, ids in [0, id_limit); ValueError saying what is wrong."""
    row = json_object(line)
    prompt = _ids(row, PROMPT_FIELDS, tokenizer, id_limit)
    output = _ids(row, OUTPUT_FIELDS, tokenizer, id_limit)
    if len(output) == 0:
        raise ValueError("empty output: nothing to measure")
    return prompt, output


def _ids(row: dict, fields: tuple, tokenizer, limit: int) -> np.ndarray:
    name = next((f for f in fields if f in row), None)
    if name is None:
        raise ValueError(f"missing field {fields[0]!r} (expected one of {', '.join(map(repr, fields))}: text or a "
                         f"list of token ids)")
    value = row[name]
    if isinstance(value, str):
        return np.asarray(tokenizer.encode(value), dtype=np.int64)
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise ValueError(f"field {name!r} must be text or a list of integer token ids, got {_kind(value)}")
    ids = np.asarray(value, dtype=np.int64)
    bad = ids[(ids < 0) | (ids >= limit)]
    if len(bad):
        raise ValueError(f"token id {int(bad[0])} in {name!r} is outside the tokenizer's vocabulary "
                         f"[0, {limit})")
    return ids


def _kind(value) -> str:
    if isinstance(value, list):
        odd = next(v for v in value if not isinstance(v, int) or isinstance(v, bool))
        return f"a list holding {type(odd).__name__} {odd!r}"
    return type(value).__name__
