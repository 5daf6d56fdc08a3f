"""The kernels' two tiers (`lookahead.runtime.jit`): their Python twins draft and accept exactly as numba's kernels do, and a
call whose kernels numba has not compiled runs the twins while a background process compiles them."""
import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzz_generate
from lookahead import Memory, NgramIndex, SuffixIndex, generate
from lookahead.runtime import jit as _jit
from models import repeated_prompt, tiny_model

CALLS = {  # name -> generate's options
    "ngram chain": dict(lookup="ngram"),
    "suffix chain": dict(lookup="suffix"),
    "suffix tree": dict(lookup="suffix", draft="tree"),
    "recycle tree": dict(lookup="recycle", draft="tree"),
    "suffix+recycle tree": dict(lookup="suffix+recycle", draft="tree"),
    "static chain": dict(lookup="ngram", cache_implementation="static"),
    "static tree": dict(lookup="suffix", draft="tree", cache_implementation="static"),
    "chain with a processor": dict(lookup="ngram", min_new_tokens=35),
}


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3)


def _batch(model, rows: int):
    """Left-padded prompts that hold the model's own greedy continuation of their opening, then the opening again:
    something the drafts copy and the model accepts."""
    prompts = []
    for seed in range(rows):
        opening = repeated_prompt(seed, 10 + 3 * seed)[None]
        continued = model.generate(opening, max_new_tokens=30, do_sample=False, pad_token_id=0)[0]
        prompts.append(torch.cat([continued, opening[0]]))
    width = max(len(p) for p in prompts)
    ids = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):], mask[r, width - len(p):] = p, 1
    return ids, mask


def _run(model, rows: int, **options):
    ids, mask = _batch(model, rows)
    out, stats = generate(model, ids, attention_mask=mask, max_new_tokens=40, draft_cost=(0.8, 0.08),
                          return_stats=True, **options)
    return out, (stats.forward_passes, stats.draft_tokens, stats.accepted_tokens)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("name", list(CALLS))
def test_twins_write_greedy_tokens_with_the_same_drafts(model, name, rows):
    """Every kind of call gives model.generate's greedy tokens with the Python twins, and drafts, verifies and accepts
    as many tokens in as many forwards as with numba's kernels (the twins draft what the kernels draft)."""
    options = CALLS[name]
    if rows > 1 and options.get("cache_implementation") == "static" and options.get("draft") == "tree":
        pytest.skip("a static tree step runs one row")
    ids, mask = _batch(model, rows)
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=0,
                              **{k: v for k, v in options.items() if k == "min_new_tokens"})
    compiled_out, compiled_stats = _run(model, rows, **options)
    with _jit.interpreted_kernels():
        out, stats = _run(model, rows, **options)
    assert torch.equal(out, expected) and torch.equal(compiled_out, expected)
    assert stats == compiled_stats
    assert stats[2] > 0  # drafts were accepted: the twins drafted something


def test_twins_sample_what_the_kernels_sample(model):
    """A seeded sampling call writes the same text with either tier (its drafts decide which numbers it draws)."""
    outs = []
    for context in (_jit.compiled(), _jit.interpreted_kernels()):
        with context:
            torch.manual_seed(5)
            outs.append(_run(model, 2, lookup="suffix", do_sample=True, temperature=0.8)[0])
    assert torch.equal(*outs)


def test_twins_with_documents_and_memory(model):
    """Drafting from documents and from a Memory of earlier calls is the same with the twins."""
    ids, _ = _batch(model, 1)
    docs = [ids[0, :30].tolist() * 2]
    expected = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=0)
    results = []
    for context in (_jit.compiled(), _jit.interpreted_kernels()):
        memory = Memory()
        with context:
            generate(model, ids, max_new_tokens=20, memory=memory, draft_cost=(0.8, 0.08))
            out, stats = generate(model, ids, max_new_tokens=40, documents=docs, memory=memory,
                                  draft_cost=(0.8, 0.08), lookup="suffix", draft="tree", return_stats=True)
        assert torch.equal(out, expected)
        results.append((stats.forward_passes, stats.accepted_tokens))
    assert results[0] == results[1]


