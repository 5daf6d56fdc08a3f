"""cache_implementation="static": the slot cache gives greedy's exact tokens, chains and trees, batches and padding."""
import numpy as np
import pytest
import torch
import transformers as T
from hypothesis import given, settings, strategies as st

from lookahead import generate
from lookahead.model.slot_cache import SlotCache
from lookahead.model.static import COMPILED_WIDTHS, WIDTHS
from models import CONFIGS, repeated_prompt, tiny_model
from test_generate import left_padded


@pytest.mark.parametrize("arch", sorted(CONFIGS))
@pytest.mark.parametrize("draft", ["chain", "tree"])
def test_static_matches_greedy(arch, draft):
    """Batch of one and a left-padded batch of three give model.generate's tokens, as the dynamic cache does."""
    static_calls_match_greedy(arch, draft)


def static_calls_match_greedy(arch: str, draft: str) -> None:
    """A row, and a left-padded batch of three whose rows end at different steps (an eos id; the running rows move
    to a smaller batch), give model.generate's tokens from the static cache."""
    model = tiny_model(arch)
    kwargs = dict(lookup="suffix", draft=draft, cache_implementation="static", draft_cost=0.0)
    ids = repeated_prompt(0, 40)[None]
    expected = model.generate(ids, do_sample=False, max_new_tokens=48)
    assert torch.equal(generate(model, ids, max_new_tokens=48, **kwargs), expected)
    batch, mask = left_padded([30, 17, 41])
    eos = int(expected[0, 45])  # a token some rows reach before others
    expected = model.generate(batch, attention_mask=mask, do_sample=False, max_new_tokens=32, eos_token_id=eos,
                              pad_token_id=0)
    out = generate(model, batch, attention_mask=mask, max_new_tokens=32, eos_token_id=eos, pad_token_id=0, **kwargs)
    assert torch.equal(out, expected)


@pytest.fixture
def same_drafts(monkeypatch):
    """The static step fills drafts up to its width, the dynamic one up to the widest draft or the width its cost
    curve pads to: here both fill to the widest draft, so that their drafts are the same."""
    from lookahead.model.static import StaticCausalLM
    from lookahead.model.causal import CausalLM

    monkeypatch.setattr(StaticCausalLM, "padded", staticmethod(lambda n: n))
    monkeypatch.setattr(CausalLM, "pad_to", lambda self, pads: None)


@pytest.mark.parametrize("kwargs", [dict(), dict(lookup="suffix"), dict(lookup="suffix", draft="tree"),
                                    dict(lookup="suffix", draft="tree", draft_cost=0.0, max_draft_nodes=40),
                                    dict(lookup="suffix", draft="tree", no_repeat_ngram_size=4)])
def test_static_on_the_pretrained_model_accepts_what_the_dynamic_cache_accepts(stories_model, kwargs, same_drafts):
    """Real text with long accepted drafts: the same tokens as model.generate and the same forwards as the dynamic
    cache (a rejected draft is overwritten, an accepted tree path is packed)."""
    story = stories_model.generate(torch.tensor([[1]]), do_sample=False, max_new_tokens=80)
    prompt = torch.cat([story, story[:, 1:30]], dim=1)
    batch = torch.cat([prompt, torch.cat([torch.zeros(1, 12, dtype=torch.long), prompt[:, :-12]], 1)])
    mask = torch.ones_like(batch)
    mask[1, :12] = 0
    hf = {k: v for k, v in kwargs.items() if k == "no_repeat_ngram_size"}
    expected = stories_model.generate(batch, attention_mask=mask, do_sample=False, max_new_tokens=100, **hf)
    dynamic, stats = generate(stories_model, batch, attention_mask=mask, max_new_tokens=100, return_stats=True,
                              **kwargs)
    static, static_stats = generate(stories_model, batch, attention_mask=mask, max_new_tokens=100, return_stats=True,
                                    cache_implementation="static", **kwargs)
    assert torch.equal(dynamic, expected) and torch.equal(static, expected)
    assert static_stats.forward_passes == stats.forward_passes and stats.tokens_per_forward > 1.2


