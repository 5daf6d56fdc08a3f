"""Verification of drafts: the acceptance rules (greedy and speculative sampling, chains and trees) and how drafts
are packed into one step's batch."""
from .greedy import greedy_accept
from .sampling import sample_accept

__all__ = ["greedy_accept", "sample_accept"]
