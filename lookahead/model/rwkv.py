"""RWKV's blocks, whose states follow the accepted path.

RWKV keeps no KV cache: its forward takes and updates in place a `state` of five tensors [b, hidden, layers] (each
block's last feed-forward input and last attention input, its token shifts; then the linear attention's numerator,
denominator and stabiliser). A forward over several tokens from a state continues it as one-token forwards do (the
token shift reads the state for the first token; the linear attention runs a token at a time either way).

During a verification forward each block's attention and feed-forward inputs are recorded, and its linear attention
runs a token at a time through transformers' own function, its state after each token kept (`RwkvStates`): after the
verdict a row that kept k of the forward's tokens gets the states after its k-th token, read off the records, with
no forward run again. A row that kept them all keeps what the forward left. The protocol of `recurrent.Checkpoints`
(`forward`, `settle`, `close`, `seconds`).
"""
from __future__ import annotations

import contextlib
import inspect
import sys
import time

import torch


class RwkvState(list):
    """RWKV's `state` (a list of its five tensors [b, hidden, layers], as the model takes it), as lookahead's cache:
    its type tells the cache's operations (`cache.py`) what it holds."""


def is_rwkv(model) -> bool:
    """Whether `model` is RWKV: its forward takes `state` (read first: every model's checks ask), and its blocks'
    attention has a time decay and time first."""
    try:
        takes_state = "state" in inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return False
    return takes_state and any(hasattr(m, "time_decay") and hasattr(m, "time_first") and hasattr(m, "layer_id")
                               for m in model.modules())


def rwkv_blocks(model) -> list:
    """The blocks of an RWKV model, in order (layer i's state is column i of the state's tensors)."""
    return [m for m in model.modules() if hasattr(m, "attention") and hasattr(m, "feed_forward")
            and hasattr(getattr(m, "attention"), "time_decay")]


def keeps_rwkv_state(cache) -> bool:
    return isinstance(cache, RwkvState)


def new_state(model, rows: int) -> RwkvState:
    """A state for `rows` rows before any token, as RWKV's forward makes one (its token shifts in the model's dtype,
    the linear attention's in float32, the stabiliser at -1e30)."""
    weight = next(model.parameters())
    config = model.config
    shape = (rows, config.hidden_size, config.num_hidden_layers)
    state = RwkvState(torch.zeros(*shape, dtype=weight.dtype if i <= 1 else torch.float32, device=weight.device)
                      for i in range(5))
    state[4] -= 1e30
    return state


def select_rows(state: RwkvState, rows: torch.Tensor) -> None:
    for i, tensor in enumerate(state):
        state[i] = tensor.index_select(0, rows.to(tensor.device))


def join_rows(state: RwkvState, other: RwkvState) -> None:
    for i, tensor in enumerate(state):
        state[i] = torch.cat([tensor, other[i]], dim=0)


class RwkvStates:
    """The states of one call's RWKV `state`: recorded through each verification forward, settled on each row's
    accepted tokens.

    Args:
        model: the model (its blocks and the modeling module's linear attention are found once).
        state: its `RwkvState`.
    """

    def __init__(self, model, state: RwkvState):
        self.cache, self.blocks = state, rwkv_blocks(model)
        self.module = sys.modules[type(self.blocks[0].attention).__module__] if self.blocks else None
        self.seconds = 0.0  # host time settling states (what following the path costs)
        self.inputs = {}  # (layer, 0 feed-forward / 1 attention) -> its input [b, T, H] in the forward
        self.scans = {}  # layer -> [(num, den, max) [b, H] after each token]
        self._layer = None  # the block whose attention runs now
        self._recording, self._hooks = False, []

    def _hook(self) -> None:
        for block in self.blocks:
            layer = block.attention.layer_id
            self._hooks.append(block.attention.register_forward_pre_hook(
                lambda module, args, kwargs, layer=layer: self._record(layer, 1, args, kwargs), with_kwargs=True))
            self._hooks.append(block.feed_forward.register_forward_pre_hook(
                lambda module, args, kwargs, layer=layer: self._record(layer, 0, args, kwargs), with_kwargs=True))

    def _record(self, layer: int, which: int, args, kwargs):
        if self._recording:
            self.inputs[(layer, which)] = args[0] if args else kwargs["hidden"]
            if which == 1:
                self._layer = layer
        return None

    def close(self) -> None:
        """Take the hooks off the model."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _scan(self, time_decay, time_first, key, value, state=None, return_state=False):
        """transformers' linear attention (its CPU function) a token at a time, each token's state kept; the same
        arithmetic as its loop over the tokens."""
        scan, outputs, kept = self.module.rwkv_linear_attention_cpu, [], []
        for t in range(key.shape[1]):
            out, state = scan(time_decay, time_first, key[:, t:t + 1], value[:, t:t + 1], state=state,
                              return_state=True)
            outputs.append(out)
            kept.append(state)
        self.scans[self._layer] = kept
        return torch.cat(outputs, dim=1), state

    @contextlib.contextmanager
    def forward(self):
        """Around a verification forward: record the blocks' inputs and the linear attention's states per token."""
        if not self._hooks:  # at the first verification forward, so that a call failing before its loop leaves none
            self._hook()
        self.inputs, self.scans, self._recording = {}, {}, True
        own = self.module.rwkv_linear_attention
        self.module.rwkv_linear_attention = self._scan
        try:
            yield
        finally:
            self.module.rwkv_linear_attention = own
            self._recording, self._layer = False, None

    def settle(self, kept) -> None:
        """After the verdict: kept [b] tokens of the forward's T that each row keeps (its root and accepted drafts).
        Rows that keep fewer than T get the states after their last kept token, from the records."""
        if not self.scans:
            return
        start = time.perf_counter()
        kept = torch.as_tensor(kept, dtype=torch.long)
        width = len(next(iter(self.scans.values())))
        rows = torch.nonzero(kept < width).flatten()
        if len(rows):
            last = kept[rows] - 1
            state = self.cache
            device = state[0].device
            at, rows_on = last.to(device), rows.to(device)
            for layer, scans in self.scans.items():
                for which in (0, 1):
                    state[which][rows_on, :, layer] = self.inputs[(layer, which)][rows_on, at]
                for j in range(3):
                    stacked = torch.stack([s[j] for s in scans], dim=1)  # [b, T, H]
                    state[2 + j][rows_on, :, layer] = stacked[rows_on, at]
        self.inputs, self.scans = {}, {}
        self.seconds += time.perf_counter() - start