def test_static_samples_as_the_dynamic_cache_does(stories_model, same_drafts):
    """With one seed, sampling through the static cache draws the same tokens as through the dynamic one."""
    ids = stories_model.generate(torch.tensor([[1]]), do_sample=False, max_new_tokens=60)
    kwargs = dict(do_sample=True, temperature=0.8, generator=3, max_new_tokens=40, lookup="suffix", draft="tree")
    assert torch.equal(generate(stories_model, ids, cache_implementation="static", **kwargs),
                       generate(stories_model, ids, **kwargs))


def test_the_cache_is_reused_across_calls_of_other_lengths():
    """A later call with another prompt length reuses the preallocated cache and is still exact."""
    model = tiny_model("llama")
    from lookahead.model.static import _STATES

    for length in (30, 45, 22):
        ids = repeated_prompt(length, length)[None]
        expected = model.generate(ids, do_sample=False, max_new_tokens=20)
        assert torch.equal(generate(model, ids, max_new_tokens=20, cache_implementation="static"), expected)
    assert len(_STATES[model]) == 1


def test_a_longer_call_replaces_the_cache_and_few_are_kept(monkeypatch):
    """A call that needs more slots replaces the shorter cache of its batch size (one state per batch size, dtype
    and compilation, at most MAX_STATES per model, the least recently used dropped first)."""
    import lookahead.model.static as S

    monkeypatch.setattr(S, "MAX_STATES", 2)
    model = tiny_model("llama")
    facts = S.ModelFacts.of(model)
    first = S._state(model, facts, 1, 100, None)
    assert first.cache.slots == 256 and S._state(model, facts, 1, 200, None) is first
    longer = S._state(model, facts, 1, 300, None)
    assert longer.cache.slots == 512 and S._STATES[model] == [longer]
    two, three = S._state(model, facts, 2, 10, None), S._state(model, facts, 3, 10, None)
    assert S._STATES[model] == [two, three]  # batch 1's state was the least recently used
    assert S._state(model, facts, 2, 10, None) is two and S._STATES[model] == [three, two]


class _Config:
    def __init__(self, **fields):
        self.__dict__.update(dict(cache_implementation=None, compile_config=None, disable_compile=False), **fields)


def _on_cuda(model, **facts):
    """The model's facts, as if it were on CUDA (static_mode reads only its facts)."""
    from dataclasses import replace

    from lookahead.model.facts import ModelFacts

    return replace(ModelFacts.of(model), device=torch.device("cuda"), **facts)


def test_static_mode_decides_the_cache_and_its_compilation():
    """On CUDA: unset gives graphs without compilation for the tested architectures with full attention; "static"
    compiles (transformers' own CompileConfig unless one is given); disable_compile turns both off; "dynamic"
    keeps the dynamic cache. On a CPU only an explicit "static" gives the static cache."""
    from lookahead.model.static import static_mode

    from lookahead.model.facts import ModelFacts

    llama, cpu = _on_cuda(tiny_model("llama")), ModelFacts.of(tiny_model("llama"))
    assert static_mode(llama, _Config()) == (True, None)
    graphs, compiled = static_mode(llama, _Config(cache_implementation="static"))
    assert graphs and isinstance(compiled, T.CompileConfig)
    mine = T.CompileConfig(fullgraph=True)
    assert static_mode(llama, _Config(cache_implementation="static", compile_config=mine)) == (True, mine)
    assert static_mode(llama, _Config(cache_implementation="static", disable_compile=True)) == (False, None)
    assert static_mode(llama, _Config(disable_compile=True)) is None
    assert static_mode(llama, _Config(cache_implementation="dynamic")) is None
    config = T.MistralConfig(vocab_size=96, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, sliding_window=64)
    assert static_mode(_on_cuda(T.MistralForCausalLM(config)), _Config()) == (True, None)  # windows take it too
    assert static_mode(cpu, _Config()) is None
    assert static_mode(cpu, _Config(cache_implementation="static")) == (True, None)  # graphs are CUDA-only anyway


