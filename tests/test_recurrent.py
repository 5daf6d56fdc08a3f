"""Recurrent layers (gated delta nets, Mamba, short convolutions) follow the accepted path: drafts that are partly
accepted, in one row and in left-padded batches, give model.generate's tokens; sampling keeps the target's law;
trees and the static cache are refused by name; the hooks leave the model as it was."""
import re
import sys

import pytest
import torch
from hypothesis import given, strategies as st

from transformers import CompileConfig

import families as F
import lookahead
from lookahead.model import delta, griffin, recurrent
from lookahead.model.cache import new_cache

# one family per kind of recurrent module: gated delta net, Mamba2 stepped and continued, Mamba, short convolutions,
# a parallel hybrid (attention and Mamba in one layer), lightning attention in a cache of its own (MiniMax),
# RecurrentGemma's Griffin blocks (states on the modules), Zaya's convolved attention projections (a conv_mask),
# Inkling's short convolutions in sliding-window layers, Qwen4-Exp's gated delta nets beside an indexer that reads its
# keys' positions from the cache, xLSTM's mLSTM states in a cache of its own, RWKV's blocks in the state its forward
# takes (no cache)
KINDS = ["qwen3_5_text", "nemotron_h", "granitemoehybrid", "mamba", "lfm2", "falcon_h1", "kimi_linear", "minimax",
         "recurrent_gemma", "zaya", "inkling_text", "qwen4_exp_text", "xlstm", "rwkv"]


def _model(name):
    if name not in F.causal_types():
        pytest.skip(f"transformers has no {name}")
    return F.tiny_model(name)


def corrupted(tokens: torch.Tensor, every: int = 5) -> list:
    """The tokens with every `every`-th one changed: a document whose drafts are accepted up to a change, then
    rejected there."""
    out = tokens.clone()
    out[every - 1::every] = (out[every - 1::every] + 1) % F.VOCAB
    return out.tolist()


@pytest.mark.parametrize("name", [k for k in KINDS if k != "recurrent_gemma"]  # its states live on its modules,
                         + ["bamba", "zamba", "zamba2", "jamba", "qwen3_next", "lfm3", "mamba2"])  # not in two caches
def test_several_tokens_continue_a_cached_state(name):
    """Inside `recurrent.stepping`, a forward over several tokens from a cached state, then a one-token forward, give
    the logits that one-token forwards give (model.generate's decoding, which for some families differs from one
    forward over the whole text): what a verification forward and the next step rely on. The modules in `STEPPED`
    run a token at a time there; the others continue the state themselves."""
    from lookahead.model.facts import cache_kwarg

    model = _model(name)
    ids, kv = F.prompt(60), cache_kwarg(model)  # RWKV: its `state`

    def forward(cache, start, end):  # positions given, as lookahead gives them (not read from the cache's length)
        positions = torch.arange(start, end)[None]
        return model(ids[:, start:end], **{kv: cache}, use_cache=True, position_ids=positions).logits[0]

    with torch.no_grad(), recurrent.stepping(model):
        for width in (3, 7):
            caches = new_cache(model), new_cache(model)
            for cache in caches:
                forward(cache, 0, 40)
            many, one = forward(caches[0], 40, 40 + width), forward(caches[0], 40 + width, 41 + width)
            decoded = [forward(caches[1], t, t + 1) for t in range(40, 41 + width)]
            torch.testing.assert_close(torch.cat([many, one]), torch.cat(decoded), atol=5e-4, rtol=1e-4)  # logits
            # of 8-10: float32 rounding through a few layers (a wrong state differs by 1 to 10)


@pytest.mark.parametrize("name", KINDS)
def test_partly_accepted_drafts_give_generate_tokens(name):
    """Drafts from a document that agrees with greedy's output except at every fifth token are accepted up to the
    change and rejected there: every step settles the recurrent states on the accepted path, and the tokens are
    model.generate's."""
    model = _model(name)
    ids = F.prompt()
    want = F.reference(model, ids)
    out, stats = lookahead.generate(model, ids, documents=[corrupted(want)], draft_cost=0, max_new_tokens=F.NEW,
                                    min_new_tokens=F.NEW, return_stats=True)
    assert out[0, ids.shape[1]:].tolist() == want.tolist()
    assert stats.accepted_tokens >= F.NEW // 3 and stats.draft_tokens - stats.accepted_tokens >= 4


