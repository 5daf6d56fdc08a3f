"""A fuzz of `generate` meant to run under numba's bounds checks (`test_bounds.py` runs it in a process of its own
with NUMBA_BOUNDSCHECK=1 and a fresh NUMBA_CACHE_DIR): a kernel compiled without checks that writes past its array
corrupts the heap silently; compiled with them, it raises IndexError.

Every greedy call must equal `model.generate(do_sample=False)`; a sampling call must return well-formed rows. The
calls span what reaches the kernels' buffers at their edges: batches with ragged prompts of one token on, calls that
run to `max_new_tokens` (where the room left and the draft width meet) or whose rows end early at an eos, chain and
tree budgets from 1 to 64, `draft_cost` 0 and default, the dynamic and the static cache (also captured as CUDA graphs
on a CPU stand-in: `graphs.py`), the fused and the unfused loop, repetitive and random prompts, every lookup
(recycling ones with their predictions cold or kept from earlier calls), on the bundled pretrained model and on a
random one, in float32 and float64.
FUZZ_EXAMPLES sets the number of calls (default 300).

A multi-token forward rounds differently from a one-token one, so in float32 a greedy output may leave plain
greedy's where two tokens' logits tie to within rounding (one such case in some 3,000 calls on stories260K: 5e-6
apart). There the check is that the first difference is such a near-tie, judged in float64; in float64 outputs must
be equal.
"""
import functools
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from lookahead import Memory, generate
from graphs import cpu_graphs
from lookahead.models import default_model_path
from models import tiny_model

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "300"))


@functools.cache
def _model(name: str, dtype: torch.dtype = torch.float32):
    if dtype != torch.float32:
        return _model(name).to(dtype)
    if name == "stories":
        return AutoModelForCausalLM.from_pretrained(default_model_path()).eval()
    return tiny_model("llama", seed=3)


