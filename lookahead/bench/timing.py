"""Timing of generate calls and of the forwards inside them, and methods run in turns so that drift in the
machine's speed falls on all of them alike.

`ForwardTimer` hooks a model: on CUDA it records a pair of CUDA events around every forward (the forward's span on
the device's timeline; in eager mode that includes the gaps where the GPU waits for the host's launches), on a CPU
it reads `time.perf_counter` around it. Forwards replayed from a CUDA graph run no
hooks: on CUDA the timer also marks every `CUDAGraph.replay` while attached (a lookahead static step is one replay);
a call whose forwards were not all seen (a compiled forward) reports no forward time, see `steps`. On a CPU a lookahead
static step (`lookahead.model.static._step`) is marked as one forward too, the attention mask it builds included: on CUDA
that mask is built inside the step's graph, on the device, so host time means the same on both.
`timed_call` runs one call and returns a `Call`: wall-clock seconds (the
device's queued work included), each forward's start and duration, and the call's output.

Example::

    timer = ForwardTimer(model.device)
    handles = timer.attach(model)
    call = timed_call(lambda: model.generate(ids, max_new_tokens=32), timer)
    print(call.seconds, call.forward_seconds, call.host_seconds_per_step)
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Call:
    """One timed call: ``seconds`` wall clock; ``starts``/``durations`` of each forward in seconds from the call's
    start (None when the forwards were not seen, e.g. inside a CUDA graph); the call's ``result``."""

    seconds: float
    starts: np.ndarray | None
    durations: np.ndarray | None
    result: object = None

    @property
    def forwards(self) -> int:
        return 0 if self.durations is None else len(self.durations)

    @property
    def forward_seconds(self) -> float:
        """Time inside forwards, the prefill included (nan when not seen)."""
        return float(self.durations.sum()) if self.forwards else float("nan")

    @property
    def decode_seconds(self) -> float:
        """From the end of the prefill (the first forward) to the end of the call."""
        return self.seconds - float(self.starts[0] + self.durations[0]) if self.forwards else float("nan")

    @property
    def host_seconds_per_step(self) -> float:
        """Time per decoding step spent outside the model's forwards: the call less everything up to the end of the
        prefill and less the forwards after it, over the forwards after the prefill."""
        if self.forwards < 2:
            return float("nan")
        return (self.decode_seconds - float(self.durations[1:].sum())) / (self.forwards - 1)


class ForwardTimer:
    """Times each forward of the models it is attached to (see module docstring)."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self._marks: list = []  # per forward: (start, end) events on CUDA, perf_counter floats on a CPU
        self._open, self._inside = None, False  # _inside: within a static step marked as a whole

    def attach(self, model, hooks: bool = True) -> list:
        """Register the pre- and post-forward hooks (`hooks`; leave them off for a compiled forward, which would
        trace them) and on CUDA time every CUDA graph replay as a forward (replays run no hooks), on a CPU every
        uncompiled static step (with `hooks`); returns the handles (call `.remove()` on each)."""
        handles = [model.register_forward_pre_hook(self._before), model.register_forward_hook(self._after)] if hooks \
            else []
        return handles + ([_ReplayTimer(self)] if self.cuda else [_StepTimer(self)] if hooks else [])

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _before(self, module, args):
        if not _capturing() and not self._inside:
            self._open = self._now()

    def _after(self, module, args, output):
        if not _capturing() and not self._inside:  # a CUDA graph being captured: its replays run no hooks
            self._marks.append((self._open, self._now()))

    def start(self) -> object:
        """Forget earlier forwards; return the call's start mark."""
        self._marks = []
        return self._now()

    def spans(self, start) -> tuple:
        """(starts, durations) in seconds of the forwards since `start` (synchronizes the device)."""
        if not self._marks:
            return None, None
        if self.cuda:
            torch.cuda.synchronize()
            begin = [start.elapsed_time(a) / 1e3 for a, _ in self._marks]
            length = [a.elapsed_time(b) / 1e3 for a, b in self._marks]
        else:
            begin = [a - start for a, _ in self._marks]
            length = [b - a for a, b in self._marks]
        return np.array(begin), np.array(length)


class _ReplayTimer:
    """Wraps `torch.cuda.CUDAGraph.replay` until `remove()`: each replay is marked like a forward (a lookahead step
    replayed from its graph is one forward)."""

    def __init__(self, timer: ForwardTimer):
        self.original = replay = torch.cuda.CUDAGraph.replay

        def timed(graph):
            timer._before(None, None)
            replay(graph)
            timer._after(None, None, None)

        torch.cuda.CUDAGraph.replay = timed

    def remove(self) -> None:
        torch.cuda.CUDAGraph.replay = self.original


class _StepTimer:
    """Wraps lookahead's uncompiled static step (`lookahead.model.static._step`) until `remove()`: each step is marked as one
    forward, its attention mask included, and the model's hooks inside it mark nothing."""

    def __init__(self, timer: ForwardTimer):
        from ..model import static

        self.module, self.original = static, static._step

        def timed(model, state, inputs):
            timer._before(None, None)
            timer._inside = True
            try:
                return self.original(model, state, inputs)
            finally:
                timer._inside = False
                timer._after(None, None, None)

        static._step = timed

    def remove(self) -> None:
        self.module._step = self.original


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed_call(fn, timer: ForwardTimer | None = None, device="cpu") -> Call:
    """Run ``fn()`` once and time it and (with a timer attached to the model) each forward inside it."""
    device = "cuda" if timer is not None and timer.cuda else device
    synchronize(device)
    mark = timer.start() if timer is not None else None
    begin = time.perf_counter()
    result = fn()
    synchronize(device)
    seconds = time.perf_counter() - begin
    starts, durations = timer.spans(mark) if timer is not None else (None, None)
    return Call(seconds, starts, durations, result)


def rotations(names: list, rounds: int) -> list:
    """``rounds`` orders of ``names``, each rotated by one more place (round-robin: no method always goes first).

    >>> rotations(["a", "b", "c"], 2)
    [['a', 'b', 'c'], ['b', 'c', 'a']]
    """
    n = max(len(names), 1)
    return [names[r % n:] + names[: r % n] for r in range(rounds)]


def spread(values) -> tuple:
    """(median, min, max) of a non-empty sequence."""
    values = np.asarray(values, dtype=float)
    return float(np.median(values)), float(values.min()), float(values.max())
