"""A fuzz of the server's engine (`lookahead.serve.engine.Engine`), meant to run under numba's bounds checks as
`fuzz_generate.py` does (`test_bounds.py` runs both in a process of their own with NUMBA_BOUNDSCHECK=1 and a fresh
NUMBA_CACHE_DIR).

Each example is a load: requests with their own options arriving at different turns of the engine's loop, so that
rows join and leave running batches and a batch moves between the engine's own step and `generate`'s fused step
(greedy chains and trees, recycling and merged trees, predictions right, wrong or unrelated; loads whose greedy
rows all draft alike and loads of rows each with its own options, sampling rows beside greedy ones; budgets from 1
to 64, eos ids and stop strings that end rows early, a memory the rows add to), in float32 and float64, from the
dynamic and the static cache, with a fixed cost or the measured one (the engine then times its steps, `StepTimes`,
and may cut drafting). The models: the bundled pretrained one, a random Llama, and the families' tiny hybrids with
gated delta nets or short convolutions, sliding windows, ALiBi (each row a batch of its own) and latent attention.

Every greedy row must give `model.generate(do_sample=False)`'s tokens for its prompt alone (in float32 up to a
near-tie of the two tokens' logits, judged in float64), its text cut before the first stop string; a sampling row
well-formed tokens; every row's counts must add up. SERVE_FUZZ_EXAMPLES sets the number of loads (default 100).
"""
import functools
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import families as F
import fuzz_generate
from graphs import cpu_graphs
from lookahead import Memory
from lookahead._checks import LOOKUPS, TREE_LOOKUPS
from lookahead.model.facts import ModelFacts, tree_refusal
from lookahead.models import default_model_path
from lookahead.serve.engine import Engine
from lookahead.serve.row import Drafting, Row, Sampling

EXAMPLES = int(os.environ.get("SERVE_FUZZ_EXAMPLES", "100"))
TURNS = 8  # requests arrive at turns 0 to TURNS - 1 of the engine's loop
FAMILIES = ("qwen3_5_text", "lfm2", "gemma3_text", "mpt", "deepseek_v3")  # tiny random models of `families.py`: a
# gated delta net and short convolutions beside attention (recurrent states followed, no trees), sliding windows,
# ALiBi (each row a batch of its own), multi-head latent attention
MODELS = ("stories", "random") + tuple(name for name in FAMILIES if name in [n for n, _, _ in F.families()])
PEAKED = FAMILIES  # random models whose logits are peaked (`families.build`): no near-ties; float32 only (MoE
# layers' grouped matrix products take no float64)


@functools.cache
def _model(name: str, dtype: torch.dtype = torch.float32):
    """`fuzz_generate`'s models, and the families' tiny ones."""
    if name in ("stories", "random"):
        return fuzz_generate._model(name, dtype)
    return F.tiny_model(name) if dtype == torch.float32 else _model(name).to(dtype)


@functools.cache
def _common_tokens(name: str) -> tuple:
    """The ten most frequent tokens of the model's greedy answer to a prompt: eos ids that end rows early."""
    if name in ("stories", "random"):
        return fuzz_generate._common_tokens(name)
    story = _model(name).generate(F.prompt(30), do_sample=False, max_new_tokens=200, eos_token_id=[],
                                  pad_token_id=0)[0, 30:]
    return tuple(int(t) for t in torch.bincount(story).argsort(descending=True)[:10])


def _tokenizer():
    from transformers import AutoTokenizer

    if not hasattr(_tokenizer, "cached"):
        _tokenizer.cached = AutoTokenizer.from_pretrained(default_model_path())
    return _tokenizer.cached


def _greedy(name: str, dtype: torch.dtype, prompt: np.ndarray, max_new: int, eos: tuple) -> list:
    """`model.generate(do_sample=False)`'s new tokens after `prompt` alone."""
    with torch.inference_mode():
        out = _model(name, dtype).generate(torch.from_numpy(prompt)[None], max_new_tokens=max_new, do_sample=False,
                                           eos_token_id=list(eos), pad_token_id=0)
    return out[0, len(prompt):].tolist()


