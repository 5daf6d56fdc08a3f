"""The per-row indexes of a generate call: memory as background, then the row's documents, then its prompt."""
from __future__ import annotations

from .ngram import NgramIndex
from .suffix import SuffixIndex


def row_indexes(lookup: str, max_ngram: int, min_ngram: int, sources: list, documents=None, memory=None) -> list:
    """One index per row holding the memory's tokens (as background), the row's documents, then its source tokens.

    Args:
        lookup: "ngram", "suffix" or "none" (no index: a list of None).
        max_ngram, min_ngram: the n-gram index's match lengths.
        sources: per row, the tokens it continues (its prompt without padding).
        documents: None, or document lists (arrays of ids): one list shared by all rows, or one per row (rows
            repeated by num_return_sequences share their input's list).
        memory: a `lookahead.Memory`, or None.

    Raises:
        ValueError: the number of document lists fits neither one for all rows nor one per row.
    """
    if lookup == "none":
        return [None] * len(sources)
    docs = documents or [[]]
    if 1 < len(docs) < len(sources) and len(sources) % len(docs) == 0:  # rows expanded by num_return_sequences
        docs = [d for d in docs for _ in range(len(sources) // len(docs))]
    if len(docs) not in (1, len(sources)):
        raise ValueError(f"documents must be one list for all rows or one list per row ({len(sources)}), "
                         f"got {len(docs)} lists")
    background = memory.documents()[0] if memory is not None and len(memory) else []
    indexes = []
    for i, source in enumerate(sources):
        index = NgramIndex(max_ngram, min_ngram) if lookup == "ngram" else SuffixIndex()
        for piece in background:
            index.extend(piece)
        if background and hasattr(index, "begin_request"):
            index.begin_request()
        for doc in docs[i % len(docs)]:
            index.extend(doc)
        index.extend(source)
        indexes.append(index)
    return indexes
