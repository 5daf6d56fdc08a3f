"""A real model writing its own greedy answers (`lookahead bench real`): transformers greedy, its prompt lookup and
lookahead's methods on the same chat prompts, whole calls timed in turns.

For each prompt every method runs `repeats` times in rotated orders (with a one-token greedy call that times the
prefill), and each counts its median; a workload's speedup is greedy's total seconds over the method's (every
output is checked against greedy's, so the tokens are the same). Tokens per forward count the new tokens (eos
included) over the target's forward calls (prefill included).

"Tokens per forward under ``draft_cost=0``" is what lookahead verifies when drafting costs nothing (a GPU at batch
1): lookahead's own loop runs with ``draft_cost=0`` on a tiny random-weight model forced to write greedy's output
(`forcing.ForcedOutputs`). Drafts depend only on the tokens and the acceptance, and the acceptance of a greedy
draft only on whether it equals greedy's token, so the count is the one the real model would give at that cost,
for a fraction of the time (`tests/test_real_bench.py` checks this against a real model).

Example::

    bench = Bench(model, eos=2, repeats=3, max_new=128)
    bench.warm_up(prompts[0])
    rows = bench.workload("summarization", prompts)
    print(speed_table(rows))
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from .e2e import generate_with, random_model
from .forcing import ForcedOutputs
from .methods import REAL_DEFAULT, resolve
from .real_workloads import is_spec_bench
from .timing import rotations

GREEDY, HF_LOOKUP = "hf-greedy", "hf-prompt-lookup-2"
METHODS = REAL_DEFAULT
LOOKAHEAD = ("lookahead-ngram", "lookahead-suffix", "lookahead-suffix-tree", "lookahead-recycle-tree",
             "lookahead-suffix-recycle-tree")
PREFILL = "prefill"  # the one-token greedy call that times the prompt's prefill
_BENCH_COST = object()  # `Bench._call`'s draft_cost when not given: the bench's own (None means lookahead's default)


@dataclass
class Row:
    """One method on one workload: totals over its prompts (``seconds``: the sum of each prompt's median)."""

    workload: str
    method: str
    prompts: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    forwards: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # the process's CPU time over the same calls (medians): what load on other cores
    # changes least, with one torch thread
    prefill: float = 0.0
    same: int = 0  # prompts whose output equals greedy's
    free_forwards: int | None = None  # forwards under draft_cost=0 (lookahead's methods)
    load: float | None = None  # 1-minute load average when the workload ended

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / self.forwards if self.forwards else float("nan")

    @property
    def free_tokens_per_forward(self) -> float | None:
        return self.new_tokens / self.free_forwards if self.free_forwards else None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Bench:
    """Runs the methods on one workload's prompts at a time (see the module docstring).

    Args:
        model: the target, in eval mode.
        eos: its end-of-sequence id (also the padding id).
        methods: names of `methods.METHODS` that generate; greedy must be among them.
        repeats: timed calls of each method on each prompt (>= 1).
        max_new: most new tokens per prompt.
        free: lookahead methods whose tokens per forward under ``draft_cost=0`` are counted.
        draft_cost: lookahead's ``draft_cost`` in the timed calls (None: its default).
    """

    model: object
    eos: int
    methods: tuple = METHODS
    repeats: int = 3
    max_new: int = 128
    free: tuple = LOOKAHEAD
    draft_cost: object = None
    _calls: list = field(default_factory=lambda: [0])

    def __post_init__(self):
        if GREEDY not in self.methods:
            raise ValueError(f"methods must include {GREEDY!r} (the reference), got {list(self.methods)}")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"repeats must be an int >= 1, got {self.repeats!r}")
        self._methods = {m.name: m for m in resolve(self.methods, need="generate")}
        self.free = tuple(m for m in self.free if m in self._methods and self._methods[m].runner == "lookahead")
        vocab = self.model.get_input_embeddings().num_embeddings
        self._tiny = random_model("tiny", vocab, self.eos, max_positions=self.model.config.max_position_embeddings)

    def warm_up(self, prompt) -> None:
        """One whole call of every method (and a short replay) before any clock runs: kernels compiled or loaded,
        buffers grown to a call's size, the cost curve measured (after 8-token warm-ups greedy wrote 20.5 tokens/s
        on the first workload, a 53-token prompt, against 24-27 on the next ones of its size)."""
        ids, mask = _inputs(prompt.input_ids)
        with torch.inference_mode():
            for method in self._methods.values():
                self._generate(method, self.model, ids, mask, self.max_new, self.draft_cost)
            greedy = self._call(self._methods[GREEDY], ids, mask, 8)[0]
            for name in self.free:
                self._free_forwards(prompt.input_ids, greedy, name)

    def workload(self, name: str, prompts: list, progress=None, load=None) -> list:
        """One `Row` per method over `prompts`; `progress` is called once per prompt done."""
        rows = {m: Row(name, m) for m in self._methods}
        for prompt in prompts:
            self._prompt(prompt, rows)
            if progress is not None:
                progress()
        for row in rows.values():
            row.load = load
        return list(rows.values())

    def _prompt(self, prompt, rows: dict) -> None:
        ids, mask = _inputs(prompt.input_ids)
        samples = {name: [] for name in [*self._methods, PREFILL]}
        cpu = {name: [] for name in self._methods}
        outs, forwards = {}, {}
        with torch.inference_mode():
            for order in rotations(list(samples), self.repeats):
                for name in order:
                    method = self._methods[GREEDY if name == PREFILL else name]
                    out, seconds, cpu_seconds, calls = self._call(method, ids, mask,
                                                                  1 if name == PREFILL else self.max_new)
                    samples[name].append(seconds)
                    if name != PREFILL:
                        outs[name], forwards[name] = out, calls
                        cpu[name].append(cpu_seconds)
            prefill = float(np.median(samples[PREFILL]))
            for name, row in rows.items():
                row.prompts += 1
                row.prompt_tokens += len(prompt.input_ids)
                row.new_tokens += len(outs[name])
                row.forwards += forwards[name]
                row.seconds += float(np.median(samples[name]))
                row.cpu_seconds += float(np.median(cpu[name]))
                row.prefill += prefill
                row.same += outs[name] == outs[GREEDY]
                if name in self.free:
                    free = self._free_forwards(prompt.input_ids, outs[GREEDY], name)
                    row.free_forwards = (row.free_forwards or 0) + free

    def _call(self, method, ids, mask, new: int, draft_cost=_BENCH_COST) -> tuple:
        """(new tokens up to and with the first eos, wall-clock seconds, process CPU seconds, target forwards) of one
        call (lookahead's with `draft_cost`, the bench's own by default)."""
        self._calls[0] = 0
        hook = self.model.register_forward_pre_hook(lambda *_: self._calls.__setitem__(0, self._calls[0] + 1))
        try:
            start, cpu = time.perf_counter(), time.process_time()
            cost = self.draft_cost if draft_cost is _BENCH_COST else draft_cost
            out = self._generate(method, self.model, ids, mask, new, cost)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        finally:
            hook.remove()
        return _until_eos(out[0, ids.shape[1]:].tolist(), self.eos), seconds, cpu, self._calls[0]

    def _generate(self, method, model, ids, mask, new: int, draft_cost) -> torch.Tensor:
        """One call of `method`: transformers' as `e2e.generate_with` runs it, lookahead's with its own defaults
        (``num_draft_tokens`` and ``max_draft_nodes`` as a user gets them) and `draft_cost` when not None."""
        if method.runner != "lookahead":
            return generate_with(method, model, ids, mask, new, self.eos)[0]
        from ..generate import generate

        cost = {} if draft_cost is None else {"draft_cost": draft_cost}
        options = {k: v for k, v in method.generate_options().items() if k != "max_draft_nodes"}  # the library's default
        return generate(model, ids, attention_mask=mask, max_new_tokens=new, eos_token_id=self.eos,
                        pad_token_id=self.eos, **options, **cost)

    def _free_forwards(self, prompt_ids: np.ndarray, greedy: list, name: str) -> int:
        """Forwards lookahead's `name` makes under ``draft_cost=0`` to write `greedy` after `prompt_ids`.

        Raises:
            RuntimeError: the replay wrote other tokens than greedy's (the forcing broke).
        """
        if "recycle" in self._methods[name].options["lookup"]:  # its drafts come from the model's own logits
            return self._real_free_forwards(prompt_ids, greedy, name)
        recorded = greedy[:-1] if greedy and greedy[-1] == self.eos else greedy
        forced = ForcedOutputs([(prompt_ids, np.asarray(recorded, np.int64))], self.eos)
        handle = forced.attach(self._tiny)
        calls = [0]
        counter = self._tiny.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        try:
            ids, mask = _inputs(prompt_ids)
            with torch.inference_mode():
                out = self._generate(self._methods[name], self._tiny, ids, mask, max(len(greedy), 1), 0)
        finally:
            handle.remove()
            counter.remove()
        if _until_eos(out[0, ids.shape[1]:].tolist(), self.eos) != greedy:
            raise RuntimeError(f"the draft_cost=0 replay of {name} did not write greedy's tokens")
        return calls[0]

    def _real_free_forwards(self, prompt_ids: np.ndarray, greedy: list, name: str) -> int:
        """Forwards of the real model under ``draft_cost=0``: a recycling method drafts from the target's own
        predictions, which a replay on another model would not give.

        Raises:
            RuntimeError: the call wrote other tokens than greedy's (a lossless method never does).
        """
        ids, mask = _inputs(prompt_ids)
        with torch.inference_mode():
            out, _, _, calls = self._call(self._methods[name], ids, mask, max(len(greedy), 1), draft_cost=0)
        if out != greedy:
            raise RuntimeError(f"{name} under draft_cost=0 did not write greedy's tokens")
        return calls


