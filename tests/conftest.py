"""Test settings: a hypothesis profile sized for a 2-core CI machine, and shared fixtures."""
import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

# Tiny models: threading costs more than it brings, and a loaded CI machine makes spinning threads very slow.
torch.set_num_threads(1)

settings.register_profile("ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=60, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
STORIES = SHARED / "models" / "stories260K"


FIRST = ("test_bounds.py",)  # the longest single test (kernels compiled afresh with bounds checks, then a fuzz): started
# first, so that the other worker runs the rest of the suite beside it


def pytest_collection_modifyitems(items):
    """Run the tests of `FIRST` before the others (the workers take files in this order)."""
    items.sort(key=lambda item: item.path.name not in FIRST)


@pytest.fixture(scope="session", autouse=True)
def _own_cache_folder(tmp_path_factory):
    """The suite keeps its measured cost curves (`lookahead.decode.curves`) in a folder of its own, never in the
    user's ~/.cache/lookahead: curves measured on a loaded test machine must not decide a user's drafts."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture(scope="session", autouse=True)
def _compiled_kernels():
    """The suite runs numba's kernels (compiling what is not cached), as before the Python twins: `tests/test_jit.py`
    compares the tiers and runs what a fresh install's first call does."""
    from lookahead.runtime import jit as _jit

    with _jit.compiled():
        yield


@pytest.fixture(scope="session")
def stories_model():
    """The real pretrained 260K-parameter Llama from ../shared/models, or skip when it is absent."""
    if not (STORIES / "config.json").exists():
        pytest.skip(f"{STORIES} not found")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(STORIES).eval()


@pytest.fixture
def cli(capsys):
    """`cli(*args)` -> (exit status, stdout, stderr) of `lookahead ARGS`, argparse's own exits included."""
    from lookahead.cli import main

    def run(*args) -> tuple:
        try:
            status = main([str(a) for a in args])
        except SystemExit as stop:
            status = stop.code
        out = capsys.readouterr()
        return status, out.out, out.err
    return run
