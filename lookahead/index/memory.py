"""Memory across calls: the tenth request of an agent or a batch job can copy from the first nine."""
from __future__ import annotations

from collections import deque

import numpy as np

from .._checks import check_int
from ._tokens import as_token_array, range_error
from .build import new_index
from .ngram import DEFAULT_MAX_NGRAM
from .recycle import Recycled

_INT32_MAX = np.iinfo(np.int32).max
_MAX_INDEXES = 4  # index kinds and settings kept at once; the least recently used goes first


class Memory:
    """Earlier prompts and outputs, bounded in tokens; the oldest are evicted first.

    Pass the same object to every call: `generate(..., memory=mem)` drafts from what the memory holds (as if it
    were extra documents, but with `lookup="suffix"` a copy prefers the call's own documents and prompt) and adds
    the call's prompts and outputs to it afterwards.

    The memory is indexed once, not per call: it keeps an index over everything it holds for each kind of index
    asked of it (`request_index`), extended as tokens are added, and each request drafts from a copy of it. When
    more than ``max_tokens`` are held, the oldest pieces are evicted until at most 3/4 of ``max_tokens`` remain
    (the newest piece always stays): an eviction means indexing the rest again, and evicting a quarter at a time
    does that once per ``max_tokens / 4`` tokens added rather than on every call.

    With ``lookup="recycle"`` or ``"suffix+recycle"`` it also keeps what the target predicted after each token
    (`recycled`: a `Recycled` per model and vocabulary, a few MB each), so that later calls draft from a warm table.
    ``max_tokens=0`` keeps only that: no text. `save` and `load` write and read everything it holds.

    Args:
        max_tokens: most tokens held (>= 0).

    Raises:
        TypeError: max_tokens is not an int.
        ValueError: max_tokens < 0.

    Example:
        >>> mem = Memory(max_tokens=100_000)
        >>> for ids in requests:
        ...     out = generate(model, ids, lookup="suffix", memory=mem)
    """

    def __init__(self, max_tokens: int = 65536):
        self.max_tokens = check_int("max_tokens", max_tokens, 0)
        self._items: deque = deque()
        self._size, self._max_id = 0, -1
        self._indexes: dict = {}  # (lookup, settings...) -> an index over every piece held, in order
        self._recycled: dict = {}  # (model, vocabulary) -> its Recycled

    def __len__(self) -> int:
        """Tokens held."""
        return self._size

    def __repr__(self) -> str:
        return f"Memory(max_tokens={self.max_tokens}, held={self._size} tokens in {len(self._items)} pieces)"

    @property
    def max_token_id(self) -> int:
        """The largest token id held (-1 while empty): a model whose vocabulary does not reach it cannot use it."""
        return self._max_id

    def add_tokens(self, tokens) -> None:
        """Remember one sequence of token ids (its tail if it alone exceeds max_tokens).

        Args:
            tokens: a list, numpy array or 1-D tensor of token ids.

        Raises:
            TypeError: the ids are not integers.
            ValueError: not one-dimensional, or an id is negative or above 2**31 - 1 (nothing is added).
        """
        arr = as_token_array(tokens)
        if arr.size and (arr.min() < 0 or arr.max() > _INT32_MAX):
            raise range_error(arr)
        arr = np.array(arr[max(len(arr) - self.max_tokens, 0):], dtype=np.int64)  # a copy: the caller may reuse it
        if arr.size == 0 or self.max_tokens == 0:
            return
        self._items.append(arr)
        self._size += arr.size
        self._max_id = max(self._max_id, int(arr.max()))
        if self._size > self.max_tokens:
            self._evict()
        for index in self._indexes.values():
            index.extend(arr)

    def add(self, sequences, attention_mask, pad_token_id=None) -> None:
        """Remember each row of a `generate` result: its prompt (without padding) and its new tokens (up to the last
        one that is not `pad_token_id`).

        Args:
            sequences: [B, L + new] token ids (a tensor or an array); attention_mask: [B, L] of the prompts.
        """
        sequences, mask = _as_numpy(sequences), _as_numpy(attention_mask).astype(bool)
        prompt_len = mask.shape[1]
        for row, row_mask in zip(sequences, mask):
            new = row[prompt_len:]
            if pad_token_id is not None:
                keep = np.flatnonzero(new != pad_token_id)
                new = new[: keep.max() + 1] if keep.size else new[:0]
            self.add_tokens(np.concatenate([row[:prompt_len][row_mask], new]))

    def request_index(self, lookup: str, max_ngram: int = DEFAULT_MAX_NGRAM, min_ngram: int = 1):
        """A new index holding everything the memory holds, for one request to extend with its own documents and
        tokens: a copy of the memory's index of that kind (built on first use, then kept current as tokens are
        added). A `SuffixIndex` comes marked with `begin_request()` when the memory holds tokens, so that a copy
        that starts anew prefers the request's own text.

        Args:
            lookup: "ngram" (``NgramIndex(max_ngram, min_ngram)``) or "suffix" (``SuffixIndex()``).

        Raises:
            ValueError: an unknown lookup, or bad n-gram settings.

        >>> mem = Memory(); mem.add_tokens([1, 5, 6]); idx = mem.request_index("suffix"); idx.extend([1])
        >>> idx.propose(2).tolist()
        [5, 6]
        """
        key = ("ngram", max_ngram, min_ngram) if lookup == "ngram" else (lookup,)
        index = self._indexes.pop(key, None)
        if index is None:
            index = new_index(lookup, max_ngram, min_ngram)
            for piece in self._items:
                index.extend(piece)
        self._indexes[key] = index  # most recently used last
        while len(self._indexes) > _MAX_INDEXES:
            del self._indexes[next(iter(self._indexes))]
        copy = index.copy()
        if self._size and lookup == "suffix":
            copy.begin_request()
        return copy

    def recycled(self, vocab: int, model: str = "") -> Recycled:
        """The `Recycled` predictions kept for `model` (a name) and its vocabulary, new (empty) on first use.

        >>> mem = Memory(0); mem.recycled(100, "smollm2") is mem.recycled(100, "smollm2")
        True
        """
        key = (str(model), check_int("vocab", vocab, 1))
        if key not in self._recycled:
            self._recycled[key] = Recycled(vocab)
        return self._recycled[key]

    def save(self, path) -> None:
        """Write what the memory holds (its pieces, its recycled predictions) to `path` (a numpy .npz file).

        >>> mem.save("memory.npz"); mem = Memory.load("memory.npz")
        """
        arrays = {"max_tokens": np.array(self.max_tokens), "pieces": np.array(len(self._items))}
        arrays.update({f"piece{i}": piece for i, piece in enumerate(self._items)})
        for i, ((model, vocab), table) in enumerate(self._recycled.items()):
            arrays[f"recycled{i}.key"] = np.array([model, str(vocab)])
            arrays.update({f"recycled{i}.{name}": value for name, value in table.state().items()})
        np.savez(path, **arrays)

    @classmethod
    def load(cls, path) -> "Memory":
        """The memory `save` wrote to `path`."""
        with np.load(path) as data:
            memory = cls(int(data["max_tokens"]))
            for i in range(int(data["pieces"])):
                memory.add_tokens(data[f"piece{i}"])
            i = 0
            while f"recycled{i}.key" in data:
                model, vocab = data[f"recycled{i}.key"].tolist()
                names = [n.split(".", 1)[1] for n in data.files
                         if n.startswith(f"recycled{i}.") and not n.endswith(".key")]
                memory._recycled[model, int(vocab)] = Recycled.from_state({n: data[f"recycled{i}.{n}"] for n in names})
                i += 1
        return memory

    def documents(self) -> list | None:
        """What the memory holds as one row's document list (``[pieces]``), None while it is empty."""
        held = list(self._items)
        return [held] if held else None

    def _evict(self) -> None:
        """Drop the oldest pieces down to 3/4 of max_tokens (keeping the newest) and the indexes built on them."""
        while self._size > self.max_tokens * 3 // 4 and len(self._items) > 1:
            self._size -= self._items.popleft().size
        self._indexes.clear()
        self._max_id = max(int(piece.max()) for piece in self._items)


def _as_numpy(values) -> np.ndarray:
    """A tensor (without importing torch) or an array-like as a numpy array."""
    return values.detach().cpu().numpy() if hasattr(values, "detach") else np.asarray(values)