@pytest.mark.parametrize("name", ["qwen3_5_text", "nemotron_h", "lfm2", "recurrent_gemma", "zaya", "qwen4_exp_text",
                                  "xlstm", "rwkv"])
def test_a_padded_batch_settles_each_row_on_its_own_path(name):
    """Two left-padded rows of different lengths, each drafting from its own corrupted document, accept different
    numbers of drafts per step: each row equals model.generate on its own prompt."""
    model = _model(name)
    ids, mask = F.padded_batch()
    rows = [ids[0:1], ids[1:2, 10:]]
    wants = [F.reference(model, row) for row in rows]
    documents = [[corrupted(wants[0], 4)], [corrupted(wants[1], 7)]]
    out = lookahead.generate(model, ids, attention_mask=mask, documents=documents, draft_cost=0,
                             max_new_tokens=F.NEW, min_new_tokens=F.NEW)
    for i, want in enumerate(wants):
        assert out[i, ids.shape[1]:].tolist() == want.tolist()


@pytest.mark.parametrize("name", ["qwen3_5_text", "rwkv"])
def test_the_job_gives_each_line_generate_tokens(tmp_path, name):
    """`lookahead generate` (the JSONL job, local engine) on a hybrid and on a recurrent-only model: three lines of
    different lengths in one batch, each drafting from its own document that agrees with greedy's output but at every
    fifth token; each line's output_ids are model.generate's on its own prompt, with drafts accepted."""
    import io
    import json

    from lookahead import models
    from lookahead.job import run

    model, tok = _model(name), models.load(models.default_model_path())[1]  # the tiny vocabulary is the tokenizer's
    prompts = [F.prompt(30 + 5 * k, seed=k) for k in range(3)]
    wants = [F.reference(model, ids).tolist() for ids in prompts]
    lines = [{"id": k, "input_ids": ids[0].tolist(), "documents": [corrupted(torch.tensor(want))]}
             for k, (ids, want) in enumerate(zip(prompts, wants))]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = run(str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"), model=lambda: (model, tok),
                  max_new_tokens=F.NEW, batch_size=3, errors=io.StringIO(), progress=False)
    records = {r["id"]: r for r in map(json.loads, open(tmp_path / "out.jsonl"))}
    assert (summary.written, summary.failed) == (3, 0)
    assert [records[k]["output_ids"] for k in range(3)] == wants
    assert sum(records[k]["forwards"] for k in range(3)) < 3 * F.NEW  # drafts were accepted


def test_a_griffin_block_continues_its_states_as_decoding_does():
    """Over several tokens from a cached state, a Griffin block inside a verification forward gives, in fp32, the
    outputs and states that its one-token (decoding) forward gives token after token, to the rounding of its linear
    layers over several rows (its own multi-token forward restarts the convolution from zero: far from them)."""
    model = _model("recurrent_gemma")
    block = griffin.griffin_blocks(model)[0]
    width = block.conv_1d.weight.shape[0]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, model.config.hidden_size, generator=g)
    positions = torch.arange(30, 36)[None].expand(2, -1)
    start = torch.randn(2, width, block.conv1d_width - 1, generator=g), torch.randn(2, width, generator=g)
    with torch.no_grad():
        block.conv1d_state, block.rg_lru.recurrent_states = start
        outs, states = [], []
        for t in range(6):
            outs.append(block(x[:, t:t + 1], positions[:, t:t + 1], None)[0])
            states.append((block.conv1d_state, block.rg_lru.recurrent_states))
        block.conv1d_state, block.rg_lru.recurrent_states = start
        follower = griffin.BlockStates(model)
        with follower.forward():
            out = block(x, positions, None)[0]
        whole = block(x, positions, None)[0]  # its own forward: a prefill
    torch.testing.assert_close(out, torch.cat(outs, dim=1), rtol=0, atol=1e-6)
    assert (whole - out).abs().max() > 1e-2
    recorded = follower.record[block]
    assert len(recorded) == 6
    for (conv, state), (conv_want, state_want) in zip(recorded, states):
        torch.testing.assert_close(conv, conv_want, rtol=0, atol=1e-6)
        torch.testing.assert_close(state, state_want, rtol=0, atol=1e-6)


