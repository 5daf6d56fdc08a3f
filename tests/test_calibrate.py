"""measure_draft_cost: the cost of each draft size, measured from real forward timings."""
from pathlib import Path

import numpy as np
import pytest
import torch

from lookahead.decode.calibrate import forward_times, measure_draft_cost
from models import tiny_model


def test_forward_times_cover_the_sizes_and_the_cost_is_a_fraction():
    model = tiny_model("llama")
    times = forward_times(model, sizes=(1, 4), context=16, repeats=2)
    assert set(times) == {1, 4} and all(t > 0 for t in times.values())
    cost = measure_draft_cost(model, context=16, max_tokens=8)
    assert cost.costs.shape == (9,) and cost.costs[0] == 1.0
    assert np.all(np.diff(cost.costs) >= 0)  # padding a draft is always possible: never cheaper to verify more
    overhead, per_token = cost.linear()
    assert overhead >= 0.0 and per_token >= 0.0


def test_auto_cost_is_measured_once_per_model_and_decodes_losslessly():
    from lookahead import generate
    from lookahead.decode.calibrate import _MEASURED

    model = tiny_model("llama")
    ids = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4, 1, 2]])
    want = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(generate(model, ids, draft_cost="auto", max_new_tokens=12), want)
    curves = dict(_MEASURED[model])
    assert len(curves) == 1
    assert torch.equal(generate(model, ids, draft_cost="auto", max_new_tokens=12), want)
    assert _MEASURED[model] == curves  # the second call reuses the measurement


def test_auto_cost_stays_inside_a_learned_position_table():
    """GPT-2 with 256 positions, and a draft budget of 600 with 1024 positions: calibration fits the table."""
    import transformers as T
    from lookahead import generate

    for positions, budget in ((256, 10), (1024, 600)):
        config = T.GPT2Config(vocab_size=96, n_embd=16, n_layer=1, n_head=2, n_positions=positions, bos_token_id=1,
                              eos_token_id=2)
        torch.manual_seed(0)
        model = T.GPT2LMHeadModel(config).eval()
        ids = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4, 1, 2]])
        want = model.generate(ids, max_new_tokens=8, do_sample=False)
        assert torch.equal(generate(model, ids, draft_cost="auto", num_draft_tokens=budget, max_new_tokens=8), want)


def test_a_stored_value_is_used_only_under_its_own_key(tmp_path):
    """A value read back equals the one stored; another kind or key, a damaged file or `Store(None)` gives None."""
    from lookahead.runtime.store import Store

    store, key = Store(tmp_path), {"model": "m", "threads": 2, "cpu": "x"}
    assert store.get("cost-curves", key) is None
    store.put("cost-curves", key, [1.0, 1.5, None, 2.0])
    assert store.get("cost-curves", key) == [1.0, 1.5, None, 2.0]
    assert store.get("cost-curves", {**key, "threads": 1}) is None and store.get("linear-rows", key) is None
    for path in (tmp_path / "cost-curves").iterdir():  # a damaged file is measured again, not an error
        path.write_text("{not json")
    assert store.get("cost-curves", key) is None
    Store(None).put("cost-curves", key, [1.0])
    assert Store(None).get("cost-curves", key) is None


def test_the_curve_key_tells_models_threads_and_widths_apart():
    """Two models of one config share a key (the curve depends on shapes); another config, thread count or
    width does not."""
    from lookahead.decode.calibrate import curve_key

    key = curve_key(tiny_model("llama"), 8)
    assert curve_key(tiny_model("llama", seed=1), 8) == key
    assert curve_key(tiny_model("gpt2"), 8) != key and curve_key(tiny_model("llama"), 9) != key
    before = torch.get_num_threads()
    torch.set_num_threads(before + 1)
    try:
        assert curve_key(tiny_model("llama"), 8) != key
    finally:
        torch.set_num_threads(before)


def test_a_new_process_reuses_the_curve_measured_for_the_same_model(tmp_path, monkeypatch):
    """`draft_cost="auto"` measures once and keeps the curve on disk: another model object with the same config (as
    in a new process) reads it back instead of measuring, the same curve; a model of another config measures its
    own."""
    from lookahead.runtime.store import Store
    from lookahead.decode import calibrate

    real = calibrate._timed
    monkeypatch.setattr(calibrate, "_timed", lambda *a: (real(*a)[0], 0.0))  # a quiet machine (whatever runs beside)
    store = Store(tmp_path)
    first = calibrate.measured_draft_cost(tiny_model("llama"), 8, store)
    assert len(list((tmp_path / "cost-curves").iterdir())) == 1
    measure = calibrate.measure_draft_cost
    monkeypatch.setattr(calibrate, "measure_draft_cost", lambda *a, **k: pytest.fail("measured again"))
    again = calibrate.measured_draft_cost(tiny_model("llama", seed=1), 8, store)
    assert again.raw.tolist() == first.raw.tolist() and again.costs.tolist() == first.costs.tolist()
    monkeypatch.setattr(calibrate, "measure_draft_cost", measure)
    calibrate.measured_draft_cost(tiny_model("gpt2"), 8, store)
    assert len(list((tmp_path / "cost-curves").iterdir())) == 2