def test_a_step_that_does_not_compile_runs_uncompiled(monkeypatch, caplog):
    """Where torch.compile fails (no compiler), the static step warns once and runs uncompiled, still exact."""
    import lookahead.model.static as S

    def broken(fn, **options):
        def run(*args, **kwargs):
            raise RuntimeError("no compiler here")
        return run

    monkeypatch.setattr(S.torch, "compile", broken)
    model = tiny_model("qwen2")
    ids = repeated_prompt(1, 40)[None]
    expected = model.generate(ids, do_sample=False, max_new_tokens=24)
    with caplog.at_level("WARNING", logger="lookahead.model.static"):
        out = generate(model, ids, max_new_tokens=24, cache_implementation="static",
                       compile_config=T.CompileConfig())
    assert torch.equal(out, expected)
    assert sum("compiling the static step failed" in r.message for r in caplog.records) == 1


def test_slot_cache_writes_each_row_at_its_own_slots():
    """update() writes every row's keys at that row's slots and returns the whole buffers."""
    config = T.LlamaConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1)
    cache = SlotCache(config, batch=2, slots=6, dtype=torch.float32, device="cpu")
    cache.writes = torch.tensor([[1, 2], [4, 5]])
    keys = torch.arange(2 * 2 * 4, dtype=torch.float32).reshape(2, 1, 2, 4)
    out, _ = cache.update(keys, keys, 0)
    assert out.shape == (2, 1, 6, 4)
    assert torch.equal(out[0, 0, 1:3], keys[0, 0]) and torch.equal(out[1, 0, 4:6], keys[1, 0])
    assert out[0, 0, [0, 3, 4, 5]].abs().sum() == 0
    cache.move(torch.tensor([[4, 5], [4, 5]]), torch.tensor([[0, 1], [0, 1]]))
    assert torch.equal(cache.layers[0].keys[1, 0, :2], keys[1, 0]) and cache.layers[0].keys[0, 0, :2].abs().sum() == 0


def test_widths_are_the_captured_sizes():
    """Steps are padded to a few widths, so that few CUDA graphs serve every draft size (fewer when each is also a
    compilation)."""
    assert WIDTHS == (1, 2, 4, 8, 16, 32, 64) and COMPILED_WIDTHS == (1, 4, 16, 64)


def test_static_refuses_what_it_cannot_hold():
    """Encoder-decoders are refused, naming cache_implementation; a sliding window narrower than the call is not
    (its layers get windowed masks): the tokens are greedy's."""
    bart = T.BartForConditionalGeneration(T.BartConfig(vocab_size=96, d_model=16, encoder_layers=1, decoder_layers=1,
                                                       encoder_attention_heads=2, decoder_attention_heads=2,
                                                       encoder_ffn_dim=16, decoder_ffn_dim=16)).eval()
    with pytest.raises(ValueError, match="cache_implementation='static' needs a decoder-only model"):
        generate(bart, torch.tensor([[5, 6, 7]]), max_new_tokens=4, cache_implementation="static")
    config = T.MistralConfig(vocab_size=96, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, sliding_window=64)
    mistral = T.MistralForCausalLM(config).eval()
    ids = torch.tensor([[5, 6, 7]])
    expected = mistral.generate(ids, do_sample=False, max_new_tokens=100, min_new_tokens=100)
    out = generate(mistral, ids, max_new_tokens=100, min_new_tokens=100, cache_implementation="static")
    assert torch.equal(out, expected)


@pytest.mark.parametrize("draft,in_step", [("chain", False), ("tree", False), ("chain", True)])
def test_a_compiled_step_gives_the_same_tokens(monkeypatch, draft, in_step):
    """compile_config compiles the step (once per width) before it runs; the tokens stay greedy's, chains and trees
    (whose ancestry bits and positions are inputs of the compiled step), and with the argmax compiled into the step
    (as on CUDA)."""
    import lookahead.model.static as S

    monkeypatch.setattr(S, "argmax_in_step", lambda device: in_step)
    model = tiny_model("llama")
    ids = repeated_prompt(0, 40)[None]
    expected = model.generate(ids, do_sample=False, max_new_tokens=30)
    budget = dict(num_draft_tokens=3) if draft == "chain" else dict(lookup="suffix", draft="tree", max_draft_nodes=12)
    out, stats = generate(model, ids, max_new_tokens=30, cache_implementation="static",
                          compile_config=T.CompileConfig(), return_stats=True, **budget)
    assert torch.equal(out, expected) and {s.argmax for s in S._STATES[model]} == {in_step}
    assert stats.accepted_tokens > 0 and stats.forward_passes < 30


