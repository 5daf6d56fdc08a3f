"""Host overhead of a decoding step (issue 12, item 2): the time a step spends outside the model's forward, for
transformers' greedy and for lookahead's chains and trees, measured in the same run on a tiny model (one CPU
thread), where the forward is cheap and the host's work shows.

Host time per step = (the call - everything up to the end of the prefill - the forwards after it) / the forwards after
the prefill: drafting, acceptance, cache commit, logits processing and bookkeeping. Each method is reported as a
ratio to transformers' greedy host time per step at the same batch size (issue targets at batch 1: chains <= 0.15x,
trees <= 0.30x).

`floor` (method "floor", batch 1) is the least host work a speculative step can do: a drafter that costs nothing
and is always right (the recording's next tokens), the step's inputs written into a kept tensor, the forward, one
argmax of its logits on the host and the comparison in Python. No decoder anyone would ship; the host time of any
step that verifies drafts with the model and reads its choices on the host is at least this.

Example::

    rows = run_host(random_model("tiny", 50257, 50256), traces, eos=50256)
    print(markdown(rows))
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from ..model.facts import ModelFacts
from .e2e import left_pad
from .forcing import ForcedOutputs
from .methods import Method, resolve
from .steps import Batch, run_rounds
from .timing import ForwardTimer, spread

METHODS = ("hf-greedy", "lookahead-ngram", "lookahead-suffix", "lookahead-suffix-tree")
FLOOR = "floor"  # the lower bound of a speculative step's host work (`floor`), at batch 1 only
TARGETS = {"lookahead-ngram": 0.15, "lookahead-suffix": 0.15, "lookahead-suffix-tree": 0.30}  # at batch 1


@dataclass
class HostRow:
    batch: int
    method: str
    host_ms: tuple        # (median, min, max) over rounds: host milliseconds per step
    forward_ms: float     # forward milliseconds per step (median round)
    steps: int
    tokens: int
    mismatches: int
    phases: dict              # lookahead's host ms per step by phase (median round; empty for transformers)
    split: tuple = ()         # (ms per call after the prefill, ms per gap between steps, ms per call after the last
    # forward, steps per call): the host time of the median round, split where it falls
    ratio: float = float("nan")  # median host time over hf-greedy's at the same batch size


def run_host(model, traces: list, eos: int, batches=(1, 8, 16), prompts_at_1: int = 4, repeats: int = 3,
             max_new: int = 128, methods=METHODS, log=None, floor_width: int | None = None) -> list:
    """HostRows for every batch size and method (batch 1: `prompts_at_1` prompts one by one; batch b: the first b
    prompts in one call; methods in turns, a warm-up call each); `floor_width`: also `floor` at batch 1, drafting
    that many tokens a step."""
    forced = ForcedOutputs(traces, eos, model.device)
    hook = forced.attach(model)
    timer = ForwardTimer(model.device)
    rows, methods = [], resolve(methods, need="generate")
    at_1 = [] if floor_width is None else [Method(
        FLOOR, "the least host work of a speculative step (`host.floor`)", runner="call",
        options={"generate": functools.partial(floor, forced=forced, width=floor_width)})]
    try:
        for batch in batches:
            if batch > len(traces):
                continue
            groups = [[i] for i in range(min(prompts_at_1, len(traces)))] if batch == 1 else [list(range(batch))]
            calls = [Batch(*left_pad([traces[i][0] for i in g], eos, model.device), tuple(g), max_new) for g in groups]
            say = (lambda line, b=batch: log(f"batch {b}: {line}")) if log else None
            timed = methods + (at_1 if batch == 1 else [])
            samples, _ = run_rounds(model, timed, calls, forced, timer, eos, repeats, log=say)
            rows += [_row(batch, name, runs) for name, runs in samples.items()]
    finally:
        hook.remove()
    greedy = {r.batch: r.host_ms[0] for r in rows if r.method == "hf-greedy"}
    for r in rows:
        r.ratio = r.host_ms[0] / greedy[r.batch] if r.batch in greedy else float("nan")
    return rows


def floor(model, ids, mask, max_new: int, eos: int, forced: ForcedOutputs, width: int = 15):
    """Generate one row as a speculative decoder whose drafter is free and always right: each step verifies the
    recording's next `width` tokens (`forced` makes the model choose them) in one forward over the dynamic cache
    (transformers' own: its update and causal mask fall inside the forward), takes the argmax of the step's logits on
    the host and compares it with the draft in Python. Every draft is accepted, so the cache is never cut back. No
    logits outlive their argmax (large ones cost their memory map when freed), and the prefill computes its last
    column only. The host time between its forwards is the least that any step of this kind (drafts verified by the
    model, choices read on the host) spends on this machine.

    Returns:
        LongTensor [1, prompt + new], as `generate` (eos ends a row and is kept).
    """
    if ids.shape[0] != 1:
        raise ValueError(f"floor generates one row at a time, got a batch of {ids.shape[0]}")
    recorded = forced.expected(forced.row_of(ids[0][mask[0].bool()].tolist()), max_new)  # before the prefill: free
    n, cache = ids.shape[1], DynamicCache(config=model.config)
    facts = ModelFacts.of(model)
    kv, last = {facts.kv: cache}, facts.last_logits_only()  # transformers' keyword for the cache
    positions = torch.arange(n + max_new + width, device=ids.device)[None]
    step = torch.zeros((1, width + 1), dtype=torch.long)  # the step's input tensor, written through a numpy view
    inputs = step.numpy()
    with torch.inference_mode():
        out = [int(model(input_ids=ids, attention_mask=mask, **kv, use_cache=True, **last)
                   .logits[0, -1].argmax())]
        while len(out) < max_new and out[-1] != eos:
            draft = recorded[len(out): len(out) + min(width, max_new - len(out) - 1)]
            at, q = n + len(out) - 1, len(draft) + 1  # the position of the step's first input (the last token)
            inputs[0, 0] = out[-1]
            inputs[0, 1:q] = draft
            logits = model(input_ids=step[:, :q].to(ids.device), **kv, use_cache=True,
                           position_ids=positions[:, at: at + q]).logits
            choices = logits.cpu().numpy()[0].argmax(-1).tolist()
            del logits  # freed before the next forward, as lookahead's step frees its own
            k = 0
            while k < len(draft) and choices[k] == draft[k]:
                k += 1
            if k < len(draft):  # a real step would cut its cache back here, and cost more
                raise RuntimeError(f"floor: the model rejected the recorded token at new token {len(out) + k}; it "
                                   "runs on forced replays only (`ForcedOutputs`)")
            out += draft + [choices[k]]
        if eos in out:
            out = out[: out.index(eos) + 1]
    return torch.cat([ids, torch.tensor([out], dtype=ids.dtype, device=ids.device)], dim=1)


def _row(batch: int, method: str, runs: list) -> HostRow:
    host = [1e3 * (s.decode_seconds - s.forward_seconds) / max(s.steps, 1) for s in runs]
    median = runs[int(np.argsort(host)[len(host) // 2])]
    steps = max(median.steps, 1)
    phases = {k: 1e3 * median.phases.get(k, 0.0) / steps for k in ("draft", "accept", "commit") if median.phases}
    return HostRow(batch, method, spread(host), 1e3 * median.forward_seconds / steps, median.steps, median.tokens,
                   sum(s.mismatches for s in runs), phases, _split(median))


def _split(s) -> tuple:
    """(ms per call from the end of the prefill to the first step's forward, ms per gap between two steps' forwards,
    ms per call from the end of the last forward to the end of the call, steps per call), or () when the forwards were
    not seen."""
    gaps = s.steps - s.calls  # a call of n steps after its prefill has n - 1 gaps between them
    if not s.calls or gaps <= 0:
        return ()
    between = s.decode_seconds - s.forward_seconds - s.start_seconds - s.end_seconds
    return 1e3 * s.start_seconds / s.calls, 1e3 * between / gaps, 1e3 * s.end_seconds / s.calls, s.steps / s.calls


def split_markdown(rows: list) -> str:
    """Where each method's host time falls: once per call (after the prefill, until the first step's forward; after
    the last forward, until the call returns) and between two steps' forwards, in ms, with the steps per call."""
    lines = ["| batch | method | host ms/step | per call: after the prefill | between two forwards | per call: after the "
             "last forward | steps per call |", "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if r.split:
            lines.append(f"| {r.batch} | {r.method} | {r.host_ms[0]:.3f} | {r.split[0]:.3f} | {r.split[1]:.3f} | "
                         f"{r.split[2]:.3f} | {r.split[3]:.1f} |")
    return "\n".join(lines)


def markdown(rows: list) -> str:
    """One row per (batch, method): host ms per step (median, min-max), the ratio to transformers' greedy, the
    target where the issue sets one, lookahead's own split of its host time (``GenerationStats.seconds``, when
    reported), the forward's ms per step and tokens per step."""
    lines = ["| batch | method | host ms/step (min-max) | vs hf-greedy host | target (batch 1) | of which draft | "
             "accept | commit | forward ms/step | steps | tokens/step | same as recorded |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        med, lo, hi = r.host_ms
        goal = TARGETS.get(r.method) if r.batch == 1 else None
        target = "—" if goal is None else f"<= {goal:.2f}x {'✓' if r.ratio <= goal else '✗'}"
        phases = " | ".join(f"{r.phases[k]:.3f}" if k in r.phases else "—" for k in ("draft", "accept", "commit"))
        lines.append(f"| {r.batch} | {r.method} | {med:.3f} ({lo:.3f}-{hi:.3f}) | {r.ratio:.2f}x | {target} | "
                     f"{phases} | {r.forward_ms:.3f} | {r.steps} | {r.tokens / max(r.steps + 1, 1):.2f} | "
                     f"{'yes' if not r.mismatches else f'NO ({r.mismatches} rows)'} |")
    return "\n".join(lines)


def folded(traces: list, vocab: int) -> list:
    """Traces with their token ids folded into `vocab` ids (id mod vocab - 1; vocab - 1 is left for eos): what
    copies what stays so, and a model with that vocabulary computes small logits."""
    return [([t % (vocab - 1) for t in prompt], [t % (vocab - 1) for t in output]) for prompt, output in traces]


COLD_OPS = {  # one small operation of each kind a host step is made of
    "python (sum of 20 ints)": lambda a, t: sum(range(20)),
    "numpy reduction (max of 1)": lambda a, t: a.max(),
    "numpy arithmetic (5 + 1)": lambda a, t: a + 1,
    "numpy allocation (zeros(3))": lambda a, t: np.zeros(3),
    "torch allocation (zeros(3))": lambda a, t: t.new_zeros(3),
}


def cold_costs(model, tokens: int = 11, repeats: int = 100) -> list:
    """(operation, microseconds right after a forward over `tokens` tokens, microseconds when repeated at once):
    medians over `repeats` forwards. A forward streams the weights and the logits through the CPU's caches, so the
    host's next operation finds its own code and data evicted."""
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), device=model.device)
    a, t = np.zeros(5), torch.zeros(1)
    rows = []
    with torch.inference_mode():
        for name, op in COLD_OPS.items():
            after, again = [], []
            for _ in range(repeats):
                model(input_ids=ids)
                t0 = time.perf_counter_ns()
                op(a, t)
                t1 = time.perf_counter_ns()
                op(a, t)
                after.append(t1 - t0)
                again.append(time.perf_counter_ns() - t1)
            rows.append((name, float(np.median(after)) / 1e3, float(np.median(again)) / 1e3))
    return rows