@st.composite
def requests(draw, name: str, vocab: int, tied: bool, shared: dict | None) -> dict:
    """One request: its prompt, options, prediction and the turn it arrives at; `shared`: the drafting, sampling and
    eos ids of every request of the load (so that their batch may take the fused step), or None: its own."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n, kind = draw(st.integers(1, 60)), draw(st.sampled_from(["random", "repeat", "period"]))
    if kind == "random":
        prompt = rng.integers(3, vocab, n)
    elif kind == "repeat":  # a stretch and its copy: long matches from the first steps on
        half = rng.integers(3, vocab, (n + 1) // 2)
        prompt = np.concatenate([half, half])[:n]
    else:  # a short period: drafts as long as the budget allows
        prompt = np.resize(rng.integers(3, vocab, int(rng.integers(1, 4))), n)
    return dict(prompt=prompt.astype(np.int64), max_new=draw(st.integers(1, 80)),
                **(shared if shared is not None else draw(options(name))),
                prediction=draw(st.sampled_from([None, "answer", "changed", "random"])),
                stop=draw(st.sampled_from([None, None, None, "stop"])) if tied else None,
                turn=draw(st.integers(0, TURNS - 1)))


@st.composite
def options(draw, name: str, greedy: bool = False) -> dict:
    """A request's drafting, sampling (greedy with `greedy`) and eos ids."""
    trees = tree_refusal(ModelFacts.of(_model(name))) is None  # (a recurrent state follows one path: no trees)
    draft = draw(st.sampled_from(["chain", "tree"] if trees else ["chain"]))
    lookup = draw(st.sampled_from(TREE_LOOKUPS if draft == "tree" else LOOKUPS))
    budget = draw(st.one_of(st.none(), st.integers(1, 64)))
    drafting = Drafting(lookup=lookup, draft=draft, num_draft_tokens=budget if draft == "chain" else None,
                        max_draft_nodes=budget if draft == "tree" else None)
    greedy = greedy or draw(st.sampled_from([True, True, True, False]))
    return dict(drafting=drafting,
                sampling=Sampling(0.0) if greedy else Sampling(draw(st.sampled_from([0.7, 1.0])),
                                                               draw(st.sampled_from([1.0, 0.9])),
                                                               draw(st.integers(0, 99))),
                eos=draw(st.sampled_from([(), (_common_tokens(name)[draw(st.integers(0, 9))],)])))


@st.composite
def loads(draw) -> dict:
    """A load: the model, the engine's settings and its requests."""
    name = draw(st.sampled_from(MODELS))
    dtype = draw(st.sampled_from([torch.float32] if name in PEAKED else [torch.float32, torch.float64]))
    vocab = _model(name).config.vocab_size
    cache = draw(st.sampled_from(["dynamic", "static", "static graphs"]))  # graphs: CUDA's semantics (`graphs.py`)
    cost = draw(st.sampled_from([None, (0.0, 0.05), (0.5, 0.3)]))
    shared = draw(st.one_of(st.none(), options(name, greedy=True)))  # greedy rows alike: the fused step's batches
    return dict(name=name, dtype=dtype, cache=cache, cost=cost, memory=draw(st.booleans()),
                requests=draw(st.lists(requests(name, vocab, name == "stories", shared), min_size=1, max_size=6)))


