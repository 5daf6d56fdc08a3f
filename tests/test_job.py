"""The JSONL job (`lookahead.job.run`, local engine): greedy's outputs, bad lines, resume."""
import io
import json
import os
import re

import pytest
import torch
from hypothesis import given, settings, strategies as st

from lookahead import models
from lookahead.job import Options, run
from lookahead.job.lines import BadLine, Model, done_ids, parse_line

NEW = 24
LINES = [
    {"id": "story", "prompt": "Once upon a time, there was a little girl named Lily."},
    {"prompt": "Tom had a red ball. He liked to play with it in the park."},  # its id is its line number, 2
    {"id": 7, "input_ids": [403, 407, 261, 378]},
    {"id": "docs", "prompt": "Lily and Ben went to the park.",
     "documents": ["Lily and Ben went to the park. They saw a big dog. The dog was happy.", [403, 407, 261]]},
    {"id": "retell", "prompt": "Tom had a little red car. He liked to drive his car on the floor. One day, the car "
                               "went under the bed. Tom told his mom. He said, \"Mom, my little red car"},
    {"id": "short", "prompt": "The sun"},
]


@pytest.fixture(scope="module")
def stories():
    """The bundled stories260K model and tokenizer (fp32)."""
    model, tok, _ = models.load(models.default_model_path())
    return model, tok


@pytest.fixture(scope="module")
def greedy(stories):
    """Plain `model.generate` greedy new tokens of every test line, one line at a time, keyed by id."""
    model, tok = stories
    out = {}
    for number, row in enumerate(LINES, start=1):
        ids = row["input_ids"] if "input_ids" in row else tok(row["prompt"]).input_ids
        seq = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW)
        out[row.get("id", number)] = seq[0, len(ids):].tolist()
    return out


def write_jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def read_records(path) -> list:
    return [json.loads(line) for line in open(path)]


def check_greedy(records, greedy, tok) -> None:
    assert sorted(map(str, (r["id"] for r in records))) == sorted(map(str, greedy))
    for r in records:
        assert r["output_ids"] == greedy[r["id"]], r["id"]
        assert r["text"] == tok.decode(greedy[r["id"]], skip_special_tokens=True)
        assert r["new_tokens"] == len(r["output_ids"]) and 1 <= r["forwards"] <= r["new_tokens"]
        assert r["tokens_per_forward"] == round(r["new_tokens"] / r["forwards"], 4)


@pytest.mark.parametrize("settings_", [dict(batch_size=1), dict(batch_size=4),
                                       dict(batch_size=3, lookup="suffix", draft="tree", memory=2000),
                                       dict(batch_size=6, lookup="suffix")])
def test_local_engine_gives_greedy_output(tmp_path, stories, greedy, settings_):
    """Every line's output_ids and text equal `model.generate` greedy's, whatever the batching and lookup."""
    out = tmp_path / "out.jsonl"
    summary = run(write_jsonl(tmp_path / "in.jsonl", LINES), str(out), max_new_tokens=NEW, errors=io.StringIO(),
                  **settings_)
    check_greedy(read_records(out), greedy, stories[1])
    assert (summary.written, summary.failed, summary.skipped) == (len(LINES), 0, 0)
    assert summary.new_tokens == sum(map(len, greedy.values()))


def test_bad_lines_are_reported_and_the_rest_is_written(tmp_path, stories, greedy):
    """Not JSON, no prompt, a repeated id, a too-long prompt, messages without a chat template: each reported with its
    line number, and the rest goes on."""
    bad = ["{not json", {"id": "x", "text": "no prompt here"}, {"id": "story", "prompt": "again"},
           {"id": "long", "input_ids": [300] * (512 - NEW + 1)}, {"id": "chat", "messages": [{"role": "user",
                                                                                             "content": "hi"}]}]
    rows = LINES[:3] + bad + LINES[3:]  # bad lines are lines 4-8
    errors = io.StringIO()
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    summary = run(path, str(tmp_path / "out.jsonl"), max_new_tokens=NEW, errors=errors)
    reports = errors.getvalue().splitlines()
    assert reports[:5] == [
        f"{path}:4: not JSON (Expecting property name enclosed in double quotes at column 2)",
        f'{path}:5: expected one of "prompt", "messages", "input_ids"; found none',
        f'{path}:6: id "story" was already used on line 1',
        f"{path}:7: prompt of {512 - NEW + 1} tokens + max_new_tokens={NEW} exceeds the model's limit of 512 positions",
        f'{path}:8: "messages" needs a tokenizer with a chat template and this one has none; use "prompt"']
    assert reports[5].startswith("lookahead generate: 6 lines written, 0 already done, 5 failed;")
    assert summary.failed == 5
    check_greedy(read_records(tmp_path / "out.jsonl"), greedy, stories[1])