tokens = st.lists(st.integers(0, 40), min_size=1, max_size=300)


@given(tokens, st.integers(1, 4), st.integers(1, 16))
def test_ngram_twins_propose_what_the_kernels_propose(seq, max_ngram, k):
    """An `NgramIndex` fed and asked the same proposes the same tokens with either tier, int32 and int64 input alike
    (the hashes wrap in numpy as in numba)."""
    proposals = []
    for context in (_jit.compiled(), _jit.interpreted_kernels()):
        with context:
            index = NgramIndex(max_ngram)
            half = len(seq) // 2
            index.extend(np.array(seq[:half], dtype=np.int32))
            index.extend(np.array(seq[half:], dtype=np.int64))
            proposals.append(index.propose(k).tolist())
    assert proposals[0] == proposals[1]


@given(tokens, st.integers(1, 24))
def test_suffix_twins_propose_what_the_kernels_propose(seq, n):
    """A `SuffixIndex` proposes the same chain and the same tree (tokens, parents) with either tier."""
    proposals = []
    for context in (_jit.compiled(), _jit.interpreted_kernels()):
        with context:
            index = SuffixIndex()
            index.extend(np.array(seq, dtype=np.int64))
            tree = index.propose_tree(n)
            proposals.append((index.propose(n).tolist(), tree.tokens.tolist(), tree.parents.tolist()))
    assert proposals[0] == proposals[1]


@given(tokens, st.lists(st.sampled_from(["int8", "int16", "int32", "int64", "readonly"]), min_size=1, max_size=6),
       st.integers(1, 16))
def test_indexes_take_ids_of_every_integer_dtype_through_their_kernels_entries(seq, dtypes, k):
    """An index's calls go through their kernels' compiled entries (`jit.entry`: found once per process, not typed at
    every call), one per dtype of the ids: ids of any integer dtype in turns, read-only ones too, give the index
    that plain lists give, chains and trees; and in the twins' tier the twins run, entry or not."""
    for context in (_jit.compiled(), _jit.interpreted_kernels()):
        with context:
            used = set()  # the dtypes of the ids that reached a kernel
            for make in (NgramIndex, SuffixIndex):
                index, plain = make(), make()
                parts = np.array_split(np.array(seq), len(dtypes))
                for part, dtype in zip(parts, dtypes):
                    ids = part.astype(np.int64 if dtype == "readonly" else dtype)
                    ids.flags.writeable = dtype != "readonly"
                    used |= {ids.dtype} if len(ids) else set()
                    index.extend(ids)
                    plain.extend(part.tolist())
                    assert index.propose(k).tolist() == plain.propose(k).tolist()
                if make is SuffixIndex:
                    assert index.propose_tree(k).tokens.tolist() == plain.propose_tree(k).tokens.tolist()
    from lookahead.index import _kernels

    twin = _jit.twins()["lookahead.index._kernels"].ngram_propose
    assert _jit.entry(twin, None, ()) is twin and (twin, None) not in _jit._ENTRIES
    found = {key for kernel, key in _jit._ENTRIES if kernel is _kernels.ngram_extend}
    assert used <= found


@pytest.fixture
def uncompiled(tmp_path, monkeypatch):
    """What a user's process gets on a fresh install: no kind in the marker (one of its own, `tmp_path`), no compiler
    started, numba's kernels not forced (the suite runs compiled: conftest). Yields the marker's path."""
    marker = tmp_path / "kernels.json"
    monkeypatch.setattr(_jit, "marker", lambda: marker)
    for name in ("_KNOWN", "_STARTED", "_WANTED"):
        monkeypatch.setattr(_jit, name, type(getattr(_jit, name))())
    token = _jit._COMPILED.set(False)
    try:
        yield marker
    finally:
        _jit._COMPILED.reset(token)


