"""How many CPU threads torch should use so that a timing means something on a shared machine.

torch starts one thread per core. When another process keeps a core busy, every parallel region of a forward
waits for the thread that shares that core, and a call can take twice as long one time as the next: three runs of
the demo on a 2-core machine with one busy process printed 0.46x, 1.80x and 0.47x. `free_cores` looks at how busy
the cores are right now (the other processes: this one sleeps while it looks) and `choose_threads` takes as many
threads as there are free cores, at least one.

Example::

    threads = choose_threads()          # 2 on an idle 2-core machine, 1 while another process keeps a core busy
    torch.set_num_threads(threads)
"""
from __future__ import annotations

import math
import os
import time


def cpu_count() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_cores(interval: float = 0.5) -> float:
    """How many cores other processes keep busy: the machine's non-idle share over `interval` seconds (while this
    process sleeps) times the cores, from ``/proc/stat``; elsewhere the 1-minute load average.

    Raises:
        ValueError: a negative interval.
    """
    if not interval >= 0:
        raise ValueError(f"interval must be >= 0 seconds, got {interval!r}")
    first = _cpu_times()
    if first is None:
        try:
            return float(min(os.getloadavg()[0], cpu_count()))
        except (AttributeError, OSError):
            return 0.0
    time.sleep(interval)
    second = _cpu_times()
    total, idle = second[0] - first[0], second[1] - first[1]
    share = (total - idle) / total if total > 0 else 0.0
    return max(share, 0.0) * (os.cpu_count() or 1)


class OtherWork:
    """How many cores other processes kept busy while a block ran (its own threads left out): ``/proc/stat``'s
    non-idle time less niced time (work that yields the CPU, such as lookahead's background compiler) and this
    process's CPU time, over the wall time; None where ``/proc/stat`` is missing.

    Example::

        with OtherWork() as others:
            timings = time_forwards()
        others.cores            # 0.0-0.2 on a quiet machine, about 2 beside two busy loops
    """

    cores = None

    def __enter__(self) -> "OtherWork":
        self._start = _cpu_times(), time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        (first, cpu, wall), second = self._start, _cpu_times()
        if first is None or second is None:
            return
        hertz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        busy = ((second[0] - first[0]) - (second[1] - first[1]) - (second[2] - first[2])) / hertz \
            - (time.process_time() - cpu)
        self.cores = max(busy, 0.0) / max(time.perf_counter() - wall, 1e-9)


def _cpu_times() -> tuple | None:
    """(all jiffies, idle + iowait jiffies, niced jiffies) of the machine, or None without ``/proc/stat``."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields[:8]), fields[3] + (fields[4] if len(fields) > 4 else 0), fields[1]


def free_cores(interval: float = 0.5) -> int:
    """Cores no other process is using now (at least 1): the cores less `busy_cores`, rounded down unless within
    a fifth of a core of the next whole one."""
    return max(1, min(cpu_count(), math.floor(cpu_count() - busy_cores(interval) + 0.2)))


def choose_threads(limit: int | None = None, interval: float = 0.5) -> int:
    """Threads for torch: `free_cores`, at most `limit` (default: torch's own count, one per core).

    Raises:
        ValueError: a limit below 1.
    """
    if limit is None:
        import torch

        limit = torch.get_num_threads()
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an int >= 1, got {limit!r}")
    return min(limit, free_cores(interval))