def test_rerun_on_a_finished_output_adds_nothing(tmp_path):
    """A second run with the same output skips every line and leaves the file as it was."""
    path, out = write_jsonl(tmp_path / "in.jsonl", LINES), tmp_path / "out.jsonl"
    run(path, str(out), max_new_tokens=NEW, errors=io.StringIO())
    before = out.read_bytes()
    summary = run(path, str(out), max_new_tokens=NEW, errors=io.StringIO())
    assert out.read_bytes() == before
    assert (summary.written, summary.skipped, summary.new_tokens) == (0, len(LINES), 0)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A complete output of the test lines, as bytes."""
    folder = tmp_path_factory.mktemp("finished")
    run(write_jsonl(folder / "in.jsonl", LINES), str(folder / "out.jsonl"), max_new_tokens=NEW, batch_size=2,
        errors=io.StringIO())
    return (folder / "out.jsonl").read_bytes()


@settings(max_examples=6)
@given(cut=st.floats(0, 1))
def test_killed_job_resumes_without_duplicates(tmp_path_factory, stories, greedy, finished, cut):
    """An output cut anywhere (a job killed mid-write) is completed by a rerun: every id once, greedy's tokens."""
    folder = tmp_path_factory.mktemp("resume")
    out = folder / "out.jsonl"
    out.write_bytes(finished[: int(cut * len(finished))])
    errors = io.StringIO()
    run(write_jsonl(folder / "in.jsonl", LINES), str(out), max_new_tokens=NEW, batch_size=2, errors=errors)
    check_greedy(read_records(out), greedy, stories[1])
    partial = not finished[: int(cut * len(finished))].endswith(b"\n") and int(cut * len(finished)) > 0
    assert ("removed a last line cut off" in errors.getvalue()) == partial


def test_sampling_is_seeded(tmp_path):
    """With do_sample the same seed writes the same lines, another seed other lines."""
    path = write_jsonl(tmp_path / "in.jsonl", LINES)
    texts = []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        run(path, str(tmp_path / name), max_new_tokens=NEW, do_sample=True, temperature=1.0, top_p=0.9, seed=seed,
            errors=io.StringIO())
        texts.append([r["text"] for r in read_records(tmp_path / name)])
    assert texts[0] == texts[1] and texts[0] != texts[2]


def test_output_to_stdout_and_echo(tmp_path, capsys):
    """`output="-"` writes the records to stdout; `echo` gets "[id] text" per line."""
    echo = io.StringIO()
    run(write_jsonl(tmp_path / "in.jsonl", LINES[:2]), "-", max_new_tokens=4, echo=echo, errors=io.StringIO())
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in records] == ["story", 2]
    assert echo.getvalue().splitlines()[0] == f"[story] {records[0]['text']}"


@pytest.fixture(scope="module")
def described(stories):
    """What lines are checked against: the stories tokenizer, 512 positions, 8 new tokens."""
    return Model(stories[1], 512, 512, 8)


@given(ident=st.one_of(st.integers(-10**6, 10**6), st.text(max_size=8)), words=st.lists(
    st.sampled_from(["Lily", "ran", "to", "the", "park", "."]), min_size=1, max_size=20))
def test_parse_line_tokenizes_the_prompt_and_keeps_the_id(described, ident, words):
    """A prompt line keeps its id, its tokens are the tokenizer's, and the id cannot be used again."""
    prompt = " ".join(words)
    seen = {}
    line = parse_line(json.dumps({"id": ident, "prompt": prompt}), 3, described, seen)
    assert line.id == ident and line.number == 3
    assert line.input_ids.tolist() == described.tokenizer(prompt).input_ids
    with pytest.raises(BadLine, match=f"already used on line 3"):
        parse_line(json.dumps({"id": ident, "input_ids": [5]}), 9, described, seen)


@pytest.mark.parametrize("row, reason", [
    ('[1, 2]', "expected a JSON object, got list"),
    ('{"id": [1], "prompt": "a"}', '"id" must be a string or an integer, got [1]'),
    ('{"id": true, "prompt": "a"}', '"id" must be a string or an integer, got true'),
    ('{"prompt": "a", "input_ids": [5]}',
     'expected one of "prompt", "messages", "input_ids"; got prompt and input_ids'),
    ('{"prompt": 5}', '"prompt" must be a string, got int'),
    ('{"prompt": ""}', "the prompt is empty (no tokens)"),
    ('{"input_ids": [1, 512]}', '"input_ids" must lie in [0, 512) (the model\'s vocabulary), got ids from 1 to 512'),
    ('{"input_ids": [1, 2.5]}', '"input_ids" must be a list of integers'),
    ('{"prompt": "a", "documents": "text"}', '"documents" must be a list of strings or of token id lists, got str'),
    ('{"prompt": "a", "documents": [[1, -1]]}', '"documents" must lie in [0, 512)'),
    ('{"messages": "hi"}', '"messages" must be a list of {"role": ..., "content": ...} objects'),
    ('{"prompt": "Once upon a time"}', "the tokenizer gave id 407, outside the model's vocabulary [0, 300)"),
])
def test_parse_line_says_what_is_wrong(described, row, reason):
    """Each kind of bad line gets a one-line reason that names the field."""
    small = Model(described.tokenizer, 300, 512, 8)  # a model smaller than its tokenizer, for the last case
    with pytest.raises(BadLine) as error:
        parse_line(row, 1, described if "Once" not in row else small, {})
    assert str(error.value).startswith(reason) and "\n" not in str(error.value)


