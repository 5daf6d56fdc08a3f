"""`cache_implementation="static"`: a preallocated KV cache written by position (`slot_cache.SlotCache`), and CUDA
graphs over the step.

Each row owns a run of slots: its left-padded prompt, then the tokens it committed. A verification forward writes
its [last token, draft nodes] at the row's next slots; a rejected draft is simply overwritten by the next step, so a
rollback copies nothing (for trees, the accepted path is packed behind the committed slots with one gather). The
attention mask is built on the device from three step inputs: each row's next slot, its positions and the tree's
ancestry, so every step has the same shapes. Query widths are padded up to a few sizes (1, 2, 4, ..., 64): on CUDA
each (batch, width) is captured once as a CUDA graph and replayed, so a step costs one host-to-device copy, one graph
launch and one device-to-host copy of the argmax, which the graph takes (reference: gpt-fast's static cache and its
in-graph sampling; vLLM's captured sizes).
Rows that finish stay in the batch (their outputs are ignored) so that shapes do not change, until the rows still
running fit a batch of a power of four at most half as large: then their slots move there (one gather), and later
steps compute only them (a batch of 16 code edits ends with its 2-4 slowest rows for half its steps). A compiled step
(`torch.compile`, inductor's kernels under our graphs) is padded to fewer widths (1, 4, 16, 64): each is a
compilation. Its batch dimension is compiled dynamic, so one compilation per width serves every batch of two rows or
more: compaction, and later calls of other batch sizes, cost captures, not compilations (a batch of one is a
compilation of its own, so a compiled step compacts to two rows at least). Which calls take this path, and compiled or
not, is `static_mode`'s decision.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import threading
import weakref

import numpy as np
import torch

from ..verify.rules import argmax, argmax_rows
from ..runtime.jit import kernels
from . import _kernels, alibi
from .facts import ModelFacts
from .indexer import reads_key_positions
from .local import by_position
from .layers import FULL, INDEXED, SLIDING, WINDOWED, LayerKinds, additive, check_windows_in_masks, state_space
from .recurrent import Checkpoints, close_states, state_layers
from .slot_cache import SlotCache, check_static


logger = logging.getLogger(__name__)
WIDTHS = (1, 2, 4, 8, 16, 32, 64)  # query widths a step is padded to (one CUDA graph each); 64 at most: a query's
# ancestry is the bits of one int64, so a step verifies at most 63 draft tokens or nodes per row
COMPILED_WIDTHS = (1, 4, 16, 64)  # fewer for a compiled step: each width costs a compilation (~15 s on an H100)
TESTED = ("llama", "gpt2", "qwen2", "qwen3", "mistral", "gpt_neox", "phi3", "gemma", "gemma2", "gemma3_text",
          "gpt_oss", "cohere2", "olmo3", "ministral", "starcoder2")  # model types tested on the static path
MAX_STATES = 4  # caches (with their graphs) kept per model; the least recently used goes first
_BIT = (np.uint64(1) << np.arange(64, dtype=np.uint64)).view(np.int64)  # query q sees itself
RECOMPILE_LIMIT = 64  # compiled step specialisations per process: widths x cache lengths x (one row, more)
_STATES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> [_State], most recently used last
_LOCK = threading.Lock()


class _State:
    """What outlives a call for one (model, batch, slots, dtype): the cache, the step buffers, the step function
    (compiled when asked) and the CUDA graphs captured over it."""

    def __init__(self, model, facts: ModelFacts, batch: int, slots: int, compile_config=None):
        device = facts.device
        self.key = _key(facts, batch, compile_config)
        kinds = LayerKinds.of(model.config)
        self.ring = _ring(kinds, slots)  # a sliding layer's slots (None: every layer keeps the whole call)
        rings = {i: self.ring for i, kind in enumerate(kinds.per_layer) if kind == SLIDING} if self.ring else {}
        states = state_layers(model) if facts.recurrent == "" else {}  # recurrent layers' own states
        self.cache = SlotCache(model.config, batch, slots, facts.dtype, device, rings, states)
        self.stateful = bool(states)  # recurrent layers: their states are settled after each step (`Checkpoints`)
        self.attends = not state_space(facts.layers)  # a state-space model takes no attention mask in its steps
        self.kv, self.dtype = facts.kv, facts.dtype  # the keyword the model's forward takes the cache by
        self.kinds = kinds  # windowed layers get masks of their own, by position
        self.key_positions = reads_key_positions(model)  # the model reads each slot's position from the cache
        self.alibi = facts.alibi  # ALiBi biases from each key's position (`model.alibi`): how the model builds them
        self.prompt_valid = torch.zeros((batch, slots), dtype=torch.bool, device=device)
        self.start = torch.zeros((), dtype=torch.long, device=device)  # first slot after the prompts
        self.inputs, self.outputs, self.graphs = {}, {}, {}  # outputs: width -> (logits, argmax) of its graph
        self.host = {}  # width -> (the step inputs on the host: pinned on CUDA, `inputs` itself on a CPU; numpy view)
        self.moves = None  # the host buffer of a tree commit's slot moves (pinned on CUDA), made when first needed
        self.argmax = argmax_in_step(device)  # the step also takes the argmax of its logits, on the device
        self.pool, self.eager = None, False  # eager: capturing failed once, so this state runs without graphs
        # step(model, state, inputs): the model is an argument, so that torch.compile traces into it (a weak proxy
        # breaks its graph) and the state holds no reference that would keep the model alive
        self.step, self.compiled = _step, compile_config is not None
        if self.compiled:  # fused kernels; the graphs stay ours, so never torch's own cudagraphs
            options = compile_config.to_dict() if hasattr(compile_config, "to_dict") else dict(compile_config)
            if options.get("mode") == "reduce-overhead":
                options["mode"] = "default"
            if options.get("dynamic") is None:  # one static graph per width: the best kernels, no guessing
                options["dynamic"] = False
            self.step = torch.compile(_step, **{k: v for k, v in options.items()
                                                if k in ("fullgraph", "dynamic", "backend", "mode", "options")})
            for tensor, dim in self.cache.batch_tensors() + [(self.prompt_valid, 0)]:
                _batch_dynamic(tensor, dim)

    def run(self, model, width: int) -> tuple:
        """(logits [b, width, V], their argmax [b, width] or None) of the step over the input buffer of `width`;
        compiled, each width, cache length and batch of one row or more is one more specialisation, more than
        dynamo's default limit of 8 per function allows, so the limit is raised while it runs."""
        if self.compiled:
            limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
            try:
                with torch._dynamo.config.patch(recompile_limit=limit):
                    return self.step(model, self, self.inputs[width])
            except Exception as error:  # no compiler here (e.g. no triton): the same step, uncompiled
                if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                    raise
                logger.warning("lookahead: compiling the static step failed (%s: %s); running it uncompiled (pass "
                               "disable_compile=True to skip compiling)", type(error).__name__, error)
                self.step, self.compiled = _step, False
        return _step(model, self, self.inputs[width])


