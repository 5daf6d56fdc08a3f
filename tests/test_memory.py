"""Memory: what goes in, what is evicted, and the indexes it keeps over what it holds."""
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lookahead import Memory
from lookahead.index import NgramIndex, SuffixIndex
from strategies import memory_calls


def index_from_pieces(lookup, pieces, documents, source):
    """The reference: a fresh index extended with the memory's pieces (then marked as background for the suffix
    index), the row's documents and its source, as generate built one per row before the memory kept indexes."""
    index = NgramIndex(4, 1) if lookup == "ngram" else SuffixIndex()
    for piece in pieces:
        index.extend(piece)
    if pieces and lookup == "suffix":
        index.begin_request()
    for doc in documents:
        index.extend(doc)
    index.extend(source)
    return index


def drafts(index) -> tuple:
    tree = index.propose_tree(24) if isinstance(index, SuffixIndex) else None
    return (index.propose(16).tolist(), index.match_length, len(index),
            None if tree is None else (tree.tokens.tolist(), tree.parents.tolist(), tree.probs.tolist()))


@given(memory_calls(), st.sampled_from([40, 150, 10_000]))
def test_a_request_index_equals_one_built_from_the_pieces_held(calls, max_tokens):
    """Whatever was added and evicted before, a request's index (a copy of the memory's) extended with documents
    and a prompt proposes exactly what an index built from the pieces held would; requests do not change it."""
    memory = Memory(max_tokens)
    for name, *args in calls:
        if name == "add":
            memory.add_tokens(args[0])
            continue
        lookup, documents, source = args
        index = memory.request_index(lookup)
        for doc in documents:
            index.extend(doc)
        index.extend(source)
        pieces = memory.documents()[0] if len(memory) else []
        assert drafts(index) == drafts(index_from_pieces(lookup, pieces, documents, source))
        assert len(memory) <= max_tokens and sum(map(len, pieces)) == len(memory)


def test_eviction_drops_the_oldest_pieces_down_to_three_quarters():
    """Over max_tokens, the oldest pieces go until at most 3/4 of it remain; the newest piece always stays."""
    memory = Memory(max_tokens=100)
    memory.add_tokens(range(60))
    memory.add_tokens(range(100, 130))
    assert len(memory) == 90
    memory.add_tokens(range(200, 230))  # 120 > 100: drop pieces until <= 75
    assert len(memory) == 60 and [p[0] for p in memory.documents()[0]] == [100, 200]
    memory.add_tokens(range(1000, 1150))  # alone over max_tokens: its tail, and nothing older
    assert len(memory) == 100 and memory.documents()[0][0].tolist() == list(range(1050, 1150))
    assert repr(memory) == "Memory(max_tokens=100, held=100 tokens in 1 pieces)"


def test_max_token_id_follows_what_is_held():
    memory = Memory(max_tokens=10)
    assert memory.max_token_id == -1
    memory.add_tokens([3, 900, 4])
    memory.add_tokens(np.array([5, 6], dtype=np.int32))
    assert memory.max_token_id == 900
    memory.add_tokens(torch.tensor([7, 8, 9, 10, 11, 12]))  # 11 > 10: evicts down to 7 tokens or fewer
    assert memory.max_token_id == 12 and len(memory) == 6


def test_add_keeps_prompts_without_padding_and_outputs_up_to_their_last_real_token():
    memory = Memory()
    sequences = torch.tensor([[0, 5, 6, 7, 8, 0], [9, 9, 9, 0, 0, 0]])
    memory.add(sequences, torch.tensor([[0, 1, 1], [1, 1, 1]]), pad_token_id=0)
    assert [p.tolist() for p in memory.documents()[0]] == [[5, 6, 7, 8], [9, 9, 9]]


def test_the_pieces_are_copies():
    buffer = np.array([1, 2, 3])
    memory = Memory()
    memory.add_tokens(buffer)
    buffer[:] = 0
    assert memory.documents()[0][0].tolist() == [1, 2, 3]


@pytest.mark.parametrize(
    "tokens, error, message",
    [
        ([1, -2], ValueError, r"tokens must hold ids in \[0, 2147483647\], got min -2 and max 1"),
        ([1.0, 2.0], TypeError, "tokens must hold integer ids, got dtype float64"),
        (torch.tensor([1.5]), TypeError, "tokens must hold integer ids, got a tensor of dtype torch.float32"),
        ([[1, 2]], ValueError, r"tokens must be one-dimensional, got shape \(1, 2\)"),
        (np.array([2**64 - 1], dtype=np.uint64), ValueError, "got min 18446744073709551615"),
        ([2**31], ValueError, "got min 2147483648"),
    ],
)
def test_add_tokens_refuses_what_no_index_can_hold(tokens, error, message):
    memory = Memory()
    with pytest.raises(error, match=message):
        memory.add_tokens(tokens)
    assert len(memory) == 0 and memory.documents() is None


@pytest.mark.parametrize(
    "max_tokens, error, message",
    [(-1, ValueError, "max_tokens must be >= 0, got -1"), (2.5, TypeError, r"max_tokens must be an int, got float"),
     (True, TypeError, "max_tokens must be an int, got bool")],
)
def test_max_tokens_errors(max_tokens, error, message):
    with pytest.raises(error, match=message):
        Memory(max_tokens=max_tokens)


def test_request_index_errors():
    with pytest.raises(ValueError, match="lookup must be one of 'ngram', 'suffix', got 'none'"):
        Memory().request_index("none")
    with pytest.raises(ValueError, match="max_ngram must be <= 64, got 100"):
        Memory().request_index("ngram", max_ngram=100)