def _a_row_leaves(model, **kwargs):
    """A left-padded batch of two rows drafting from their own corrupted documents, the short row ending early (its
    eos), the other going on without it: assert each equals model.generate on its own prompt; the call's stats."""
    ids, mask = F.padded_batch()
    wants = [F.reference(model, row) for row in (ids[0:1], ids[1:2, 10:])]
    eos = next(int(t) for t in wants[1][5:] if int(t) not in wants[0].tolist())
    model.generation_config.eos_token_id = eos
    try:
        documents = [[corrupted(wants[0], 4)], [corrupted(wants[1], 6)]]
        out, stats = lookahead.generate(model, ids, attention_mask=mask, documents=documents, draft_cost=0,
                                        max_new_tokens=F.NEW, return_stats=True, **kwargs)
    finally:
        model.generation_config.eos_token_id = None
    short = wants[1].tolist().index(eos) + 1
    assert out[1, ids.shape[1]:ids.shape[1] + short].tolist() == wants[1][:short].tolist()
    assert out[0, ids.shape[1]:].tolist() == wants[0].tolist()
    assert stats.new_tokens_by_row == [F.NEW, short]
    return stats


def test_griffin_states_follow_rows_that_leave_the_batch():
    """RecurrentGemma's blocks hold their states themselves: when a row of a left-padded batch ends (its eos) and
    leaves the batch, the other row's states stay its own, and both rows equal model.generate; the blocks' own
    forward is back after the call."""
    model = _model("recurrent_gemma")
    stats = _a_row_leaves(model)
    assert stats.draft_tokens > stats.accepted_tokens > F.NEW // 2
    assert all("forward" not in vars(block) for block in griffin.griffin_blocks(model))


