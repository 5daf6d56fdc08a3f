"""Linear layers for verification forwards on a CPU, with weights packed once for MKL.

A verification forward multiplies a few rows (the step's tokens) by every weight matrix. Handed a plain weight, MKL's
`sgemm` copies it into its own blocked layout inside every product from about 4 rows up, so a forward over 4-12
tokens reads the weights twice: on SmolLM2-135M (2-core Xeon, 512 tokens cached) a forward over 8 tokens took 60.0 ms
with transformers' `nn.Linear` and 48.3 ms with the weights packed once (`cblas_sgemm_pack`, which torch exposes as
`torch.ops.mkl._mkl_reorder_linear_weight` and uses from its own compiler); benchmarks/RESULTS.md, "Step cost".
Which kernel is faster depends on the rows and the CPU (at 1-3 rows and from 16 the plain one is as fast or faster),
so `packed_linears(model)` times both on a sample of the model's layers once per model and thread count and routes
each row count to the faster one. The result is the same product summed in another order: it differs from the plain
kernel's in the last bits, as any multi-token forward does from a one-token one.

The packed copies cost about as much memory as the layers' weights; they are kept while the model lives (a weak
reference) and packed anew when a weight changes. Models whose fp32 linear weights exceed a quarter of the machine's
memory or half of what is free, other dtypes, other devices, modules that override `forward` and torch builds
without MKL run unchanged.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
import weakref

import torch
from torch import nn

from ..runtime.store import Store, machine

ROWS = 16  # row counts above this go to the plain kernel (as fast there); weights are packed for this many rows,
# which serves fewer rows as well (packed for one row, MKL's layout is slower from two rows up)
SAMPLE_BYTES = 48 << 20  # the layers timed to choose a kernel per row count: about this much weight, and the largest
_PACKS: "weakref.WeakKeyDictionary[nn.Module, _Packs]" = weakref.WeakKeyDictionary()
logger = logging.getLogger(__name__)


def available() -> bool:
    """Whether this torch build has MKL's packed sgemm."""
    mkl = getattr(torch.ops, "mkl", None)
    return bool(torch._C.has_mkl) and hasattr(mkl, "_mkl_linear") and hasattr(mkl, "_mkl_reorder_linear_weight")


@contextlib.contextmanager
def packed_linears(model):
    """Run `model`'s `nn.Linear` layers with packed weights inside the block, for the row counts where that is faster
    on this machine (unchanged otherwise: not a CPU fp32 model, no MKL, too large); the layers' own `forward` is
    back when the block ends, also on an error. Nested blocks on one model do nothing more.

    Example:
        >>> with packed_linears(model):
        ...     logits = model(input_ids=ids[:, -8:], past_key_values=cache).logits
    """
    packs = _packs_for(model)
    if packs is None or packs.active:
        yield
        return
    packs.install()
    try:
        yield
    finally:
        packs.remove()


def _packs_for(model):
    """The model's packs, made or refreshed, with their kernel choice for this thread count; None when not eligible."""
    if not available():
        return None
    packs = _PACKS.get(model)
    if packs is None:
        layers = _eligible(model)
        if not layers:
            return None
        packs = _PACKS[model] = _Packs(layers)
    packs.refresh()
    return packs


