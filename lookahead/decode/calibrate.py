"""Measure what verifying more tokens costs on the machine at hand, to size drafts by tokens per second.

On a GPU at batch 1 a forward over 32 tokens costs about what a forward over 1 costs; on a CPU, or at large batch,
every verified token adds compute, and on a CPU any multi-token forward costs well over a one-token one (a
matrix-vector product). `measure_draft_cost` times forwards over a filled KV cache and returns the measured curve;
pass it as `generate(..., draft_cost=...)`, or pass `draft_cost="auto"` to have it measured once per model (and
device, dtype and thread count) on first use and kept on disk for later processes (`lookahead.runtime.store`).

A measurement taken while other work holds the CPU says wide forwards cost more than they do on a quiet machine,
and would switch drafting off for good. So a curve is kept on disk only when no other process kept `BUSY` cores
busy while it was measured (`lookahead.runtime.threads.OtherWork`), and a kept curve is checked when a new process loads it:
a few one-token forwards timed against the one-token time it was measured with; a machine that is now clearly
faster (`FASTER`) measures it again. The check's forwards follow a short context (`CHECK_CONTEXT`, whose own time the
curve keeps), so a new process pays a few forwards for it, not the prefill of the curve's context.
"""
from __future__ import annotations

import hashlib
import logging
import time
import weakref

import numpy as np
import torch

from ..model.attention import packed_attention
from ..model.cache import new_cache, rollback
from ..model.facts import ModelFacts, cache_kwarg, position_limit
from ..model.indexer import decoding_order
from ..model.linear import packed_linears
from ..runtime.store import Store, machine
from ..runtime.threads import OtherWork
from .policy import CostCurve, as_cost
from .settings import DRAFT_TOKENS

logger = logging.getLogger(__name__)
BUSY = 0.5  # a measurement while other processes kept this many cores busy (on average) was taken on a busy CPU
FASTER = 0.6  # a kept curve whose one-token forward now takes less than this share of its measured time is stale
NOISE = 2e-3  # seconds a one-token forward's time may move by without meaning anything
_MEASURED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {conditions: CostCurve}


def forward_times(model, sizes=(1, 4, 8, 16, 32), context: int = 512, batch: int = 1, repeats: int = 3) -> dict:
    """Median seconds of one forward over n new tokens (n in `sizes`) after `context` cached tokens.

    The sizes take turns (one round warms up, then `repeats` timed rounds), so that drift in the machine's speed
    falls on every size alike rather than on whichever was timed first."""
    return _timed(model, sizes, context, batch, repeats)[0]


def _timed(model, sizes, context: int, batch: int, repeats: int) -> tuple:
    """(`forward_times`, the cores other processes kept busy meanwhile: None where that cannot be seen)."""
    device = model.device
    vocab = model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(0)
    samples = {n: [] for n in sizes}
    kv = cache_kwarg(model)
    with torch.inference_mode(), packed_attention(model), packed_linears(model), decoding_order(model):  # as a call's
        # forwards run (`decode`)
        cache = new_cache(model)
        others = OtherWork().__enter__()
        model(input_ids=torch.randint(0, vocab, (batch, context), generator=g).to(device), **{kv: cache},
              use_cache=True)
        for _ in range(repeats + 1):
            for n in sizes:
                ids = torch.randint(0, vocab, (batch, n), generator=g).to(device)
                start = time.perf_counter()
                model(input_ids=ids, **{kv: cache}, use_cache=True).logits.argmax(-1).cpu()
                samples[n].append(time.perf_counter() - start)
                rollback(cache, context, context + n)  # (recurrent states run on: only time counts here)
        others.__exit__(None, None, None)
    return {n: float(np.median(t[1:])) for n, t in samples.items()}, others.cores


CONTEXT = 512  # cached tokens the forwards are timed after
CHECK_CONTEXT = 32  # cached tokens a kept curve's check (`fresh`) times its one-token forwards after


