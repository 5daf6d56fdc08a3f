"""The main job: `lookahead generate INPUT.jsonl --output OUT.jsonl`, one machine or a Ray cluster (`run`)."""
from .driver import Summary, run
from .worker import Options

__all__ = ["Options", "Summary", "run"]
