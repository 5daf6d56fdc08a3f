"""The main job: `lookahead generate INPUT.jsonl --output OUT.jsonl`, one machine or a Ray cluster (`run`).

The names below are imported on first use, so that the console script's parser (`job.cli`) loads no torch."""
import importlib

_SOURCES = {"Options": ".worker", "Summary": ".driver", "run": ".driver"}
__all__ = ["Options", "Summary", "run"]


def __getattr__(name: str):
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_SOURCES[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
