"""argparse ``type=`` validators of `lookahead bench` and the scripts in benchmarks/ (the generic ones from
`lookahead.arguments`): a bad value is argparse's one-line error and exit status 2, never a traceback.

Example::

    parser.add_argument("--budget", type=positive_int, default=10)
    parser.add_argument("--cost-tokens", type=int_at_least(2), default=11)
"""
from __future__ import annotations

import argparse

from ..arguments import int_at_least, positive_int
from .methods import method_name

__all__ = ["cost_ratio", "int_at_least", "method_name", "positive_int"]


def cost_ratio(text: str) -> float:
    """A forward-cost ratio: a number >= 1 (a bigger forward never costs less than a one-token one)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 1 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}")
    return value