def test_done_ids_reads_ids_and_drops_a_partial_line(tmp_path):
    """The ids of complete lines are done; a last line without its newline is cut off the file."""
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": 1, "text": "a"}\n{"id": "1"}\n{"id": "x", "te')
    assert done_ids(out) == ({"1", '"1"'}, True)
    assert out.read_text() == '{"id": 1, "text": "a"}\n{"id": "1"}\n'
    assert done_ids(tmp_path / "missing.jsonl") == (set(), False)


@pytest.mark.parametrize("kwargs, message", [
    (dict(engine="spark"), "engine must be one of local, ray, got 'spark'"),
    (dict(draft="tree"), "draft='tree' needs lookup='suffix', 'recycle' or 'suffix+recycle', got lookup='ngram'"),
    (dict(batch_size=0), "batch_size must be an int >= 1, got 0"),
    (dict(max_new_tokens=True), "max_new_tokens must be an int >= 1, got True"),
    (dict(top_p=0), "temperature must be > 0 and top_p in (0, 1], got 1.0, 0"),
    (dict(dtype="int8"), "dtype must be one of fp32, bf16, fp16, got 'int8'"),
    (dict(engine="ray", workers=0), "workers must be an int >= 1, got 0"),
    (dict(model="/nonexistent/model"), "no model folder at /nonexistent/model (no such directory)"),
])
def test_run_refuses_bad_settings(tmp_path, kwargs, message):
    """Settings out of range raise ValueError naming the setting, before anything is written."""
    with pytest.raises(ValueError) as error:
        run(write_jsonl(tmp_path / "in.jsonl", LINES), str(tmp_path / "out.jsonl"), **kwargs)
    assert str(error.value) == message
    assert not (tmp_path / "out.jsonl").exists()


def test_run_says_when_the_input_cannot_be_read(tmp_path):
    """A missing input file is one ValueError naming the file."""
    with pytest.raises(ValueError, match="cannot read .*missing.jsonl: No such file or directory"):
        run(str(tmp_path / "missing.jsonl"), str(tmp_path / "out.jsonl"), errors=io.StringIO())


def test_run_says_when_the_output_cannot_be_written(tmp_path):
    """An output in a missing folder is one ValueError naming the file, raised before any line is generated."""
    out = tmp_path / "no-such-folder" / "out.jsonl"
    with pytest.raises(ValueError, match=f"cannot write {out}: No such file or directory"):
        run(write_jsonl(tmp_path / "in.jsonl", LINES), str(out), errors=io.StringIO())


def test_options_are_checked_at_construction():
    """`Options` refuses a lookup it does not know."""
    with pytest.raises(ValueError,
                       match="lookup must be one of ngram, suffix, recycle, suffix\\+recycle, none, got 'regex'"):
        Options(lookup="regex")


def test_job_threads_given_or_chosen(tmp_path, greedy, stories):
    """`run(threads=)` generates with that many torch threads, restores torch's, and reports them; by default it
    takes the free cores (`choose_threads`). Outputs stay greedy's."""
    before = torch.get_num_threads()
    out = tmp_path / "out.jsonl"
    summary = run(write_jsonl(tmp_path / "in.jsonl", LINES), str(out), max_new_tokens=NEW, threads=2,
                  errors=io.StringIO())
    assert (summary.threads, summary.threads_chosen) == (2, False) and torch.get_num_threads() == before
    assert str(summary).endswith("; 2 torch threads (as given)")
    check_greedy(read_records(out), greedy, stories[1])
    summary = run(write_jsonl(tmp_path / "in.jsonl", LINES), str(tmp_path / "o2.jsonl"), max_new_tokens=NEW,
                  errors=io.StringIO())
    assert summary.threads_chosen and 1 <= summary.threads <= os.cpu_count()


@pytest.mark.parametrize("threads, error, message", [
    (0, ValueError, "threads must be >= 1, got 0"),
    (1.5, TypeError, "threads must be an int, got float (1.5)"),
])
def test_job_refuses_bad_threads(tmp_path, threads, error, message):
    """A bad thread count is refused before the model loads, naming the argument."""
    with pytest.raises(error, match=re.escape(message)):
        run(write_jsonl(tmp_path / "in.jsonl", LINES), str(tmp_path / "out.jsonl"), threads=threads)
