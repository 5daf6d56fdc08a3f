"""xLSTM's mLSTM layers, whose states follow the accepted path.

Each mLSTM layer keeps a matrix memory, a normaliser and a stabiliser per head (`C` [b, heads, dqk, dv], `n`
[b, heads, dqk], `m` [b, heads, 1]) in the model's own `xLSTMCache` (`rnn_state`: layer -> (C, n, m)), no keys or
values. Its forward over several tokens from a cached state continues the state exactly (its chunkwise and recurrent
kernels start from it; `tests/test_recurrent.py`), so a verification forward runs the step's tokens as transformers
runs a prompt. Before it the states are checkpointed and each mLSTM layer's input recorded; after the verdict a row
that rejected part of its step gets its checkpoint back and each mLSTM layer runs again, alone, over its recorded
input cut to the row's kept tokens: the layer's projections and scan over the kept tokens, not the blocks' feed-forward
parts or the head. A row that accepted its whole step keeps what the forward left. The protocol of
`recurrent.Checkpoints` (`forward`, `settle`, `close`, `seconds`).
"""
from __future__ import annotations

import contextlib
import time

import torch


def is_mlstm(module) -> bool:
    """Whether `module` is an mLSTM layer: its `mlstm_backend` scans `forward(x, state) -> (h, state)`."""
    return hasattr(module, "mlstm_backend") and callable(getattr(module, "forward", None))


def mlstm_layers(model) -> list:
    """The mLSTM layers of `model`, in order: layer i's state is the cache's `rnn_state[i]`."""
    return [module for module in model.modules() if is_mlstm(module)]


def keeps_rnn_state(cache) -> bool:
    """Whether `cache` is an xLSTM cache: states per layer in `rnn_state`, no keys or values."""
    return isinstance(getattr(cache, "rnn_state", None), dict)


class LayerStates:
    """The mLSTM states of one call's cache: checkpointed around each verification forward, settled on each row's
    accepted tokens.

    Args:
        model: the model (its mLSTM layers are found once).
        cache: its `xLSTMCache`.
    """

    def __init__(self, model, cache):
        self.cache, self.layers = cache, mlstm_layers(model)
        self.seconds = 0.0  # host time checkpointing and settling states (what following the path costs)
        self.saved = None  # layer -> (C, n, m) before the forward
        self.inputs = {}  # layer -> its input [b, T, H] in the forward
        self._recording, self._hooks = False, []

    def _record(self, module, args):
        if self._recording:
            self.inputs[module] = args[0]

    def close(self) -> None:
        """Take the hooks off the model."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    @contextlib.contextmanager
    def forward(self):
        """Around a verification forward: checkpoint the states, record the mLSTM layers' inputs."""
        if not self._hooks:  # at the first verification forward, so that a call failing before its loop leaves none
            self._hooks = [layer.register_forward_pre_hook(self._record) for layer in self.layers]
        start = time.perf_counter()
        self.saved = {i: tuple(t.clone() for t in state) for i, state in self.cache.rnn_state.items()}
        self.seconds += time.perf_counter() - start
        self.inputs, self._recording = {}, True
        try:
            yield
        finally:
            self._recording = False

    def settle(self, kept) -> None:
        """After the verdict: kept [b] tokens of the forward's T that each row keeps (its root and accepted drafts).
        Rows that keep fewer than T (grouped by how many) get their checkpoint, then each mLSTM layer over its
        recorded input cut to the kept tokens."""
        if not self.inputs:
            return
        start = time.perf_counter()
        width = next(iter(self.inputs.values())).shape[1]
        with torch.inference_mode():
            for n in sorted({int(k) for k in kept if int(k) < width}):
                rows = torch.tensor([r for r, k in enumerate(kept) if int(k) == n],
                                    device=self.cache.rnn_state[0][0].device)
                for i, layer in enumerate(self.layers):
                    before = tuple(t[rows] for t in self.saved[i])
                    _, after = layer(self.inputs[layer][rows, :n], before)
                    for held, value in zip(self.cache.rnn_state[i], after):
                        held[rows] = value.to(held.dtype)
        self.seconds += time.perf_counter() - start


def select_rows(cache, rows: torch.Tensor) -> None:
    """Keep only the batch rows `rows` of every state."""
    for i, state in cache.rnn_state.items():
        cache.rnn_state[i] = tuple(t[rows.to(t.device)] for t in state)


def join_rows(cache, other) -> None:
    """Append `other`'s rows to `cache`'s (a server's batch taking a request prefilled alone)."""
    for i, state in cache.rnn_state.items():
        cache.rnn_state[i] = tuple(torch.cat([mine, theirs], dim=0) for mine, theirs in zip(state, other.rnn_state[i]))
