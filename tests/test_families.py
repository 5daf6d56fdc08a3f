"""Every decoder-only architecture the installed transformers has (found from its auto mappings, `tests/families.py`),
as a tiny random model, through six everyday calls: each equals `model.generate(do_sample=False)` token for token,
or is refused before any forward with the message its layers' kind calls for (`families.REFUSALS`); the few cells
that fail for a reason still open are named in `families.KNOWN_FAILURES` (xfail, not strict). `python
tests/families.py` prints the table."""
import functools
import re

import pytest

import families as F

CASES = [(name, call) for name, _, _ in F.families() for call in F.CALLS]


@functools.lru_cache(maxsize=None)
def _model(name: str):
    """The family's tiny model, built once per test session; skips the family with its reason where it has no tiny
    decoder-only model."""
    model_type = dict((n, t) for n, t, _ in F.families())[name]
    why = F.static_skip(model_type)
    if why:
        return why
    try:
        return F.tiny_model(name)
    except Exception as error:  # noqa: BLE001 (the reason the family is skipped)
        return f"cannot be built tiny offline: {type(error).__name__}: {str(error).splitlines()[0][:120]}"


def runnable(name: str):
    """The family's tiny model, or skip with why there is none or why transformers' own generate fails on it."""
    model = _model(name)
    if isinstance(model, str):
        pytest.skip(model)
    try:
        F.reference(model, F.prompt())
    except Exception as error:  # noqa: BLE001
        pytest.skip(f"transformers' own generate fails on the tiny config: {type(error).__name__}: {error}")
    return model