def _batch_dynamic(tensor: torch.Tensor, dim: int) -> None:
    """Compile the step with `tensor`'s batch dimension `dim` symbolic: one compilation per width serves every batch
    of two rows or more (a batch of one is specialised all the same)."""
    torch._dynamo.maybe_mark_dynamic(tensor, dim)


def argmax_in_step(device) -> bool:
    """Whether a static step on `device` takes its logits' argmax itself: on CUDA, inside the step's graph (one
    fused reduction; greedy acceptance then copies [b, Q] ids to the host, and no logits are copied or reduced
    outside the graph, as gpt-fast and vLLM sample inside their graphs). Not on a CPU, where numpy's argmax of
    the logits is many times faster than torch's."""
    return torch.device(device).type == "cuda"


def _step(model, state: _State, inputs: torch.Tensor) -> tuple:
    """The forward of a step from its input buffer [b, 3Q + 1] (tokens, positions, next slots, ancestry bits):
    (logits [b, Q, V], their argmax [b, Q] when `state.argmax`, else None)."""
    width = inputs.shape[1] // 3
    tokens, positions, write = inputs[:, :width], inputs[:, width:2 * width], inputs[:, 2 * width]
    shifts = torch.arange(width, device=inputs.device)
    anc = (inputs[:, 2 * width + 1:, None] >> shifts & 1).bool()  # [b, Q, Q] query q sees step column c
    s = torch.arange(state.cache.slots, device=inputs.device)
    committed = state.prompt_valid | ((s[None, :] >= state.start) & (s[None, :] < write[:, None]))  # [b, S]
    offset = s[None, None, :] - write[:, None, None]  # [b, 1, S] step column of each slot
    in_step = (offset >= 0) & (offset < width)
    sees = anc.gather(2, offset.clamp(0, width - 1).expand(-1, width, -1))  # [b, Q, S]
    allowed = committed[:, None, :] & ~in_step | in_step & sees
    state.cache.writes = write[:, None] + torch.arange(width, device=inputs.device)[None, :]
    key_pos = None
    if state.kinds.windowed or state.alibi or state.key_positions or state.kinds.by_slot:  # a row's slots hold
        # consecutive positions (its prompt left-padded, then what it committed), the step's columns their nodes' own
        key_pos = torch.where(in_step[:, 0], positions.gather(1, offset[:, 0].clamp(0, width - 1)),
                              s[None, :] - (write - positions[:, 0])[:, None])
        state.cache.key_positions = key_pos if state.key_positions else None
    if state.kinds.windowed:
        views = {SLIDING: _ring_view(allowed, key_pos, write + width, state.ring)} if state.ring else None
        mask = state.kinds.masks(allowed, key_pos, positions, state.dtype, views)
    else:
        mask = additive(allowed, state.dtype) if state.attends else None
    bands = by_position(model, key_pos, positions, state.kinds.by_slot) if state.kinds.by_slot \
        else contextlib.nullcontext()  # GPT-Neo's windows by position, over the whole buffer of slots
    with alibi.from_positions(model, key_pos, state.alibi) if state.alibi else contextlib.nullcontext(), bands:
        logits = model(input_ids=tokens, attention_mask=mask, position_ids=positions,
                       **{state.kv: state.cache}, use_cache=True,
                       cache_position=torch.arange(width, device=inputs.device)).logits
    return logits, logits.argmax(-1) if state.argmax else None


