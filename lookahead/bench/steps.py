"""Where the time of a decoding step goes: methods timed in turns on the same calls, each call split into prefill,
forwards and the host's work between them.

A `Sample` is one method's pass over a list of calls (prompt batches): wall clock, the time inside the forwards after
the prefill (CUDA events on a GPU), decoding steps, lookahead's own phase times (``GenerationStats.seconds`` where
generate reports them) and the rows whose output differs from the recording. `run_rounds` warms every method up
once, then runs ``repeats`` rounds, each method once per round in a rotated order.

Example::

    forced = ForcedOutputs(traces, eos, model.device); forced.attach(model)
    timer = ForwardTimer(model.device); timer.attach(model)
    samples, first = run_rounds(model, resolve(["hf-greedy", "lookahead-ngram"]), calls, forced, timer, eos, 3)
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import numpy as np

from .e2e import generate_with
from .timing import rotations, timed_call

PHASES = ("draft", "forward", "accept", "commit")


@dataclass
class Sample:
    """One method's pass over the calls of a workload (sums over the calls)."""

    seconds: float = 0.0         # wall clock of the calls
    decode_seconds: float = 0.0  # after the end of each call's prefill (nan where forwards were not seen)
    forward_seconds: float = 0.0  # inside the forwards after the prefill (nan where not seen)
    tokens: int = 0              # new tokens, eos excluded
    steps: int = 0               # decoding forwards after the prefill
    mismatches: int = 0          # rows whose new tokens differ from the recording
    drafted: int = 0             # draft tokens (or tree nodes) verified, all rows (lookahead's GenerationStats)
    phases: dict = field(default_factory=dict)  # lookahead's GenerationStats.seconds, summed, when reported
    calls: int = 0               # calls whose every forward was seen (the next two are theirs)
    start_seconds: float = 0.0   # from the end of each call's prefill to the start of its first step's forward
    end_seconds: float = 0.0     # from the end of each call's last forward to the end of the call

    def add(self, other: "Sample") -> None:
        for name in ("seconds", "decode_seconds", "forward_seconds", "tokens", "steps", "mismatches", "drafted",
                     "calls", "start_seconds", "end_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for key, value in other.phases.items():
            self.phases[key] = self.phases.get(key, 0.0) + value


@dataclass(frozen=True)
class Batch:
    """One generate call: left-padded ids and mask, the traces its rows replay, the new-token limit."""

    ids: object
    mask: object
    rows: tuple
    max_new: int


def call_sample(model, method, batch: Batch, forced, timer, eos: int, compiled: bool = False) -> Sample:
    """Run `method` once on `batch` and account for it; `compiled`: its forwards run inside a compiled graph, where
    the timer's hooks are taken off (the forcing hook stays: it is traced into the graph); only its CUDA graph
    replays are timed then."""
    forced.reset()
    handles = timer.attach(model, hooks=not compiled) if timer is not None else []
    try:
        call = timed_call(lambda: generate_with(method, model, batch.ids, batch.mask, batch.max_new, eos), timer,
                          model.device)
    finally:
        for handle in handles:
            handle.remove()
    out, stats = call.result
    width = batch.ids.shape[1]
    written = [row[: row.index(eos) + 1] if eos in row else row for row in out[:, width:].tolist()]
    expected = [forced.expected(r, batch.max_new) for r in batch.rows]
    sample = Sample(seconds=call.seconds, tokens=sum(len(w) - (w[-1] == eos) for w in written if w),
                    mismatches=sum(w != e for w, e in zip(written, expected)))
    seen = call.forwards if handles else 0
    # transformers' compiled greedy may replay more than one graph per token: count its steps by tokens then
    forwards = seen if seen and not compiled else max(map(len, written))
    sample.steps = (stats.forward_passes if stats is not None else forwards) - 1
    if seen and seen == sample.steps + 1:
        sample.decode_seconds, sample.forward_seconds = call.decode_seconds, float(call.durations[1:].sum())
        if seen > 1:
            ends = call.starts + call.durations
            sample.calls, sample.start_seconds = 1, float(call.starts[1] - ends[0])
            sample.end_seconds = call.seconds - float(ends[-1])
    elif seen and compiled and seen == sample.steps:  # graph replays only: the (compiled) prefill went unseen
        sample.decode_seconds = call.seconds - float(call.starts[0])  # from the first replay (less one step's host)
        sample.forward_seconds = float(call.durations.sum())
    else:
        sample.decode_seconds = sample.forward_seconds = float("nan")
    sample.drafted = int(getattr(stats, "draft_tokens", 0))
    phases = getattr(stats, "seconds", None)
    if isinstance(phases, dict):
        sample.phases = {k: float(v) for k, v in phases.items()}
    return sample


def run_rounds(model, methods: list, batches: list, forced, timer, eos: int, repeats: int, compiled=(),
               log=None) -> tuple:
    """Warm every method up on the first batch, then ``repeats`` rounds over all batches, methods in turns.

    Args:
        methods: `methods.Method`s that generate.
        batches: `Batch`es (each round runs every method on every batch).
        forced: the `ForcedOutputs` hook attached to the model. timer: a `ForwardTimer` or None.
        compiled: names of the methods whose forwards are compiled graphs (no forward timing).
        log: called with a line after each round; with a log, a method whose warm-up call raises is logged (with
            its traceback) and left out, without one the error propagates.
    Returns:
        ({method name: [Sample per round]}, {method name: seconds of its warm-up call}), for the methods that ran.
    """
    first, working = {}, []
    for m in methods:
        try:
            first[m.name] = call_sample(model, m, batches[0], forced, timer, eos, m.name in compiled).seconds
            working.append(m)
        except Exception as error:  # one broken method must not lose the others' figures
            if log is None:
                raise
            log(f"{m.name} failed and is left out: {type(error).__name__}: {error}\n{traceback.format_exc()}")
    methods = working
    samples = {m.name: [] for m in methods}
    for r, order in enumerate(rotations(list(methods), repeats)):
        for m in order:
            total = Sample()
            for batch in batches:
                total.add(call_sample(model, m, batch, forced, timer, eos, m.name in compiled))
            samples[m.name].append(total)
        if log is not None:
            log(f"round {r + 1}/{repeats}")
    return samples, first


def per_step(sample: Sample) -> dict:
    """Milliseconds per decoding step: the step, the forward inside it, lookahead's phases (when reported) and the
    rest, and the host's share of the step (1 - forward / step). On a GPU "accept+commit" leaves out the time the
    host spent waiting there for the queued forward to finish."""
    steps = max(sample.steps, 1)
    step = sample.decode_seconds / steps if np.isfinite(sample.decode_seconds) else sample.seconds / steps
    forward = sample.forward_seconds / steps
    out = {"step": 1e3 * step, "forward": 1e3 * forward}
    if sample.phases:
        out["draft"] = 1e3 * sample.phases.get("draft", 0.0) / steps
        accept = sample.phases.get("accept", 0.0) + sample.phases.get("commit", 0.0)
        if np.isfinite(forward) and "forward" in sample.phases:  # a forward queued on a GPU returns at once: the
            # host then waits for it inside "accept" (the argmax's copy), which is forward time, not host time
            accept -= max(sample.forward_seconds - sample.phases["forward"], 0.0)
        out["accept+commit"] = 1e3 * max(accept, 0.0) / steps
    known = forward + sum(out.get(k, 0.0) for k in ("draft", "accept+commit")) / 1e3
    out["rest"] = 1e3 * (step - known) if np.isfinite(known) else float("nan")
    out["host share"] = 1.0 - forward / step if np.isfinite(forward) and step > 0 else float("nan")
    return out
