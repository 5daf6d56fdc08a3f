"""Wall-clock generation: plain greedy, Hugging Face prompt lookup and lookahead's modes on the same prompts.

The target is a pretrained model, or a random-weight Llama of a given shape whose greedy choice is forced to replay
recorded outputs (`ForcedReplay`): its forwards cost what the shape costs, its acceptance pattern is that of the model
that wrote the traces. Every method must produce the same tokens; a run that does not is reported.

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

from .forced import ForcedReplay

SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "gpt2-small": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                       num_key_value_heads=12),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8),  # Llama-3.2-1B's layout: about 1.2B parameters with a 50k vocabulary
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
GREEDY, HF_LOOKUP = "greedy", "hf-prompt-lookup"
HF_NUM_TOKENS = 10  # prompt_lookup_num_tokens, as lookahead's num_draft_tokens
TREE_NODES = 32  # max_draft_nodes of tree drafts


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
    mismatches: int = 0      # rows whose output differs from the first method's
    outputs: list = field(default_factory=list)  # new tokens of each prompt, in trace order

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens per second of decoding alone, the prefill taken out (what long outputs approach)."""
        return self.tokens / (self.seconds - self.prefill) if self.seconds > self.prefill else float("nan")


def lookahead_modes() -> list:
    """The modes `lookahead.generate` accepts here (checked, not assumed): "ngram", "suffix" and, where generate
    verifies tree drafts, "suffix-tree"."""
    import inspect

    from ..generate import generate
    from ..settings import make_settings

    modes = []
    for mode in ("ngram", "suffix"):
        try:
            make_settings(lookup=mode)
        except (ValueError, TypeError):
            continue
        modes.append(mode)
    if "suffix" in modes and "draft" in inspect.signature(generate).parameters:
        modes.append("suffix-tree")
    return modes


def all_methods() -> list:
    return [GREEDY, HF_LOOKUP] + [f"lookahead-{m}" for m in lookahead_modes()]


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
    return LlamaForCausalLM(config).to(device=device, dtype=DTYPES[dtype]).eval()


def pretrained_model(path_or_id: str, device: str = "cpu", dtype: str = "fp32"):
    """(model, tokenizer or None when the folder has none) from a local folder or the hub.

    Raises:
        ValueError: unknown dtype, or the model cannot be loaded (the reason in one line).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
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


def generate_with(method: str, model, ids, mask, max_new: int, eos: int, processors: list, draft_cost=None):
    """Run one method (lookahead ones with `draft_cost`, see `lookahead.generate`); LongTensor [b, prompt + new]."""
    from transformers import LogitsProcessorList

    if method in (GREEDY, HF_LOOKUP):
        extra = {"prompt_lookup_num_tokens": HF_NUM_TOKENS} if method == HF_LOOKUP else {}
        return model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new, eos_token_id=eos,
                              pad_token_id=eos, logits_processor=LogitsProcessorList(processors), **extra)
    if not method.startswith("lookahead-"):
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(all_methods())}")
    from ..generate import generate

    mode = method.removeprefix("lookahead-")
    tree = {"draft": "tree", "max_draft_nodes": TREE_NODES} if mode.endswith("-tree") else {}
    return generate(model, ids, attention_mask=mask, lookup=mode.removesuffix("-tree"), num_draft_tokens=HF_NUM_TOKENS,
                    max_new_tokens=max_new, eos_token_id=eos, pad_token_id=eos,
                    logits_processor=LogitsProcessorList(processors), draft_cost=draft_cost, **tree)


def run_e2e(model, traces, dataset: str = "traces", methods=None, batch_sizes=(1,), eos: int = 0, force: bool = True,
            max_new: int = 128, progress=None, draft_cost=None) -> list:
    """Time every method on the same prompts at each batch size; one `Timing` per (batch size, method).

    Args:
        model: the target (`random_model` or `pretrained_model`).
        traces: (prompt_ids, output_ids) pairs; outputs are cut to `max_new` tokens.
        dataset: the name the timings carry.
        methods: of `all_methods()` (default: all). HF prompt lookup runs at batch 1 only (transformers refuses
            assisted generation for batches).
        batch_sizes: prompts per `generate` call.
        eos: end-of-sequence and padding id, used by no trace.
        force: force the recorded outputs (random-weight targets); else the model writes `max_new` tokens.
        max_new: most new tokens per prompt.
        progress: wraps the list of batches (e.g. ``tqdm``).
        draft_cost: lookahead's verification cost model (None: its default; "auto": measured during the warm-up,
            before any timing).
    Returns:
        list of `Timing`.
    """
    methods = list(methods or all_methods())
    traces = [(p, o[:max_new]) for p, o in traces]
    processors = [ForcedReplay(traces, eos, eos)] if force else []
    calls = [0]
    hook = model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        for method in methods:  # compile, allocate, load kernels before the clock runs
            ids, mask = left_pad([traces[0][0]], eos, model.device)
            generate_with(method, model, ids, mask, 4, eos, processors, draft_cost)
        timings = []
        for batch in batch_sizes:
            timings += _run_batches(model, traces, dataset, methods, batch, eos, force, max_new, processors, calls,
                                    progress, draft_cost)
    finally:
        hook.remove()
    return timings


def _run_batches(model, traces, dataset, methods, batch, eos, force, max_new, processors, calls, progress,
                 draft_cost) -> list:
    """Timings of each method at one batch size, the methods taking turns on each batch (so load drift is shared)."""
    timings = {m: Timing(dataset, batch, m) for m in methods}
    if batch > 1 and HF_LOOKUP in timings:
        timings.pop(HF_LOOKUP)
    chunks = [traces[i:i + batch] for i in range(0, len(traces), batch)]
    for chunk in (progress(chunks, desc=f"{dataset} batch {batch}") if progress else chunks):
        ids, mask = left_pad([p for p, _ in chunk], eos, model.device)
        new = max(len(o) for _, o in chunk) + 1 if force else max_new
        _, prefill = _timed(lambda: generate_with(GREEDY, model, ids, mask, 1, eos, processors), model.device)
        outs = {}
        for method, timing in timings.items():
            calls[0] = 0
            out, seconds = _timed(lambda: generate_with(method, model, ids, mask, new, eos, processors, draft_cost),
                                  model.device)
            outs[method] = _new_tokens(out, ids.shape[1], eos)
            timing.seconds, timing.prefill = timing.seconds + seconds, timing.prefill + prefill
            timing.forwards += calls[0]
            timing.tokens += sum(len(row) for row in outs[method])
            timing.outputs += outs[method]
        reference = next(iter(outs.values()))
        for method, rows in outs.items():
            timings[method].mismatches += sum(a != b for a, b in zip(rows, reference))
    return list(timings.values())


def _new_tokens(out: torch.Tensor, prompt_len: int, eos: int) -> list:
    """Each row's new tokens up to its first eos."""
    rows = []
    for row in out[:, prompt_len:].tolist():
        rows.append(row[: row.index(eos)] if eos in row else row)
    return rows


