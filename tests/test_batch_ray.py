"""The JSONL job's Ray engine on a local cluster (2 CPUs, 2 workers): the local engine's output, resume, bad lines."""
import io
import json

import pytest

ray = pytest.importorskip("ray")

from lookahead.batch import run  # noqa: E402

NEW = 16
LINES = [{"id": f"s{i}", "prompt": f"Once upon a time, there was a {word}. The {word} liked to"}
         for i, word in enumerate(["dog", "cat", "bird", "little girl named Lily", "big red ball", "boy named Tom"])]
LINES.insert(2, {"id": "s1", "prompt": "a repeated id"})  # line 3
LINES.insert(4, "not json")  # line 5


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """One local Ray cluster of 2 CPUs for the module."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def write_jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def by_id(path) -> dict:
    records = [json.loads(line) for line in open(path)]
    assert len(records) == len({r["id"] for r in records})  # no duplicates
    return {r["id"]: r for r in records}


def test_ray_engine_writes_the_local_engines_output(tmp_path):
    """Two Ray workers write the same lines as the local engine (order aside), and report the same bad lines."""
    path = write_jsonl(tmp_path / "in.jsonl", LINES)
    reports = {}
    for engine in ("local", "ray"):
        errors = io.StringIO()
        summary = run(path, str(tmp_path / f"{engine}.jsonl"), engine=engine, workers=2, max_new_tokens=NEW,
                      batch_size=2, errors=errors)
        reports[engine] = errors.getvalue().splitlines()[:2]
        assert (summary.written, summary.failed) == (6, 2)
    assert by_id(tmp_path / "ray.jsonl") == by_id(tmp_path / "local.jsonl")
    assert reports["ray"] == reports["local"] == [f'{path}:3: id "s1" was already used on line 2',
                                                  f"{path}:5: not JSON (Expecting value at column 1)"]


def test_ray_engine_resumes_a_killed_job(tmp_path):
    """A Ray run on a partial output (two lines and half of one) adds only the missing lines."""
    path = write_jsonl(tmp_path / "in.jsonl", LINES)
    run(path, str(tmp_path / "full.jsonl"), max_new_tokens=NEW, batch_size=2, errors=io.StringIO())
    full = (tmp_path / "full.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "out.jsonl").write_text("".join(full[:2]) + full[2][:20])
    summary = run(path, str(tmp_path / "out.jsonl"), engine="ray", workers=2, max_new_tokens=NEW, batch_size=2,
                  errors=io.StringIO())
    assert (summary.written, summary.skipped) == (4, 2)
    assert set(by_id(tmp_path / "out.jsonl")) == set(by_id(tmp_path / "full.jsonl"))
    again = run(path, str(tmp_path / "out.jsonl"), engine="ray", workers=2, max_new_tokens=NEW, errors=io.StringIO())
    assert (again.written, again.skipped) == (0, 6)