@pytest.mark.parametrize("lookup, draft", [("suffix", "chain"), ("suffix", "tree"), ("ngram", "chain")])
def test_a_step_that_takes_its_own_argmax_is_accepted_by_it(monkeypatch, lookup, draft):
    """Where the step takes the argmax of its logits itself (on CUDA, inside its graph; forced here on a CPU), greedy
    acceptance reads those ids and reduces no logits after the prefill: the tokens stay greedy's while rows finish and
    are left out (n-gram chains: in the fused step), with the logits kept for the output, and with a processor (whose
    own scores are reduced)."""
    import lookahead.model.static as S
    from lookahead.verify.rules import argmax

    reduced = []
    monkeypatch.setattr(S, "argmax_in_step", lambda device: True)
    monkeypatch.setattr(S, "argmax", lambda scores: reduced.append(scores.shape) or argmax(scores))
    model, batch, mask, eos = _staggered()
    kwargs = dict(attention_mask=mask, max_new_tokens=40, eos_token_id=eos)
    static = dict(lookup=lookup, draft=draft, cache_implementation="static", draft_cost=0.0, return_stats=True)
    out, stats = generate(model, batch, **kwargs, **static)
    assert torch.equal(out, model.generate(batch, do_sample=False, **kwargs))
    assert len(reduced) == 1 and stats.forward_passes > 5  # the prefill's logits only
    assert {s.argmax for s in S._STATES[model]} == {True}

    rich = dict(return_dict_in_generate=True, output_scores=True, output_logits=True)
    out, _ = generate(model, batch, **kwargs, **static, **rich)
    expected = model.generate(batch, do_sample=False, **kwargs, **rich)
    assert torch.equal(out.sequences, expected.sequences)
    ours, theirs = torch.stack(out.logits), torch.stack(expected.logits)  # [steps, b, V]
    running = torch.isfinite(ours).all(-1)  # after a row finished, ours puts all mass on the pad id
    assert running.sum() > 60 and torch.allclose(ours[running], theirs[running], atol=1e-4)

    reduced.clear()
    out, stats = generate(model, batch, repetition_penalty=1.5, **kwargs, **static)
    assert torch.equal(out, model.generate(batch, do_sample=False, repetition_penalty=1.5, **kwargs))
    assert len(reduced) == stats.forward_passes  # every step's processed scores, and the prefill's


def _staggered():
    """A tiny model, a left-padded batch of 5 and an eos id that ends rows 0-3 within 25 tokens and never row 4."""
    model = tiny_model("llama", seed=3)
    batch, mask = left_padded([30, 17, 41, 25, 33])
    plain = model.generate(batch, attention_mask=mask, do_sample=False, max_new_tokens=40, eos_token_id=None)
    first = [{t: row.index(t) for t in reversed(row)} for row in plain[:, batch.shape[1]:].tolist()]
    eos = next(t for t in range(3, 96) if all(first[r].get(t, 99) < 25 for r in range(4)) and t not in first[4])
    return model, batch, mask, eos


@pytest.mark.parametrize("draft", ["chain", "tree"])
@pytest.mark.parametrize("gather_most", [None, 0])
def test_rows_that_finish_are_compacted_away_and_the_rest_stays_exact(monkeypatch, draft, gather_most):
    """When few rows still run, they move into a smaller batch (a power of four); the outputs stay greedy's, whether
    the running rows' argmax gathers their logits first or reduces them row by row (large logits: gather_most=0)."""
    import lookahead.model.static as S
    import lookahead.verify.rules as R

    if gather_most is not None:
        monkeypatch.setattr(R, "GATHER_MOST", gather_most)
    model, batch, mask, eos = _staggered()
    expected = model.generate(batch, attention_mask=mask, do_sample=False, max_new_tokens=40, eos_token_id=eos)
    out = generate(model, batch, attention_mask=mask, max_new_tokens=40, eos_token_id=eos, lookup="suffix",
                   draft=draft, cache_implementation="static", draft_cost=0.0)
    assert torch.equal(out, expected)
    assert {s.cache.rows.shape[0] for s in S._STATES[model]} == {5, 1}  # the last running row moved to a batch of 1


