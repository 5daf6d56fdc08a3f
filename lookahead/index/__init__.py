"""Draft indexes: incremental structures over token ids that propose continuations."""
from .ngram import NgramIndex

__all__ = ["NgramIndex"]
