"""Measurement tools behind `lookahead bench`: model-free replay, HF prompt lookup as a peer, trace files and git
history as workloads, forced replay of recorded outputs, wall-clock and index timing harnesses."""
from .forced import ForcedReplay
from .git_traces import git_traces
from .peers import PromptLookup
from .replay import ReplayStats, predicted_speedup, replay_dataset, replay_trace
from .traces_io import load_tokenizer, read_traces

__all__ = ["ForcedReplay", "PromptLookup", "ReplayStats", "git_traces", "load_tokenizer", "predicted_speedup",
           "read_traces", "replay_dataset", "replay_trace"]
