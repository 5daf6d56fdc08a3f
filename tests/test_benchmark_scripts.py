"""The scripts behind benchmarks/RESULTS.md start, and the server's step and load scripts run a small case on the
bundled model: a script that a change broke shows here, not when someone next reruns its table (`serve_load.py`
failed at its first step for a week after `Engine._step` began to take a batch)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
DATA = ROOT.parent / "shared" / "data"
STORIES = ROOT / "lookahead" / "models" / "stories260K"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if '__name__ == "__main__"' in p.read_text())

# each script's --help in one interpreter (torch and transformers import once): [(script, why it failed)]
HELP = """
import contextlib, io, runpy, sys
sys.path.insert(0, {bench!r})
failed = []
for name in {names!r}:
    sys.argv = [name, "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path({bench!r} + "/" + name, run_name="__main__")
        failed.append((name, "ran past --help"))
    except SystemExit as stop:
        if stop.code not in (0, None) or "usage:" not in out.getvalue():
            failed.append((name, f"exit {{stop.code}}: {{out.getvalue()[-300:]}}"))
    except BaseException as error:
        failed.append((name, repr(error)))
print(failed)
"""


def run(*args, timeout: int = 600) -> str:
    """A benchmark script's stdout; fails the test with its stderr's tail when it exits non-zero."""
    done = subprocess.run([sys.executable, *map(str, args)], cwd=BENCH, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_every_benchmark_script_answers_help():
    assert len(SCRIPTS) >= 15
    out = run("-c", HELP.format(bench=str(BENCH), names=SCRIPTS))
    assert out.strip().splitlines()[-1] == "[]"


def test_serve_step_gives_generate_tokens_through_both_caches():
    out = run("serve_step.py", "--max-new", 24, "--rounds", 1)
    rows = [line for line in out.splitlines() if re.match(r"\| (dynamic|static) \|", line)]
    assert len(rows) == 4, out  # the engine and generate, with each cache
    assert all(line.rstrip(" |").endswith("yes") for line in rows), out


def test_serve_step_times_sampling_rows():
    out = run("serve_step.py", "--max-new", 16, "--rounds", 1, "--rows", 2, "--temperature", 0.8, "--caches", "dynamic")
    rows = [line for line in out.splitlines() if line.startswith("| dynamic |")]
    assert len(rows) == 2 and all("n/a (sampled)" in line for line in rows), out
    assert "sampling at temperature 0.8" in out


@pytest.mark.skipif(not (DATA / "rag").exists(), reason=f"{DATA} not found")
def test_serve_load_gives_the_same_text_with_and_without_drafts():
    out = run("serve_load.py", "--model", STORIES, "--no-warm", "--workloads", "rag", "--per-workload", 1,
              "--max-prompt", 400, "--max-new", 8, "--clients", 1, 2, "--rounds", 1, "--threads", 1, "--data", DATA)
    table = [line for line in out.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [line.split("|")[1].strip() for line in table] == ["1", "2"], out
    assert all(line.rstrip(" |").endswith("True") for line in table), out