def test_sampling_from_a_hybrid_keeps_the_target_law():
    """A gated-delta-net hybrid samples the target's joint law of its first 4 tokens (chi-square), while drafts are
    accepted and rejected."""
    import test_sampling as S
    import transformers as T

    config = T.Qwen3NextConfig(vocab_size=S.V, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                               num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=2,
                               linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                               num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                               shared_expert_intermediate_size=16, layer_types=["linear_attention", "full_attention"],
                               max_position_embeddings=64, initializer_range=0.5, bos_token_id=None,
                               eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    model = T.Qwen3NextForCausalLM(config).eval()
    base = torch.tensor([[3, 1, 4, 1, 5, 2]])
    prompt = torch.cat([model.generate(base, do_sample=False, max_new_tokens=6), base], dim=1)
    probs = S.exact_joint(model, prompt)
    counts, stats = S.lookahead_samples(model, prompt)
    assert counts[probs == 0].sum() == 0
    assert S.chi_square_pvalue(counts, probs) > 1e-3
    accepted, drafted = sum(s.accepted_tokens for s in stats), sum(s.draft_tokens for s in stats)
    assert accepted > S.N / 8 and drafted - accepted > S.N / 8


@pytest.mark.parametrize("name, kwargs, message", [
    ("qwen3_5_text", {"lookup": "suffix", "draft": "tree"},
     r"draft='tree' is not supported for Qwen3_5ForCausalLM: its recurrent layers carry one state along one sequence "
     r"of tokens"),
    ("qwen3_5_text", {"cache_implementation": "static", "compile_config": CompileConfig()},
     r"cache_implementation='static' would compile or capture the step of Qwen3_5ForCausalLM, whose recurrent states "
     r"lookahead settles around an eager step: pass disable_compile=True"),
    ("recurrent_gemma", {"cache_implementation": "static"},
     r"cache_implementation='static' is not supported for RecurrentGemmaForCausalLM: its recurrent blocks keep their "
     r"states on the modules"),
    ("inkling_text", {"cache_implementation": "static"},
     r"cache_implementation='static' is not supported for InklingForCausalLM: its layers keep recurrent states beside "
     r"a sliding window"),
    ("minimax", {"cache_implementation": "static"},
     r"cache_implementation='static' is not supported for MiniMaxForCausalLM: its recurrent states live in a cache of "
     r"its own \(MiniMaxCache\)"),
    ("xlstm", {"cache_implementation": "static"},
     r"cache_implementation='static' is not supported for xLSTMForCausalLM: its recurrent states live in a cache of "
     r"its own \(xLSTMCache\)"),
    ("rwkv", {"cache_implementation": "static"},
     r"cache_implementation='static' is not supported for RwkvForCausalLM: its blocks keep their states in the state "
     r"its forward takes"),
    ("rwkv", {"lookup": "suffix", "draft": "tree"},
     r"draft='tree' is not supported for RwkvForCausalLM: its recurrent layers carry one state"),
])
def test_what_a_state_cannot_follow_is_refused_by_name(name, kwargs, message):
    """A tree asked of a hybrid, a compiled static step, and the static cache where the states are not transformers'
    recurrent cache layers alone, are refused before any forward, naming what works instead."""
    model = _model(name)
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(ValueError, match=message):
            lookahead.generate(model, F.prompt(), max_new_tokens=5, **kwargs)
    finally:
        hook.remove()
    assert not calls


def test_a_window_cut_by_slot_beside_recurrent_states_runs_batches_a_row_at_a_time():
    """Inkling's sliding-window layers that keep recurrent states cut their window by cache slot (their own cache
    layer's): one row per call is exact (`test_partly_accepted_drafts_give_generate_tokens`); a batch of several rows,
    whose rows would keep the slots of rejected drafts, runs a row at a time (said), each row exact; transformers
    calling lookahead's loop on the whole batch (`custom_generate`) is refused before any forward; the server runs
    each row in a batch of its own (`tests/test_serve.py`)."""
    from lookahead.decode.fallback import RowsApartWarning
    from lookahead.serve.engine import Engine

    model = _model("inkling_text")
    ids, mask = F.padded_batch()
    with pytest.warns(RowsApartWarning, match="recurrent states cut their sliding window by cache slot"):
        out = lookahead.generate(model, ids, attention_mask=mask, max_new_tokens=F.NEW, min_new_tokens=F.NEW)
    for i, row in enumerate((ids[0:1], ids[1:2, 10:])):
        assert out[i, ids.shape[1]:].tolist() == F.reference(model, row).tolist()
    with pytest.raises(ValueError, match=r"a batch of 2 rows is not supported for InklingForCausalLM: its layers that "
                                         r"keep recurrent states cut their sliding window by cache slot"):
        model.generate(ids, attention_mask=mask, custom_generate=lookahead.custom_generate, max_new_tokens=5)
    assert "cut their sliding window by cache slot" in Engine(model, draft_cost=0).apart  # served a row apart


STATIC = [k for k in KINDS if k not in ("minimax", "recurrent_gemma", "inkling_text", "xlstm", "rwkv")] + ["mamba2", "qwen3_next",
                                                                                         "zamba2"]


@pytest.mark.parametrize("name", STATIC)
def test_the_static_cache_settles_states_on_the_accepted_path(name):
    """In the static cache (eager steps padded to fixed widths), drafts accepted up to a change and rejected there
    settle each recurrent state on the accepted tokens: model.generate's tokens."""
    model = _model(name)
    ids = F.prompt()
    want = F.reference(model, ids)
    out, stats = lookahead.generate(model, ids, documents=[corrupted(want)], draft_cost=0, max_new_tokens=F.NEW,
                                    min_new_tokens=F.NEW, cache_implementation="static", return_stats=True)
    assert out[0, ids.shape[1]:].tolist() == want.tolist()
    assert stats.accepted_tokens >= F.NEW // 3 and stats.draft_tokens - stats.accepted_tokens >= 4


@pytest.mark.parametrize("name", ["qwen3_5_text", "nemotron_h", "lfm2", "mamba", "falcon_h1", "zaya", "lfm3",
                                  "lara_mini", "qwen4_exp_text"])
def test_a_static_padded_batch_keeps_each_row_on_its_own_path(name):
    """A left-padded batch in the static cache: the padding is kept out of the recurrent states (as model.generate
    keeps it), each row settles on its own accepted tokens, and when the short row ends (its eos) the other moves
    into a batch of one with its states (compaction): each row equals model.generate on its own prompt."""
    stats = _a_row_leaves(_model(name), cache_implementation="static")
    assert stats.accepted_tokens >= F.NEW // 3


@given(length=st.integers(1, 12), heads=st.sampled_from([(2, 2), (1, 3)]), rows=st.integers(1, 2),
       seed=st.integers(0, 2 ** 16), steep=st.booleans())
def test_one_chunk_is_the_gated_delta_rule_token_by_token(length, heads, rows, seed, steep):
    """`delta.one_chunk` (a verification forward's scan as one chunk) gives the outputs and final state of
    transformers' token-by-token gated delta rule (what decoding runs), grouped value heads and steep decays included;
    its record gives the state after every prefix, as decoding only that prefix leaves it."""
    rule = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5").torch_recurrent_gated_delta_rule
    generator = torch.Generator().manual_seed(seed)
    (k_heads, v_heads), d = heads, 8
    q, k = (torch.randn(rows, length, k_heads, d, generator=generator) for _ in range(2))
    v = torch.randn(rows, length, v_heads, d, generator=generator)
    g = -torch.rand(rows, length, v_heads, generator=generator) * (12.0 if steep else 1.0)
    beta, start = torch.rand(rows, length, v_heads, generator=generator), torch.randn(rows, v_heads, d, d)
    out, final, record = delta.one_chunk(q, k, v, g, beta, start.clone())
    want, want_final = rule(q, k, v, g=g, beta=beta, initial_state=start.clone(), output_final_state=True,
                            use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(final, want_final, atol=1e-5, rtol=1e-4)
    for n in range(1, length + 1):
        _, prefix = rule(q[:, :n], k[:, :n], v[:, :n], g=g[:, :n], beta=beta[:, :n], initial_state=start.clone(),
                         output_final_state=True, use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(delta.state_after(record, n), prefix, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(delta.state_after(record, n, torch.tensor([rows - 1])), prefix[rows - 1:],
                                   atol=1e-5, rtol=1e-4)


def test_gated_delta_nets_settle_without_running_again():
    """After a verification forward of 7 tokens, rows keeping 3 and 7 of them get the states decoding those tokens
    alone leaves (recurrent state and convolution window), and no recurrent module runs again to get them."""
    model = _model("qwen3_5_text")
    ids = F.prompt(60)[:, :47].repeat(2, 1)
    with torch.no_grad():
        cache, reference = new_cache(model), new_cache(model)
        model(ids[:, :40], cache=cache, use_cache=True)
        model(ids[:1, :40], cache=reference, use_cache=True)
        states = recurrent.Checkpoints(model, cache)
        with states.forward():
            model(ids[:, 40:47], cache=cache, use_cache=True)
        calls = []
        hooks = [m.register_forward_pre_hook(lambda *a: calls.append(a)) for m in states.modules]
        try:
            states.settle(torch.tensor([3, 7]))
        finally:
            states.close()
            for hook in hooks:
                hook.remove()
        assert not calls and states.records
        for t in range(40, 43):
            model(ids[:1, t:t + 1], cache=reference, use_cache=True)
    for i in recurrent.recurrent_layers(cache):
        for kind in ("conv_states", "recurrent_states"):
            got, want = getattr(cache.layers[i], kind)[0], getattr(reference.layers[i], kind)[0]
            torch.testing.assert_close(got[:1], want, atol=1e-5, rtol=1e-4)


def test_the_model_is_left_as_it_was():
    """After a call (and after failing ones, before and after the target is built), no hook of lookahead's stays on
    the recurrent modules and the stepped ones have their own forward back."""
    model = _model("nemotron_h")
    modules = recurrent.recurrent_modules(model)
    lookahead.generate(model, F.prompt(), max_new_tokens=8)
    with pytest.raises(ValueError):
        lookahead.generate(model, F.prompt(), max_new_tokens=8, num_beams=2)
    with pytest.raises(ValueError, match="documents must hold token ids"):  # refused once the target is built
        lookahead.generate(model, F.prompt(), max_new_tokens=8, documents=[[F.VOCAB + 5, 3, 4]])
    for module in modules:
        assert not module._forward_pre_hooks
        assert "forward" not in vars(module)
    gated = _model("qwen3_5_text")
    scan = getattr(sys.modules[type(recurrent.recurrent_modules(gated)[0]).__module__], delta.SCAN)
    cache = new_cache(gated)
    lookahead.generate(gated, F.prompt(), max_new_tokens=8, cache=cache)
    assert getattr(sys.modules[type(recurrent.recurrent_modules(gated)[0]).__module__], delta.SCAN) is scan
    assert all("update_conv_state" not in vars(layer) for layer in cache.layers)


def test_layers_not_drafted_over_fall_back_to_model_generate_and_say_why():
    """A model lookahead cannot draft over (XLNet: its memories are no KV cache to roll back) is not refused: the call runs
    model.generate's own decoding (its greedy tokens, a fixed seed's sample), warns with the reason, and its stats say
    so; the plugin path (transformers calling lookahead's loop) still refuses, with the reason."""
    from lookahead.decode.fallback import FallbackWarning

    model = _model("xlnet")
    ids = F.prompt()
    reason = r"XLNetLMHeadModel keeps no KV cache that lookahead can roll back"
    with pytest.warns(FallbackWarning, match=reason):
        out, stats = lookahead.generate(model, ids, max_new_tokens=12, min_new_tokens=12, return_stats=True)
    assert out[0, ids.shape[1]:].tolist() == F.reference(model, ids, 12).tolist()
    assert re.search(reason, stats.fallback)
    assert (stats.new_tokens, stats.forward_passes, stats.draft_tokens, stats.tokens_per_forward) == (12, 12, 0, 1.0)
    with pytest.warns(FallbackWarning):
        sampled = [lookahead.generate(model, ids, max_new_tokens=12, do_sample=True, generator=seed)
                   for seed in (5, 5, 6)]
    torch.manual_seed(5)
    want = model.generate(ids, max_new_tokens=12, do_sample=True)
    assert torch.equal(sampled[0], want) and torch.equal(sampled[1], want)
    assert not torch.equal(sampled[2], want)
    with pytest.warns(FallbackWarning):
        out = lookahead.generate(model, ids, max_new_tokens=12, return_dict_in_generate=True)
    assert out.lookahead_stats.fallback is not None and out.sequences.shape == (1, ids.shape[1] + 12)
    with pytest.raises(ValueError, match=reason):
        model.generate(ids, custom_generate=lookahead.custom_generate, max_new_tokens=5)



def test_a_layer_kind_lookahead_does_not_know_falls_back(monkeypatch):
    """A layer kind lookahead does not know (none in transformers 5.24 since DeepSeek-V4's compressed attention is
    followed; here full attention, struck from the known kinds) runs model.generate's own decoding, said with the
    layers' names, and the plugin path refuses with the same reason."""
    from lookahead import _validate
    from lookahead.decode.fallback import FallbackWarning

    model, ids = _model("llama"), F.prompt()
    monkeypatch.setattr(_validate, "KNOWN", tuple(k for k in _validate.KNOWN if k != "full_attention"))
    reason = r"LlamaForCausalLM has layers of a kind lookahead does not know \(full_attention"
    with pytest.warns(FallbackWarning, match=reason):
        out = lookahead.generate(model, ids, max_new_tokens=12, min_new_tokens=12)
    assert out[0, ids.shape[1]:].tolist() == F.reference(model, ids, 12).tolist()
    with pytest.raises(ValueError, match=reason):
        model.generate(ids, custom_generate=lookahead.custom_generate, max_new_tokens=5)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