def test_a_compiled_step_compacts_without_compiling_again(monkeypatch):
    """A compiled step's batch dimension is dynamic: the batch of 5 and the 2 rows it is compacted into (two at
    least: one row would be a compilation of its own) share one compilation per width, and the tokens stay greedy's."""
    import lookahead.model.static as S
    from torch._dynamo.utils import counters

    model, batch, mask, eos = _staggered()
    expected = model.generate(batch, attention_mask=mask, do_sample=False, max_new_tokens=40, eos_token_id=eos)
    steps, run = [], S.StaticCausalLM._run
    monkeypatch.setattr(S.StaticCausalLM, "_run", lambda self, width: steps.append((len(self.write), width))
                        or run(self, width))
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    out = generate(model, batch, attention_mask=mask, max_new_tokens=40, eos_token_id=eos, lookup="suffix",
                   cache_implementation="static", compile_config=T.CompileConfig())
    assert torch.equal(out, expected)
    assert {b for b, _ in steps} == {5, 2}  # compacted, to two rows
    assert counters["stats"]["unique_graphs"] - before == len({w for _, w in steps})  # one compilation per width


def test_a_model_spread_over_devices_keeps_the_dynamic_cache():
    """device_map over several devices: the default stays dynamic, and an explicit static cache is refused."""
    from lookahead.model.static import static_mode

    llama = _on_cuda(tiny_model("llama"), devices=frozenset({"0", "1"}))  # device_map over two devices
    assert static_mode(llama, _Config()) is None
    with pytest.raises(ValueError, match="cache_implementation='static' keeps the cache on one device"):
        static_mode(llama, _Config(cache_implementation="static"))


