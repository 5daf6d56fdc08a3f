"""lookahead: lossless speculative decoding for Hugging Face causal LMs, drafted by an n-gram / suffix index."""
from .generate import GenerationStats, generate
from .index import NgramIndex, SuffixIndex
from .memory import Memory
from .plugin import custom_generate, pipeline, plugin

__all__ = ["GenerationStats", "Memory", "NgramIndex", "SuffixIndex", "custom_generate", "generate", "pipeline",
           "plugin"]
__version__ = "0.1.0"