def test_an_uncompiled_call_runs_the_twins_while_the_background_compiles(model, uncompiled):
    """Outside `compiled()`, a call whose kind the marker does not list runs the twins (greedy's tokens) and starts
    `python -m lookahead.warm`, which lists every kind once numba's cache holds its kernels; the next call of
    that kind runs compiled."""
    ids, _ = _batch(model, 1)
    expected = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=0)
    assert torch.equal(generate(model, ids, max_new_tokens=40), expected)
    kind = _jit.kind_of("ngram", "chain", 1, False, False)
    assert _jit._WANTED == [kind] and _jit._STARTED  # the twins ran; the compiler started
    assert _jit._STARTED[0].wait(timeout=600) == 0
    assert [list(k) for k in _jit.KINDS] == json.loads(uncompiled.read_text())
    _jit._WANTED.clear()
    assert torch.equal(generate(model, ids, max_new_tokens=40), expected)
    assert _jit._WANTED == []  # compiled now: no twins


def test_compile_now_runs_compiled_and_starts_no_process(model, uncompiled, monkeypatch):
    """With LOOKAHEAD_COMPILE=now an uncompiled kind runs numba's kernels in the calling process (it compiles what it
    needs) and no background compiler starts; any other value than "background" or "now" is refused by name."""
    ids, _ = _batch(model, 1)
    expected = model.generate(ids, max_new_tokens=20, do_sample=False, pad_token_id=0)
    monkeypatch.setenv("LOOKAHEAD_COMPILE", "now")
    assert torch.equal(generate(model, ids, max_new_tokens=20), expected)
    assert _jit._WANTED == [] and _jit._STARTED == []  # no twins ran, no compiler started
    monkeypatch.setenv("LOOKAHEAD_COMPILE", "later")
    with pytest.raises(ValueError, match="LOOKAHEAD_COMPILE must be 'background' .* or 'now' .*'later'"):
        generate(model, ids, max_new_tokens=20)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(fuzz_generate.calls())
def test_the_generate_fuzz_passes_with_the_twins(call):
    """`fuzz_generate`'s calls (every lookup, chains and trees, budgets 1-64, batches of ragged prompts, the static
    cache, early eos, sampling, float32 and float64) with the Python twins: greedy equals `model.generate`, and
    numpy checks every index the twins read or write (an out-of-bounds one raises)."""
    with _jit.interpreted_kernels():
        fuzz_generate.test_generate_stays_in_bounds_and_equals_greedy.hypothesis.inner_test(call)


