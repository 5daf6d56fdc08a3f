"""argparse ``type=`` validators shared by `lookahead bench` and the scripts in benchmarks/: a bad value is argparse's
one-line error and exit status 2, never a traceback.

Example::

    parser.add_argument("--budget", type=positive_int, default=10)
    parser.add_argument("--cost-tokens", type=int_at_least(2), default=11)
"""
from __future__ import annotations

import argparse
from typing import Callable

from .methods import method_name

__all__ = ["cost_ratio", "int_at_least", "method_name", "positive_int"]


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


def cost_ratio(text: str) -> float:
    """A forward-cost ratio: a number >= 1 (a bigger forward never costs less than a one-token one)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 1 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}")
    return value
