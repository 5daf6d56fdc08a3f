"""`CausalLM`: a decoder-only model over transformers' dynamic cache, wrapped for the loop (`sources`, `prefill`,
`verify`, `commit`, `keep`).

One cache for the batch, left padding, per-row position ids; a row that accepts fewer drafts than the widest row keeps
the slots it rejected in the cache, masked out. Chains are verified with a causal step mask and committed by cutting
the cache; trees with a tree attention mask and committed by packing each row's accepted path behind the earlier
slots. On a CPU one kernel writes a step's inputs and mask (`_kernels`), another its commit's.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from ..verify import tree as T
from ..verify.batch import to_device
from ..verify.rules import argmax
from ..runtime.jit import kernels
from . import _kernels, alibi
from .cache import join_rows, keep_slots, new_cache, rollback, select_rows
from .facts import ModelFacts
from .layers import LayerKinds, state_space
from .compressed import CompressedStates, compressed_layers
from .griffin import BlockStates, griffin_blocks
from .local import by_position
from .recurrent import Checkpoints, close_states, keeps_states
from .static import prompt_positions, prompt_sources
from .rwkv import RwkvStates, keeps_rwkv_state
from .xlstm import LayerStates, keeps_rnn_state


# No warm-up at import: each kernel compiles (or loads from numba's cache) on first use, with the types it gets.


class CausalLM:
    """A decoder-only model wrapped for the loop.

    Args:
        model: an `AutoModelForCausalLM`.
        facts: its `ModelFacts`.
        input_ids: [b, P] left-padded prompts.
        mask: [b, P] 1 on real tokens.
    """

    most = None  # most draft tokens or nodes a step verifies per row (None: as many as the budgets ask)
    argmax = staticmethod(argmax)  # scores -> their argmax on the host (greedy acceptance)
    pads = None  # pads[n]: the drafts a step verifying n pads to, where it costs less (`pad_to`); None: n

    def __init__(self, model, facts: ModelFacts, input_ids: torch.Tensor, mask: torch.Tensor):
        self.model, self.facts, self.input_ids = model, facts, input_ids
        self._slots = torch.zeros((len(mask), 2 * mask.shape[1] + 64), dtype=mask.dtype, device=mask.device)
        self._slots[:, : mask.shape[1]] = mask  # [b, capacity]: the cache slots each row sees, the first `width`
        self.width = mask.shape[1]
        self.cache = new_cache(model, len(mask))
        self.pos = mask.sum(-1).cpu().numpy()  # [b] position id of each row's next token
        self.on_host = mask.device.type == "cpu"  # kernels write the step's inputs and the mask in place; else the
        # mask is written on its device
        self.held = 0  # the step's columns the cache holds past `width` until the commit
        self.kinds = LayerKinds.of(model.config)  # windowed layers get masks of their own, by position
        # recurrent layers: their states checkpointed before each verification, settled on the accepted path after
        # (RecurrentGemma's blocks hold theirs themselves: recorded a token at a time, `griffin.BlockStates`)
        # (DeepSeek-V4's compressed layers: their windows and entries set back and refolded, `compressed.py`)
        self.states = BlockStates(model) if griffin_blocks(model) else \
            Checkpoints(model, self.cache) if keeps_states(self.cache) else \
            LayerStates(model, self.cache) if keeps_rnn_state(self.cache) else \
            RwkvStates(model, self.cache) if keeps_rwkv_state(self.cache) else \
            CompressedStates(model, self.cache) if compressed_layers(self.cache) else None
        self.band = self.kinds.by_slot  # GPT-Neo's window of slots: its layers read bands by position (`local.py`)
        self.attends = not state_space(facts.layers)  # a state-space model takes no mask after its prefill (some
        # pass it to their mixers as padding of the step, as model.generate never does)

    @property
    def mask(self) -> torch.Tensor:
        """[b, S] 1 on the cache slots each row sees."""
        return self._slots[:, : self.width]

    def _masked(self, step: np.ndarray) -> torch.Tensor:
        """The cache mask followed by `step` [b, W] (slots of the next forward), without copying the cache mask; on a
        CPU the kernels write the mask in place instead."""
        end = self._room(step.shape[1])
        self._slots[:, self.width:end] = to_device(step, self._slots.device, self._slots.dtype)
        return self._slots[:, :end]

    def _room(self, n: int) -> int:
        """Grow the slot mask to hold n more slots; returns where they end."""
        end = self.width + n
        if end > self._slots.shape[1]:
            grown = torch.zeros((len(self._slots), 2 * end), dtype=self._slots.dtype, device=self._slots.device)
            grown[:, : self.width] = self.mask
            self._slots = grown
        return end

    def _chain_inputs(self, last: np.ndarray, batch) -> tuple:
        """(tokens [b, N+1], positions [b, N+1], the mask of the cache and the step [b, S + N + 1]) of a chain step:
        on a CPU one kernel writes them all, the mask in place."""
        kern = kernels(_kernels)
        steps = np.empty((2, len(last), batch.width + 1), dtype=np.int64)
        if not self.on_host:  # the mask's columns written on the host, then copied
            cols = np.empty((len(last), batch.width + 1), dtype=np.int64)
            kern.chain_inputs(last, batch.tokens, batch.sizes, self.pos, steps, cols, 0)
            return steps[0], steps[1], self._masked(cols)
        end = self._room(batch.width + 1)  # the kernel writes the step's N + 1 columns of the mask
        written = kern.chain_inputs(last, batch.tokens, batch.sizes, self.pos, steps, self._slots.numpy(), self.width)
        assert written >= 0, "the slot mask is narrower than the step"
        return steps[0], steps[1], self._slots[:, :end]

    def _tree_inputs(self, last: np.ndarray, batch) -> tuple:
        """(tokens [b, N+1], positions [b, N+1], the additive 4D mask [b, 1, N+1, S+N+1]) of a tree step: on a CPU
        one kernel writes them all (the mask in float32, or float64, then in the model's dtype: the same values)."""
        kern = kernels(_kernels)
        if not self.on_host:  # the mask built on the device
            tokens = np.empty((len(last), batch.width + 1), dtype=np.int64)
            tokens[:, 0], tokens[:, 1:] = last, batch.tokens
            seen, depth = batch.ancestry
            return tokens, self.pos[:, None] + depth, T.tree_mask(self.mask, seen, self.facts.dtype)
        b, q, dtype = len(last), batch.width + 1, self.facts.dtype
        steps = np.empty((2, b, q), dtype=np.int64)
        mask = np.empty((b, 1, q, self.width + q), dtype=np.float64 if dtype == torch.float64 else np.float32)
        kern.tree_inputs(last, batch.tokens, batch.parents, self.pos, self._slots.numpy(), self.width,
                      torch.finfo(dtype).min, steps, mask)
        mask = torch.from_numpy(mask)
        return steps[0], steps[1], mask if mask.dtype == dtype else mask.to(dtype)

    def sources(self) -> list:
        """Per row: the prompt's real tokens."""
        return prompt_sources(self.input_ids, self.mask)

    def pad_to(self, pads) -> None:
        """Pad each chain step verifying n drafts to pads[n] of them (a `CostCurve`'s `pads`: on a CPU a forward
        over a few more tokens can cost less), with filler drafts where the rows hold fewer; the acceptance never
        reads past a row's own drafts, so filler costs nothing but its columns."""
        self.pads = np.asarray(pads, dtype=np.int64)

    def padded(self, n: int) -> int:
        """Draft columns a forward verifying at most n per row computes: the widest draft, or the width it pads to."""
        return int(self.pads[n]) if self.pads is not None and n < len(self.pads) else n

    def prefill(self, stats) -> torch.Tensor:
        """Logits [b, 1, V] after each prompt."""
        with self.states.prefill() if isinstance(self.states, BlockStates) else contextlib.nullcontext():
            logits = self._prefill()
        stats.add_forward(len(self.pos))
        return logits[:, -1:]

    def _prefill(self) -> torch.Tensor:
        """The prompts' forward: logits [b, P or 1, V]."""
        alone = keeps_rnn_state(self.cache) or keeps_rwkv_state(self.cache)  # states that read every token
        one = keeps_rwkv_state(self.cache) and self.width == 1  # RWKV's one-token forward mixes a batch's rows
        if alone and len(self.pos) > 1 and (one or not bool(self.mask.bool().all())):
            return self._prefill_alone()
        positions = prompt_positions(self.mask)
        mask = None if keeps_rwkv_state(self.cache) else self.mask  # RWKV takes none (and says so)
        with by_position(self.model, positions, positions, self.band) if self.band else contextlib.nullcontext():
            return self.model(input_ids=self.input_ids, attention_mask=mask, position_ids=positions,
                              **{self.facts.kv: self.cache}, use_cache=True, **self.facts.last_logits_only()).logits

    def _prefill_alone(self) -> torch.Tensor:
        """A left-padded batch of a model whose states read every token (xLSTM's and RWKV's take no mask:
        transformers' own padded batch runs its padding into them): each row's prompt alone, without its padding, their states
        stacked; the logits [b, 1, V] after each."""
        logits, caches = [], []
        for ids, mask in zip(self.input_ids, self.mask):
            cache = new_cache(self.model, 1)
            logits.append(self.model(input_ids=ids[mask.bool()][None], **{self.facts.kv: cache}, use_cache=True,
                                     **self.facts.last_logits_only()).logits[:, -1:])
            caches.append(cache)
        for cache in caches[1:]:
            join_rows(caches[0], cache, 0, 0)
        self.cache = caches[0]
        if self.states is not None:
            self.states.cache = self.cache
        return torch.cat(logits)

    def verify(self, last: np.ndarray, batch, stats) -> torch.Tensor:
        """One forward over [last token, draft nodes] of every row; the logits after each of them [b, N+1, V]."""
        device, width = self._slots.device, batch.width
        if batch.chain and self.padded(width) > width:
            batch = batch.widened(self.padded(width))
        elif width == 0 and len(last) > 1 and keeps_rwkv_state(self.cache):  # RWKV's one-token forward mixes the
            batch = batch.widened(1)  # rows of a batch (its decode path broadcasts [b, H] shifts over [b, 1, H])
        tokens, positions, mask = self._chain_inputs(last, batch) if batch.chain else self._tree_inputs(last, batch)
        if self.kinds.windowed:
            mask = self._layer_masks(mask, positions)
        biases = alibi.from_positions(self.model, self._key_positions(to_device(positions, self._slots.device)),
                                      self.facts.alibi) \
            if self.facts.alibi and not batch.chain else contextlib.nullcontext()  # ALiBi by node depth
        if self.band:  # GPT-Neo's windows by position (a tree's depths, a batch's holes)
            query_pos = to_device(positions, self._slots.device)
            bands = by_position(self.model, self._key_positions(query_pos), query_pos, self.band)
        else:
            bands = contextlib.nullcontext()
        with self.states.forward() if self.states is not None else contextlib.nullcontext(), biases, bands:
            logits = self.model(input_ids=to_device(tokens, device), attention_mask=mask if self.attends else None,
                                use_cache=True,
                                position_ids=to_device(positions, device), **{self.facts.kv: self.cache}).logits
        stats.add_forward(len(last))
        self.held = batch.width + 1
        return logits[:, :width + 1]

    def _layer_masks(self, mask: torch.Tensor, positions: np.ndarray):
        """The step's mask for each kind of layer (`LayerKinds.masks`) from its full-attention mask: the 2D slot mask
        of a chain (causal within the step) or a tree's additive 4D mask. Windows and chunks are cut by position:
        a row's kept slots hold consecutive positions (`commit` keeps a step's accepted columns in order), so a
        slot's is the count of kept slots before it, whatever holes rejected drafts left."""
        q, width = positions.shape[1], self.width
        if mask.dim() == 2:  # [b, S + Q] -> what each query sees: the kept slots, the step's columns up to its own
            causal = torch.ones((q, width + q), dtype=torch.bool, device=mask.device).tril(width)
            allowed = mask.bool()[:, None, :] & causal
        else:
            allowed = mask[:, 0] == 0
        query_pos = to_device(positions, self._slots.device)
        return self.kinds.masks(allowed, self._key_positions(query_pos), query_pos, self.facts.dtype)

    def _key_positions(self, query_pos: torch.Tensor) -> torch.Tensor:
        """[b, S + Q] the position of every key a step sees: a kept slot's is the count of kept slots before it (a
        row's kept slots hold consecutive positions, whatever holes rejected drafts left), then the step's own
        (`query_pos` [b, Q], on the slot mask's device)."""
        return torch.cat([self.mask.cumsum(-1) - 1, query_pos], dim=1)

    def verify_ids(self, last: np.ndarray, batch, stats) -> np.ndarray:
        """`verify`, then the argmax after the root and each draft node [b, N+1] as a host array (greedy without
        scores)."""
        return argmax(self.verify(last, batch, stats))

    def commit(self, batch, verdict) -> None:
        """Keep each row's last token and accepted drafts in the cache; mask the slots of rows that accepted fewer.

        The slot mask holds the step's N + 1 columns first: a commit writes at most that many (the root and at most
        N accepted nodes), and a tree's step, unlike a chain's, writes none of them before."""
        start = self.width
        if self.states is not None:  # chains only (`recurrent.check_recurrent`): each row keeps its root and counts
            self.states.settle(verdict.counts + 1)
        self._room(max(batch.width + 1, self.held))
        if verdict.in_place:  # chains, and trees whose first nodes were accepted in order: cut the rest
            width = self._kept(0, verdict.counts)
            rollback(self.cache, start + width, start + max(batch.width + 1, self.held))
        else:
            slots = to_device(verdict.columns(), self._slots.device)  # [b, W]
            keep_slots(self.cache, start, slots)
            width = self._kept(slots.shape[1], verdict.counts)
        self.width += width

    def _kept(self, width: int, counts: np.ndarray) -> int:
        """Mask the step's first `width` slots (0: the most any row kept) to each row's root and counts [b] accepted
        nodes; move the positions on. Returns the width. The slot mask holds them (`commit` grew it)."""
        kern = kernels(_kernels)
        if self.on_host:  # one kernel, the mask in place; it writes nothing (-1) where the mask is too narrow
            width = kern.commit_slots(self._slots.numpy(), self.width, width, counts, self.pos)
            assert width >= 0, "the slot mask is narrower than the step's commit"
            return width
        width = width or int(counts.max()) + 1
        self._masked(np.arange(width)[None, :] <= counts[:, None])
        self.pos += counts + 1
        return width

    def close(self, stats=None) -> None:
        """Take lookahead's hooks off the model (the call is over); add the time its recurrent states took to follow
        the accepted path to `stats.seconds["recurrent"]`."""
        close_states(self.states, stats)

    def keep(self, rows: list) -> None:
        """Keep only the batch rows `rows`, so that finished rows cost nothing more."""
        index = torch.tensor(rows, device=self._slots.device)
        select_rows(self.cache, index)
        if isinstance(self.states, BlockStates):  # states on the modules, not in the cache
            self.states.select(index)
        self._slots, self.pos = self._slots[rows], self.pos[rows]
