"""Whether the suffix kernels' `_nrt=False` pays (issue 25): microseconds per drafting step of a `SuffixIndex` with
numba's reference counting off (`_suffix_build.kernel` as shipped) and on, on real text (this repository's own source
as UTF-8 bytes, tiled).

Each variant is a copy of the `lookahead` package whose `kernel` line says which, run in processes of its own with a
NUMBA_CACHE_DIR made fresh for it (compiled once, then loaded by its later runs; never the other variant's code); the
runs alternate between the variants, and each reports the median of its steps. Timed, each on its own: `propose(10)`,
`propose_tree(32)`, `extend` of 3 tokens, and the fused tree step (`_fused_kernels.step_trees` at batch 1: accepting a
tree verified against the text's true next tokens, extending the index, drafting the next tree of at most 32 nodes).

    python benchmarks/suffix_nrt.py                    # 7 runs of each variant, contexts of 1k and 32k tokens
    python benchmarks/suffix_nrt.py --runs 3 --steps 500
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from lookahead.bench.arguments import positive_int

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {"nrt-off": "kernel = functools.partial(njit, cache=True, _nrt=False)",
            "nrt-on": "kernel = functools.partial(njit, cache=True)"}
OPS = ("propose", "propose_tree", "extend", "fused_tree_step")


def text_pool(size: int) -> np.ndarray:
    """At least `size` tokens of real text: this repository's Python and Markdown files as UTF-8 bytes, tiled."""
    data = b"".join(p.read_bytes() for pattern in ("lookahead/**/*.py", "tests/*.py", "*.md")
                    for p in sorted(REPO.glob(pattern)))
    pool = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    return np.tile(pool, -(-size // len(pool)))[:size]


def _timed(fn) -> int:
    start = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - start


def measure_index(context: np.ndarray, stream: np.ndarray, steps: int) -> dict:
    """Nanoseconds per call of propose(10), propose_tree(32) and extend(3), each step on the same index."""
    from lookahead.index import SuffixIndex

    index = SuffixIndex()
    index.extend(context)
    index._reserve(3 * steps + 16)  # no growth inside the timed steps
    times = {op: [] for op in OPS[:3]}
    for i in range(steps):
        times["propose"].append(_timed(lambda: index.propose(10)))
        times["propose_tree"].append(_timed(lambda: index.propose_tree(32)))
        chunk = stream[3 * i:3 * i + 3]
        times["extend"].append(_timed(lambda: index.extend(chunk)))
    return times


def measure_fused(context: np.ndarray, stream: np.ndarray, steps: int) -> list:
    """Nanoseconds per fused tree step at batch 1 (`step_trees`), the target's choices being the text's next tokens."""
    from lookahead.decode import _fused_kernels as FK
    from lookahead.decode.policy import _BUCKETS
    from lookahead.decode.sizing import TreeSizing
    from lookahead.index import SuffixIndex

    nodes_budget, max_new = 32, 40 * steps + 64
    index = SuffixIndex()
    index.extend(context)
    index._reserve(max_new + 64)
    index._buffers(nodes_budget)
    sizing = TreeSizing(nodes_budget, 15, (0.0, 0.02))
    policy, cal = sizing.length, sizing.calibration
    pol = (_BUCKETS, policy.accepted, policy.rejected, policy.version)
    calib = (cal.EDGES, cal.accepted, cal.seen, cal.prior)
    sizing_args = (np.arange(nodes_budget + 1), *policy.tables(1))
    step_costs = sizing._step_costs(1)
    automata, scratches = (index._arrays,), (index._scratch,)
    bufs = [{"tokens": np.zeros((1, nodes_budget), np.int64), "parents": np.zeros((1, nodes_budget), np.int64),
             "probs": np.zeros((1, nodes_budget)), "sizes": np.zeros(1, np.int64), "matches": np.zeros(1, np.int64),
             "depths": np.zeros(1, np.int64)} for _ in range(2)]
    lens, out, last = np.zeros(1, np.int64), np.zeros((1, max_new), np.int64), np.zeros(1, np.int64)
    counts, bonus, nodes = (np.zeros(1, np.int64) for _ in range(3))
    totals, done = np.zeros(2, np.int64), np.zeros(1, np.bool_)
    paths, cols = np.zeros((1, nodes_budget), np.int64), np.zeros((1, nodes_budget + 1), np.int64)
    eos = np.zeros(0, np.int64)
    now, later = bufs
    width = FK.draft_trees(automata, scratches, lens, max_new, nodes_budget, sizing_args[0], *pol, *sizing_args[1:],
                           *calib, step_costs, now["tokens"], now["parents"], now["probs"], now["sizes"],
                           now["matches"], now["depths"], nodes)
    truth = np.concatenate([stream, np.zeros(64, np.int64)])
    times = []
    for _ in range(steps):
        depth = np.zeros(width + 1, np.int64)  # the target's choice after each column: the text's next token there
        for j in range(width):
            depth[j + 1] = depth[now["parents"][0, j] + 1] + 1
        targets = truth[lens[0] + depth][None, :]
        start = time.perf_counter_ns()
        finished, _, width = FK.step_trees(
            targets, now["tokens"], now["parents"], now["probs"], width, now["sizes"], now["matches"], now["depths"],
            automata, scratches, *pol, *calib, eos, max_new, lens, out, last, counts, bonus, paths, cols, done,
            totals, nodes_budget, *sizing_args, step_costs, later["tokens"], later["parents"], later["probs"],
            later["sizes"], later["matches"], later["depths"], nodes)
        times.append(time.perf_counter_ns() - start)
        assert finished == 0 and np.array_equal(out[0, :lens[0]], stream[:lens[0]]), "the replay left the text"
        now, later = later, now
    return times


def child(size: int, steps: int) -> None:
    pool = text_pool(size + 3 * steps + 40 * steps + 64)
    context, stream = pool[:size], pool[size:]
    measure_index(context[:64], stream, 8)  # compile (or load) before timing
    measure_fused(context[:64], stream, 4)
    times = measure_index(context, stream, steps)
    times["fused_tree_step"] = measure_fused(context, stream, steps)
    print(json.dumps({op: float(np.median(t)) / 1e3 for op, t in times.items()}))


def _variant_copy(root: Path, name: str) -> Path:
    """A copy of the package whose `kernel` line is the variant's."""
    dest = root / name
    shutil.copytree(REPO / "lookahead", dest / "lookahead", ignore=shutil.ignore_patterns("__pycache__"))
    path = dest / "lookahead" / "index" / "_suffix_build.py"
    source, count = re.subn(r"^kernel = .*$", VARIANTS[name], path.read_text(), flags=re.M)
    assert count == 1, "no `kernel = ...` line in _suffix_build.py"
    path.write_text(source)
    return dest


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=positive_int, default=7, help="runs of each variant, alternated")
    parser.add_argument("--steps", type=positive_int, default=2000, help="timed steps per run and context size")
    parser.add_argument("--sizes", type=positive_int, nargs="+", default=[1000, 32000], help="context sizes (tokens)")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return child(args.child, args.steps)
    root = Path(tempfile.mkdtemp(prefix="suffix_nrt_"))
    copies = {name: _variant_copy(root, name) for name in VARIANTS}
    caches = {name: root / f"cache-{name}" for name in VARIANTS}
    results = {(name, size): [] for name in VARIANTS for size in args.sizes}
    loads = [os.getloadavg()[0]]
    for run in range(args.runs):
        order = list(VARIANTS) if run % 2 == 0 else list(VARIANTS)[::-1]
        for size in args.sizes:
            for name in order:
                env = dict(os.environ, PYTHONPATH=str(copies[name]), NUMBA_CACHE_DIR=str(caches[name]))
                got = subprocess.run([sys.executable, __file__, "--child", str(size), "--steps", str(args.steps)],
                                     env=env, capture_output=True, text=True, check=True)
                results[name, size].append(json.loads(got.stdout.strip().splitlines()[-1]))
                loads.append(os.getloadavg()[0])
        print(f"run {run + 1}/{args.runs} done (load {loads[-1]:.1f})", file=sys.stderr)
    shutil.rmtree(root, ignore_errors=True)
    print(f"\nMedian over {args.runs} runs of each run's median µs ({args.steps} steps); [min-max of the runs]; "
          f"1-minute load average {min(loads):.1f}-{max(loads):.1f}\n")
    print("| context | op | " + " | ".join(VARIANTS) + " | on / off |")
    print("| ---: | --- | " + " | ".join("---:" for _ in VARIANTS) + " | ---: |")
    for size in args.sizes:
        for op in OPS:
            cells, medians = [], []
            for name in VARIANTS:
                values = [r[op] for r in results[name, size]]
                medians.append(float(np.median(values)))
                cells.append(f"{medians[-1]:.2f} [{min(values):.2f}-{max(values):.2f}]")
            print(f"| {size} | {op} | " + " | ".join(cells) + f" | {medians[1] / medians[0]:.2f}x |")


if __name__ == "__main__":
    main()