class StaticCausalLM:
    """A decoder-only model over a `SlotCache`; the loop's protocol (sources, prefill, verify, commit, keep).

    Args:
        model: an `AutoModelForCausalLM`; its sliding-window and chunked layers get masks of their own
            (`layers.LayerKinds`).
        facts: its `ModelFacts`.
        input_ids, mask: [b, P] left-padded prompts and their mask.
        max_new: most new tokens per row.
        max_width: most draft tokens or nodes per row and step.
        graphs: capture and replay CUDA graphs (CUDA only).
        compile_config: a transformers `CompileConfig` (or a dict of `torch.compile` options): the step is compiled
            once per width before it is captured; None runs the eager step.
        keep_logits: the loop reads a step's logits after the next step runs (it records them for the output);
            else they may be a graph's output, overwritten by its next replay.
    """

    most = WIDTHS[-1] - 1  # draft tokens or nodes a step verifies per row at most

    def __init__(self, model, facts: ModelFacts, input_ids: torch.Tensor, mask: torch.Tensor, max_new: int,
                 max_width: int, graphs: bool, compile_config=None, keep_logits: bool = True):
        b, p = input_ids.shape
        sizes = WIDTHS if compile_config is None else COMPILED_WIDTHS
        max_width = min(max_width, self.most)
        self.widths = [w for w in sizes if w < max_width + 1] + [_bucket(max_width + 1, sizes)]
        self._fits = _fits(tuple(self.widths))  # the width n query tokens pad to, by n
        slots = p + max_new + self.widths[-1]
        check_static(facts, slots, model.config)
        check_windows_in_masks(model, LayerKinds.of(model.config))
        self.model, self.facts, self.input_ids, self.mask = model, facts, input_ids, mask
        self.device = facts.device
        self.cuda = facts.device.type == "cuda"  # host buffers pinned: asynchronous copies to the device
        self.graphs = graphs and self.cuda
        self.slots, self.compile_config = slots, compile_config
        self.state = _state(model, facts, b, slots, compile_config)
        # recurrent layers: their states checkpointed before each step, settled on the accepted path after it
        self.states = Checkpoints(model, self.state.cache) if self.state.stateful else None
        self.pos = mask.sum(-1).cpu().numpy()  # [b] position id of each row's next token
        self.write = np.full(b, p, dtype=np.int64)  # [b] each row's next slot
        self.active = np.arange(b)  # rows of the call still running, in the loop's order
        self._active = torch.arange(b, device=self.device)  # the same on the device
        self.keep_logits = keep_logits  # a step's logits are read after the next step (recorded for the output)
        self._ids = (None, None, None, 0)  # the latest step's (logits, argmax on the device [b, width] or None,
        # running rows (None: all), columns)

    def sources(self) -> list:
        return prompt_sources(self.input_ids, self.mask)

    def padded(self, n: int) -> int:
        """Draft columns a step verifying at most n (<= `most`) per row computes: its width (the root's column
        aside)."""
        return self._fits[n + 1] - 1

    def prefill(self, stats) -> torch.Tensor:
        """Logits [b, 1, V] after each prompt; the prompts' keys and values fill slots 0..P-1."""
        logits = prefill_state(self.model, self.facts, self.state, self.input_ids, self.mask)
        stats.add_forward(len(self.active))
        return logits

    def _every(self) -> bool:
        """Whether every batch row runs, in batch order (the loop's rows only leave: `active` stays sorted)."""
        return len(self.active) == len(self.write)

    def verify(self, last: np.ndarray, batch, stats) -> torch.Tensor:
        """One forward over [last token, draft nodes] of the running rows; logits [b, N+1, V]. A graph's output is
        overwritten by its next replay: the logits are a copy only where they outlive the step (`keep_logits`), or
        where finished rows are left out of them."""
        n, ((logits, ids), replayed) = batch.width + 1, self._launch(last, batch, stats)
        every = self._every()
        if not every:
            logits = logits[self._active, :n]  # a copy
        else:  # every row runs: a slice (one copy kernel where the logits are kept, no index kernel)
            logits = logits[:, :n].clone() if self.keep_logits and replayed else logits[:, :n]
        self._ids = (logits, ids, None if every else self.active, n)
        return logits

    def verify_ids(self, last: np.ndarray, batch, stats) -> np.ndarray:
        """`verify` for greedy acceptance without scores: the target's argmax after the root and each draft node of the
        running rows [r, N+1] as a host array. On CUDA the step's own ids, copied (the one host-device sync): no logits
        are sliced, kept or gathered for the running rows."""
        n, ((logits, ids), _) = batch.width + 1, self._launch(last, batch, stats)
        every = self._every()
        if ids is None:
            return argmax(logits[:, :n]) if every else argmax_rows(logits, self._active, n)
        ids = ids.cpu().numpy()
        return np.ascontiguousarray(ids[:, :n] if every else ids[self.active, :n])

    def _launch(self, last: np.ndarray, batch, stats) -> tuple:
        """Fill the step's inputs and run it: ((logits [b, width, V], argmax [b, width] or None), whether they are
        a replayed graph's outputs)."""
        kern = kernels(_kernels)
        width = self._fits[batch.width + 1]  # >= the step's N + 1 columns (an IndexError past the widest width)
        written = kern.static_inputs(self._host(width), self.active, np.asarray(last, dtype=np.int64), batch.tokens,
                                  batch.parents, self.pos, self.write, width, _BIT)
        assert written >= 0, "the static step's input buffer is narrower than the step"
        with self.states.forward() if self.states is not None else contextlib.nullcontext():
            out = self._run(width)
        stats.add_forward(len(self.active))
        return out, out is self.state.outputs.get(width)

    def argmax(self, scores: torch.Tensor) -> np.ndarray:
        """The argmax over the last dimension of `scores` as a host array: for the logits `verify` just returned,
        the one the step took on the device (`argmax_in_step`: its [b, width] ids copied, the one host-device sync)."""
        logits, ids, rows, n = self._ids
        if ids is None or scores is not logits:
            return argmax(scores)
        ids = ids.cpu().numpy()  # the whole [b, width]: its running rows and columns are taken on the host
        return np.ascontiguousarray(ids[:, :n] if rows is None else ids[rows, :n])

    def commit(self, batch, verdict) -> None:
        """Advance each running row past its last token and accepted drafts (trees: packed behind it first, unless
        every row accepted its first nodes in order: `Verdict.in_place`)."""
        kern = kernels(_kernels)
        rows = self.active
        if self.states is not None:  # chains only (`check_recurrent`): each running row keeps its root and counts
            kept = np.full(len(self.write), np.iinfo(np.int64).max)  # finished rows: left as they are
            kept[rows] = verdict.counts + 1
            self.states.settle(kept)
        if not verdict.in_place:
            cols = verdict.columns()  # [r, W] root then accepted nodes
            moves = self._moves(cols.shape[1])  # [2, b, W]: what the kernel writes
            kern.pack_moves(self.write, rows, cols, moves.numpy())  # one call: the numpy operations cost more
            moves = moves.to(self.device, non_blocking=True)  # a CPU's: the buffer itself
            self.state.cache.move(moves[0], moves[1])
        kern.advance(self.write, self.pos, rows, verdict.counts)  # one call: a few numpy operations cost more

    def _moves(self, width: int) -> torch.Tensor:
        """The host buffer [2, b, width] of a tree commit's slot moves, kept by the state for every width: pinned on
        CUDA, where it is copied asynchronously (each step's one host-device sync, its argmax's copy, comes before
        the next commit writes it again), so no step allocates or pins one."""
        state, b = self.state, len(self.write)
        if state.moves is None or len(state.moves) < 2 * b * width:  # a later call may be wider
            buf = torch.empty(2 * b * max(width, self.widths[-1]), dtype=torch.long)
            state.moves = buf.pin_memory() if self.cuda else buf
        return state.moves[: 2 * b * width].view(2, b, width)

    def keep(self, rows: list) -> None:
        """Keep running only the loop's rows `rows`. The others stay in the batch, ignored, until the running rows
        fit a batch of a power of four at most half as large: then they move there (`_compact`)."""
        self.active = self.active[rows]
        size = _compacted(len(self.active), self.compile_config is not None)
        if len(self.active) and size <= len(self.write) // 2:
            self._compact(size)
        else:
            self._active = torch.from_numpy(self.active).to(self.device)

    def _compact(self, size: int) -> None:
        """Move the running rows' slots (every layer's keys and values, the prompt mask, which call row each holds)
        into the state of a batch of `size` rows (`_compacted`: the next power of four at or above their number, few
        batch sizes, each a set of graphs): later steps compute only them. Spare rows repeat the last running row
        (their outputs are ignored)."""
        live = len(self.active)
        src = np.concatenate([self.active, np.full(size - live, self.active[-1])])
        old, new = self.state, _state(self.model, self.facts, size, self.slots, self.compile_config)
        index = torch.from_numpy(src).to(self.device)
        n = min(old.cache.slots, new.cache.slots)
        new.cache.take_rows(old.cache, index, n)
        new.prompt_valid.zero_()
        new.prompt_valid[:, :n] = old.prompt_valid[index, :n]
        new.start.copy_(old.start)
        new.cache.origin.copy_(old.cache.origin[index])
        self.state, self.write, self.pos = new, self.write[src], self.pos[src]
        if self.states is not None:
            self.states.cache = new.cache
        self.active = np.arange(live)
        self._active = torch.arange(live, device=self.device)

    def close(self, stats=None) -> None:
        """Take lookahead's hooks off the model (the call is over); add the time its recurrent states took to follow
        the accepted path to `stats.seconds["recurrent"]`."""
        close_states(self.states, stats)

    def _host(self, width: int) -> np.ndarray:
        """The host buffer of a step's inputs (a numpy view [b, 3 * width + 1]): tokens, positions, the next slot, and
        per query the step columns it sees as the bits of one int64. Kept by the state, so later calls reuse it; on
        a CPU it is the step's input tensor itself (nothing is copied), on CUDA a pinned buffer copied from."""
        state = self.state
        if width not in state.host:
            buf = torch.zeros((len(self.write), 3 * width + 1), dtype=torch.long)
            if self.cuda:
                buf = buf.pin_memory()
                state.inputs[width] = torch.zeros_like(buf, device=self.device)
            else:
                state.inputs[width] = buf
            if state.compiled:
                _batch_dynamic(state.inputs[width], 0)
            state.host[width] = buf, buf.numpy()
        return state.host[width][1]

    def _run(self, width: int) -> tuple:
        """Copy the step inputs to the device (CUDA) and run the step of `width` (a CUDA graph once captured): its
        (logits, argmax) (`_State.run`), the graph's own outputs when replayed."""
        state = self.state
        if self.cuda:
            state.inputs[width].copy_(state.host[width][0], non_blocking=True)
        if not self.graphs or state.eager:
            return state.run(self.model, width)
        if width not in state.graphs:
            try:
                self._capture(width)
            except Exception as error:  # a kernel that cannot be captured: the same step, replayed by nobody
                logger.warning("lookahead: capturing the static step as a CUDA graph failed (%s: %s); running it "
                               "without graphs (pass disable_compile=True to skip capturing)", type(error).__name__,
                               error)
                state.eager = True
                return state.run(self.model, width)
        state.graphs[width].replay()
        return state.outputs[width]

    def _capture(self, width: int) -> None:
        """Warm the step of `width` up on a side stream, then capture it as a CUDA graph (gpt-fast, vLLM)."""
        state = self.state
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            state.run(self.model, width)  # writes only slots no row has committed yet
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=state.pool):
            state.outputs[width] = state.run(self.model, width)
        state.pool = graph.pool()
        state.graphs[width] = graph


