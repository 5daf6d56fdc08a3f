"""Measurement tools behind `lookahead bench` and benchmarks/: one registry of compared methods (`methods`),
model-free replay (`replay`, `quality`), peers and hindsight ceilings that need no extra package (`peers`,
`oracles`), trace files and git history as workloads, forced replay of recorded outputs on the device (`forcing`),
timing of calls and forwards (`timing`), and the wall-clock, GPU and index harnesses.

The names below are imported on first use, so that the console script's parser (`bench.cli`) loads no torch."""
from .._lazy import lazy

_SOURCES = {"ForcedReplay": ".forced", "ForcedOutputs": ".forcing", "git_traces": ".git_traces",
            "METHODS": ".methods", "Method": ".methods", "resolve": ".methods", "PromptLookup": ".peers",
            "VllmNgram": ".peers", "ReplayStats": ".replay", "predicted_speedup": ".replay", "ratio_cost": ".replay",
            "replay_dataset": ".replay", "replay_trace": ".replay", "load_tokenizer": ".traces_io",
            "read_traces": ".traces_io"}
__all__ = sorted(_SOURCES)
__getattr__, __dir__ = lazy(__name__, _SOURCES)