def _row(request: dict, name: str, dtype: torch.dtype, tok) -> tuple:
    """The request's `Row` and what greedy decoding gives its prompt alone (None for a sampling row)."""
    r = request
    want = _greedy(name, dtype, r["prompt"], r["max_new"], r["eos"]) if r["sampling"].greedy else None
    reference = want or _greedy(name, dtype, r["prompt"], r["max_new"], r["eos"])
    prediction = None
    if r["prediction"] == "answer":
        prediction = np.array(reference, dtype=np.int64)
    elif r["prediction"] == "changed":  # every fifth token changed
        prediction = np.array(reference, dtype=np.int64)
        prediction[::5] = (prediction[::5] + 1) % _model(name).config.vocab_size
    elif r["prediction"] == "random":
        prediction = np.random.default_rng(len(reference)).integers(3, _model(name).config.vocab_size, 20)
    stops = ()
    if r["stop"] is not None:  # a piece of the greedy text: the row ends before it
        text = tok.decode(reference, skip_special_tokens=True)
        stops = (text[len(text) // 2:len(text) // 2 + 3],) if len(text) >= 6 else ()
    row = Row(r["prompt"], r["max_new"], r["eos"], r["sampling"], r["drafting"], tok, stops=stops,
              prediction=prediction)
    return row, want


def _equal(name: str, prompt: np.ndarray, got: list, want: list, dtype: torch.dtype) -> bool:
    """got == want, or in float32 their first difference is a near-tie of the two tokens' logits (not on the
    families' models, whose logits are peaked)."""
    if got == want:
        return True
    n = min(len(got), len(want))
    if dtype != torch.float32 or name in PEAKED or got[:n] == want[:n]:
        return False
    at = next(i for i in range(n) if got[i] != want[i])
    seq = lambda out: torch.tensor([list(prompt) + out[:at + 1]])  # noqa: E731
    return fuzz_generate._near_tie(name, seq(got), seq(want), torch.ones(1, len(prompt), dtype=torch.long))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(loads())
def test_served_rows_stay_in_bounds_and_equal_greedy(load):
    """Every greedy row equals `model.generate` on its prompt alone (its text cut before a stop string); sampling rows
    give valid tokens; each row's counts add up: one forward a step, at least one token each, no more accepted tokens
    than drafted."""
    name, dtype, tok = load["name"], load["dtype"], _tokenizer()
    model = _model(name, dtype)
    made = [_row(r, name, dtype, tok) for r in load["requests"]]
    cache, graphs = load["cache"].split()[0], load["cache"].endswith("graphs")
    try:
        Engine(model, draft_cost=0, cache_implementation=cache).stop()
    except ValueError:  # recurrent states or rows apart: served from the dynamic cache only
        cache = "dynamic"
    arrivals = sorted(range(len(made)), key=lambda k: load["requests"][k]["turn"])
    rows = [row for row, _ in made]
    with pytest.MonkeyPatch.context() as patch:
        if graphs:
            cpu_graphs(patch)
        _serve(model, load, cache, rows, arrivals)
    for request, (row, want) in zip(load["requests"], made):
        c = row.stats
        assert row.finish in ("stop", "length") and 1 <= len(row.out) <= row.max_new
        assert c.forward_passes <= len(row.out) <= c.forward_passes + c.accepted_tokens
        assert 0 <= c.accepted_tokens <= c.draft_tokens
        assert 0 <= c.prediction_accepted + c.prediction_rejected <= c.draft_tokens
        if want is None:  # a sampling row
            assert all(0 <= t < model.config.vocab_size for t in row.out)
            assert len(row.out) == row.max_new or row.out[-1] in row.eos or row.text.stopped
            continue
        if row.text.stops:  # a greedy row ends before its stop string, its tokens greedy's up to there
            text = tok.decode(want, skip_special_tokens=True)
            stop = row.text.stops[0]
            if stop in text:
                assert row.text.stopped and row.text.text == text[:text.index(stop)]
                assert _equal(name, request["prompt"], row.out, want[:len(row.out)], dtype)
                continue
        assert _equal(name, request["prompt"], row.out, want, dtype), (request, row.out, want)
        if not row.text.stops:
            assert row.text.text == tok.decode(row.out, skip_special_tokens=True)


def _serve(model, load: dict, cache: str, rows: list, arrivals: list) -> None:
    """Run the load's rows through an `Engine`, each arriving at its turn (or when none runs)."""
    engine = Engine(model, memory=Memory() if load["memory"] else None, draft_cost=load["cost"],
                    cache_implementation=cache, max_model_len=160 if cache == "static" else None)
    try:
        with torch.inference_mode():
            turn = 0
            while not all(row.done for row in rows):
                while arrivals and (load["requests"][arrivals[0]]["turn"] <= turn or not engine.rows):
                    engine.submit(rows[arrivals.pop(0)])  # (none running: the next one arrives now)
                engine._turn(wait=False)
                turn += 1
                assert engine.error is None and turn < 10_000
    finally:
        engine.stop()