def prefill_state(model, facts: ModelFacts, state: _State, input_ids: torch.Tensor,
                  mask: torch.Tensor) -> torch.Tensor:
    """Run the prompts input_ids [b, P] (left-padded, `mask`) into `state`'s slots 0..P-1 (every row of the state's
    batch of b); the logits [b, 1, V] after each prompt."""
    p, dev = input_ids.shape[1], facts.device
    valid = mask.bool()
    state.prompt_valid.zero_()
    state.prompt_valid[:, :p] = valid
    state.start.fill_(p)
    state.cache.origin.copy_(torch.arange(len(valid), device=dev))
    s = torch.arange(state.cache.slots, device=dev)
    q = torch.arange(p, device=dev)[:, None]
    allowed = (s[None, None, :] <= q) & torch.cat([valid, state.prompt_valid[:, p:]], 1)[:, None, :]
    allowed |= s[None, None, :] == q  # a padding query sees itself, so that no row is all -inf
    state.cache.writes = q.T.expand(len(valid), -1)
    positions = prompt_positions(mask)
    # slot s of a row holds position s - pad; a padding slot the position its query has (1), so that it sees
    # itself through any window
    pad = p - mask.sum(-1, keepdim=True)
    key_pos = torch.where(s[None, :] >= pad, s[None, :] - pad, 1)
    state.cache.key_positions = key_pos if state.key_positions else None
    if state.kinds.windowed:
        views = {SLIDING: (allowed[:, :, :p], key_pos[:, :p])} if state.ring else None  # the prompt's own keys
        attention = state.kinds.masks(allowed, key_pos, positions, facts.dtype, views)
    else:
        attention = additive(allowed, facts.dtype)
    if state.stateful:  # recurrent layers start from empty states, their padding zeroed as model.generate does
        state.cache.fresh_states()
        if not state.attends:
            attention = mask
        elif not bool(mask.bool().all()):  # a padded batch: the recurrent kinds get the 2D padding mask
            # beside windowed layers' own masks; else the 2D mask, from which the model builds every layer's own
            padding = {kind: mask for kind in state.kinds.per_layer if kind not in (FULL, *WINDOWED)}
            attention = {**attention, **padding} if isinstance(attention, dict) else mask
    state.cache.prefilling = True
    try:
        bands = by_position(model, key_pos, positions, state.kinds.by_slot) if state.kinds.by_slot \
            else contextlib.nullcontext()
        with alibi.from_positions(model, key_pos, state.alibi) if state.alibi else contextlib.nullcontext(), bands:
            logits = model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                           **{state.kv: state.cache}, use_cache=True, cache_position=torch.arange(p, device=dev),
                           **facts.last_logits_only()).logits
    finally:
        state.cache.prefilling = False
    return logits[:, -1:]