def test_the_server_loop_runs_the_twins_in_its_creators_tier(model):
    """`lookahead serve`'s loop (its own thread) runs in the tier of the context that made it: with the twins, rows
    of every kind of drafting joined into one batch still write greedy's tokens, and accept what numba's kernels
    accept."""
    import threading

    from lookahead.serve.engine import Engine
    from lookahead.serve.row import Drafting, Row, Sampling

    class Tok:
        def decode(self, tokens, skip_special_tokens=True):
            return " ".join(map(str, tokens))

    ids, mask = _batch(model, 3)
    prompts = [row[m.bool()].numpy() for row, m in zip(ids, mask)]
    want = [model.generate(torch.as_tensor(p)[None], attention_mask=torch.ones(1, len(p), dtype=torch.long),
                           do_sample=False, max_new_tokens=30, pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    draftings = [Drafting(), Drafting(lookup="suffix", draft="tree"), Drafting(lookup="suffix")]
    accepted = []
    for context in (_jit.compiled(), _jit.interpreted_kernels()):
        with context:
            engine = Engine(model, draft_cost=(0.8, 0.08)).start()
        done, rows = threading.Semaphore(0), []
        try:
            for prompt, drafting in zip(prompts, draftings):
                rows.append(Row(prompt.astype(np.int64), 30, (), Sampling(0.0), drafting, Tok(),
                                emit=lambda event: event[0] == "done" and done.release()))
                engine.submit(rows[-1])
            assert all(done.acquire(timeout=300) for _ in rows)
        finally:
            engine.stop()
        assert engine.error is None and [row.out for row in rows] == want
        accepted.append(sum(row.stats.accepted_tokens for row in rows))
    assert accepted[0] > 0


@pytest.mark.parametrize("ending", ["exit", "killed"])
def test_the_background_compiler_ends_with_the_program_that_started_it(tmp_path, ending):
    """The compiler a call starts belongs to its program: it runs in the program's session (Linux shares the CPU
    between sessions before niceness counts: in a session of its own it slowed the program's forwards 17x), and it
    is gone within seconds of the program's end, whether the program exits or is killed (SIGKILL: no atexit), with
    numba's cache empty so that it had work left."""
    import os
    import subprocess
    import sys
    import time

    script = ("import os, signal, sys\nfrom lookahead.runtime import jit\njit._start_background()\n"
              "pid = jit._STARTED[0].pid\nprint(pid, os.getsid(pid) == os.getsid(0), flush=True)\n"
              "if sys.argv[1] == 'killed':\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", script, ending], env=env, capture_output=True, text=True, timeout=120)
    pid, same_session = done.stdout.split()[:2]
    pid = int(pid)
    assert same_session == "True"

    def running() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
        except OSError:
            return False

    deadline = time.monotonic() + 60
    while running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not running(), f"the compiler (pid {pid}) outlived its program ({ending})"


def test_the_background_compiler_starts_with_the_kinds_the_calls_wait_for():
    """The kinds the program's calls ran as twins go first (`--first`), those outside `KINDS` too (a static batch
    of recycled trees: before, never compiled ahead, every new process ran them as twins), then the rest in
    `KINDS`' order; what names no kind is dropped."""
    from lookahead import warm

    tree, other = ("suffix", "tree", 1, "dynamic", "greedy"), ("suffix+recycle", "tree", 2, "static", "greedy")
    assert other not in _jit.KINDS
    assert warm.ordered([list(tree), list(other), ["no", "such", 1, "kind", "x"], ["ngram", "tree", 1, "dynamic",
                         "greedy"]]) == [tree, other] + [k for k in _jit.KINDS if k != tree]
    assert warm.ordered([]) == list(_jit.KINDS)


def test_a_kind_outside_kinds_a_call_waited_for_is_compiled_and_listed(tmp_path, monkeypatch):
    """A kind of call outside `KINDS` that a program's call ran as twins (`--first`) is compiled by the background
    compiler and listed in the marker, and the program's next calls of that kind see it there (`_ready` reads the
    marker again for it though every kind of `KINDS` is listed)."""
    from lookahead import warm

    marker = tmp_path / "kernels.json"
    monkeypatch.setattr(_jit, "marker", lambda: marker)
    monkeypatch.setattr(_jit, "_KNOWN", set())
    other = ("suffix+recycle", "tree", 1, "static", "greedy")
    marker.write_text(json.dumps([list(k) for k in _jit.KINDS]))
    assert other not in _jit._ready(other) and set(_jit.KINDS) <= _jit._ready()
    assert warm.compile_kinds(marker, warm.ordered([list(other)])) == [other]  # the rest were listed
    assert other in _jit._ready(other)


def test_warm_compiles_every_kind_ahead_and_lists_it(tmp_path, monkeypatch):
    """`lookahead warm` (`lookahead.warm.warm`) compiles every kind of call and lists it in the marker, so that no
    later call runs the twins, leaving the caller's torch threads as they were; run again, it finds nothing left."""
    from lookahead import warm

    marker = tmp_path / "kernels.json"
    monkeypatch.setattr(_jit, "marker", lambda: marker)
    threads = torch.get_num_threads()
    assert warm.warm(progress=False) == list(_jit.KINDS)
    assert torch.get_num_threads() == threads  # the caller's threads come back
    assert [list(k) for k in _jit.KINDS] == json.loads(marker.read_text())
    assert warm.warm(progress=False) == []