def _eligible(model) -> list:
    """The model's plain fp32 CPU `nn.Linear` layers, or [] when their weights would take too much memory to copy."""
    layers = [m for m in model.modules() if type(m) is nn.Linear and "forward" not in m.__dict__
              and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu" and m.weight.dim() == 2]
    total = sum(m.weight.numel() * 4 for m in layers)
    physical, free = _memory()
    return layers if total and total <= physical // 4 and total <= free // 2 else []


def _memory() -> tuple:
    """(physical, available) bytes of memory; (0, 0) where the system does not say."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0, 0


class _Packs:
    """Packed copies of a model's linear weights, and the row counts for which the packed kernel is faster."""

    def __init__(self, layers):
        self.layers = layers
        self.keys = [None] * len(layers)  # (data pointer, version) of each weight when it was packed
        self.packed = [None] * len(layers)
        self.faster = {}  # thread count -> set of row counts
        self.installed = []  # (layer, the forward set on it) while a block runs

    def refresh(self):
        for i, m in enumerate(self.layers):
            key = (m.weight.data_ptr(), m.weight._version)
            if key != self.keys[i]:
                with torch.no_grad():
                    self.packed[i] = torch.ops.mkl._mkl_reorder_linear_weight(m.weight.detach(), ROWS)
                self.keys[i] = key
        threads = torch.get_num_threads()
        if threads not in self.faster:  # timed once per machine, shapes and threads: then read from disk (`runtime.store`)
            key = {"layers": [list(m.weight.shape) for m in self.layers], "threads": threads, "rows": ROWS,
                   "sample": SAMPLE_BYTES, "torch": torch.__version__, **machine()}
            stored, start = Store.default().get("linear-rows", key), time.perf_counter()
            self.faster[threads] = set(stored) if stored is not None else _faster_rows(self.layers, self.packed)
            if stored is None:
                Store.default().put("linear-rows", key, sorted(self.faster[threads]))
            logger.info("lookahead: timed packed linear weights in %.1f s (%d threads): packed at %s rows",
                        time.perf_counter() - start, threads, sorted(self.faster[threads]) or "no")

    def install(self):
        rows = frozenset(self.faster[torch.get_num_threads()])
        self.installed = []
        if not rows:
            return
        for m, packed in zip(self.layers, self.packed):
            if "forward" not in m.__dict__:  # a layer given its own forward since (a hook) keeps it
                m.forward = _forward(m, packed, rows)
                self.installed.append((m, m.forward))

    def remove(self):
        for m, forward in self.installed:
            if m.__dict__.get("forward") is forward:
                del m.__dict__["forward"]
        self.installed = []

    @property
    def active(self) -> bool:
        """Whether a block has the packed forwards set (a nested block then leaves them to it)."""
        return bool(self.installed)


def _forward(layer: nn.Linear, packed: torch.Tensor, rows: frozenset):
    """The layer's forward: the packed kernel for an fp32 input of `rows` rows without autograd, else its own."""
    weight, bias = layer.weight, layer.bias

    def forward(x):
        m = x.numel() // x.shape[-1] if x.numel() else 0
        if m not in rows or (torch.is_grad_enabled() and weight.requires_grad) or x.dtype != torch.float32:
            return nn.functional.linear(x, weight, bias)
        return torch.ops.mkl._mkl_linear(x, packed, weight, bias, m)  # [..., out]

    return forward


def _faster_rows(layers, packed, rounds: int = 2) -> set:
    """The row counts 1..ROWS at which the packed kernel beats the plain one on a sample of the layers (the largest
    and the first ones up to `SAMPLE_BYTES` of weights): best of `rounds` runs in turns after one to warm up."""
    largest = max(range(len(layers)), key=lambda i: layers[i].weight.numel())
    order, size = [largest], layers[largest].weight.numel() * 4
    for i in range(len(layers)):
        if size >= SAMPLE_BYTES:
            break
        if i != largest:
            order.append(i)
            size += layers[i].weight.numel() * 4
    g = torch.Generator().manual_seed(0)
    best = {}
    with torch.inference_mode():
        for r in range(rounds + 1):
            for m in range(1, ROWS + 1):
                xs = {layers[i].in_features: torch.randn(m, layers[i].in_features, generator=g) for i in order}
                for kind in ("plain", "packed"):
                    start = time.perf_counter()
                    for i in order:
                        w, b, x = layers[i].weight, layers[i].bias, xs[layers[i].in_features]
                        if kind == "plain":
                            nn.functional.linear(x, w, b)
                        else:
                            torch.ops.mkl._mkl_linear(x, packed[i], w, b, m)
                    if r:
                        t = time.perf_counter() - start
                        best[m, kind] = min(best.get((m, kind), t), t)
    return {m for m in range(1, ROWS + 1) if best[m, "packed"] < 0.97 * best[m, "plain"]}
