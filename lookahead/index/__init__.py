"""Draft indexes: incremental structures over token ids that propose continuations."""
from .ngram import NgramIndex
from .suffix import SuffixIndex

__all__ = ["NgramIndex", "SuffixIndex"]
