"""Forced replay on the device (`ForcedOutputs`), forward timing and the GPU harness, on tiny shapes on a CPU."""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lookahead.bench import e2e, gpu
from lookahead.bench.forcing import ForcedOutputs, distinct_prompts
from lookahead.bench.methods import resolve
from lookahead.bench.timing import Call, rotations

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup():
    """Three traces with outputs of different lengths (rows finish at different steps) and a tiny forced model."""
    traces = e2e.synthetic_traces(3, prompt_len=40, new_tokens=20, vocab=90, seed=1)
    traces = [(p, o[:n]) for (p, o), n in zip(traces, [20, 7, 13])]
    vocab, eos = e2e.free_id(traces, 90)
    return traces, eos, e2e.random_model("tiny", vocab, eos)


def written(out, width: int, eos: int) -> list:
    return [row[: row.index(eos) + 1] if eos in row else row for row in out[:, width:].tolist()]


@pytest.mark.parametrize("name", ["hf-greedy", "hf-greedy-static", "lookahead-none", "lookahead-ngram",
                                  "lookahead-suffix", "lookahead-suffix-tree", "lookahead-suffix-tree-static",
                                  "lookahead-ngram-compiled"])
def test_forced_batches_write_the_recording(setup, name):
    """Every method writes each row's recorded output; lookahead's shrinking batch is re-identified at most once per
    finished row."""
    traces, eos, model = setup
    forced = ForcedOutputs(traces, eos, model.device)
    handle = forced.attach(model)
    try:
        ids, mask = e2e.left_pad([p for p, _ in traces], eos, "cpu")
        forced.reset()
        out, _ = e2e.generate_with(resolve([name])[0], model, ids, mask, 24, eos)
    finally:
        handle.remove()
    assert written(out, ids.shape[1], eos) == [forced.expected(i, 24) for i in range(3)]
    assert 1 <= forced.identified <= 3


def test_forced_prompt_lookup_sends_prompt_and_draft_at_once(setup):
    """transformers' prompt lookup verifies its first draft in the prefill: rows are found by their prompt prefix."""
    traces, eos, model = setup
    forced = ForcedOutputs(traces, eos, model.device)
    handle = forced.attach(model)
    try:
        for i, (prompt, _) in enumerate(traces):
            ids, mask = e2e.left_pad([prompt], eos, "cpu")
            forced.reset()
            out, _ = e2e.generate_with(resolve(["hf-prompt-lookup-2"])[0], model, ids, mask, 24, eos)
            assert written(out, ids.shape[1], eos) == [forced.expected(i, 24)]
    finally:
        handle.remove()


