"""Measurement tools behind `lookahead bench` and benchmarks/: one registry of compared methods (`methods`),
model-free replay (`replay`, `quality`), peers and hindsight ceilings that need no extra package (`peers`,
`oracles`), trace files and git history as workloads, forced replay of recorded outputs on the device (`forcing`),
timing of calls and forwards (`timing`), and the wall-clock, GPU, host-overhead and index harnesses."""
from .forced import ForcedReplay
from .forcing import ForcedOutputs
from .git_traces import git_traces
from .methods import METHODS, Method, resolve
from .peers import PromptLookup, VllmNgram
from .replay import ReplayStats, predicted_speedup, ratio_cost, replay_dataset, replay_trace
from .traces_io import load_tokenizer, read_traces

__all__ = ["METHODS", "ForcedOutputs", "ForcedReplay", "Method", "PromptLookup", "ReplayStats", "VllmNgram",
           "git_traces", "load_tokenizer", "predicted_speedup", "ratio_cost", "read_traces", "replay_dataset",
           "replay_trace", "resolve"]
