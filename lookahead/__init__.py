"""lookahead: lossless speculative decoding for Hugging Face causal LMs, drafted by an n-gram index."""
from .generate import GenerationStats, generate
from .index import NgramIndex
from .plugin import custom_generate, pipeline, plugin

__all__ = ["GenerationStats", "NgramIndex", "custom_generate", "generate", "pipeline", "plugin"]
__version__ = "0.1.0"
