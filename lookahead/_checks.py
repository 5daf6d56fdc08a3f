"""Checks of scalar arguments shared by the indexes, `Memory` and the public API (imports neither torch nor
transformers). Each error names the argument; a wrong type is a TypeError, a value out of range a ValueError.

Example:
    >>> check_int("max_ngram", 4, 1, 64)
    4
    >>> check_int("max_tokens", 2.5, 0)
    Traceback (most recent call last):
    TypeError: max_tokens must be an int, got float (2.5)
"""
from __future__ import annotations

import json
import numbers

import numpy as np

LOOKUPS = ("ngram", "suffix", "recycle", "suffix+recycle", "none")
TREE_LOOKUPS = ("suffix", "recycle", "suffix+recycle")  # the lookups whose indexes propose trees
DRAFTS = ("chain", "tree")


def check_int(name: str, value, low: int, high: int | None = None) -> int:
    """Return `value` as a Python int if it is an integer in [low, high] (no upper limit when high is None).

    Python and numpy integers are accepted; bools, floats (even 2.0) and strings are not.

    Raises:
        TypeError: not an integer, naming the argument and the type that came.
        ValueError: below low or above high, naming the argument, the limit and the value.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    value = int(value)
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")
    return value


def check_float(name: str, value, low: float, high: float | None = None, low_open: bool = False) -> float:
    """Return `value` as a float if it is a real number in [low, high] ((low, high] when low_open).

    Raises:
        TypeError: not a real number (a bool, a string, None), naming the argument and the type that came.
        ValueError: out of range (or NaN), naming the argument, the limit and the value.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} ({value!r})")
    value = float(value)
    if not (value > low if low_open else value >= low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low:g}, got {value:g}")
    if high is not None and not value <= high:
        raise ValueError(f"{name} must be <= {high:g}, got {value:g}")
    return value


def check_lookup(lookup: str) -> str:
    if lookup not in LOOKUPS:
        raise ValueError(f"lookup must be one of {', '.join(map(repr, LOOKUPS))}, got {lookup!r}")
    return lookup


def json_object(text: str) -> dict:
    """One JSONL line as a dict; ValueError saying what is wrong ("not JSON (...)", "expected a JSON object ...")."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    return row
