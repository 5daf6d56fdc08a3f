"""lookahead: lossless speculative decoding for Hugging Face causal LMs, drafted by an n-gram index."""
from .generate import GenerationStats, generate
from .index import NgramIndex

__all__ = ["GenerationStats", "NgramIndex", "generate"]
__version__ = "0.1.0"