def prompt_sources(input_ids: torch.Tensor, mask: torch.Tensor) -> list:
    """Per row: the prompt's real tokens, its left padding dropped."""
    return [ids[m.bool()] for ids, m in zip(input_ids, mask)]


def prompt_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids [b, P] of left-padded prompts: 0 at each row's first real token (padding gets 1, unseen)."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)


def _compacted(live: int, compiled: bool) -> int:
    """The batch `live` running rows are compacted into: the smallest power of four that holds them; two rows at
    least when the step is compiled (its batch dimension is dynamic from two rows on: one would cost compilations)."""
    size = 1
    while size < live:
        size *= 4
    return max(size, 2) if compiled else size


@functools.cache
def _fits(widths: tuple) -> list:
    """The width of `widths` that n query tokens are padded to, for n = 0 .. widths[-1] (few distinct tuples)."""
    return [next(w for w in widths if w >= n) for n in range(widths[-1] + 1)]


def _bucket(n: int, sizes=WIDTHS) -> int:
    """The smallest width of `sizes` (or power of two beyond) that holds n query tokens."""
    return next((w for w in sizes if w >= n), 1 << (n - 1).bit_length())


def _state(model, facts: ModelFacts, batch: int, slots: int, compile_config) -> _State:
    """A kept state of `model` for this batch size, dtype and compilation with at least `slots` slots, or a new one
    (`_round_slots`, so that calls of other lengths reuse it and its graphs). Where the device has no room for a new
    one, every other kept state of the model is dropped and the allocation tried once more."""
    with _LOCK:  # threads may share a model (each has its own states, all in one list)
        return _kept_state(model, facts, batch, slots, compile_config)


