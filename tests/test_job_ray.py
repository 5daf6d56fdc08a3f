"""The JSONL job's Ray engine on a local cluster (2 CPUs, 2 workers): the local engine's output, resume, bad lines."""
import io
import json

import pytest

ray = pytest.importorskip("ray")

from lookahead.job import run  # noqa: E402

NEW = 16
LINES = [{"id": f"s{i}", "prompt": f"Once upon a time, there was a {word}. The {word} liked to"}
         for i, word in enumerate(["dog", "cat", "bird", "little girl named Lily", "big red ball", "boy named Tom"])]
LINES.insert(2, {"id": "s1", "prompt": "a repeated id"})  # line 3
LINES.insert(4, "not json")  # line 5


def write_jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def by_id(path) -> dict:
    records = [json.loads(line) for line in open(path)]
    assert len(records) == len({r["id"] for r in records})  # no duplicates
    return {r["id"]: r for r in records}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """One local Ray cluster of 2 CPUs; a full local run, then a Ray run (2 workers) resuming a killed copy of it
    (two lines and half of the third kept)."""
    folder = tmp_path_factory.mktemp("ray")
    path = write_jsonl(folder / "in.jsonl", LINES)
    local_errors, ray_errors = io.StringIO(), io.StringIO()
    run(path, str(folder / "local.jsonl"), max_new_tokens=NEW, batch_size=2, errors=local_errors)
    kept = (folder / "local.jsonl").read_text().splitlines(keepends=True)
    (folder / "ray.jsonl").write_text("".join(kept[:2]) + kept[2][:20])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        summary = run(path, str(folder / "ray.jsonl"), engine="ray", workers=2, max_new_tokens=NEW, batch_size=2,
                      errors=ray_errors)
        again = run(path, str(folder / "ray.jsonl"), engine="ray", workers=2, max_new_tokens=NEW, errors=io.StringIO())
    finally:
        ray.shutdown()
    return dict(path=path, folder=folder, summary=summary, again=again, local_errors=local_errors.getvalue(),
                ray_errors=ray_errors.getvalue())


def test_ray_engine_writes_the_local_engines_output(jobs):
    """The lines two Ray workers add are the local engine's, ids and texts (order aside), with no duplicates. Forward
    counts may differ: each process measures the CPU's verification cost itself (the default draft_cost)."""
    written = lambda path: {i: {k: v for k, v in r.items() if k not in ("forwards", "tokens_per_forward")}
                            for i, r in by_id(path).items()}
    assert written(jobs["folder"] / "ray.jsonl") == written(jobs["folder"] / "local.jsonl")


def test_ray_engine_resumes_a_killed_job(jobs):
    """The Ray run drops the half-written line, skips the two complete ones and writes the four others."""
    assert (jobs["summary"].written, jobs["summary"].skipped, jobs["summary"].failed) == (4, 2, 2)
    assert f"{jobs['folder'] / 'ray.jsonl'}: removed a last line cut off by an earlier run" in jobs["ray_errors"]
    assert (jobs["again"].written, jobs["again"].skipped) == (0, 6)


def test_ray_engine_reports_bad_lines_as_the_local_one(jobs):
    """Bad lines get the same INPUT:LINE: reason lines from both engines."""
    path = jobs["path"]
    expected = [f'{path}:3: id "s1" was already used on line 2', f"{path}:5: not JSON (Expecting value at column 1)"]
    assert [line for line in jobs["ray_errors"].splitlines() if line.startswith(path)] == expected
    assert [line for line in jobs["local_errors"].splitlines() if line.startswith(path)] == expected
