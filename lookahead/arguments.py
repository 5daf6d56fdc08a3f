"""argparse ``type=`` validators shared by the console script's commands (`lookahead generate`, `demo`, `bench`) and
the scripts in benchmarks/: a bad value gets argparse's one-line error and exit status 2, never a traceback.

Example::

    parser.add_argument("--batch-size", type=positive_int, default=8)
    parser.add_argument("--cost-tokens", type=int_at_least(2), default=11)
"""
from __future__ import annotations

import argparse
from typing import Callable

DTYPES = ("fp32", "bf16", "fp16")  # the --dtype names; `lookahead.models.DTYPES` maps them to torch dtypes


def int_at_least(low: int) -> Callable[[str], int]:
    """A validator of integers >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


positive_int = int_at_least(1)


def non_negative_int(text: str) -> int:
    """argparse type: an int >= 0."""
    return _number(text, int, lambda v: v >= 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    return _number(text, float, lambda v: 0 < v < float("inf"), "a number > 0")


def probability(text: str) -> float:
    """argparse type: a float in (0, 1]."""
    return _number(text, float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def draft_cost(text: str):
    """argparse type: 'auto', a number >= 0, or 'overhead,per_token' (a list, as JSON keeps it), as
    `lookahead.generate` takes them."""
    if text == "auto":
        return text
    try:
        numbers = [float(x) for x in text.split(",")]
    except ValueError:
        numbers = []
    if not 1 <= len(numbers) <= 2 or not all(0 <= x < float("inf") for x in numbers):
        raise argparse.ArgumentTypeError(f"expected auto, a number >= 0 or OVERHEAD,PER_TOKEN, got {text!r}")
    return numbers[0] if len(numbers) == 1 else numbers


def _number(text: str, kind, ok, expected: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value
