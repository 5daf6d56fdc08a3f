"""Draft indexes: incremental structures over token ids that propose continuations."""
from .draft import Draft
from .ngram import NgramIndex
from .suffix import SuffixIndex

__all__ = ["Draft", "NgramIndex", "SuffixIndex"]