def measure_draft_cost(model, context: int = CONTEXT, batch: int = 1, max_tokens: int = 32) -> CostCurve:
    """The cost of verifying k = 0..max_tokens drafts on this machine, in one-token forwards (a `CostCurve`).

    Times forwards over 1 + k new tokens after `context` cached tokens for the widths `widths` gives (every width to
    8, then every fourth: a CPU's matrix kernels work on blocks of rows, and a width off the block can cost far more
    than the next one on it), about 60 forwards. The widths in between are not measured: a step pads past them to
    the cheapest measured one (`CostCurve.pads`). `CostCurve.linear()` gives the closest (overhead, per_token) pair.

    Example:
        >>> cost = measure_draft_cost(model)        # ~1.0 everywhere on a GPU; ~1.4-2.5 on a CPU
        >>> generate(model, ids, lookup="suffix", draft="tree", draft_cost=cost)
    """
    sizes = widths(max_tokens + 1)
    limit = position_limit(model.config)
    if limit is not None and context + sizes[-1] > limit:  # learned positions: stay inside the table
        context = max(limit - sizes[-1], 1)
        if context + sizes[-1] > limit:
            raise ValueError(f"max_tokens={max_tokens} does not fit the model's position limit of {limit} tokens")
    times, share = _timed(model, sizes, context, batch, 3)
    curve = np.full(max_tokens + 1, np.inf)
    for n in sizes:
        curve[n - 1] = times[n] / times[1]
    curve = CostCurve(curve)
    curve.seconds, curve.busy = times[1], share  # a one-token forward, and how busy the CPU was
    curve.check = forward_times(model, (1,), min(CHECK_CONTEXT, context), batch, 3)[1]  # the same after few tokens
    return curve


def widths(most: int) -> list:
    """The forward widths (tokens) `measure_draft_cost` times, up to `most`: 1 to 8, every fourth, and `most`.

    >>> widths(33)
    [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 28, 32, 33]
    """
    return sorted({n for n in [*range(1, 9), *range(12, most + 1, 4)] if n <= most} | {1, most})


def measured_draft_cost(model, max_tokens: int, store: Store | None = None) -> CostCurve:
    """`measure_draft_cost(model, max_tokens=max_tokens)`, measured once per model, device, dtype and thread count,
    and kept on disk for the next process (like numba's cache; `lookahead.runtime.store`) when it was measured on a CPU
    this process had to itself; a kept curve that a quick check finds stale (`fresh`) is measured again.

    Args:
        store: where measured curves are kept (default `Store.default()`, ~/.cache/lookahead; ``Store(None)`` keeps
            nothing across processes).
    """
    key = (str(model.device), str(model.dtype), torch.get_num_threads(), max_tokens)
    known = _MEASURED.setdefault(model, {})
    if key not in known:
        store = Store.default() if store is None else store
        stored_key = curve_key(model, max_tokens)
        curve = _stored(store.get("cost-curves", stored_key))
        if curve is None or not fresh(model, curve):
            curve = _measure(model, max_tokens)
            if curve.busy is None or curve.busy < BUSY:
                store.put("cost-curves", stored_key, {"costs": [c if c < float("inf") else None
                                                                for c in curve.raw.tolist()],
                                                      "seconds": curve.seconds, "check": curve.check})
        known[key] = curve
    return known[key]


def _measure(model, max_tokens: int) -> CostCurve:
    """`measure_draft_cost`, saying so (once per model and process: a few seconds on a CPU)."""
    logger.warning("lookahead: measuring what verifying drafts costs %s on this machine (about 60 forwards, kept "
                   "for later processes)", getattr(model.config, "_name_or_path", "") or type(model).__name__)
    start = time.perf_counter()
    curve = measure_draft_cost(model, max_tokens=max_tokens)
    if curve.busy is not None and curve.busy >= BUSY:
        logger.warning("lookahead: measured while other processes kept %.1f cores busy: the curve serves this "
                       "process only and is measured again by the next", curve.busy)
    logger.info("lookahead: measured the verification cost in %.1f s: %r", time.perf_counter() - start, curve)
    return curve


def _stored(raw) -> CostCurve | None:
    """A kept curve (costs, and the one-token forward's seconds when it was measured: after its context, and after
    `CHECK_CONTEXT` tokens), or None."""
    if raw is None:
        return None
    raw = raw if isinstance(raw, dict) else {"costs": raw}
    try:
        curve = CostCurve([float("inf") if c is None else c for c in raw.get("costs")])
    except (TypeError, ValueError):
        return None
    curve.seconds, curve.check = raw.get("seconds"), raw.get("check")
    return curve


