"""Recurrent layers (gated delta nets, Mamba, short convolutions, MiniMax's lightning attention, ...) whose state
follows the accepted path.

A verification forward runs every draft token through a recurrent layer's state; a KV cache drops a rejected
token by cutting its slot, but a state has no slots to cut. So before each forward the target takes a checkpoint of
every recurrent state (they are small: a state per layer and row, not per token) and records the input each
recurrent module got; after the verdict, a row that rejected part of its step gets its checkpoint back and each
recurrent module runs again, alone, over that row's kept tokens (its recorded input cut there): the state after
exactly the accepted path, at the cost of the recurrent modules over the kept tokens, not of a forward. A row that
accepted its whole step keeps the state the forward left. Gated delta nets need no rerun: their scan runs as one
chunk whose intermediates give the state after any prefix of its tokens (`delta`), and their convolution windows are
cut from the inputs the forward saw.

Where transformers' own forward of a module cannot continue a cached state over several tokens (its multi-token path
restarts from zero: `STEPPED`), `stepping` makes it run a token at a time from the cached state, through the very
code `model.generate` decodes with, inside the one verification forward.

Trees cannot be verified this way (a state follows one sequence, not branches): `check_recurrent` refuses them by
name. The static cache keeps the same recurrent cache layers beside its slots (`slot_cache.SlotCache`), settled the
same way after each eager step; a compiled or graphed step, which cannot run these hooks, is refused by name.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import time
import weakref

import torch

from transformers.cache_utils import CacheLayerMixin

from . import delta
from .griffin import griffin_blocks
from .rwkv import is_rwkv
from .xlstm import mlstm_layers

try:
    from transformers.cache_utils import LinearAttentionCacheLayerMixin
except ImportError:  # older transformers: no recurrent cache layers
    LinearAttentionCacheLayerMixin = ()

# Module classes whose forward over several tokens from a cached state does not continue it exactly (transformers
# 5.24: their logits, or the next token's after them, differ from a forward over the whole text by 1e-3 to 7;
# tests/test_recurrent.py::test_several_tokens_continue_a_cached_state); they step one token at a time.
STEPPED = frozenset({"MambaMixer", "FalconMambaMixer", "Mamba2Mixer", "BambaMixer", "JambaMambaMixer",
                     "NemotronHMamba2Mixer", "ZambaMambaMixer", "Zamba2MambaMixer"})


_MODULES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> its recurrent modules


def recurrent_layers(cache) -> list:
    """Indices of the cache layers that keep a recurrent or convolution state."""
    return [i for i, layer in enumerate(getattr(cache, "layers", None) or [])
            if isinstance(layer, LinearAttentionCacheLayerMixin)]


def keeps_states(cache) -> bool:
    """Whether `cache` holds recurrent states lookahead follows: transformers' recurrent layers, or the linear
    attention states of MiniMax's own cache (`linear_cache`, one [b, heads, d, d] tensor per such layer)."""
    return bool(recurrent_layers(cache)) or hasattr(cache, "linear_cache")


def state_layers(model) -> dict:
    """{layer: (its number of states, whether it keeps keys and values beside them)} of the layers of `model` whose
    cache keeps recurrent states, as transformers' dynamic cache for its config lays them out."""
    return {i: (layer.number_of_states, isinstance(layer, CacheLayerMixin)) for i, layer in enumerate(_layers(model))
            if isinstance(layer, LinearAttentionCacheLayerMixin)}


