"""CUDA graphs' semantics on a CPU, for tests of the static step's captured path (`model/static.py`,
`serve/batch.StaticServingLM`) on a machine without CUDA.

A captured CUDA graph replays fixed kernels on fixed memory: every tensor it read at capture is read again from the
same storage (a tensor the host code has since replaced is not seen), every Python value is what it was at capture,
and a host sync inside the capture (`.item()`, `nonzero`, `.tolist()`, `if tensor:`) fails it. `CpuGraph` records the
aten ops a capture runs (a `TorchDispatchMode`) and replays them on the tensors they took at capture, writing each
op's fresh result into the tensor it returned then, so that later ops and the caller read it there; a sync fails the
capture as CUDA's does; what a capture returns holds NaN (-1 for integers) until the first replay, and graphs
captured into one pool (a state's widths) share its memory, so replaying one spoils what the others returned.

`cpu_graphs(monkeypatch)` puts it in place of `torch.cuda.CUDAGraph` and its stream helpers and makes the static
targets run as on CUDA: steps captured where CUDA captures them, their argmax taken inside the graph, and the checks
refusing what they refuse there. Not modelled: the host-to-device copies of the step's inputs (on a CPU the graph
reads the host buffer itself), and host reads that never reach torch (memory read through a numpy array made before
the capture).
"""
from __future__ import annotations

import contextlib
import inspect
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten
# ops whose result the host must wait for: CUDA refuses them while a stream captures
SYNCS = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.nonzero.default, aten.masked_select.default,
         aten.equal.default, aten._unique2.default, aten.unique_consecutive.default, aten.unique_dim.default,
         aten.repeat_interleave.Tensor}


class _HostReads(TorchFunctionMode):
    """Reads of a tensor's values by the host that never reach the dispatcher on a CPU (`tolist`, `numpy`, `cpu`,
    Python's `bool`/`int`/`float`): on CUDA each copies the device's values back, a sync."""

    READS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu, torch.Tensor.item, torch.Tensor.__bool__,
             torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            raise RuntimeError(f"{func.__name__} reads a tensor on the host: operation not permitted when stream is "
                               "capturing")
        return func(*args, **(kwargs or {}))


class _Recorder(TorchDispatchMode):
    def __init__(self, ops: list):
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNCS:
            raise RuntimeError(f"{func} syncs with the host: operation not permitted when stream is capturing")
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class CpuGraph:
    """Stands for `torch.cuda.CUDAGraph`: `replay()` reruns the captured ops on the captured tensors."""

    captures = replays = 0  # over every graph, for tests that check the graphs ran
    pools: dict = {}  # pool -> its graphs (a WeakSet: a state dropped takes its graphs with it)

    def __init__(self):
        self.ops, self.made, self.inference, self.id = [], [], False, None

    def pool(self):
        return self.id

    def replay(self) -> None:
        """Rerun the captured ops. The other graphs of its pool then hold leftovers: on CUDA they share its memory,
        so what they returned is overwritten."""
        if not self.ops:
            raise RuntimeError("replay of a graph that captured nothing")
        for other in CpuGraph.pools[self.id]:
            if other is not self:
                other._spoil()
        with torch.inference_mode(self.inference), torch.no_grad():
            for func, args, kwargs, out in self.ops:
                fresh = func(*args, **kwargs)
                for old, new in zip(tree_flatten(out)[0], tree_flatten(fresh)[0]):
                    if not isinstance(old, torch.Tensor) or _same_memory(old, new):
                        continue  # an in-place op or a view: it wrote or shows the captured storage itself
                    if old.shape != new.shape:
                        raise RuntimeError(f"{func} gave shape {tuple(new.shape)} at replay, {tuple(old.shape)} at "
                                           "capture: a captured graph's shapes are fixed")
                    old.copy_(new)
        CpuGraph.replays += 1

    def _captured(self, pool) -> None:
        """After capture a CUDA graph's outputs hold whatever its pool held: so do these, until the first replay."""
        self.inference = torch.is_inference_mode_enabled()
        self.id = pool if pool is not None else id(self)
        CpuGraph.pools.setdefault(self.id, weakref.WeakSet()).add(self)
        for func, args, kwargs, out in self.ops:  # the memory the capture allocated, not the tensors it read or wrote
            if func._schema.is_mutable:
                continue
            inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            self.made += [t for t in tree_flatten(out)[0]
                          if isinstance(t, torch.Tensor) and not any(_same_memory(t, i) for i in inputs)]
        self._spoil()
        CpuGraph.captures += 1

    def _spoil(self) -> None:
        """NaN (or -1 for integers) in the memory this graph allocated."""
        for tensor in self.made:
            tensor.fill_(float("nan") if tensor.is_floating_point() else -1)


def _same_memory(old, new) -> bool:
    if not isinstance(new, torch.Tensor) or old is new:
        return old is new
    if old.is_mkldnn or new.is_mkldnn or old.numel() == 0:  # opaque (a CPU's packed weights): no storage to compare
        return False
    return old.untyped_storage().data_ptr() == new.untyped_storage().data_ptr()


@contextlib.contextmanager
def _graph(graph: CpuGraph, pool=None, stream=None):
    """`torch.cuda.graph`: record what the body runs into `graph`."""
    graph.ops = []
    with _HostReads(), _Recorder(graph.ops):
        yield graph
    graph._captured(pool)


class _Stream:
    def wait_stream(self, other) -> None:
        pass


def cpu_graphs(monkeypatch) -> type:
    """Let `StaticCausalLM` (and so `StaticServingLM`) capture and replay its steps on a CPU as `CpuGraph`s; returns
    `CpuGraph`, whose counters say how many captures and replays ran."""
    from lookahead import _validate
    from lookahead.model import static
    from lookahead.model.static import StaticCausalLM
    from lookahead.serve.batch import StaticServingLM

    monkeypatch.setattr(torch.cuda, "CUDAGraph", CpuGraph)
    monkeypatch.setattr(torch.cuda, "graph", _graph)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    for cls in (StaticCausalLM, StaticServingLM):
        init = cls.__init__

        def with_graphs(self, *args, _init=init, **kwargs):
            _init(self, *args, **kwargs)
            self.graphs = inspect.signature(_init).bind(self, *args, **kwargs).arguments["graphs"]  # as on CUDA

        monkeypatch.setattr(cls, "__init__", with_graphs)
    monkeypatch.setattr(static, "argmax_in_step", lambda device: True)  # inside the graph, as on CUDA
    monkeypatch.setattr(_validate, "_compiled_static", lambda facts, config: not getattr(config, "disable_compile",
                                                                                           False))  # as on CUDA
    monkeypatch.setattr(CpuGraph, "captures", 0)
    monkeypatch.setattr(CpuGraph, "replays", 0)
    return CpuGraph
