"""lookahead: lossless speculative decoding for Hugging Face causal LMs, drafted by an n-gram / suffix index.

Public names are imported on first use, so that ``import lookahead.index`` (numpy and numba) loads neither torch nor
transformers.
"""
import sys
import types

from ._lazy import lazy

__all__ = ["GenerationStats", "Memory", "NgramIndex", "SuffixIndex", "custom_generate", "generate", "pipeline",
           "plugin"]
__version__ = "0.1.0"
_SOURCES = {"GenerationStats": ".generate", "generate": ".generate", "Memory": ".index.memory", "NgramIndex": ".index",
            "SuffixIndex": ".index", "custom_generate": ".plugin", "pipeline": ".plugin", "plugin": ".plugin"}
__getattr__, __dir__ = lazy(__name__, _SOURCES)


class _Package(types.ModuleType):
    """`generate` and `plugin` each name a function and the submodule that defines it. Importing a submodule binds
    it here (``setattr(lookahead, "generate", <module>)``), which would hide the function from then on: the function
    wins, as it did when this file imported everything up front."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType) and name in _SOURCES:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
