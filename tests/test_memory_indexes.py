"""row_indexes: the index each row of a call drafts from (memory as background, the row's documents, its prompt)."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lookahead import Memory
from lookahead.index import NgramIndex, SuffixIndex, row_indexes
from strategies import any_tokens
from test_memory import drafts, index_from_pieces


@given(st.lists(any_tokens(60), max_size=5), st.lists(any_tokens(40), min_size=1, max_size=4),
       st.lists(st.lists(any_tokens(30), max_size=2), min_size=1, max_size=2), st.sampled_from(["ngram", "suffix"]))
def test_rows_draft_from_memory_documents_and_prompt(pieces, sources, documents, lookup):
    """Each row's index proposes what an index built from the memory's pieces, the row's documents and its prompt
    would; with one document list per original row when there are fewer lists than rows."""
    memory = Memory()
    for piece in pieces:
        memory.add_tokens(piece)
    if len(sources) % len(documents):
        documents = documents[:1]
    indexes = row_indexes(lookup, 4, 1, sources, documents, memory)
    held = memory.documents()[0] if len(memory) else []
    per_row = len(sources) // len(documents)
    for i, (index, source) in enumerate(zip(indexes, sources)):
        assert drafts(index) == drafts(index_from_pieces(lookup, held, documents[i // per_row], source))


def test_no_index_when_nothing_is_drafted():
    assert row_indexes("none", 4, 1, [[1, 2], [3]]) == [None, None]
    assert row_indexes("suffix", 4, 1, [[1, 2]], num_draft_tokens=0) == [None]


def test_index_kinds_and_settings():
    ngram, suffix = row_indexes("ngram", 3, 2, [[1]])[0], row_indexes("suffix", 3, 2, [np.array([1, 2])])[0]
    assert isinstance(ngram, NgramIndex) and (ngram.max_ngram, ngram.min_ngram) == (3, 2)
    assert isinstance(suffix, SuffixIndex) and len(suffix) == 2


def test_rows_do_not_share_state():
    """Extending one row's index changes neither the memory's nor another row's."""
    memory = Memory()
    memory.add_tokens([1, 2, 3, 4])
    first, second = row_indexes("suffix", 4, 1, [[1], [1]], memory=memory)
    first.extend([9, 9, 9])
    assert second.propose(3).tolist() == [2, 3, 4] and len(memory.request_index("suffix")) == 4


@pytest.mark.parametrize(
    "lookup, documents, message",
    [("ngram", [[], [], []], r"documents must be one list for all rows or one list per row \(2\), got 3 lists"),
     ("trie", None, "lookup must be one of 'ngram', 'suffix', got 'trie'")],
)
def test_errors(lookup, documents, message):
    with pytest.raises(ValueError, match=message):
        row_indexes(lookup, 4, 1, [[1], [2]], documents)