def test_a_curve_measured_on_a_busy_cpu_is_not_kept(tmp_path, monkeypatch):
    """A measurement while other processes kept cores busy serves the process that took it, and is not kept: a new
    process measures again (issue 48)."""
    from lookahead.runtime.store import Store
    from lookahead.decode import calibrate

    real = calibrate._timed
    monkeypatch.setattr(calibrate, "_timed", lambda *a: (real(*a)[0], 1.8))  # two busy loops
    store = Store(tmp_path)
    curve = calibrate.measured_draft_cost(tiny_model("llama"), 8, store)
    assert curve.busy == 1.8 and not (tmp_path / "cost-curves").exists()
    monkeypatch.setattr(calibrate, "_timed", lambda *a: (real(*a)[0], 0.1))  # quiet again
    calibrate.measured_draft_cost(tiny_model("llama", seed=1), 8, store)
    assert len(list((tmp_path / "cost-curves").iterdir())) == 1


def test_a_kept_curve_the_machine_now_beats_is_measured_again(tmp_path, monkeypatch):
    """A kept curve whose one-token forward took far longer than it takes now (measured while the machine was slow)
    is measured again when a process loads it, and the new curve replaces it; one that still holds is reused."""
    from lookahead.runtime.store import Store
    from lookahead.decode import calibrate

    real = calibrate._timed
    monkeypatch.setattr(calibrate, "_timed", lambda *a: (real(*a)[0], 0.0))  # a quiet machine (whatever runs beside)
    model, store = tiny_model("llama"), Store(tmp_path)
    key = calibrate.curve_key(model, 8)
    store.put("cost-curves", key, {"costs": [1.0] + [50.0] * 8, "seconds": 1.0})  # wide forwards "cost" 50
    curve = calibrate.measured_draft_cost(model, 8, store)
    assert curve.raw[8] < 50 and store.get("cost-curves", key)["seconds"] < 0.5
    kept = store.get("cost-curves", key)
    assert 0 < kept["check"] < 0.5  # a one-token forward's time after CHECK_CONTEXT tokens, for the next check
    contexts = []
    times = calibrate.forward_times
    monkeypatch.setattr(calibrate, "forward_times", lambda m, sizes, context, *a: contexts.append(context) or
                        times(m, sizes, context, *a))
    assert calibrate.measured_draft_cost(tiny_model("llama", seed=1), 8, store).raw.tolist() == \
        [float("inf") if c is None else c for c in kept["costs"]]
    assert contexts == [calibrate.CHECK_CONTEXT]  # the check: a few forwards after a short context
    store.put("cost-curves", key, kept | {"check": 1.0})  # its short-context time "slow": measured again
    assert calibrate.measured_draft_cost(tiny_model("llama", seed=2), 8, store).raw[8] < 50
    assert store.get("cost-curves", key)["check"] < 0.5


def test_packed_linear_row_counts_are_timed_once_per_machine(tmp_path, monkeypatch):
    """The row counts at which packed weights are faster are kept on disk: a new model of the same shapes (a new
    process) reads them back instead of timing."""
    from lookahead.model import linear

    if not linear.available():
        pytest.skip("no MKL packed sgemm in this torch")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with linear.packed_linears(tiny_model("llama")):
        pass
    assert len(list((tmp_path / "lookahead" / "linear-rows").iterdir())) == 1
    monkeypatch.setattr(linear, "_faster_rows", lambda *a, **k: pytest.fail("timed again"))
    with linear.packed_linears(tiny_model("llama", seed=1)):
        pass


def test_the_cache_folder_follows_xdg_cache_home(tmp_path, monkeypatch):
    from lookahead.runtime.store import cache_folder

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_folder() == tmp_path / "lookahead"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_folder() == Path.home() / ".cache" / "lookahead"


def test_other_work_counts_the_cores_other_processes_keep_busy():
    """`OtherWork` sees a busy loop in another process (about a core) and leaves this process's own work out."""
    import subprocess
    import sys
    import time

    from lookahead.runtime.threads import OtherWork

    with OtherWork() as mine:
        end = time.perf_counter() + 0.6
        while time.perf_counter() < end:  # this process's own work
            pass
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        with OtherWork() as others:
            time.sleep(0.6)
    finally:
        loop.kill()
    if mine.cores is None:
        pytest.skip("no /proc/stat here")
    assert others.cores > mine.cores + 0.5
