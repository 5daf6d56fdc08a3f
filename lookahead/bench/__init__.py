"""Measurement tools: forced replay of recorded outputs, timing harnesses."""
from .forced import ForcedReplay

__all__ = ["ForcedReplay"]
