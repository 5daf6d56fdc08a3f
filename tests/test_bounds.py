"""The generate fuzz (`fuzz_generate.py`), the server's engine fuzz (`fuzz_serve.py`) and the kernels at their buffers'
edges (`test_kernel_edges.py`) under numba's bounds checks, in a process of its own."""
import os
import subprocess
import sys
from pathlib import Path


def test_the_generate_fuzz_passes_under_numba_bounds_checks(tmp_path):
    """Every kernel compiled afresh with bounds checks (a fresh cache: one compiled without them would hide an
    out-of-bounds write), then the kernels at their buffers' edges, 120 random `generate` calls (FUZZ_EXAMPLES;
    `tests/fuzz_generate.py` alone runs 300) and 60 random loads of the server's engine (SERVE_FUZZ_EXAMPLES;
    `tests/fuzz_serve.py` alone runs 100): none writes outside its arrays, every greedy call and greedy served row
    equals `model.generate`."""
    here = Path(__file__).resolve().parent
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    env.setdefault("FUZZ_EXAMPLES", "120")  # in the suite (its ten minutes); more by setting them
    env.setdefault("SERVE_FUZZ_EXAMPLES", "60")
    files = [str(here / "test_kernel_edges.py"), str(here / "fuzz_generate.py"), str(here / "fuzz_serve.py")]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", *files],
                         cwd=here.parent, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