def fresh(model, curve: CostCurve, repeats: int = 3) -> bool:
    """Whether a kept curve still holds here: a one-token forward after `CHECK_CONTEXT` cached tokens (a curve kept
    without that time: after `CONTEXT`) takes at least `FASTER` times what it took when the curve was measured (a
    curve measured on a busy CPU made every forward look slow, wide ones most). A curve kept without its time is
    taken as it is."""
    context, then = (CHECK_CONTEXT, curve.check) if curve.check else (CONTEXT, curve.seconds)
    if not then:
        return True
    now = forward_times(model, (1,), min(context, (position_limit(model.config) or 2 * context) // 2), 1,
                        repeats)[1]
    if now >= FASTER * then or then - now < NOISE:
        return True
    logger.warning("lookahead: a one-token forward takes %.1f ms now against %.1f ms when the verification cost was "
                   "measured: measuring it again", 1e3 * now, 1e3 * then)
    return False


def curve_key(model, max_tokens: int) -> dict:
    """What `model`'s measured curve depends on, as `Store` keys it: the model's name and a hash of its config (its
    shapes), device, dtype, threads, the widths and context timed, torch's version and the machine."""
    config = model.config.to_json_string(use_diff=False)
    return {"model": str(getattr(model.config, "_name_or_path", "") or type(model).__name__),
            "config": hashlib.sha256(config.encode()).hexdigest(), "device": str(model.device),
            "dtype": str(model.dtype), "threads": torch.get_num_threads(), "max_tokens": int(max_tokens),
            "context": CONTEXT, "torch": torch.__version__, **machine()}


def draft_cost(model, facts: ModelFacts, settings, sampling: bool = False):
    """A call's verification cost model: as given, else measured on `model` on first use ("auto", and the default of
    a greedy call on a CPU), else the default (`default_cost`)."""
    cost = settings.draft_cost if settings.draft_cost is not None else default_cost(facts, sampling)
    if isinstance(cost, str):  # "auto"
        most, limit = settings.widest(), facts.positions
        if settings.num_draft_tokens is None:  # far enough to see a wider budget that costs no more (`budget`)
            most = max(most, 2 * DRAFT_TOKENS)
        return measured_draft_cost(model, max(min(most, limit // 2 if limit else most), 1))
    return as_cost(cost)


def budget(cost, n: int) -> int:
    """The widest draft that costs no more to verify than n drafts, by a measured curve (n for other cost models).

    On a CPU a wider forward can cost less than a narrower one (matrix kernels change with the shape: on SmolLM2-135M
    16 tokens cost 2.2 one-token forwards, 11 tokens 2.5), so an unset budget widens to the end of that plateau.

    >>> budget(CostCurve([1.0, 1.2, 2.5, 2.2, 2.4]), 2)
    3
    """
    if not isinstance(cost, CostCurve):
        return n
    costs = cost.costs
    wider = [k for k in range(n, len(costs)) if costs[k] <= costs[min(n, len(costs) - 1)]]
    return max(wider, default=n)


def free_widths(target, cost):
    """n -> the most drafts (tokens or tree nodes) a step verifying n may hold at no extra cost: a static step's
    padded width (its widths are fixed when it is built), else the target's padded width or a wider draft that a
    measured cost curve says costs no more (`budget`). `generate` and the server's engine size their drafts by it."""
    if target.most is not None:
        return target.padded
    return lambda n: max(target.padded(n), budget(cost, n))


def default_cost(facts: ModelFacts, sampling: bool = False):
    """The default cost model: "auto" for a greedy call of a decoder-only model on a CPU, else (0.8, 0.08) on a CPU
    (sampling, encoder-decoders), and (0, 0.02) on an accelerator at small batch (nearly free).

    On a CPU what a multi-token forward costs depends on the model too much for one line: after a one-token forward
    (a matrix-vector product), 2 and 3 tokens cost 1.07-1.3x it on SmolLM2-135M but 1.66-2.10x on GPT-2-small's
    shape (benchmarks/RESULTS.md, "Real models"), so a greedy call measures it once per model, device, dtype and
    thread count (`measured_draft_cost`, about 60 forwards). Drafts never change a greedy output; a sampling call's
    drafts decide which random numbers it draws, so it keeps a fixed line: the same seed writes the same text in
    every process, whatever a measurement would have said."""
    if facts.device.type != "cpu":
        return 0.0, 0.02
    return "auto" if not facts.encoder_decoder and not sampling else (0.8, 0.08)  # `forward_times` feeds input_ids