def _timed(fn, device) -> tuple:
    """(fn(), wall-clock seconds it took, the device's queued work included)."""
    _sync(device)
    start = time.perf_counter()
    result = fn()
    _sync(device)
    return result, time.perf_counter() - start


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def forward_cost_ratio(model, tokens: int = 11, context: int = 512, repeats: int = 5) -> float:
    """Measured time of a `tokens`-token forward over that of a one-token forward, after `context` cached tokens.

    The ratio to pass to ``lookahead bench traces --cost-ratio`` (with ``--cost-tokens`` = `tokens`).
    """
    from ..verify import new_cache, rollback

    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (1, context + tokens), generator=torch.Generator().manual_seed(0))
    ids = ids.to(model.device)
    cache = new_cache(model)
    with torch.inference_mode():
        model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True)

        def median_seconds(n: int) -> float:
            times = []
            for _ in range(repeats + 1):
                _sync(model.device)
                start = time.perf_counter()
                model(input_ids=ids[:, context:context + n], past_key_values=cache, use_cache=True)
                _sync(model.device)
                times.append(time.perf_counter() - start)
                rollback(cache, context)
            return float(np.median(times[1:]))

        return median_seconds(tokens) / median_seconds(1)


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
                     f"{t.forwards} | {t.tokens / max(t.forwards, 1):.2f} | {over_greedy:.2f}x | {decode:.2f}x | {hf} | "
                     f"{same} |")
    return "\n".join(lines)


def predicted_vs_measured(datasets: dict, timings: list, cost_ratio: float) -> str:
    """Markdown: the speedup the model-free replay of greedy's outputs predicts with `cost_ratio` beside the
    measured one, at batch 1.

    lookahead's rows replay a fixed budget of 10 drafts while `generate` sizes drafts by their expected payoff, so
    the prediction is an estimate, not an identity.
    """
    from . import quality
    from .replay import predicted_speedup

    replayed = {"lookahead-ngram": "ngram", "lookahead-suffix": "suffix", "lookahead-suffix-tree": "suffix-tree",
                HF_LOOKUP: "hf"}
    methods = {m.key: m for m in quality.replay_methods()}
    written = {t.dataset: t.outputs for t in timings if t.batch == 1 and t.method == GREEDY}
    lines = [f"\nPredicted (model-free replay of greedy's outputs, cost ratio {cost_ratio:.2f}) against measured "
             "speedup over greedy, batch 1 (the prediction leaves the prefill out)\n",
             "| dataset | method | predicted | measured, decode only | measured, whole call |",
             "| --- | --- | ---: | ---: | ---: |"]
    for (dataset, batch, method), (measured, _, decode) in speedups(timings).items():
        if batch == 1 and replayed.get(method) in methods and dataset in written:
            traces = [(p, np.asarray(o, np.int64)) for (p, _), o in zip(datasets[dataset], written[dataset]) if o]
            stats = quality.replay_all([methods[replayed[method]]], {dataset: traces})
            predicted = predicted_speedup(next(iter(stats.values())), cost_ratio)
            lines.append(f"| {dataset} | {method} | {predicted:.2f}x | {decode:.2f}x | {measured:.2f}x |")
    return "\n".join(lines)