@pytest.mark.parametrize("name,call", CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_a_call_equals_generate_or_is_refused_for_its_layers(name, call, request):
    """The call gives model.generate's greedy tokens (sampling with top_k=1 too), or raises the ValueError its
    model's layers call for before any forward; never a crash from inside transformers, never other tokens."""
    model = runnable(name)
    want, detail = F.expected(model, call, name)
    if want == "xfail":
        request.applymarker(pytest.mark.xfail(strict=False, reason=detail))
    kind, message = F.outcome(model, call)
    if want in ("refused", "fallback", "rows apart"):
        assert kind == want, f"expected {want} matching {detail!r}, got {kind}: {message}"
        assert re.search(detail, message), message
    else:
        assert (kind, message) == ("equal", "")


def _config(model_type: str, **extra):
    return F.tiny_config(model_type, extra)


@pytest.mark.parametrize("model_type, extra, kinds", [
    ("llama", {}, [("full_attention", None)] * 2),
    ("qwen2", {"use_sliding_window": False}, [("full_attention", None)] * 2),  # a `sliding_window` field not in force
    ("qwen2", {"use_sliding_window": True, "max_window_layers": 1},
     [("full_attention", None), ("sliding_attention", 16)]),
    ("qwen2_moe", {}, [("full_attention", None)] * 2),
    ("mistral", {}, [("sliding_attention", 16)] * 2),
    ("mistral", {"sliding_window": None}, [("full_attention", None)] * 2),
    ("gemma2", {}, [("sliding_attention", 16), ("full_attention", None)]),
    ("llama4_text", {}, [("chunked_attention", 16), ("full_attention", None)]),
    ("gpt_neo", {}, [("full_attention", None), ("sliding_attention", 16)]),  # local: not in transformers' types
    ("qwen3_next", {}, [("recurrent", None), ("full_attention", None)]),
    ("mamba", {}, [("recurrent", None)] * 2),
])
def test_layer_kinds_are_what_the_layers_run(model_type, extra, kinds):
    """`layer_kinds` gives each decoder layer's kind and window as the model runs it, not as a config field reads."""
    from transformers import AutoModelForCausalLM

    from lookahead.model.layers import layer_kinds

    if model_type not in F.causal_types():
        pytest.skip(f"transformers has no {model_type}")
    model = AutoModelForCausalLM.from_config(_config(model_type, **extra))
    assert [(layer.kind, layer.window) for layer in layer_kinds(model)] == kinds


def test_a_window_that_is_not_in_force_does_not_refuse_the_static_cache():
    """Qwen2-MoE with `use_sliding_window=False` (its `sliding_window` field set) runs the static cache, equal to
    greedy (it was refused: "a sliding window of 0 tokens")."""
    import lookahead

    model = F.tiny_model("qwen2_moe")
    ids = F.prompt()
    out = lookahead.generate(model, ids, cache_implementation="static", max_new_tokens=F.NEW, min_new_tokens=F.NEW)
    assert torch_equal(out[0, ids.shape[1]:], F.reference(model, ids))


def test_a_position_limit_named_max_seq_len_bounds_calls_and_the_cost_measurement():
    """MPT's limit is `max_seq_len`: a call past it is refused before any forward, and the draft-cost measurement
    (a context plus a draft) stays inside it, so the default call at a 512-position limit runs."""
    import lookahead
    from lookahead.decode.calibrate import measure_draft_cost
    from lookahead.model.facts import position_limit

    model = F.tiny_model("mpt")
    assert position_limit(model.config) == F.POSITIONS
    assert len(measure_draft_cost(model, max_tokens=32).costs) == 33
    with pytest.raises(ValueError, match="exceeds the model's position limit of 512"):
        lookahead.generate(model, F.prompt(), max_new_tokens=F.POSITIONS)


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


def test_the_static_cache_holds_latent_attention_layers_through_compaction():
    """DeepSeek-V2's layers cache keys and values of other sizes than `head_dim` (multi-head latent attention): the
    static cache sizes them from their first keys and values, and keeps them when a finished row is compacted away;
    each row equals model.generate on its own prompt."""
    import lookahead
    from lookahead.model import static

    if "deepseek_v2" not in F.causal_types():
        pytest.skip("transformers has no deepseek_v2")
    model = F.tiny_model("deepseek_v2")
    ids, mask = F.padded_batch()
    short = F.reference(model, ids[1:2, 10:])
    eos = next(int(t) for t in short[3:] if int(t) not in F.reference(model, ids[0:1]).tolist())
    model.generation_config.eos_token_id = eos  # the short row ends early: the batch compacts to one row
    out = lookahead.generate(model, ids, attention_mask=mask, cache_implementation="static", max_new_tokens=F.NEW)
    for i, row in enumerate([ids[0:1], ids[1:2, 10:]]):
        want = model.generate(row, do_sample=False, max_new_tokens=F.NEW)[0, row.shape[1]:]
        assert out[i, ids.shape[1]:ids.shape[1] + len(want)].tolist() == want.tolist()
    assert [state.cache.own for state in static._STATES[model]] == [{0, 1}, {0, 1}]  # both batch sizes


@pytest.mark.parametrize("name", ["mamba", "qwen3_next"])
def test_recurrent_models_run_through_custom_generate_too(name):
    """Where transformers calls lookahead's loop itself (`custom_generate`), a state-space or hybrid model gives
    model.generate's greedy tokens."""
    import lookahead

    if name not in F.causal_types():
        pytest.skip(f"transformers has no {name}")
    model = F.tiny_model(name)
    ids = F.prompt()
    out = model.generate(ids, custom_generate=lookahead.custom_generate, max_new_tokens=F.NEW, min_new_tokens=F.NEW,
                         do_sample=False)
    assert out[0, ids.shape[1]:].tolist() == F.reference(model, ids).tolist()


def test_a_looped_model_keeps_each_loops_keys_in_the_static_cache():
    """Dory runs its middle layers several times, each later loop writing its own copies of their cache layers: the
    static cache holds a layer of slots for each copy (a copy the model made of a slot layer kept the slots of its
    first forward: "shape mismatch" on the next step), so chains and trees over three loops, drafts rejected at every
    fifth token, give model.generate's tokens; the mode whose earlier loops read the last loop's keys is refused by
    name."""
    import lookahead
    from test_recurrent import corrupted

    if "dory" not in F.causal_types():
        pytest.skip("transformers has no dory")
    model = F.build("dory", {"n_recurrent_loops": 3})
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    ids = F.prompt()
    want = F.reference(model, ids)
    for kwargs in ({}, {"lookup": "suffix", "draft": "tree"}):
        out, stats = lookahead.generate(model, ids, documents=[corrupted(want)], draft_cost=0, max_new_tokens=F.NEW,
                                        min_new_tokens=F.NEW, cache_implementation="static", return_stats=True,
                                        **kwargs)
        assert out[0, ids.shape[1]:].tolist() == want.tolist(), kwargs
        assert stats.draft_tokens - stats.accepted_tokens >= 4, kwargs  # rejections: slots overwritten
    model.config.recurrent_kv_cache_mode = "last_loop"
    with pytest.raises(ValueError, match="recurrent_kv_cache_mode='last_loop'.*leave cache_implementation unset"):
        lookahead.generate(model, ids, cache_implementation="static", max_new_tokens=F.NEW)


def test_a_batch_whose_rows_cannot_share_a_cache_runs_each_row_alone():
    """MPT builds its ALiBi biases from cache slots, one line for every row: a left-padded batch runs a row at a time,
    each row's prompt without its padding, said by a RowsApartWarning and the stats; the output is laid out as
    model.generate lays out a batch (the padded prompts, the new tokens, then the pad id where a row ended early at
    its eos), `max_length` counts the batch's padded length as transformers does, and what cannot be put together
    from rows alone (return_dict_in_generate's per-step scores of a batch) is refused by name."""
    import lookahead
    from lookahead.decode.fallback import RowsApartWarning

    model = F.tiny_model("mpt")
    ids, mask = F.padded_batch()
    wants = [F.reference(model, row) for row in (ids[0:1], ids[1:2, 10:])]
    eos = next(int(t) for t in wants[1][5:] if int(t) not in wants[0].tolist())
    short = wants[1].tolist().index(eos) + 1
    with pytest.warns(RowsApartWarning, match="ALiBi biases from cache slots.*rows ran one after another"):
        out, stats = lookahead.generate(model, ids, attention_mask=mask, max_new_tokens=F.NEW, eos_token_id=eos,
                                        pad_token_id=0, return_stats=True)
    p = ids.shape[1]
    assert out.shape == (2, p + F.NEW) and torch_equal(out[:, :p], ids)
    assert out[0, p:].tolist() == wants[0].tolist()
    assert out[1, p:p + short].tolist() == wants[1][:short].tolist() and set(out[1, p + short:].tolist()) == {0}
    assert stats.new_tokens_by_row == [F.NEW, short] and stats.new_tokens == F.NEW + short
    assert stats.row_forwards == sum(stats.forwards_by_row) < F.NEW + short  # drafts accepted
    assert "ALiBi biases from cache slots" in stats.rows_apart
    with pytest.warns(RowsApartWarning):
        out = lookahead.generate(model, ids, attention_mask=mask, max_length=p + 7)
    assert out.shape == (2, p + 7) and out[0, p:].tolist() == wants[0][:7].tolist()
    with pytest.raises(ValueError, match="return_dict_in_generate=True is not supported for a batch of 2 rows"):
        lookahead.generate(model, ids, attention_mask=mask, max_new_tokens=5, return_dict_in_generate=True)
