"""Recurrent layers (gated delta nets, Mamba, short convolutions, MiniMax's lightning attention, ...) whose state
follows the accepted path.

A verification forward runs every draft token through a recurrent layer's state; a KV cache drops a rejected
token by cutting its slot, but a state has no slots to cut. So before each forward the target takes a checkpoint of
every recurrent state (they are small: a state per layer and row, not per token) and records the input each
recurrent module got; after the verdict, a row that rejected part of its step gets its checkpoint back and each
recurrent module runs again, alone, over that row's kept tokens (its recorded input cut there): the state after
exactly the accepted path, at the cost of the recurrent modules over the kept tokens, not of a forward. A row that
accepted its whole step keeps the state the forward left.

Where transformers' own forward of a module cannot continue a cached state over several tokens (its multi-token path
restarts from zero: `STEPPED`), `stepping` makes it run a token at a time from the cached state, through the very
code `model.generate` decodes with, inside the one verification forward.

Trees cannot be verified this way (a state follows one sequence, not branches), nor can the static cache:
`check_recurrent` refuses both by name.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import time
import weakref

import torch

try:
    from transformers.cache_utils import LinearAttentionCacheLayerMixin
except ImportError:  # older transformers: no recurrent cache layers
    LinearAttentionCacheLayerMixin = ()

# Module classes whose forward over several tokens from a cached state does not continue it exactly (transformers
# 5.24: their logits, or the next token's after them, differ from a forward over the whole text by 1e-3 to 7;
# tests/test_recurrent.py::test_several_tokens_continue_a_cached_state); they step one token at a time.
STEPPED = frozenset({"MambaMixer", "FalconMambaMixer", "Mamba2Mixer", "BambaMixer", "JambaMambaMixer",
                     "NemotronHMamba2Mixer", "Zamba2MambaMixer"})
# Gated delta nets whose forward hands its keyword arguments to transformers' chunked scan
# (`torch_chunk_gated_delta_rule`, chunk_size=64 by default): a verification forward of T tokens from a cached state
# runs it with chunks of `CHUNK`, not padded to 64 (the scan loops over a chunk's positions, then over the chunks: on
# this CPU, the hybrid of benchmarks/hybrid.py, 11 tokens took 99 ms with chunks of 64, 93 ms of 11, 87 ms of 4).
CHUNK = 4
CHUNKED_SCANS = frozenset({"Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet", "Qwen3NextGatedDeltaNet",
                           "OlmoHybridGatedDeltaNet", "LaraMiniGatedDeltaNet"})
# Module classes whose states lookahead does not follow yet, and why (tests/test_families.py shows the refusal).
UNFOLLOWED = {
    "InklingShortConvolution": "its short convolutions inside attention, with masks of their own, give other tokens "
                               "than model.generate after a verification forward",
    "ZayaCCAProjection": "its convolved query/key projections take a conv_mask, not the attention mask, and break on "
                         "a verification forward",
}


_MODULES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> its recurrent modules


def recurrent_layers(cache) -> list:
    """Indices of the cache layers that keep a recurrent or convolution state."""
    return [i for i, layer in enumerate(getattr(cache, "layers", None) or [])
            if isinstance(layer, LinearAttentionCacheLayerMixin)]


def keeps_states(cache) -> bool:
    """Whether `cache` holds recurrent states lookahead follows: transformers' recurrent layers, or the linear
    attention states of MiniMax's own cache (`linear_cache`, one [b, heads, d, d] tensor per such layer)."""
    return bool(recurrent_layers(cache)) or hasattr(cache, "linear_cache")


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
        return "no module of its own reads the recurrent states from transformers' cache"
    for module in modules:
        if type(module).__name__ in UNFOLLOWED:
            return f"{type(module).__name__}: {UNFOLLOWED[type(module).__name__]}"
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
    return {k: v[:, start:end] if isinstance(v, torch.Tensor) and v.dim() > 1 and v.shape[1] == length else v
            for k, v in kwargs.items()}


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
        if type(module).__name__ in CHUNKED_SCANS:  # short chunks
            kwargs = dict(kwargs, chunk_size=min(CHUNK, hidden.shape[1]))
        rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        self.calls.append((module, hidden, args[1:], rest))
        return args, kwargs

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
        for outputs in self.linears.values():
            outputs.clear()
        try:
            yield
        finally:
            self._recording = False

    def settle(self, kept) -> None:
        """After the verdict: kept [b] tokens of the forward's T that each row keeps (its root and accepted drafts).
        Rows that keep fewer than T get the states after their kept tokens: the checkpoint, then each recorded
        module over its input cut to them (rows grouped by how many they keep)."""
        start = time.perf_counter()
        width = self.calls[0][1].shape[1] if self.calls else 0
        states, short = self._states(), sorted({int(n) for n in kept if int(n) < width})
        # rows that keep every token keep these (copied only where other rows are rerun over them)
        final = [state.clone() if short else state for *_, state in states]
        for n in short:
            rows = torch.tensor([r for r, k in enumerate(kept) if int(k) == n], device=final[0].device)
            self._put(self.saved, [saved.clone() for *_, saved in self.saved])
            with torch.inference_mode(), self._replayed(width):
                for module, hidden, args, kwargs in self.calls:
                    kwargs = _cut(kwargs, width, 0, n)
                    if "attention_mask" in kwargs:  # every kept token is a real one
                        kwargs["attention_mask"] = None
                    if "chunk_size" in kwargs:
                        kwargs["chunk_size"] = min(CHUNK, n)
                    module(hidden[:, :n].contiguous(), *args, **kwargs)
            for out, (*_, state) in zip(final, self._states()):
                out[rows] = state[rows]
        self._put(states, final)
        if final and final[0].device.type == "cuda":  # the time is the device's
            torch.cuda.synchronize(final[0].device)
        self.seconds += time.perf_counter() - start


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


def select_state_rows(cache, rows: torch.Tensor) -> None:
    """Keep only the batch rows `rows` of every recurrent state (transformers' recurrent layers select no rows)."""
    for i in recurrent_layers(cache):
        layer = cache.layers[i]
        for kind in ("conv_states", "recurrent_states"):
            states = getattr(layer, kind)
            for j, state in states.items():
                if state is not None:
                    states[j] = state[rows.to(state.device)]