def test_a_step_that_cannot_be_captured_runs_without_graphs(monkeypatch, caplog):
    """Where capturing a CUDA graph fails (here: no CUDA at all), the step warns once and runs without graphs."""
    from lookahead.model.static import StaticCausalLM

    model = tiny_model("phi3")
    ids = repeated_prompt(2, 40)[None]
    expected = model.generate(ids, do_sample=False, max_new_tokens=24)
    init = StaticCausalLM.__init__

    def with_graphs(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.graphs = True  # as on CUDA

    monkeypatch.setattr(StaticCausalLM, "__init__", with_graphs)
    with caplog.at_level("WARNING", logger="lookahead.model.static"):
        out = generate(model, ids, max_new_tokens=24, cache_implementation="static")
    assert torch.equal(out, expected)
    assert sum("capturing the static step as a CUDA graph failed" in r.message for r in caplog.records) == 1


def test_clear_frees_the_kept_caches():
    from lookahead.model.static import _STATES, clear

    model = tiny_model("llama")
    generate(model, repeated_prompt(0, 30)[None], max_new_tokens=4, cache_implementation="static")
    assert _STATES[model]
    clear(model)
    assert model not in _STATES


def test_no_room_for_a_new_cache_drops_the_kept_ones_and_retries(monkeypatch):
    """An out-of-memory error while allocating a cache drops the model's other kept caches and tries once more."""
    import lookahead.model.static as S

    model = tiny_model("llama")
    facts = S.ModelFacts.of(model)
    kept = S._state(model, facts, 2, 100, None)
    real, calls = S._State, []

    def tight(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == 1:
            raise torch.OutOfMemoryError("no room")
        return real(*args, **kwargs)

    monkeypatch.setattr(S, "_State", tight)
    state = S._state(model, facts, 3, 100, None)
    assert calls == [3, 3] and S._STATES[model] == [state] and kept not in S._STATES[model]


def test_threads_generating_with_one_model_get_their_own_caches():
    """Two threads that generate with one model at once each get exact output (each has its own static cache)."""
    import threading

    from lookahead.model.static import _STATES

    model = tiny_model("gpt2")
    prompts = [repeated_prompt(seed, 40)[None] for seed in (5, 6)]
    expected = [model.generate(ids, do_sample=False, max_new_tokens=30) for ids in prompts]
    results = {}

    def run(i):
        results[i] = [generate(model, prompts[i], max_new_tokens=30, cache_implementation="static")
                      for _ in range(3)]

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(out, expected[i]) for i in (0, 1) for out in results[i])
    assert len({s.key[-1] for s in _STATES[model]}) == 2


@pytest.mark.parametrize("draft, option, given, holds", [("chain", "num_draft_tokens", 10, 15),
                                                          ("tree", "max_draft_nodes", 32, 63)])
def test_unset_draft_budgets_draft_what_the_static_width_holds(draft, option, given, holds):
    """Unset, num_draft_tokens is 10 on the dynamic cache and 15 on a static step (whose width for 10 drafts is 16),
    max_draft_nodes 32 and 63 (width 64): fewer forwards, the same tokens; given, they cap the drafts as before. The
    model is forced to copy a long span of its prompt, so that every draft along the copy is accepted."""
    from lookahead.bench.forcing import ForcedOutputs

    model = tiny_model("llama")
    prompt = torch.randint(1, model.config.vocab_size - 1, (300,), generator=torch.Generator().manual_seed(0))
    forced = ForcedOutputs([(prompt.tolist(), prompt[40:260].tolist())], eos_token_id=0)
    handle = forced.attach(model)
    base = dict(lookup="suffix", draft="tree") if draft == "tree" else {}
    calls = {}
    try:
        for name, kwargs in {"static": dict(cache_implementation="static"), "dynamic": {},
                             "static, given": dict(cache_implementation="static", **{option: given})}.items():
            forced.reset()
            calls[name] = generate(model, prompt[None], max_new_tokens=200, return_stats=True, draft_cost=0.0,
                                   eos_token_id=0, **base, **kwargs)
    finally:
        handle.remove()
    assert all(out[0, 300:].tolist() == prompt[40:240].tolist() for out, _ in calls.values())
    forwards = {name: stats.forward_passes for name, (_, stats) in calls.items()}
    assert forwards["static"] < forwards["static, given"] == forwards["dynamic"]
    assert calls["static"][1].new_tokens / (forwards["static"] - 1) > given + 1
    assert calls["static, given"][1].new_tokens / (forwards["static, given"] - 1) <= given + 1 < holds


@pytest.mark.parametrize("draft, option", [("chain", "num_draft_tokens"), ("tree", "max_draft_nodes")])
def test_budgets_beyond_the_widest_static_step_are_cut_with_a_warning(caplog, draft, option):
    """A static step verifies at most 63 draft tokens or nodes per row (its ancestry bits fit one int64): a larger
    budget drafts 63, says so naming the argument, and the tokens stay greedy's."""
    model = tiny_model("llama")
    ids = repeated_prompt(0, 200)[None]
    expected = model.generate(ids, do_sample=False, max_new_tokens=100)
    base = dict(lookup="suffix", draft="tree") if draft == "tree" else {}
    with caplog.at_level("WARNING", logger="lookahead"):
        for _ in range(2):
            out = generate(model, ids, max_new_tokens=100, cache_implementation="static", draft_cost=0.0, **base,
                           **{option: 100})
            assert torch.equal(out, expected)
    assert caplog.text.count(f"{option}=100 is more than a static step verifies per row; drafting at most 63") == 1


def _inputs_by_numpy(rows, last, tokens, parents, pos, write, width):
    """What `static_inputs` writes, built from the ancestry matrix column by column (the rule it replaced)."""
    from lookahead.verify import tree as TR

    b, n = len(pos), tokens.shape[1] + 1
    host = np.zeros((b, 3 * width + 1), dtype=np.int64)
    host[:, width:2 * width] = pos[:, None] + np.arange(width)[None]
    host[:, 2 * width] = write
    host[:, 2 * width + 1:] = 1 << np.arange(width)
    seen, depth = TR.ancestry(parents)
    host[rows, 0] = last
    host[rows, 1:n] = tokens
    host[rows, width:width + n] = pos[rows, None] + depth
    host[rows, 2 * width + 1:2 * width + 1 + n] = (seen * (1 << np.arange(n))[None, None]).sum(-1)
    return host


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_static_inputs_kernel_matches_the_ancestry_matrix(data):
    """Tokens, positions (depth below the root) and ancestry bits of every query, for random trees (chains among
    them) of random running rows, as the ancestry matrix gives them; rows that do not run see themselves only."""
    from lookahead.model.static import _BIT
    from lookahead.model import _kernels as K

    b = data.draw(st.integers(1, 5))
    rows = np.array(sorted(data.draw(st.sets(st.integers(0, b - 1), min_size=1))), dtype=np.int64)
    nodes = data.draw(st.integers(0, 40))
    width = data.draw(st.sampled_from([w for w in (1, 2, 4, 8, 16, 32, 64) if w >= nodes + 1]))
    parents = np.array([[data.draw(st.integers(-1, j - 1)) for j in range(nodes)] for _ in rows],
                       dtype=np.int64).reshape(len(rows), nodes)
    tokens = np.array(data.draw(st.lists(st.integers(0, 99), min_size=len(rows) * nodes, max_size=len(rows) * nodes)),
                      dtype=np.int64).reshape(len(rows), nodes)
    last = np.arange(len(rows), dtype=np.int64) + 500
    pos = np.array(data.draw(st.lists(st.integers(0, 300), min_size=b, max_size=b)), dtype=np.int64)
    write = pos + 7
    host = np.full((b, 3 * width + 1), -5, dtype=np.int64)
    K.static_inputs(host, rows, last, tokens, parents, pos, write, width, _BIT)
    assert np.array_equal(host, _inputs_by_numpy(rows, last, tokens, parents, pos, write, width))


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_a_tree_commits_moves_pack_each_running_rows_path_behind_its_next_slot(data):
    """`pack_moves`: a running row reads its root's and accepted nodes' slots (next slot + column) and writes them at
    its next slots in order; every other batch row moves its next slot onto itself (a plain numpy reference)."""
    from lookahead.model import _kernels as K

    b, w = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 8))
    rows = np.array(sorted(data.draw(st.sets(st.integers(0, b - 1), min_size=1))), dtype=np.int64)
    write = np.array(data.draw(st.lists(st.integers(0, 500), min_size=b, max_size=b)), dtype=np.int64)
    cols = np.zeros((len(rows), w + 3), dtype=np.int64)
    for k in range(len(rows)):  # a root, then increasing node columns
        cols[k, 1:w] = sorted(data.draw(st.sets(st.integers(1, 40), min_size=w - 1, max_size=w - 1)))
    view = cols[:, :w]  # as the fused trees pass it: the first columns of a buffer
    moves = np.full((2, b, w), -1, dtype=np.int64)
    K.pack_moves(write, rows, view, moves)
    src, dst = np.repeat(write[:, None], w, 1), np.repeat(write[:, None], w, 1)
    src[rows] += view
    dst[rows] += np.arange(w)[None, :]
    assert np.array_equal(moves[0], src) and np.array_equal(moves[1], dst)