def _kept_state(model, facts: ModelFacts, batch: int, slots: int, compile_config) -> _State:
    key, states = _key(facts, batch, compile_config), _STATES.setdefault(model, [])
    fits = [s for s in states if s.key == key and s.cache.slots >= slots]
    state = min(fits, key=lambda s: s.cache.slots) if fits else None
    if state is None:
        states[:] = [s for s in states if s.key != key]  # a longer one replaces the shorter ones
        del states[: max(len(states) - MAX_STATES + 1, 0)]
        try:
            state = _new_state(model, facts, batch, slots, compile_config)
        except torch.OutOfMemoryError:
            states.clear()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            state = _new_state(model, facts, batch, slots, compile_config)
    else:
        states.remove(state)
    states.append(state)
    return state


def _new_state(model, facts: ModelFacts, batch: int, slots: int, compile_config) -> _State:
    """A new state, its tensors made in inference mode wherever it is made (a call's first state is made before the
    loop enters inference mode, a compacted one inside it): a compiled step guards on that, and would recompile."""
    with torch.inference_mode():
        return _State(model, facts, batch, _round_slots(slots), compile_config)


def _key(facts: ModelFacts, batch: int, compile_config) -> tuple:
    """What a kept state serves: a batch size, a dtype, a compilation and a thread (threads that generate with one
    model at once each get their own caches)."""
    return batch, facts.dtype, None if compile_config is None else repr(compile_config), threading.get_ident()


