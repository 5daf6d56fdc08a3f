"""Draft indexes: incremental structures over token ids that propose continuations."""
from ._tokens import MAX_DRAFT
from .build import row_indexes
from .draft import Draft
from .ngram import NgramIndex
from .recycle import Recycled, RecycleIndex
from .suffix import SuffixIndex

__all__ = ["MAX_DRAFT", "Draft", "NgramIndex", "Recycled", "RecycleIndex", "SuffixIndex", "row_indexes"]
