"""glibc's allocator for a process that serves: keep the memory it frees, instead of handing it back to the system.

A serving step allocates and frees tens of megabytes (logits, the cache's copies when rows join or leave). glibc
hands large blocks back to the system as they are freed and moves its thresholds as it goes, so a later step's
tensors land on fresh pages that fault in one by one: at 64 SmolLM2 rows on this 2-core CPU, 31 steps took 42,000
to 618,000 page faults and 6.8-7.9 s, and whether drafting was on changed which (the same forwards 5-13% slower).
With fixed thresholds that keep freed memory (`keep_freed_memory`) the same steps took 1,000-30,000 faults and
6.2-6.5 s. The process's memory then stays at its peak, as a server's does anyway (vLLM's and TGI's allocate
their caches once).
"""
from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks up to it come from the heap, and are reused from there
TRIM_THRESHOLD = 1 << 30  # free memory at the heap's top kept before any is handed back


def keep_freed_memory() -> bool:
    """Set glibc's thresholds so that freed memory is kept for the next allocations (fixed thresholds, which glibc
    then stops moving); True where it did, False where the allocator is not glibc's (nothing changes).

    Example::

        keep_freed_memory()   # `lookahead serve` does it first
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
