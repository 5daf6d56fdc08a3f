"""Verification of drafts: acceptance rules and the one place that rolls the KV cache back."""
from .cache import new_cache, rollback, select_rows
from .greedy import greedy_accept
from .sampling import sample_accept

__all__ = ["new_cache", "rollback", "select_rows", "greedy_accept", "sample_accept"]