def _round_slots(slots: int) -> int:
    """Slots rounded up to one of eight steps per power of two (at least 256): at most 1/8 more than asked for,
    and few distinct sizes, so that a kept cache serves calls of nearby lengths.

    >>> [_round_slots(n) for n in (100, 656, 1100, 8256)]
    [256, 768, 1280, 10240]
    """
    step = max(256, (1 << (slots - 1).bit_length()) // 8)
    return -(-slots // step) * step


def clear(model) -> None:
    """Free the static caches (and their CUDA graphs) kept for `model`; later calls allocate them again. They are
    also freed with the model. At most `MAX_STATES` are kept per model."""
    _STATES.pop(model, None)


def compiles_on_cpu(config) -> bool:
    """Whether a call's config asks for a compiled static step, which a CPU runs only when given a compile_config
    (`static_mode`): such a step traces the model's layers once, so they must stay as they were traced."""
    return (getattr(config, "cache_implementation", None) == "static" and not getattr(config, "disable_compile", False)
            and getattr(config, "compile_config", None) is not None)


def static_mode(facts: ModelFacts, config) -> tuple | None:
    """How a decoder-only call runs (its model's `ModelFacts`, the call's generation config): None for the dynamic
    cache, else (graphs, compile_config) of the static one.

    - cache_implementation="static": the static cache; on CUDA its step is compiled (`config.compile_config`, else
      transformers' `CompileConfig()`, as transformers compiles a static cache) and captured as CUDA graphs; on a
      CPU it runs eagerly unless a compile_config is given. disable_compile=True: neither graphs nor compilation.
    - cache_implementation unset, on CUDA: the static cache with CUDA graphs, uncompiled (capture takes about a
      second per width, a compilation ~15 s), for the architectures the static path is tested on (`TESTED`, with
      sliding-window layers or not) when they sit on one device; others keep the dynamic cache.
    - anything else ("dynamic", ...): the dynamic cache.

    A model whose indexer picks each query's keys (`indexer.pick_alone`: rows of every width, read on the host) is
    never captured: its steps run without graphs.
    """
    implementation = getattr(config, "cache_implementation", None)
    cuda = facts.device.type == "cuda"
    off = bool(getattr(config, "disable_compile", False))
    spread = len(facts.devices) > 1
    if implementation == "static" and spread:
        raise ValueError(f"cache_implementation='static' keeps the cache on one device; this model is spread over "
                         f"{sorted(facts.devices)} by device_map: leave cache_implementation unset")
    if implementation == "static":
        compile_config = getattr(config, "compile_config", None)
        if compile_config is None and cuda:
            from transformers import CompileConfig

            compile_config = CompileConfig()
        return (False, None) if off else (all(layer.kind != INDEXED for layer in facts.layers), compile_config)
    if implementation is None and cuda and not off and not spread and facts.model_type in TESTED:
        return True, None
    return None


def _ring(kinds: LayerKinds, slots: int) -> int | None:
    """The slots a sliding layer keeps: its window and the widest step (a query sees the window's last positions
    before the step and the step's columns), rounded up to 64; None where that is no fewer than the call's."""
    window = kinds.sizes.get(SLIDING)
    if window is None:
        return None
    ring = -(-(window - 1 + WIDTHS[-1]) // 64) * 64
    return ring if ring < slots else None


def _ring_view(allowed: torch.Tensor, key_pos: torch.Tensor, end: torch.Tensor, ring: int) -> tuple:
    """(allowed [b, Q, R], key positions [b, R]) over a ring of R slots from what they are over every slot: ring
    index j holds each row's newest slot j mod R before `end` [b] (the step's end), -1 where none was written."""
    j = torch.arange(ring, device=end.device)
    base = end[:, None] - ring
    slot = base + torch.remainder(j[None, :] - base, ring)  # [b, R] the slot each ring index holds
    held = slot >= 0
    index = slot.clamp(min=0)
    seen = allowed.gather(2, index[:, None, :].expand(-1, allowed.shape[1], -1)) & held[:, None, :]
    return seen, key_pos.gather(1, index)


