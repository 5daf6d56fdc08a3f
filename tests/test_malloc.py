"""`lookahead serve`'s allocator settings (`runtime.malloc`): memory a step frees is reused by the next."""
import resource
import sys
import types

import numpy as np
import pytest

from lookahead.runtime import malloc


def faults(make) -> int:
    """Minor page faults while `make()` runs."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    make()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_memory_is_reused_without_faulting_in_fresh_pages():
    """glibc's own thresholds hand such blocks back and fault them in again, 1,500 page faults a step here."""
    assert malloc.keep_freed_memory()

    def step():  # a step's tensors, freed at its end
        return [np.ones(12 << 20, dtype=np.uint8) for _ in range(3)]

    step()
    again = faults(step)
    assert again < 200, f"{again} page faults for 9,216 pages freed just before"


def test_the_server_sets_the_allocator_first(monkeypatch):
    from lookahead.serve import server

    called = []
    monkeypatch.setattr(malloc, "keep_freed_memory", lambda: called.append(True) or True)
    server.configure(types.SimpleNamespace(log_level="warning", threads=None))
    assert called == [True]
