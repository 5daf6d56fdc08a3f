"""The main job from Python: generate for every line of a JSONL file, resumably, and read the summary.

Runs offline on the bundled stories260K model; set MODEL to a folder or hub id for another one, and ENGINE to "ray"
(after `pip install -e ".[ray]"`) to spread the batches over WORKERS model replicas.
"""
import json
import tempfile
from pathlib import Path

from lookahead.job import run

INPUT = Path(__file__).resolve().parent / "stories.jsonl"
MODEL = None  # None: the bundled stories260K
ENGINE, WORKERS = "local", 1
MAX_NEW_TOKENS = 64


def main() -> None:
    output = Path(tempfile.mkdtemp()) / "stories.out.jsonl"
    summary = run(INPUT, output, MODEL, engine=ENGINE, workers=WORKERS, lookup="suffix", max_new_tokens=MAX_NEW_TOKENS,
                  batch_size=4, memory=10_000)
    for line in open(output):
        record = json.loads(line)
        print(f"[{record['id']}] {record['tokens_per_forward']:.2f} tokens/forward: {record['text'][:80]!r}")
    again = run(INPUT, output, MODEL, engine=ENGINE, workers=WORKERS, max_new_tokens=MAX_NEW_TOKENS)
    print(f"first run: {summary.written} lines, {summary.tokens_per_forward:.2f} tokens per forward; "
          f"rerun: {again.written} written, {again.skipped} already done")


if __name__ == "__main__":
    main()