def _near_tie(name: str, got: torch.Tensor, expected: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether each row's first difference between got and expected [b, L] is a float32 near-tie: the two tokens'
    logits after the shared prefix within 1e-4 of each other, computed in float64."""
    model, prompt = _model(name, torch.float64), mask.shape[1]
    for row in (got != expected).any(-1).nonzero().flatten().tolist():
        at = int((got[row] != expected[row]).nonzero()[0])
        prefix = expected[row:row + 1, :at]
        pad = torch.cat([mask[row:row + 1], torch.ones((1, at - prompt), dtype=torch.long)], 1)
        with torch.no_grad():
            logits = model(prefix, attention_mask=pad).logits[0, -1]
        if abs(float(logits[got[row, at]] - logits[expected[row, at]])) > 1e-4:
            return False
    return True


@functools.cache
def _memory(name: str, dtype: torch.dtype) -> Memory:
    """A memory of no tokens whose recycled predictions every call of the model (in the dtype) adds to."""
    return Memory(0)


@functools.cache
def _common_tokens(name: str) -> tuple:
    """The ten most frequent tokens of a greedy story of the model: eos ids that end rows early."""
    story = _model(name).generate(torch.tensor([[1]]), do_sample=False, max_new_tokens=200)[0, 1:]
    return tuple(int(t) for t in torch.bincount(story).argsort(descending=True)[:10])


@st.composite
def calls(draw) -> dict:
    """One `generate` call: its model, left-padded prompts and arguments."""
    name = draw(st.sampled_from(["stories", "random"]))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    vocab = _model(name).config.vocab_size
    lengths = draw(st.lists(st.integers(1, 60), min_size=1, max_size=4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["random", "repeat", "period"]))
    rows = []
    for n in lengths:
        if kind == "random":
            rows.append(rng.integers(3, vocab, n))
        elif kind == "repeat":  # a stretch and its copy: long matches from the first steps on
            half = rng.integers(3, vocab, (n + 1) // 2)
            rows.append(np.concatenate([half, half])[:n])
        else:  # a short period: drafts as long as the budget allows, every step
            rows.append(np.resize(rng.integers(3, vocab, int(rng.integers(1, 4))), n))
    width = max(lengths)
    ids, mask = torch.zeros((len(rows), width), dtype=torch.long), torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):], mask[i, width - len(row):] = torch.from_numpy(row), 1
    draft = draw(st.sampled_from(["chain", "tree"]))
    lookups = ["suffix", "recycle", "suffix+recycle"] + (["ngram"] if draft == "chain" else [])
    kwargs = dict(lookup=draw(st.sampled_from(lookups)), draft=draft,
                  max_new_tokens=draw(st.integers(1, 300)), draft_cost=draw(st.sampled_from([None, 0.0])),
                  cache_implementation=draw(st.sampled_from(["dynamic", "static", "static graphs"])),
                  eos_token_id=draw(st.sampled_from([[], [_common_tokens(name)[draw(st.integers(0, 9))]]])),
                  pad_token_id=0)
    budget = draw(st.one_of(st.none(), st.integers(1, 64)))
    kwargs["max_draft_nodes" if draft == "tree" else "num_draft_tokens"] = budget
    if draw(st.booleans()):  # the unfused loop: it records scores
        kwargs.update(return_dict_in_generate=True, output_scores=True)
    if "recycle" in kwargs["lookup"] and draw(st.booleans()):  # predictions kept from the model's earlier calls
        kwargs["memory"] = _memory(name, dtype)
    sample = draw(st.sampled_from([False, False, True]))
    graphs = kwargs["cache_implementation"] == "static graphs"  # captured with CUDA graphs' semantics (`graphs.py`)
    kwargs["cache_implementation"] = kwargs["cache_implementation"].split()[0]
    return dict(name=name, dtype=dtype, ids=ids, mask=mask, sample=sample, kwargs=kwargs, graphs=graphs)


def _sequences(out) -> torch.Tensor:
    return out.sequences if hasattr(out, "sequences") else out


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(calls())
def test_generate_stays_in_bounds_and_equals_greedy(call):
    """Greedy calls equal `model.generate` (in float32, up to near-ties); sampling calls return rows of valid ids."""
    with pytest.MonkeyPatch.context() as patch:
        if call["graphs"]:
            cpu_graphs(patch)
        _check(call)


def _check(call: dict) -> None:
    model, ids, mask, kwargs = _model(call["name"], call["dtype"]), call["ids"], call["mask"], call["kwargs"]
    if call["sample"]:
        out = _sequences(generate(model, ids, attention_mask=mask, do_sample=True, generator=0, **kwargs))
        new = out[:, ids.shape[1]:]
        assert 1 <= new.shape[1] <= kwargs["max_new_tokens"]
        assert bool(((new >= 0) & (new < model.config.vocab_size)).all())
        return
    out = _sequences(generate(model, ids, attention_mask=mask, **kwargs))
    reference = {k: v for k, v in kwargs.items() if k in ("max_new_tokens", "eos_token_id", "pad_token_id")}
    expected = model.generate(ids, attention_mask=mask, do_sample=False, **reference)
    assert torch.equal(out, expected) or (call["dtype"] == torch.float32 and out.shape == expected.shape
                                          and _near_tie(call["name"], out, expected, mask))


def test_a_tree_call_to_max_new_tokens_on_a_short_prompt():
    """The bug of issue 25: a dynamic-cache tree at batch 1 that runs to `max_new_tokens` committed past the slot mask
    (whose first size held twice the prompt plus 64 slots) once the output outgrew it."""
    model = _model("stories")
    for length in (1, 5, 12, 20):
        ids = torch.from_numpy(np.random.default_rng(length).integers(3, 512, (1, length)))
        expected = model.generate(ids, do_sample=False, max_new_tokens=128, eos_token_id=[], pad_token_id=0)
        for nodes in (None, 1, 5, 64):
            out = generate(model, ids, lookup="suffix", draft="tree", max_new_tokens=128, draft_cost=0,
                           max_draft_nodes=nodes, eos_token_id=[], pad_token_id=0)
            assert torch.equal(out, expected), (length, nodes)