def windowed_state_layers(model) -> list:
    """The layers of `model` that keep recurrent states beside a sliding window's keys and values (Inkling's): their
    window is the cache layer's own, which the static cache's masks do not apply."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    return [i for i, layer in enumerate(_layers(model))
            if isinstance(layer, LinearAttentionCacheLayerMixin) and isinstance(layer, DynamicSlidingWindowLayer)]


def _layers(model) -> list:
    """The layers of transformers' dynamic cache for `model`'s config (none where it cannot build one)."""
    try:
        from transformers import DynamicCache

        return DynamicCache(config=model.config).layers
    except (TypeError, ValueError, AttributeError):
        return []


def recurrent_modules(model) -> list:
    """The modules that read and write a recurrent cache layer's state (`layer_idx` names the layer), in order;
    found once per model (a call's checks, `stepping` and `Checkpoints` each ask)."""
    try:
        return _MODULES[model]
    except KeyError:
        found = [module for module in model.modules() if _keeps_state(type(module))
                 and isinstance(getattr(module, "layer_idx", None), int)]
        _MODULES[model] = found
        return found


@functools.lru_cache(maxsize=None)
def _keeps_state(cls) -> bool:
    """Whether a module class's forward reads or writes a recurrent cache layer's state, and takes the cache (the
    mixer of a recurrent layer, not the decoder layer around it)."""
    try:
        source, params = inspect.getsource(cls.forward), inspect.signature(cls.forward).parameters
    except (TypeError, OSError, ValueError):
        return False
    return ("get_recurrent_state" in source or "get_conv_state" in source or "update_conv_state" in source
            or "get_linear_cache" in source) and "cache" in params and "decoder_layer" not in source


def unsupported(model) -> str | None:
    """Why lookahead cannot follow the accepted path through `model`'s recurrent layers, or None: each recurrent
    cache layer must be written by modules that take the cache as `cache` and their input as `hidden_states`."""
    modules = recurrent_modules(model)
    if not modules:
        if griffin_blocks(model):  # RecurrentGemma: states on its blocks (`griffin.BlockStates`)
            return None
        if mlstm_layers(model):  # xLSTM: states in its own cache (`xlstm.LayerStates`)
            return None
        if is_rwkv(model):  # RWKV: states in the `state` its forward takes (`rwkv.RwkvStates`)
            return None
        return "no module of its own reads the recurrent states from transformers' cache"
    for module in modules:
        params = inspect.signature(type(module).forward).parameters
        if "hidden_states" not in params:
            return f"{type(module).__name__} takes no hidden_states"
    return None


@contextlib.contextmanager
def stepping(model):
    """Within: each `STEPPED` module of `model` runs a multi-token forward from a cached state one token at a time
    (the decode path model.generate runs), so a verification forward continues its state exactly; a prefill (no
    cached state yet) runs as before. Restores the modules' own forward on exit."""
    changed = [m for m in recurrent_modules(model) if type(m).__name__ in STEPPED]
    for module in changed:
        module.forward = functools.partial(_stepped, module, type(module).forward.__get__(module))
    try:
        yield
    finally:
        for module in changed:
            del module.forward


def _stepped(module, forward, hidden_states, cache=None, attention_mask=None, **kwargs):
    """`forward` over hidden_states [b, T, H] a token at a time once `cache` holds the module's state."""
    length = hidden_states.shape[1]
    if length == 1 or cache is None or cache.get_recurrent_state(module.layer_idx) is None:
        return forward(hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
    outs = [forward(hidden_states[:, t:t + 1], cache=cache, attention_mask=None, **_cut(kwargs, length, t, t + 1))
            for t in range(length)]
    return torch.cat(outs, dim=1)


def _cut(kwargs: dict, length: int, start: int, end: int) -> dict:
    """kwargs with every tensor that runs along the step's `length` tokens (dim 1) cut to [start, end)."""
    return {k: _cut_one(v, length, start, end) for k, v in kwargs.items()}


def _cut_one(value, length: int, start: int, end: int):
    """`value` cut to [start, end) along dim 1 where it is a tensor running along the step's `length` tokens (a
    per-token mask, such as Zaya's positional `conv_mask`), else itself."""
    if isinstance(value, torch.Tensor) and value.dim() > 1 and value.shape[1] == length:
        return value[:, start:end]
    return value


class Checkpoints:
    """The recurrent states of a cache before a verification forward, and the inputs its recurrent modules got in
    it; `settle` gives each row the states after its accepted tokens only.

    Args:
        model: the model (its recurrent modules are found once).
        cache: its cache (transformers' `DynamicCache` with recurrent layers, `cache.new_cache`).
    """

    def __init__(self, model, cache):
        self.cache, self.layers = cache, recurrent_layers(cache)
        self.saved = None  # [(layer index, kind, state index, tensor)] before the forward
        self.seconds = 0.0  # host time taking checkpoints and settling states (what following the path costs)
        self.calls = []  # (module, hidden_states [b, T, H], other args, kwargs) of the forward
        self._recording, self._hooks = False, []
        self.modules = recurrent_modules(model)
        # gated delta nets: their scan runs as one chunk (`delta.one_chunk`), whose record gives the state after any
        # prefix of the forward's tokens; with the convolution inputs each layer saw, such a module settles without
        # running again
        self.scans = {sys.modules[type(m).__module__] for m in self.modules if delta.scans(type(m))}
        self.records, self.convs = {}, {}  # module -> delta.Record; (layer, state index) -> conv inputs [b, C, L]
        self._module = None  # the recurrent module running now
        # the linear layers inside the recurrent modules: their outputs in the forward, replayed when the modules run
        # again over a row's kept tokens (the same inputs, cut there), so that settling computes no projection
        self.linears = {linear: [] for m in self.modules for linear in m.modules()
                        if isinstance(linear, torch.nn.Linear)}

    def _hook(self) -> None:
        """Put the hooks on the model (at the first verification forward, so that a call that fails before its loop
        leaves none; `close` takes them off)."""
        self._hooks = [m.register_forward_pre_hook(self._record, with_kwargs=True) for m in self.modules]
        self._hooks += [linear.register_forward_hook(self._keep) for linear in self.linears]

    def close(self) -> None:
        """Remove the hooks from the model."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _record(self, module, args, kwargs):
        if not self._recording:
            return None
        hidden = args[0] if args else kwargs["hidden_states"]
        rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        self.calls.append((module, hidden, args[1:], rest))
        self._module = module
        return None

    def _scan(self, scan, query, key, value, g=None, beta=None, chunk_size=64, initial_state=None,
              output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
        """transformers' chunked gated delta rule (`scan`) as one chunk, recorded, over a verification forward's
        tokens from a cached state; else `scan` itself."""
        if (initial_state is None or key.shape[1] > delta.MAX_TOKENS or self._module is None
                or kwargs.get("cu_seqlens") is not None):
            return scan(query, key, value, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
                        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                        **kwargs)
        out, final, self.records[self._module] = delta.one_chunk(query, key, value, g, beta, initial_state,
                                                                 use_qk_l2norm_in_kernel)
        return out, final if output_final_state else None

    def _conv(self, layer: int, update, conv_states, state_idx: int = 0, **kwargs):
        """A recurrent cache layer's `update_conv_state`, keeping the inputs it returns (the state before the forward,
        then the forward's tokens)."""
        full = update(conv_states, state_idx, **kwargs)
        self.convs[(layer, state_idx)] = full
        return full

    @contextlib.contextmanager
    def _scanning(self):
        """Within: the gated delta nets' scans run as recorded single chunks, the recurrent cache layers keep their
        convolution inputs."""
        scans = [(module, getattr(module, delta.SCAN)) for module in self.scans]
        layers = [self.cache.layers[i] for i in self.layers]
        for module, scan in scans:
            setattr(module, delta.SCAN, functools.partial(self._scan, scan))
        for i, layer in zip(self.layers, layers):
            layer.update_conv_state = functools.partial(self._conv, i, type(layer).update_conv_state.__get__(layer))
        try:
            yield
        finally:
            for module, scan in scans:
                setattr(module, delta.SCAN, scan)
            for layer in layers:
                del layer.update_conv_state
            self._module = None

    def _keep(self, linear, args, output):
        if self._recording:
            self.linears[linear].append(output)

    @contextlib.contextmanager
    def _replayed(self, width: int):
        """Within: each linear layer of the recurrent modules returns its outputs of the forward over `width`
        tokens, token after token, instead of computing them (a rerun over a row's kept tokens sees the same inputs,
        in order); a layer whose outputs do not cover the forward's tokens once (called twice a token) computes."""
        changed = []
        for linear, outputs in self.linears.items():
            if sum(out.shape[1] if out.dim() == 3 else -1 for out in outputs) != width:
                continue
            own = vars(linear).get("forward")  # a forward set for the call (packed weights), or None
            changed.append((linear, own))
            linear.forward = functools.partial(_replay, [[out, 0] for out in outputs],
                                               own or type(linear).forward.__get__(linear))
        try:
            yield
        finally:
            for linear, own in changed:
                if own is None:
                    del linear.forward
                else:
                    linear.forward = own

    def _states(self) -> list:
        """(layer, kind, state index, tensor) of every state the recurrent layers hold now; a layer that records its
        convolution inputs (a sliding-window hybrid, whose attention part must keep every slot) shows the last
        `conv_kernel_size` of them, all a next forward reads. MiniMax's cache: each linear attention layer's state."""
        found = [(i, "linear_cache", None, state) for i, state in enumerate(getattr(self.cache, "linear_cache", ()))
                 if isinstance(state, torch.Tensor)]
        for i in self.layers:
            layer = self.cache.layers[i]
            for kind in ("conv_states", "recurrent_states"):
                for j, state in getattr(layer, kind).items():
                    if state is not None:
                        if kind == "conv_states" and layer.record_past:
                            state = state[..., -layer.conv_kernel_size[j]:]
                        found.append((i, kind, j, state))
        return found

    def _put(self, states, values) -> None:
        for (i, kind, j, _), value in zip(states, values):
            if kind == "linear_cache":
                self.cache.linear_cache[i] = value
            else:
                getattr(self.cache.layers[i], kind)[j] = value

    @contextlib.contextmanager
    def forward(self):
        """Around a verification forward: checkpoint the states, record the recurrent modules' inputs."""
        if not self._hooks:
            self._hook()
        start = time.perf_counter()
        self.saved = [(i, kind, j, state.clone()) for i, kind, j, state in self._states()]
        self.seconds += time.perf_counter() - start
        self.calls, self._recording = [], True
        self.records, self.convs = {}, {}
        for outputs in self.linears.values():
            outputs.clear()
        try:
            with self._scanning():
                yield
        finally:
            self._recording = False

    def settle(self, kept) -> None:
        """After the verdict: kept [b] tokens of the forward's T that each row keeps (its root and accepted drafts).
        Rows that keep fewer than T get the states after their kept tokens (rows grouped by how many they keep): a
        gated delta net's from its record of the forward (`delta.state_after`, its convolution window cut from the
        inputs it saw); any other recurrent module's by the checkpoint, then the module over its recorded input cut to
        the kept tokens."""
        start = time.perf_counter()
        width = self.calls[0][1].shape[1] if self.calls else 0
        states, short = self._states(), sorted({int(n) for n in kept if int(n) < width})
        where = {(i, kind, j): at for at, (i, kind, j, _) in enumerate(states)}
        direct = self._direct(where, width) if short else {}
        rerun = [call for call in self.calls if call[0] not in direct]
        # the states to put back: those the forward left, copied where rows are rerun over them (a rerun writes the
        # cache's own), else written in place
        final = [state.clone() if short and rerun else state for *_, state in states]
        for n in short:
            rows = [r for r, k in enumerate(kept) if int(k) == n]
            every = len(rows) == len(kept)
            rows = torch.tensor(rows, device=final[0].device)
            if rerun:
                self._put(self.saved, [saved.clone() for *_, saved in self.saved])
                with torch.inference_mode(), self._replayed(width):
                    for module, hidden, args, kwargs in rerun:
                        args = tuple(_cut_one(arg, width, 0, n) for arg in args)
                        kwargs = _cut(kwargs, width, 0, n)
                        if "attention_mask" in kwargs:  # every kept token is a real one
                            kwargs["attention_mask"] = None
                        module(hidden[:, :n].contiguous(), *args, **kwargs)
                for out, (*_, state) in zip(final, self._states()):
                    out[rows] = state[rows]
            for out, value in self._followed(direct, where, final, n, None if every else rows, width):
                if every:
                    out.copy_(value)
                else:
                    out[rows] = value
        self._put(states, final)
        if final and final[0].device.type == "cuda":  # the time is the device's
            torch.cuda.synchronize(final[0].device)
        self.seconds += time.perf_counter() - start

    def _followed(self, direct: dict, where: dict, final: list, n: int, rows, width: int):
        """(state, its rows' value after n kept tokens) of each gated delta net in `direct`: the recurrent state from
        its record, each convolution window cut from the inputs the forward saw (copied: with `record_past` those
        inputs are the state itself)."""
        for module, record in direct.items():
            i = module.layer_idx
            yield final[where[(i, "recurrent_states", 0)]], delta.state_after(record, n, rows)
            for (layer, j), inputs in self.convs.items():
                if layer == i:
                    out = final[where[(i, "conv_states", j)]]
                    end = inputs.shape[-1] - (width - n)
                    window = inputs[..., end - out.shape[-1]:end]
                    yield out, (window if rows is None else window[rows]).clone()

    def _direct(self, where: dict, width: int) -> dict:
        """{module: its delta.Record} of the gated delta nets whose every state follows from the forward's record:
        the recurrent state from their scan over all `width` tokens, each convolution window from its inputs."""
        direct, saved = {}, {(i, kind, j): state for i, kind, j, state in self.saved}
        for module, record in self.records.items():
            i = module.layer_idx
            held = {(kind, j) for (layer, kind, j) in where if layer == i}
            found = {("recurrent_states", 0)} | {("conv_states", j) for (layer, j) in self.convs if layer == i}
            if record.key.shape[2] == width and held == found:
                # the record's start is the cache's own tensor, which the forward then overwrote: the checkpoint's
                direct[module] = record._replace(start=saved[(i, "recurrent_states", 0)])
        return direct


def _replay(outputs: list, forward, x: torch.Tensor) -> torch.Tensor:
    """x's tokens [b, m, in] of the recorded outputs ([output [b, T, out], tokens already given] in order), else
    `forward(x)`."""
    while outputs and outputs[0][1] >= outputs[0][0].shape[1]:
        outputs.pop(0)
    if not outputs or x.dim() != 3 or outputs[0][0].shape[0] != x.shape[0]:
        return forward(x)
    out, at = outputs[0]
    if at + x.shape[1] > out.shape[1]:
        return forward(x)
    outputs[0][1] = at + x.shape[1]
    return out[:, at:at + x.shape[1]]


def close_states(states, stats=None) -> None:
    """At the end of a call: take a target's state follower (`Checkpoints`, `griffin.BlockStates` or None) off the
    model, and add the time it took to follow the accepted path to `stats.seconds["recurrent"]`."""
    if states is None:
        return
    states.close()
    if stats is not None:
        stats.seconds["recurrent"] = stats.seconds.get("recurrent", 0.0) + states.seconds


def select_state_rows(cache, rows: torch.Tensor) -> None:
    """Keep only the batch rows `rows` of every recurrent state (transformers' recurrent layers select no rows)."""
    for i in recurrent_layers(cache):
        layer = cache.layers[i]
        for kind in ("conv_states", "recurrent_states"):
            states = getattr(layer, kind)
            for j, state in states.items():
                if state is not None:
                    states[j] = state[rows.to(state.device)]