def fake_forward(forced, input_ids, position_ids, vocab=100, mask=None):
    """Call the hook as a model's forward would, on zero logits; return the argmax it forces."""
    output = SimpleNamespace(logits=torch.zeros(*input_ids.shape, vocab))
    forced.hook(None, (), {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": mask}, output)
    return output.logits.argmax(-1).tolist()


def test_tree_columns_are_forced_by_their_depth():
    """A tree column gets the recorded token after its position (row position + depth), whatever its index."""
    forced = ForcedOutputs([([5, 6], [7, 8, 9])], eos_token_id=99)
    assert fake_forward(forced, torch.tensor([[5, 6]]), torch.tensor([[0, 1]]), mask=torch.ones(1, 2)) == [[6, 7]]
    #        root (pos 2), two children (depth 1), a grandchild (depth 2): next tokens by position
    got = fake_forward(forced, torch.tensor([[7, 8, 3, 9]]), torch.tensor([[2, 3, 3, 4]]))
    assert got == [[8, 9, 9, 99]]


def test_survivors_are_matched_by_position_and_token():
    """When a row finishes the next forward has fewer rows: the survivors keep their traces, in order."""
    forced = ForcedOutputs([([1, 2], [3, 4, 5]), ([6, 7], [8, 9, 10])], eos_token_id=99)
    for token, forced_next in ((9, 10), (4, 5)):
        fake_forward(forced, torch.tensor([[1, 2], [6, 7]]), torch.tensor([[0, 1], [0, 1]]), mask=torch.ones(2, 2))
        assert fake_forward(forced, torch.tensor([[token]]), torch.tensor([[3]])) == [[forced_next]]
    fake_forward(forced, torch.tensor([[1, 2], [6, 7]]), torch.tensor([[0, 1], [0, 1]]), mask=torch.ones(2, 2))
    with pytest.raises(RuntimeError, match="a row with token 50 at position 3 follows none of the 2 previous rows"):
        fake_forward(forced, torch.tensor([[50]]), torch.tensor([[3]]))


def test_unknown_prompts_are_left_alone():
    """A forward that starts with no recorded prompt (a calibration forward) keeps its logits."""
    forced = ForcedOutputs([([1, 2], [3])], eos_token_id=99)
    assert fake_forward(forced, torch.tensor([[50, 51]]), torch.tensor([[0, 1]]), mask=torch.ones(1, 2)) == [[0, 0]]
    assert forced.batch == 0


@pytest.mark.parametrize("traces, message", [
    ([], "traces must hold at least one"),
    ([([], [1])], "every prompt must hold at least one token"),
    ([([0, 1], [2])], "a prompt starts with pad_token_id=0"),
    ([([1, 2], [3]), ([1, 2, 4], [5])], "the prompts of traces 0 and 1 are prefixes of one another"),
])
def test_forced_outputs_refuses_traces_it_cannot_tell_apart(traces, message):
    """Each refusal names what is wrong."""
    with pytest.raises(ValueError, match=message):
        ForcedOutputs(traces, eos_token_id=9, pad_token_id=0)


def test_distinct_prompts_drops_prefixes_and_repeats():
    """Only the first of prompts that extend or repeat one another is kept."""
    traces = [([1, 2], [3]), ([1, 2, 4], [5]), ([1, 2], [6]), ([7], [8])]
    assert [p for p, _ in distinct_prompts(traces)] == [[1, 2], [7]]


def test_call_accounting():
    """Host time per step is the call less everything up to the end of the prefill and less the later forwards."""
    call = Call(seconds=1.0, starts=np.array([0.1, 0.5, 0.7]), durations=np.array([0.2, 0.1, 0.1]))
    assert call.decode_seconds == pytest.approx(0.7) and call.host_seconds_per_step == pytest.approx(0.25)
    assert rotations(["a", "b"], 3) == [["a", "b"], ["b", "a"], ["a", "b"]]


def test_gpu_plan_on_tiny_shapes(setup):
    """The GPU harness runs every method on a CPU, finds each output equal to the recording, fills the targets."""
    traces, eos, model = setup
    workloads = {"code-edit": traces[:2], "no-copy": traces[2:]}
    plan = gpu.Plan(device="cpu", batches=(1, 2), prompts_at_1=1, repeats=2, context=48, max_new=24)
    rows = gpu.run_plan(model, workloads, plan, eos, log=lambda line: None)
    assert {(r.workload, r.batch) for r in rows} == {("code-edit", 1), ("code-edit", 2), ("no-copy", 1)}
    assert all(r.mismatches == 0 and r.tokens > 0 for r in rows)
    assert [r.method for r in rows if r.batch == 2] == [m for m in plan.methods if m != gpu.LOOKUP]
    table = gpu.markdown(rows)
    assert "### Targets (issue 12)" in table and "| code-edit, batch 1: >= 4x fastest greedy |" in table
    json.dumps(gpu.as_json(rows, plan, {}))


def test_gpu_script_runs_from_exported_traces(setup, tmp_path):
    """`python benchmarks/gpu.py` reads a trace folder, prints the tables and writes gpu.md and gpu.json."""
    traces, eos, _ = setup
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "code-edit.jsonl").write_text("".join(
        json.dumps({"prompt_ids": p.tolist(), "output_ids": o.tolist()}) + "\n" for p, o in traces))
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu.py", "--traces", str(folder), "--workloads", "code-edit", "--device", "cpu",
         "--shape", "tiny", "--dtype", "fp32", "--batch", "1", "--prompts", "1", "--repeats", "1", "--max-new", "8",
         "--methods", "hf-greedy", "lookahead-ngram", "--out", str(tmp_path / "out"), "--threads", "1", "--profile"],
        cwd=ROOT, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert "| lookahead-ngram |" in done.stdout and (tmp_path / "out" / "gpu.json").exists()
    profile = (tmp_path / "out" / "profile-code-edit-lookahead-ngram.txt").read_text()  # lookahead's methods only
    assert "aten::" in profile and "lookahead/generate.py" in profile.split("lookahead's own functions")[1]
    assert not (tmp_path / "out" / "profile-code-edit-hf-greedy.txt").exists()
    bad = subprocess.run([sys.executable, "benchmarks/gpu.py", "--repeats", "0"], cwd=ROOT, capture_output=True,
                         text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert bad.returncode == 2 and "argument --repeats: expected an integer >= 1, got '0'" in bad.stderr


def test_a_step_split_leaves_the_wait_for_a_queued_forward_out_of_the_host_time():
    """On a GPU the host waits for the queued forward inside "accept": per_step charges that wait to the forward."""
    from lookahead.bench.steps import Sample, per_step

    sample = Sample(seconds=2.5, decode_seconds=2.0, forward_seconds=1.0, steps=10,
                    phases={"draft": 0.2, "forward": 0.1, "accept": 1.2, "commit": 0.1})
    split = per_step(sample)
    assert split["forward"] == pytest.approx(100.0) and split["draft"] == pytest.approx(20.0)
    assert split["accept+commit"] == pytest.approx(40.0)  # (1.2 + 0.1 - (1.0 - 0.1)) s over 10 steps
    assert split["rest"] == pytest.approx(40.0) and split["host share"] == pytest.approx(0.5)


def test_a_method_that_fails_is_logged_and_left_out(setup):
    """One broken method costs its own row, not the others' figures."""
    from dataclasses import replace

    from lookahead.bench.steps import Batch, run_rounds
    from lookahead.bench.timing import ForwardTimer

    traces, eos, model = setup
    forced = ForcedOutputs(traces, eos, model.device)
    hook = forced.attach(model)
    try:
        ids, mask = e2e.left_pad([traces[0][0]], eos, "cpu")
        good = resolve(["lookahead-ngram"])[0]
        broken = replace(good, name="broken", options={"lookup": "no-such-lookup"})
        lines = []
        samples, first = run_rounds(model, [broken, good], [Batch(ids, mask, (0,), 8)], forced,
                                    ForwardTimer("cpu"), eos, 1, log=lines.append)
    finally:
        hook.remove()
    assert list(samples) == ["lookahead-ngram"] and samples["lookahead-ngram"][0].mismatches == 0
    assert any(line.startswith("broken failed and is left out: ValueError") for line in lines)


def _row(method: str, ms: float, workload: str = "summarization") -> gpu.Row:
    return gpu.Row(workload, 1, method, (ms, ms, ms), {"host share": 0.1}, 128, 30, 0, 0.0, 0)


def test_fastest_greedy_is_whichever_greedy_ran():
    """Without eager greedy in --methods, the compiled static greedy is the baseline, and a target whose baseline did
    not run gets no verdict (the H200 run of 11bbd65 printed '—' for every method and failed each target)."""
    rows = [_row("hf-greedy-static", 3.0), _row("lookahead-ngram-static", 0.75)]
    gpu.add_ratios(rows)
    assert rows[1].ratios["fastest"] == pytest.approx(4.0)
    assert np.isnan(rows[1].ratios["greedy"])
    assert [cells["lookahead-ngram-static"] for what, cells in gpu.targets(rows) if "fastest" in what] == [(4.0, True)]
    rows = [_row("hf-greedy", 16.0), _row("lookahead-ngram", 2.0)]        # only eager greedy ran
    gpu.add_ratios(rows)
    assert rows[1].ratios["fastest"] == pytest.approx(8.0)
    rows = [_row("hf-prompt-lookup-2", 5.0), _row("lookahead-ngram", 1.0)]  # no greedy: no speedup target
    gpu.add_ratios(rows)
    assert all("fastest" not in what for what, _ in gpu.targets(rows))


def test_methods_in_turns_keep_their_static_caches(setup, monkeypatch):
    """Each method's static caches (one per batch size it compacts to) outlive the other methods' turns, so the timed
    rounds rebuild none and recapture no graph; the library's own limit comes back afterwards."""
    from lookahead.model import static

    traces, eos, model = setup
    static.clear(model)  # the module's model: earlier tests' caches would serve these calls
    made = []
    new_state = static._new_state
    monkeypatch.setattr(static, "_new_state", lambda *args: made.append(args[2:4]) or new_state(*args))
    monkeypatch.setattr(static, "MAX_STATES", 1)  # a batch of 3 compacts to 1 row: two caches, over this limit
    plan = gpu.Plan(device="cpu", batches=(3,), repeats=2, context=48, max_new=24,
                    methods=("lookahead-ngram-static", "lookahead-suffix-tree-static"))
    rows = gpu.run_plan(model, {"code-edit": traces}, plan, eos, log=lambda line: None)
    assert all(r.mismatches == 0 for r in rows)
    assert sorted({batch for batch, _ in made}) == [1, 3] and len(made) == 2  # both made in the first warm-up only
    static.clear(model)
    assert static.MAX_STATES == 1
