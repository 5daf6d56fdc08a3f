"""Wall-clock generation: transformers greedy, its prompt lookup and lookahead's methods on the same prompts.

The target is a pretrained model, or a random-weight Llama of a given shape forced to replay recorded outputs
(`forcing.ForcedOutputs`, a forward hook: the forced tokens come from the device): its forwards cost what the shape
costs, its acceptance pattern is that of the model that wrote the traces. Methods come from `methods.METHODS`
(runner "hf" or "lookahead"); every method must write the same tokens, and a run that does not is reported.

Example::

    model = random_model("gpt2-small", vocab_size=50257)
    rows = run_e2e(model, traces, batch_sizes=(1, 4), eos=50256)
    print(markdown(rows))
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .forcing import ForcedOutputs
from .methods import E2E_DEFAULT, TREE_NODES, resolve
from .shapes import SHAPES
from .timing import rotations, synchronize

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

GREEDY, HF_LOOKUP = "hf-greedy", "hf-prompt-lookup-2"


@dataclass
class Timing:
    """One method on one dataset at one batch size: totals over the batches."""

    dataset: str
    batch: int
    method: str
    seconds: float = 0.0
    prefill: float = 0.0     # seconds of the prompts' prefill (the same forward for every method), within `seconds`
    tokens: int = 0          # new tokens, all rows
    forwards: int = 0        # target forward calls (a batch forward counts once)
    mismatches: int = 0      # rows whose output differs from the recording (forced) or from the first method's
    outputs: list = field(default_factory=list)  # new tokens of each prompt, in trace order

    def add(self, outputs: list, seconds: float, prefill: float, forwards: int) -> None:
        """Count one batch: its rows' new tokens, the call's seconds, the prefill's and the forwards."""
        self.seconds, self.prefill = self.seconds + seconds, self.prefill + prefill
        self.forwards += forwards
        self.tokens += sum(len(row) for row in outputs)
        self.outputs += outputs

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens per second of decoding alone, the prefill taken out (what long outputs approach)."""
        return self.tokens / (self.seconds - self.prefill) if self.seconds > self.prefill else float("nan")


def random_model(shape: str, vocab_size: int, eos: int | None = None, device: str = "cpu", dtype: str = "fp32",
                 max_positions: int = 16384, seed: int = 0):
    """A random-weight `LlamaForCausalLM` of a shape in `SHAPES`.

    Raises:
        ValueError: unknown shape or dtype.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; expected one of {', '.join(SHAPES)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    eos = vocab_size - 1 if eos is None else eos
    config = LlamaConfig(vocab_size=vocab_size, max_position_embeddings=max_positions, bos_token_id=eos,
                         eos_token_id=eos, pad_token_id=eos, **SHAPES[shape])
    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it runs: a 1B model's random init is slow on a CPU
        model = LlamaForCausalLM(config)
    return model.to(dtype=DTYPES[dtype]).eval()


def pretrained_model(path_or_id: str, device: str = "cpu", dtype: str = "fp32"):
    """(model, tokenizer or None when the folder has none) from a local folder, the hub, a ``.gguf`` file or
    ``smollm2`` (`lookahead.models.gguf`).

    Raises:
        ValueError: unknown dtype, or the model cannot be loaded (the reason in one line).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    from ..models import gguf

    if gguf.is_gguf(path_or_id):  # a .gguf file or "smollm2": model and tokenizer from the one file
        model, tokenizer, _ = gguf.load(path_or_id, device, DTYPES[dtype])
        return model, tokenizer
    try:
        model = AutoModelForCausalLM.from_pretrained(path_or_id, dtype=DTYPES[dtype])
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot load model {path_or_id!r}: {str(error).splitlines()[0]}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(path_or_id)
    except (OSError, ValueError, TypeError):
        tokenizer = None
    return model.to(device).eval(), tokenizer


def free_id(traces, vocab_size: int) -> tuple[int, int]:
    """(vocab size, eos/pad id): the last id of the vocabulary if no trace uses it, else one past the largest id."""
    used = max((int(max(p.max(initial=0), o.max(initial=0))) for p, o in traces), default=0)
    eos = vocab_size - 1 if used < vocab_size - 1 else used + 1
    return max(vocab_size, eos + 1), eos


def synthetic_traces(count: int, prompt_len: int = 384, new_tokens: int = 128, vocab: int = 50_000,
                     seed: int = 0) -> list:
    """Random prompts in which spans repeat, each with an output that copies spans of its prompt between fresh
    tokens: a stand-in for an edit or a summary when no recorded traces are at hand."""
    if prompt_len < 1 or new_tokens < 1:
        raise ValueError(f"prompt_len and new_tokens must be >= 1, got {prompt_len} and {new_tokens}")
    rng = np.random.default_rng(seed)
    traces = []
    for _ in range(count):
        prompt = rng.integers(0, vocab - 1, prompt_len)
        output = []
        while len(output) < new_tokens:
            length = int(rng.integers(1, max(2, min(32, prompt_len // 2))))
            start = int(rng.integers(0, prompt_len - length + 1))
            output += prompt[start:start + length].tolist() + rng.integers(0, vocab - 1, 2).tolist()
        traces.append((prompt.astype(np.int64), np.asarray(output[:new_tokens], np.int64)))
    return traces


def left_pad(prompts, pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids and attention mask [b, longest prompt] with left padding."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.as_tensor(np.asarray(p, dtype=np.int64))
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def generate_with(method, model, ids, mask, max_new: int, eos: int, **extra):
    """Run one method of `methods.METHODS` (``extra``: more generate arguments, e.g. lookahead's ``draft_cost``).

    Returns:
        (LongTensor [b, prompt + new], lookahead's GenerationStats or None for transformers' methods).
    """
    common = dict(attention_mask=mask, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=eos)
    if method.runner == "call":  # a method that brings its own loop (``options["generate"]``)
        return method.options["generate"](model, ids, mask, max_new, eos), None
    if method.runner == "hf":
        return model.generate(ids, do_sample=False, **common, **method.generate_options()), None
    from ..generate import generate

    extra = {k: v for k, v in extra.items() if v is not None}
    return generate(model, ids, **common, **method.generate_options(), num_draft_tokens=10, return_stats=True, **extra)


def run_e2e(model, traces, dataset: str = "traces", methods=E2E_DEFAULT, batch_sizes=(1,), eos: int = 0,
            force: bool = True, max_new: int = 128, progress=None, draft_cost=None, repeats: int = 1,
            forced: ForcedOutputs | None = None) -> list:
    """Time every method on the same prompts at each batch size; one `Timing` per (batch size, method).

    Args:
        model: the target (`random_model` or `pretrained_model`).
        traces: (prompt_ids, output_ids) pairs with distinct prompts; outputs are cut to `max_new` tokens.
        dataset: the name the timings carry.
        methods: names of `methods.METHODS` that generate. HF prompt lookup runs at batch 1 only (transformers
            refuses assisted generation for batches).
        batch_sizes: prompts per `generate` call.
        eos: end-of-sequence and padding id, used by no trace.
        force: force the recorded outputs (random-weight targets); else the model writes `max_new` tokens.
        max_new: most new tokens per prompt.
        progress: wraps the list of batches (e.g. ``tqdm``).
        draft_cost: lookahead's verification cost model (None: its default; "auto": measured during the warm-up,
            before any timing).
        repeats: timed calls of each method on each batch, in rotated orders; each batch counts its median.
        forced: the forcing hook to use (one over every dataset of a run: CUDA graphs that lookahead's static cache
            captures keep the hook's tensors), else one is made for `traces` (when `force`).
    Returns:
        list of `Timing`.
    """
    methods = resolve(methods, need="generate")
    traces = [(p, o[:max_new]) for p, o in traces]
    forced = (forced or ForcedOutputs(traces, eos, model.device)) if force else None
    calls = [0]
    hooks = [model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))]
    hooks += [forced.attach(model)] if forced is not None else []
    try:
        for method in methods:  # compile, allocate, load kernels before the clock runs
            ids, mask = left_pad([traces[0][0]], eos, model.device)
            _reset(forced)
            generate_with(method, model, ids, mask, 4, eos, draft_cost=draft_cost)
        timings = []
        for batch in batch_sizes:
            run = _Run(model, traces, dataset, batch, eos, max_new if not force else None, forced, calls, draft_cost)
            timings += run.all(methods, progress, repeats, max_new)
    finally:
        for hook in hooks:
            hook.remove()
    return timings


def _reset(forced) -> None:
    if forced is not None:
        forced.reset()


@dataclass
class _Run:
    """One batch size of `run_e2e`: the methods take turns on each batch (so load drift is shared)."""

    model: object
    traces: list
    dataset: str
    batch: int
    eos: int
    max_new: int | None  # None: each batch's longest recorded output + 1 (forced)
    forced: object
    calls: list
    draft_cost: object

    def all(self, methods, progress, repeats: int, limit: int) -> list:
        timings = {m.name: Timing(self.dataset, self.batch, m.name) for m in methods
                   if self.batch == 1 or m.name != HF_LOOKUP}
        by_name = {m.name: m for m in methods}
        for start in (progress(range(0, len(self.traces), self.batch), desc=f"{self.dataset} batch {self.batch}")
                      if progress else range(0, len(self.traces), self.batch)):
            chunk = self.traces[start:start + self.batch]
            ids, mask = left_pad([p for p, _ in chunk], self.eos, self.model.device)
            new = self.max_new or min(max(len(o) for _, o in chunk) + 1, limit)
            prefill = float(np.median([self._timed(by_name.get(GREEDY), ids, mask, 1)[1]
                                       for _ in range(max(repeats, 3))]))  # one noisy sample could exceed a call
            outs, forwards, samples = {}, {}, {name: [] for name in timings}
            for order in rotations(list(timings), repeats):
                for name in order:
                    out, seconds = self._timed(by_name[name], ids, mask, new)
                    outs[name], forwards[name] = _new_tokens(out, ids.shape[1], self.eos), self.calls[0]
                    samples[name].append(seconds)
            reference = ([_until(self.forced.expected(self.forced.row_of(p), new), self.eos) for p, _ in chunk]
                         if self.forced is not None else next(iter(outs.values())))
            for name, timing in timings.items():
                timing.add(outs[name], float(np.median(samples[name])), prefill, forwards[name])
                timing.mismatches += sum(a != b for a, b in zip(outs[name], reference))
        return list(timings.values())

    def _timed(self, method, ids, mask, new: int) -> tuple:
        """(output, wall-clock seconds) of one call, the device's queued work included."""
        if method is None:
            return None, 0.0
        _reset(self.forced)
        self.calls[0] = 0
        synchronize(self.model.device)
        start = time.perf_counter()
        out, _ = generate_with(method, self.model, ids, mask, new, self.eos, draft_cost=self.draft_cost)
        synchronize(self.model.device)
        return out, time.perf_counter() - start


def _new_tokens(out: torch.Tensor, prompt_len: int, eos: int) -> list:
    """Each row's new tokens up to its first eos."""
    return [_until(row, eos) for row in out[:, prompt_len:].tolist()]


def _until(tokens: list, eos: int) -> list:
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


def speedups(timings: list) -> dict:
    """{(dataset, batch, method): (speedup over greedy, over HF prompt lookup or None, decode-only over greedy)}."""
    by_key = {(t.dataset, t.batch, t.method): t for t in timings}
    result = {}
    for (dataset, batch, method), t in by_key.items():
        greedy, hf = by_key.get((dataset, batch, GREEDY)), by_key.get((dataset, batch, HF_LOOKUP))
        over_greedy = t.tokens_per_second / greedy.tokens_per_second if greedy else float("nan")
        over_hf = t.tokens_per_second / hf.tokens_per_second if hf else None
        decode = t.decode_tokens_per_second / greedy.decode_tokens_per_second if greedy else float("nan")
        result[dataset, batch, method] = (over_greedy, over_hf, decode)
    return result


def speedup_points(timings: list) -> dict:
    """{(dataset, method): [(batch, speedup over greedy), ...]} for every method but greedy (for the plot)."""
    points = {}
    for (dataset, batch, method), (speedup, _, _) in speedups(timings).items():
        if method != GREEDY:
            points.setdefault((dataset, method), []).append((batch, speedup))
    return points


def markdown(timings: list) -> str:
    """One row per (dataset, batch, method): tokens/s, forwards, speedups over greedy (whole call, decode alone)
    and over HF prompt lookup."""
    ratio = speedups(timings)
    lines = ["| dataset | batch | method | new tokens | tokens/s | forwards | tokens/forward | vs greedy | "
             "decode only vs greedy | vs HF lookup | same output |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for t in timings:
        over_greedy, over_hf, decode = ratio[t.dataset, t.batch, t.method]
        hf = f"{over_hf:.2f}x" if over_hf is not None and t.method != HF_LOOKUP else "—"
        same = "yes" if not t.mismatches else f"NO ({t.mismatches} rows)"
        lines.append(f"| {t.dataset} | {t.batch} | {t.method} | {t.tokens} | {t.tokens_per_second:.1f} | "
                     f"{t.forwards} | {t.tokens / max(t.forwards, 1):.2f} | {over_greedy:.2f}x | {decode:.2f}x | "
                     f"{hf} | {same} |")
    return "\n".join(lines)


def measured_cost(model, context: int = 512):
    """The verification cost curve of `model` here (`lookahead.decode.calibrate.measure_draft_cost`, up to a tree's nodes):
    sizes timed in turns, medians, never below a one-token forward and never decreasing, so that timing noise cannot
    make a bigger forward look cheaper than a smaller one."""
    from ..decode.calibrate import measure_draft_cost

    return measure_draft_cost(model, context=context, max_tokens=TREE_NODES)


def predicted_vs_measured(datasets: dict, timings: list, cost) -> str:
    """Markdown: the speedup the model-free replay of greedy's outputs predicts for the cost model `cost` (a
    `CostCurve`, see `measured_cost`) beside the measured one, at batch 1.

    Each replayed step costs ``step_cost(cost, k)`` for its k drafted tokens or tree nodes. lookahead's rows replay
    a fixed budget (10 drafts, 32 nodes) while `generate` sizes drafts by their expected payoff, so the prediction is
    an estimate, not an identity.
    """
    from .methods import METHODS
    from .quality import replay_all
    from .replay import predicted_speedup

    written = {t.dataset: t.outputs for t in timings if t.batch == 1 and t.method == GREEDY}
    lines = ["\nPredicted (model-free replay of greedy's outputs with the measured cost curve) against measured "
             "speedup over greedy, batch 1 (the prediction leaves the prefill out)\n",
             "| dataset | method | predicted | measured, decode only | measured, whole call |",
             "| --- | --- | ---: | ---: | ---: |"]
    for (dataset, batch, method), (measured, _, decode) in speedups(timings).items():
        if batch == 1 and METHODS[method].replayable and dataset in written:
            traces = [(p, np.asarray(o, np.int64)) for (p, _), o in zip(datasets[dataset], written[dataset]) if o]
            stats = replay_all([METHODS[method]], {dataset: traces})
            predicted = predicted_speedup(next(iter(stats.values())), cost)
            lines.append(f"| {dataset} | {method} | {predicted:.2f}x | {decode:.2f}x | {measured:.2f}x |")
    return "\n".join(lines)
