"""The job's files: input lines checked and tokenized one by one (a bad line is reported, never fatal), and the ids an
earlier run already wrote to the output (what a rerun skips)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._checks import json_object

SOURCES = ("prompt", "messages", "input_ids")


class BadLine(ValueError):
    """One input line that cannot be generated for; the message is the one-line reason."""


@dataclass
class Line:
    """One input line, ready to generate for."""

    id: object  # as given, or the line number
    number: int  # 1-based line number in the input file
    input_ids: np.ndarray  # [L] int64
    documents: list | None = None  # token id arrays, or None

    @property
    def key(self) -> str:
        """What resume compares: the id as JSON (so 3 and "3" differ)."""
        return json.dumps(self.id)

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "number": self.number, "input_ids": self.input_ids.tolist(),
                           "documents": None if self.documents is None else [d.tolist() for d in self.documents]})

    @classmethod
    def from_json(cls, text: str) -> "Line":
        row = json.loads(text)
        docs = row["documents"]
        return cls(row["id"], row["number"], np.asarray(row["input_ids"], np.int64),
                   None if docs is None else [np.asarray(d, np.int64) for d in docs])


@dataclass
class Model:
    """What the driver needs to know of the model to check lines: its tokenizer and limits."""

    tokenizer: object
    vocab_size: int
    max_positions: int | None  # None: no limit known
    max_new_tokens: int


def read_input(path, model: Model, done: set) -> tuple[list, list, int]:
    """(lines to generate, [(line number, reason)] of bad lines, number of lines skipped as already done).

    Raises:
        ValueError: the file cannot be read.
    """
    lines, bad, skipped, first_seen = [], [], 0, {}
    try:
        with open(path, encoding="utf-8") as f:
            for number, text in enumerate(f, start=1):
                if not text.strip():
                    continue  # blank lines (a trailing newline, spacing) are not lines
                try:
                    line = parse_line(text, number, model, first_seen)
                except BadLine as reason:
                    bad.append((number, str(reason)))
                    continue
                if line.key in done:
                    skipped += 1
                else:
                    lines.append(line)
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error.strerror if isinstance(error, OSError) else error}") from None
    return lines, bad, skipped


def parse_line(text: str, number: int, model: Model, first_seen: dict) -> Line:
    """The `Line` of one input line; `first_seen` maps the ids met so far to their line numbers (updated).

    Raises:
        BadLine: not a JSON object, a bad or repeated id, no prompt or more than one, a prompt that is empty or too
            long for the model, ids outside the vocabulary, malformed documents.
    """
    try:
        row = json_object(text)
    except ValueError as error:
        raise BadLine(str(error)) from None
    line_id = row.get("id", number)
    if isinstance(line_id, bool) or not isinstance(line_id, (str, int)):
        raise BadLine(f'"id" must be a string or an integer, got {json.dumps(line_id)}')
    key = json.dumps(line_id)
    if key in first_seen:
        raise BadLine(f"id {key} was already used on line {first_seen[key]}")
    first_seen[key] = number
    ids = _prompt_ids(row, model)
    if model.max_positions is not None and len(ids) + model.max_new_tokens > model.max_positions:
        raise BadLine(f"prompt of {len(ids)} tokens + max_new_tokens={model.max_new_tokens} exceeds the model's "
                      f"limit of {model.max_positions} positions")
    docs = _documents(row["documents"], model) if row.get("documents") is not None else None
    return Line(line_id, number, ids, docs)


def _prompt_ids(row: dict, model: Model) -> np.ndarray:
    given = [name for name in SOURCES if name in row]
    if len(given) != 1:
        found = f"got {' and '.join(given)}" if given else "found none"
        raise BadLine(f'expected one of "prompt", "messages", "input_ids"; {found}')
    value = row[given[0]]
    if given[0] == "prompt":
        if not isinstance(value, str):
            raise BadLine(f'"prompt" must be a string, got {type(value).__name__}')
        ids = model.tokenizer(value)["input_ids"]
    elif given[0] == "messages":
        ids = _chat_ids(value, model.tokenizer)
    else:
        ids = _token_ids("input_ids", value, model.vocab_size)
    if len(ids) == 0:
        raise BadLine(f'the {given[0]} is empty (no tokens)')
    if max(ids) >= model.vocab_size:  # a tokenizer larger than the model's embedding
        raise BadLine(f"the tokenizer gave id {max(ids)}, outside the model's vocabulary [0, {model.vocab_size})")
    return np.asarray(ids, np.int64)


def _chat_ids(messages, tokenizer) -> list:
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise BadLine('"messages" must be a list of {"role": ..., "content": ...} objects')
    if not getattr(tokenizer, "chat_template", None):
        raise BadLine('"messages" needs a tokenizer with a chat template and this one has none; use "prompt"')
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as error:  # jinja raises its own errors from inside the model's template
        raise BadLine(f"the chat template failed on these messages: {str(error).splitlines()[0]}") from None
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _token_ids(name: str, value, vocab_size: int) -> list:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise BadLine(f'"{name}" must be a list of integers')
    if value and (min(value) < 0 or max(value) >= vocab_size):
        raise BadLine(f'"{name}" must lie in [0, {vocab_size}) (the model\'s vocabulary), got ids from '
                      f'{min(value)} to {max(value)}')
    return value


def _documents(docs, model: Model) -> list:
    if not isinstance(docs, list):
        raise BadLine(f'"documents" must be a list of strings or of token id lists, got {type(docs).__name__}')
    out = []
    for doc in docs:
        if isinstance(doc, str):
            out.append(np.asarray(model.tokenizer(doc, add_special_tokens=False)["input_ids"], np.int64))
        else:
            out.append(np.asarray(_token_ids("documents", doc, model.vocab_size), np.int64))
    return out


def done_ids(path) -> tuple[set, bool]:
    """(keys (`Line.key`) of the lines an earlier run wrote to `path`, whether a half-written last line was removed).

    Raises:
        ValueError: `path` exists but cannot be read or repaired.
    """
    path = Path(path)
    if not path.exists():
        return set(), False
    try:
        cut = _drop_partial_line(path)
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(text) for text in f if text.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot resume from {path}: {error}") from None
    return {json.dumps(row["id"]) for row in rows if isinstance(row, dict) and "id" in row}, cut


def _drop_partial_line(path: Path) -> bool:
    """Cut what follows the last newline (a job killed while writing leaves half a line); whether anything was cut."""
    with open(path, "rb+") as f:
        end = pos = f.seek(0, os.SEEK_END)
        while pos > 0:  # read back in chunks until a newline
            start = max(pos - (1 << 16), 0)
            f.seek(start)
            newline = f.read(pos - start).rfind(b"\n")
            if newline >= 0:
                pos = start + newline + 1
                break
            pos = start
        if pos < end:
            f.truncate(pos)
        return pos < end