def test_a_tree_commits_move_buffer_is_kept_by_the_state_and_grows_when_a_step_is_wider():
    """`_moves`: one host buffer per kept state, reused by every commit (no allocation per step), and grown when a
    step is wider than it (a later call sharing the state may verify wider trees)."""
    from lookahead.model.static import StaticCausalLM

    model, ids = tiny_model("llama"), torch.ones((2, 4), dtype=torch.long)
    from lookahead.model.facts import ModelFacts

    target = StaticCausalLM(model, ModelFacts.of(model), ids, torch.ones_like(ids), 8, 3, graphs=False)
    two, four = target._moves(2), target._moves(4)
    assert two.shape == (2, 2, 2) and four.shape == (2, 2, 4) and two.data_ptr() == four.data_ptr()
    wide = target._moves(40)
    assert wide.shape == (2, 2, 40) and target._moves(2).data_ptr() == wide.data_ptr() == target.state.moves.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gather_most", [1 << 20, 0])
def test_the_running_rows_argmax_is_the_gathered_rows_argmax(monkeypatch, dtype, gather_most):
    """`argmax_rows`: each running row's argmax over its first n columns, gathered first or row by row in place."""
    import lookahead.verify.rules as R

    monkeypatch.setattr(R, "GATHER_MOST", gather_most)
    torch.manual_seed(0)
    logits, rows = torch.randn(6, 8, 50).to(dtype), torch.tensor([0, 2, 3, 5])
    assert np.array_equal(R.argmax_rows(logits, rows, 5), logits[rows, :5].float().argmax(-1).numpy())
