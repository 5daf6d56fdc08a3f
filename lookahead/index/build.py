"""The indexes a call drafts from, one per row: the memory's tokens as background, the row's documents, its prompt."""
from __future__ import annotations

from .ngram import DEFAULT_MAX_NGRAM, NgramIndex
from .recycle import RecycleIndex
from .suffix import SuffixIndex

LOOKUPS = ("ngram", "suffix")
RECYCLING = ("recycle", "suffix+recycle")  # lookups that draft from a `Recycled` shared by the call's rows


def new_index(lookup: str, max_ngram: int = DEFAULT_MAX_NGRAM, min_ngram: int = 1):
    """An empty index of the given kind: ``NgramIndex(max_ngram, min_ngram)`` or ``SuffixIndex()``.

    Raises:
        ValueError: lookup is neither "ngram" nor "suffix".
    """
    if lookup == "ngram":
        return NgramIndex(max_ngram, min_ngram)
    if lookup == "suffix":
        return SuffixIndex()
    raise ValueError(f"lookup must be one of {', '.join(map(repr, LOOKUPS))}, got {lookup!r}")


def row_indexes(lookup: str, max_ngram: int, min_ngram: int, sources: list, documents: list | None = None,
                memory=None, num_draft_tokens: int | None = None, recycled=None) -> list:
    """One index per row holding, in order, what `memory` holds (as background: a copy of the memory's own index,
    see `Memory.request_index`), the row's documents, then its source tokens.

    Args:
        lookup: "ngram", "suffix", "recycle", "suffix+recycle" (a `RecycleIndex` over `recycled`, with a suffix
            index for the latter), or "none" (no index).
        max_ngram, min_ngram: the n-gram index's settings.
        sources: per row, its token ids (prompt; for encoder-decoders the encoder input then the decoder prompt).
        documents: token-id arrays to draft from: one list for every row, or one list per row; when the rows
            were expanded (num_return_sequences), one list per original row, repeated for its copies.
        memory: a `lookahead.Memory`, or None.
        num_draft_tokens: 0 means plain decoding: no index.
        recycled: the call's `Recycled` (lookups of `RECYCLING`).

    Returns:
        a list with an index per row, or None per row when nothing is drafted (lookup "none", num_draft_tokens 0).

    Raises:
        ValueError: as many document lists as neither 1 nor the rows (nor a divisor of them), an unknown lookup, or a
            recycling lookup without `recycled`.

    Example:
        >>> [idx.propose(2).tolist() for idx in row_indexes("ngram", 4, 1, [[1, 2, 3, 1], [5, 6, 5]])]
        [[2, 3], [6, 5]]
    """
    if lookup == "none" or num_draft_tokens == 0:
        return [None] * len(sources)
    docs = documents or [[]]
    if 1 < len(docs) < len(sources) and len(sources) % len(docs) == 0:  # rows expanded by num_return_sequences
        docs = [d for d in docs for _ in range(len(sources) // len(docs))]
    if len(docs) not in (1, len(sources)):
        raise ValueError(f"documents must be one list for all rows or one list per row ({len(sources)}), "
                         f"got {len(docs)} lists")
    if lookup in RECYCLING and recycled is None:
        raise ValueError(f"lookup={lookup!r} needs the call's recycled predictions (recycled=)")
    indexes = []
    for i, source in enumerate(sources):
        index = _row_index(lookup, max_ngram, min_ngram, memory, recycled)
        for doc in docs[i % len(docs)]:
            index.extend(doc)
        index.extend(source)
        indexes.append(index)
    return indexes


def _row_index(lookup: str, max_ngram: int, min_ngram: int, memory, recycled):
    """One row's empty index (holding the memory's tokens, where there is a memory)."""
    if lookup == "recycle":
        return RecycleIndex(recycled)
    kind = "suffix" if lookup == "suffix+recycle" else lookup
    index = (memory.request_index(kind, max_ngram, min_ngram) if memory is not None
             else new_index(kind, max_ngram, min_ngram))
    return RecycleIndex(recycled, index) if lookup == "suffix+recycle" else index
