"""The main job: `lookahead generate INPUT.jsonl --output OUT.jsonl`, one machine or a Ray cluster (`run`).

The names below are imported on first use, so that the console script's parser (`job.cli`) loads no torch."""
from .._lazy import lazy

_SOURCES = {"Options": ".worker", "Summary": ".driver", "run": ".driver"}
__all__ = ["Options", "Summary", "run"]
__getattr__, __dir__ = lazy(__name__, _SOURCES)
