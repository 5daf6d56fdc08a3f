"""RecurrentGemma's recurrent blocks (Griffin: a short convolution, then the RG-LRU), whose states follow the accepted
path.

These blocks keep their states on the modules themselves (`conv1d_state` [b, C, width - 1] and the RG-LRU's
`recurrent_states` [b, C] in fp32), not in transformers' cache, and their forward over several tokens is a prefill:
it restarts the convolution from zero. So during a verification forward each block continues its states: its linear
layers over all the step's tokens at once, its convolution and RG-LRU a token at a time through the operations of
the block's one-token path (what `model.generate` decodes with), keeping the states after each token; after the
verdict a row gets the states after its kept tokens, taken from that record (no rerun). Rows a call drops are dropped
from the states too. A batch keeps its states between its forwards (`hold`), so a server's joining row, prefilled
alone on the same modules, does not overwrite them, and joins them (`join`). The blocks are found by what they hold
(`is_griffin`), not by name.
"""
from __future__ import annotations

import contextlib
import functools
import time

import torch


def is_griffin(module) -> bool:
    """Whether `module` is a Griffin recurrent block: a short convolution (`conv_1d`, its window `conv1d_state`) and an
    RG-LRU (`rg_lru`, its `recurrent_states`), states held on the modules."""
    return (hasattr(module, "conv1d_state") and hasattr(module, "conv_1d")
            and hasattr(getattr(module, "rg_lru", None), "recurrent_states"))


def griffin_blocks(model) -> list:
    """The Griffin recurrent blocks of `model`, in order."""
    return [module for module in model.modules() if is_griffin(module)]


class BlockStates:
    """The Griffin blocks of a model during one call (or one served batch): verification forwards continue their states
    and record the state after each token (`_stepped`); `settle` gives each row the states after its kept tokens;
    between forwards the batch holds its states (`hold`), which a server's joining rows `join`. The protocol of
    `recurrent.Checkpoints` (`forward`, `settle`, `close`, `seconds`), and `prefill`, `select`, `join`.

    Args:
        model: the model (its blocks are found once).
    """

    def __init__(self, model):
        self.blocks = griffin_blocks(model)
        self.seconds = 0.0  # host time recording and settling states (what following the path costs)
        self.record = {}  # block -> [(conv1d_state, recurrent_states) after each token of the forward]
        self.held = None  # block -> (conv1d_state, recurrent_states) of this batch's rows between its forwards: the
        # modules hold one batch's states at a time, and a server prefills a joining row's alone in between

    def _load(self) -> None:
        """Put this batch's states on the blocks (another batch's prefill may have replaced them)."""
        for block, (conv, state) in (self.held or {}).items():
            block.conv1d_state, block.rg_lru.recurrent_states = conv, state

    def hold(self) -> None:
        """Keep the states the blocks have now as this batch's (after its prefill or a settled step)."""
        self.held = {block: (block.conv1d_state, block.rg_lru.recurrent_states) for block in self.blocks}

    @contextlib.contextmanager
    def prefill(self):
        """Around a batch's prefill: the blocks start from no state (their own forward sets it up), and keep what it
        leaves as this batch's."""
        for block in self.blocks:
            block.conv1d_state = block.rg_lru.recurrent_states = None
        yield
        self.hold()

    def join(self, other: "BlockStates") -> None:
        """Append the rows of `other` (the same model's blocks, another batch) behind this batch's."""
        self.held = {block: tuple(torch.cat(pair) for pair in zip(self.held[block], other.held[block]))
                     for block in self.blocks}

    @contextlib.contextmanager
    def forward(self):
        """Around a verification forward: each block steps a token at a time from its state, recorded."""
        self._load()
        self.record = {block: [] for block in self.blocks}
        for block in self.blocks:
            block.forward = functools.partial(_stepped, self.record[block], type(block).forward.__get__(block))
        try:
            yield
        finally:
            for block in self.blocks:
                del block.forward

    def settle(self, kept) -> None:
        """After the verdict: kept [b] tokens of the forward's T that each row keeps (its root and accepted drafts);
        each block's states become those after them (rows that kept all T have them already)."""
        start = time.perf_counter()
        for block, steps in self.record.items():
            if not steps or all(int(n) == len(steps) for n in kept):
                continue
            at = torch.as_tensor([int(n) - 1 for n in kept], device=steps[0][0].device)
            rows = torch.arange(len(at), device=at.device)
            block.conv1d_state = torch.stack([conv for conv, _ in steps])[at, rows]
            block.rg_lru.recurrent_states = torch.stack([state for _, state in steps])[at, rows]
        self.record = {}
        self.hold()
        self.seconds += time.perf_counter() - start

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows `rows` of every block's states."""
        self.held = {block: tuple(None if t is None else t[rows.to(t.device)] for t in held)
                     for block, held in (self.held or {}).items()}
        self._load()

    def close(self) -> None:
        """Nothing stays on the model between calls (`forward` restores each block's own forward)."""


def _stepped(record: list, forward, input_states, position_ids, attention_mask=None, use_cache=True, **kwargs):
    """A Griffin block's `forward` over input_states [b, T, H] continuing its states (its own forward over several
    tokens would restart the convolution from zero), appending the states after each token to `record`: transformers
    5.24's `RecurrentGemmaRecurrentBlock` with its convolution over the cached window and the step's tokens, each
    output summed as its one-token (decoding) path sums it, and the RG-LRU's scan recorded (`_scan`)."""
    block = forward.__self__
    if input_states.shape[1] == 1 or not use_cache or block.conv1d_state is None \
            or block.conv1d_state.shape[0] != input_states.shape[0]:
        out = forward(input_states, position_ids, attention_mask, use_cache=use_cache, **kwargs)
        record.append((block.conv1d_state, block.rg_lru.recurrent_states))
        return out
    length, width = input_states.shape[1], block.conv1d_width
    y_branch = block.act_fn(block.linear_y(input_states))
    full = torch.cat((block.conv1d_state, block.linear_x(input_states).transpose(1, 2)), -1)  # [b, C, w - 1 + T]
    products = (full.unfold(-1, width, 1) * block.conv_1d.weight[:, None, 0, :]).contiguous()  # [b, C, T, w]
    x_branch = (torch.sum(products, dim=-1) + block.conv_1d.bias[:, None]).transpose(1, 2)  # [b, T, C]
    states = []
    block.rg_lru._rnn_scan = functools.partial(_scan, states)
    try:
        x_branch = block.rg_lru(x_branch, position_ids)
    finally:
        del block.rg_lru._rnn_scan
    block.conv1d_state = full[:, :, length:]
    record.extend((full[:, :, t + 1:t + width], state) for t, state in enumerate(states))
    return block.linear_out(x_branch * y_branch), None


def _scan(record: list, hidden_states, recurrent_gate, reset, recurrent_states, acc_dtype=torch.float32) -> tuple:
    """The RG-LRU's linear recurrence over [b, T, C] from `recurrent_states` (transformers' `_rnn_scan`, the same
    operations token after token), appending the state after each token (in `acc_dtype`) to `record`."""
    recurrent_gate = recurrent_gate * ~reset
    contextualized_states = torch.zeros_like(hidden_states)
    for t in range(hidden_states.shape[1]):
        recurrent_states = recurrent_gate[:, t].type(acc_dtype) * recurrent_states.to(recurrent_gate.device)
        recurrent_states = recurrent_states + hidden_states[:, t].type(acc_dtype)
        contextualized_states[:, t] = recurrent_states.type(hidden_states.dtype)
        record.append(recurrent_states)
    return contextualized_states, recurrent_states
