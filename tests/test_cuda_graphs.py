"""The static step captured as CUDA graphs and replayed, run on a CPU stand-in with CUDA graphs' semantics
(`graphs.CpuGraph`: fixed tensors, frozen Python values, no host syncs): `generate` and the server's rows joining and
leaving a captured batch give greedy's tokens."""
import logging

import pytest
import torch

from graphs import cpu_graphs
from lookahead import generate
from models import CONFIGS
from test_serve import reference  # noqa: F401 (a fixture)
from test_static import static_calls_match_greedy


@pytest.fixture
def captured(monkeypatch, caplog):
    """Static targets capture their steps as `CpuGraph`s; the test fails if a capture failed."""
    graphs = cpu_graphs(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="lookahead.model.static"):
        yield graphs
    assert not [r.message for r in caplog.records if "CUDA graph failed" in r.message]


def _capture(graphs, fn):
    graph = graphs()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def test_a_replay_reads_the_tensors_it_captured_and_freezes_python_values(captured):
    """As on CUDA: a tensor changed in place is read anew, a tensor replaced is not, a Python number stays what it
    was at capture."""
    x, scale = torch.zeros(3), {"n": 2.0}
    graph, y = _capture(captured, lambda: x * scale["n"] + 1)
    x.add_(1)
    scale["n"] = 10.0
    graph.replay()
    assert y.tolist() == [3.0, 3.0, 3.0]
    x = torch.full((3,), 5.0)  # a new tensor: the graph still reads the old one
    graph.replay()
    assert y.tolist() == [3.0, 3.0, 3.0]


def test_a_host_sync_fails_the_capture(captured):
    """`.item()`, `if tensor:` and `nonzero` wait for the device: CUDA refuses them while capturing."""
    x = torch.ones(3)
    for sync in (lambda: x.sum().item(), lambda: bool(x.all()), lambda: x.nonzero()):
        with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
            _capture(captured, sync)


def test_what_a_capture_returns_is_undefined_until_replayed(captured):
    """A capture runs nothing on CUDA: its outputs hold the pool's leftovers until the first replay."""
    x = torch.arange(4.0)
    graph, (y, z) = _capture(captured, lambda: (x + 1, (x > 1).long()))
    assert torch.isnan(y).all() and (z == -1).all()
    graph.replay()
    assert y.tolist() == [1.0, 2.0, 3.0, 4.0] and z.tolist() == [0, 0, 1, 1]


def test_graphs_sharing_a_pool_overwrite_what_the_others_returned(captured):
    """A state's graphs share one memory pool: what one returned is not kept past another's replay."""
    x = torch.ones(2)
    first, y = _capture(captured, lambda: x + 1)
    second = captured()
    with torch.cuda.graph(second, pool=first.pool()):
        z = x * 3
    first.replay()
    assert y.tolist() == [2.0, 2.0]
    second.replay()
    assert torch.isnan(y).all() and z.tolist() == [3.0, 3.0]


@pytest.mark.parametrize("arch", sorted(CONFIGS))
@pytest.mark.parametrize("draft", ["chain", "tree"])
def test_captured_static_steps_give_greedy(captured, arch, draft):
    """A row and a left-padded batch of three whose rows finish at different steps (the running rows move to a
    smaller batch: another set of graphs) give model.generate's tokens from replayed graphs."""
    static_calls_match_greedy(arch, draft)
    assert captured.captures >= 2 and captured.replays > 2 * captured.captures


@pytest.mark.parametrize("draft", ["chain", "tree"])
def test_logits_kept_for_the_output_outlive_the_next_replays(captured, draft):
    """Scores and logits recorded for the output are copies of a replayed graph's outputs, which the next replay (of
    any width of the state: one memory pool) overwrites: they equal model.generate's, rows finishing on the way."""
    from test_static import _staggered

    model, batch, mask, eos = _staggered()
    kwargs = dict(attention_mask=mask, max_new_tokens=40, eos_token_id=eos, return_dict_in_generate=True,
                  output_scores=True, output_logits=True)
    expected = model.generate(batch, do_sample=False, **kwargs)
    out = generate(model, batch, lookup="suffix", draft=draft, cache_implementation="static", draft_cost=0.0,
                   repetition_penalty=1.0, **kwargs)
    assert torch.equal(out.sequences, expected.sequences)
    ours, theirs = torch.stack(out.logits), torch.stack(expected.logits)  # [steps, b, V]
    running = torch.isfinite(ours).all(-1)  # after a row finished, ours puts all mass on the pad id
    assert running.sum() > 60 and torch.allclose(ours[running], theirs[running], atol=1e-4)
    assert captured.replays > 5


def test_the_server_replays_its_captured_batches_as_rows_join_and_leave(captured, reference):
    """`lookahead serve`'s static cache on CUDA: rows joining a captured batch, leaving it, and the batch moving
    between sizes (each size its own graphs) decode every row to its greedy answer from replayed graphs."""
    from test_serve import rows_joining_and_leaving

    sizes = rows_joining_and_leaving(reference)
    assert 16 in sizes and captured.captures >= 3 and captured.replays > 2 * captured.captures


def test_an_indexer_that_picks_keys_on_the_host_is_not_captured(captured):
    """DeepSeek-V3.2's indexer picks each query's keys from rows of their own widths (`indexer.pick_alone`), which
    no graph can hold: its static steps run without graphs, and give greedy's tokens."""
    import families as F
    from lookahead.model.facts import ModelFacts
    from lookahead.model.static import static_mode

    model = F.tiny_model("deepseek_v32")
    assert static_mode(ModelFacts.of(model), model.generation_config.__class__(cache_implementation="static")) \
        == (False, None)
    ids = F.prompt(30)
    expected = model.generate(ids, do_sample=False, max_new_tokens=24, pad_token_id=0)
    assert torch.equal(generate(model, ids, max_new_tokens=24, cache_implementation="static", pad_token_id=0),
                       expected)
    assert captured.captures == 0


FAMILIES = [name for name, _, _ in __import__("families").families()]


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_static_call_replays_its_graphs_or_says_why_not(monkeypatch, caplog, name):
    """The family walk's static call as CUDA runs it: every family whose static call gives `model.generate`'s tokens
    gives them from replayed graphs, or says why it cannot be captured (a MoE router that reads on the host: the
    same step, uncompiled) and gives them from eager steps; recurrent states (settled around an eager step) and
    ALiBi (biases set around an eager step) are refused with CUDA's message."""
    import families as F
    import test_families as TF
    from lookahead.model.facts import ModelFacts

    model = TF.runnable(name)
    want, _ = F.expected(model, "static", name)
    if want != "equal":
        pytest.skip(f"its static call is expected {want}, graphs or not (test_families)")
    graphs = cpu_graphs(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="lookahead.model.static"):
        kind, message = F.outcome(model, "static")
    facts = ModelFacts.of(model)
    if facts.recurrent == "" or facts.alibi:
        assert kind == "refused" and "cache_implementation='static' would compile" in message, message
        return
    assert (kind, message) == ("equal", "")
    failed = [r.message for r in caplog.records if "capturing the static step as a CUDA graph failed" in r.message]
    indexed = any(layer.kind == "indexed_attention" for layer in facts.layers)
    assert graphs.replays > 0 or failed or indexed, "no graph replayed and nothing said why"