def _inputs(prompt_ids) -> tuple:
    ids = torch.as_tensor(np.asarray(prompt_ids, dtype=np.int64))[None]
    return ids, torch.ones_like(ids)


def _until_eos(tokens: list, eos: int) -> list:
    """The tokens up to and with the first eos."""
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


# ---------------------------------------------------------------------------------------------------------------
# Figures: speedups, ratios to HF prompt lookup, the Spec-Bench geometric mean
# ---------------------------------------------------------------------------------------------------------------

def speedups(rows: list, clock: str = "seconds") -> dict:
    """{(workload, method): greedy's seconds over the method's} (every method, greedy's 1.0 included); `clock`
    "cpu_seconds" compares CPU time instead of wall-clock time."""
    greedy = {r.workload: getattr(r, clock) for r in rows if r.method == GREEDY}
    return {(r.workload, r.method): greedy[r.workload] / getattr(r, clock) for r in rows
            if r.workload in greedy and getattr(r, clock) > 0}


def geomean(values) -> float:
    values = np.asarray(list(values), dtype=float)
    return float(np.exp(np.log(values).mean())) if len(values) else float("nan")


def spec_bench_means(rows: list, clock: str = "seconds") -> dict:
    """{method: geometric mean of its speedup over Spec-Bench's categories present} (empty without any)."""
    ratio = speedups(rows, clock)
    methods = dict.fromkeys(r.method for r in rows)
    return {m: geomean(v for (w, n), v in ratio.items() if n == m and is_spec_bench(w)) for m in methods
            if any(is_spec_bench(w) and n == m for w, n in ratio)}
