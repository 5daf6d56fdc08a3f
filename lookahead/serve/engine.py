"""`Engine`: one thread owns the model and steps every running row together (continuous batching); `lookahead serve`
runs it on the process's first thread (`Engine.run`).

Each turn of the loop: take the rows that arrived (those with prompts as long prefilled together where the model's
layers allow, else each alone; then joined to the batch: `ServingLM.join`), drop cancelled rows, then one step for all
rows of a batch:

    draft (each row's index and policy; in a batch, greedy rows draft at most the step's width, the one with the
    most tokens expected per unit of cost for the whole batch: `policy.batch_width`, and fill up to it: those columns
    are computed anyway) -> verify (one forward over every row's [last token, draft]) -> accept (per row: greedy,
    or speculative sampling with the row's temperature, top-p and generator) -> commit (the cache keeps each row's
    accepted path) -> advance (append, stream, stop) -> drop finished rows.

A batch whose rows are all greedy chains from n-gram or suffix indexes, or all greedy trees from suffix indexes or
merged suffix+recycle ones, with or without a prediction, with one set of eos ids, takes `generate`'s fused step
instead (`fused.for_rows`: after the forward, one kernel call accepts, teaches each row's policy (and calibration),
stops, extends the indexes and drafts the next step, chains cut to the same batch width, trees sized for the batch's
step; a prediction's next tokens are written over its chain row's draft, `_predicted`); its rows then advance as any
row does.

Rows of a recycling lookup (``"recycle"``, ``"suffix+recycle"``) draft from M, the target's own top-k predictions
after each token (`recycled`: the memory's, or the engine's, shared by every such row and kept across requests), and
learn the top-k after every column of each forward, before their indexes take the step's tokens, as `generate`'s rows
do (`lookahead.index.recycle`).

Greedy rows gain exactly the tokens `model.generate(do_sample=False)` gives their prompt alone: each row's attention
sees its own slots only and its positions are its own. The acceptance rules are `lookahead.verify`'s.

The rows run in one batch over one cache, except on a model whose rows cannot share one (`facts.rows_apart`:
DeepSeek-V4's compressed attention, MPT's ALiBi from slots, Inkling's windowed recurrent layers): there each row is a
batch of its own (with a fused step of its own), stepped one after another in the same turn, as `generate` runs such a
batch's rows.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import queue
import threading
import time
import types

import numpy as np
import torch

from ..runtime.jit import SERVED, setting, tier
from ..decode.calibrate import budget, draft_cost, free_widths
from ..decode.engine import Batch
from ..decode.fused import for_rows
from ..decode.policy import CostCurve, StepTimes, batch_width
from ..decode.recycling import Recycling, table_for, top_k
from ..decode.settings import DRAFT_NODES, DRAFT_TOKENS, GenerationStats, make_settings
from ..index.build import RECYCLING
from ..index.recycle import Recycled
from ..model.attention import packed_attention
from ..model.facts import ModelFacts, rows_apart
from ..model.indexer import decoding_order
from ..model.layers import CHUNKED, COMPRESSED, FULL, INDEXED, NONE, RECURRENT, SLIDING
from ..model.linear import packed_linears
from ..model.recurrent import state_layers, stepping
from ..model.static import static_mode
from ..verify.batch import DraftBatch, Verdict
from ..verify.rules import argmax_rows, by_row
from .batch import ServingLM, StaticServingLM
from .row import PREDICTION_TOKENS

logger = logging.getLogger("lookahead.serve")


def check_servable(model) -> ModelFacts:
    """The model's facts, or ValueError when the engine cannot serve it: its layers must attend to full or windowed
    spans of a KV cache (sliding windows and chunks get masks by position, as in `generate`; GPT-Neo's bands of slots
    by position too, `model.local`; ALiBi biases from each row's mask, or from slots with each row alone), compressed
    spans (DeepSeek-V4, each row alone: `facts.rows_apart`), or keep recurrent states lookahead follows (each joined
    row its own, `recurrent.Checkpoints`).

    Raises:
        ValueError: an encoder-decoder, or layers of another kind (recurrent ones not followed, ...), named.
    """
    facts = ModelFacts.of(model)
    if facts.encoder_decoder:
        raise ValueError(f"lookahead serve runs decoder-only models; {facts.name} is an encoder-decoder")
    followed = (FULL, SLIDING, CHUNKED, INDEXED, COMPRESSED, NONE) + ((RECURRENT,) if facts.recurrent == "" else ())
    other = sorted({layer.name for layer in facts.layers if layer.kind not in followed})
    if other:
        raise ValueError(f"lookahead serve batches full-attention, sliding-window, chunked and compressed layers and "
                         f"the recurrent layers lookahead follows; {facts.name} has {', '.join(other)} layers")
    return facts


class Engine:
    """The decoding loop of a server, in a thread of its own (`start`) or the caller's (`run`).

    Args:
        model: a decoder-only Hugging Face causal LM with full attention (`check_servable`).
        memory: a `lookahead.Memory` every row drafts from and adds its prompt and output to, or None.
        metrics: a `lookahead.serve.metrics.Metrics`, or None.
        draft_cost: greedy rows' verification cost model (`lookahead.generate`'s `draft_cost`; default: measured
            on this machine on a CPU, and a batch's steps timed as they run: `policy.StepTimes`).
        cache_implementation: "static": every row in a preallocated slot cache (`batch.StaticServingLM`), its step
            compiled and captured as CUDA graphs on CUDA, eager on a CPU, as `generate`'s
            `cache_implementation="static"`; "dynamic": transformers' dynamic cache; None (default): as `generate`
            chooses, the static cache with CUDA graphs on CUDA for the architectures its static path is tested on,
            else the dynamic cache.
        max_model_len: with the static cache, the most tokens of a request, prompt and answer (default: the
            model's position limit, at most 4096); the slots every row holds.

    Raises:
        ValueError: the model cannot be served (`check_servable`), or not from the static cache it was asked to be;
            LOOKAHEAD_COMPILE is neither "background" nor "now" (`runtime.jit.setting`).
    """

    def __init__(self, model, memory=None, metrics=None, draft_cost=None, cache_implementation=None,
                 max_model_len=None):
        setting()  # a LOOKAHEAD_COMPILE it cannot follow is refused here, not at the first step
        self.model, self.facts, self.memory, self.metrics = model, check_servable(model), memory, metrics
        self.apart = rows_apart(self.facts, model)  # why each row is a batch of its own, or None: one batch
        self.static = _static(model, self.facts, cache_implementation, self.apart)  # (graphs, compile_config) or None
        self.limit = self.facts.positions  # the most tokens of a request, prompt and answer (None: no limit)
        if self.static is not None:
            self.limit = min(self.facts.positions or MAX_MODEL_LEN, MAX_MODEL_LEN) if max_model_len is None \
                else min(max_model_len, self.facts.positions or max_model_len)
        self._prefill_state = None  # the static cache's one-row state requests are prefilled in, kept across batches
        graphs, compiled = self.static or (False, None)
        self.cache_name = "dynamic cache" if self.static is None else f"static cache of {self.limit} tokens a row" \
            + (", CUDA graphs" if graphs and self.facts.device.type == "cuda" else "") \
            + (", compiled" if compiled is not None else "")
        self.chain_cost = _cost(model, self.facts, draft_cost, False)
        self._given = draft_cost
        self._tree = None  # a greedy tree's (cost, tokens, nodes, pads), made at the first one (`sizing`)
        self.sampling_cost = _cost(model, self.facts, None, True)
        self.num_draft_tokens = max(DRAFT_TOKENS, budget(self.chain_cost, DRAFT_TOKENS))
        self.pads = None  # at batch 1 on a measured curve, the drafts a chain step pads to (`CausalLM.pad_to`)
        self._cut: set = set()  # the batch sizes whose drafting was cut at least once (`_told`)
        self.times = StepTimes(self.chain_cost, timed=draft_cost is None, told=self._told)  # what a batch's step
        # costs at each width, as timed (a cost the caller gave is taken as it is)
        if isinstance(self.chain_cost, CostCurve):
            self.pads = self.chain_cost.pads_within(self.num_draft_tokens)
        self.pending: queue.Queue = queue.Queue()
        self.batches: list = []  # the running `Batch`es: one, or (`apart`) one a row
        self.stats = GenerationStats()  # forwards, for the metrics
        self.freed = 0  # cancelled rows dropped from the batch (or never prefilled)
        self.peak = 0  # most rows a step has verified together
        self._fused: dict = {}  # id(batch) -> the fused step of that batch of greedy rows (`_Fused`)
        self._recycled = self._recycling = None  # M of the recycling rows and its `Recycling` (`recycled`), made at
        # the first one
        self._stop = threading.Event()
        context = contextvars.copy_context()  # the loop runs in its creator's context (the kernels' tier: `_jit`)
        self._thread = threading.Thread(target=context.run, args=(self._run,), name="lookahead-engine", daemon=True)
        self.error: BaseException | None = None

    @property
    def rows(self) -> list:
        """The running rows, batch after batch."""
        return [row for batch in self.batches for row in batch.rows]

    @property
    def target(self):
        """The running batch's cache (`ServingLM`, `StaticServingLM`), or None; with rows apart, the first one's."""
        return self.batches[0].target if self.batches else None

    def start(self) -> "Engine":
        """Run the loop in a thread of its own (tests, Ray replicas, `server.Running`)."""
        self._thread.start()
        return self

    def run(self) -> None:
        """Run the loop in the calling thread until `stop` (from another thread) or an interrupt. `lookahead serve`
        runs it on the process's first thread, the one that loaded and measured the model: OpenMP's workers spin
        between a thread's parallel regions only while the process's teams of workers fit its cores, so a second
        thread's torch work beside the first's idle team made every forward wait for its workers to wake (SmolLM2
        on 2 cores: 79 ms a forward against 54)."""
        self._run()

    def stop(self) -> None:
        """End the loop (rows still running are closed as cancelled) and wait for its thread."""
        self._stop.set()
        self.pending.put(None)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def submit(self, row) -> None:
        """Queue a `Row`; it joins the batch at the next step after its prefill."""
        if self.error is not None:
            raise RuntimeError(f"the decoding loop failed: {self.error}")
        self.pending.put(row)
        self._gauge()

    def cancel(self, row) -> None:
        """Mark a row cancelled: the loop drops it from the batch before its next step."""
        row.cancelled = True

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue.set(self.pending.qsize())
            self.metrics.running.set(len(self.rows))

    def _run(self) -> None:
        try:
            with torch.inference_mode(), _fast(self.model):
                while not self._stop.is_set():
                    self._turn()
        except KeyboardInterrupt:  # the loop ran in the foreground (`run`): the server is stopping
            raise
        except BaseException as error:  # noqa: BLE001: every waiting client must hear of it
            logger.exception("lookahead serve: the decoding loop failed")
            self.error = error
        finally:
            for row in self.rows + _drain(self.pending):
                row.close("cancelled")
            self._release()

    def _turn(self, wait: bool = True) -> None:
        """One turn of the loop. A step that fails ends the rows of its batch with an error (their clients hear
        of it) and the loop goes on with the other batches' rows and the rows that arrive next. `wait`: with no row
        running, wait for one to arrive (the server's loop); False: return (a caller that turns the loop itself)."""
        with tier(SERVED):  # numba's kernels, or their Python twins while numba compiles them (`lookahead.runtime.jit`)
            self._admit(wait)
            for batch in list(self.batches):
                try:
                    self._drop(batch, [row.cancelled or row.done for row in batch.rows])
                    if batch.rows:
                        self._step(batch)
                except Exception:  # noqa: BLE001: one batch's failure must not stop the server
                    logger.exception("lookahead serve: a step failed; its rows end with an error")
                    for row in batch.rows:
                        row.close("error")
                    if batch in self.batches:
                        self._release(batch)
        self._gauge()

    def _admit(self, wait: bool = True) -> None:
        """Prefill the rows that arrived (with `wait`, waiting for one when none runs) and join them to the batch:
        rows that arrived together with prompts as long in one forward where the model's layers allow (`_groups`),
        else each alone."""
        while not self._stop.is_set():  # (a stop's None may be drained below)
            # the common turn: nothing arrived (no exception to raise)
            if (self.rows or not wait) and self.pending.empty():
                return
            try:
                row = self.pending.get(block=wait and not self.rows)
            except queue.Empty:
                return
            if row is None:
                return
            ready = []
            for row in [row] + _drain(self.pending):
                if row.cancelled:
                    self.freed += 1
                    self._finished(row, "cancelled")
                    continue
                try:
                    self._start(row)
                    ready.append(row)
                except Exception:  # noqa: BLE001: this row's failure is its own
                    logger.exception("lookahead serve: a prefill failed; its row ends with an error")
                    row.close("error")
            for group in self._groups(ready):
                try:
                    self._prefill(group)
                except Exception:  # noqa: BLE001: these rows' failure is their own
                    logger.exception("lookahead serve: a prefill failed; its rows end with an error")
                    for row in group:
                        row.close("error")

    def _start(self, row) -> None:
        """Check that the row fits, build its index and policy (`Row.start`; on the static cache its budgets cut to
        what a step verifies for a row, so that it may take the fused step)."""
        if self.limit is not None and len(row.prompt) + row.max_new > self.limit:
            raise ValueError(f"a request of {len(row.prompt)} prompt tokens and {row.max_new} new tokens exceeds the "
                             f"{self.limit} tokens a row holds")
        row.start(self.memory, *self.sizing(row), self.facts.device,
                  self.recycled() if row.drafting.lookup in RECYCLING else None,
                  StaticServingLM.most if self.static is not None else None)

    def _groups(self, rows: list) -> list:
        """The rows in the groups prefilled together, where the model takes them together (`_together`; else one row
        each): rows whose prompts are as long, at most `PREFILL_TOKENS` tokens a group. Padding costs more than its
        tokens: a padded batch's attention takes the masked path (on this CPU SmolLM2 prompts of 817 and 938 tokens
        took 2.38-2.47 s together against 1.90-1.91 s alone; 4 of 98 to 938 tokens 4.6-5.0 s against 2.4 s), where
        prompts as long take 4.2-4.3 s either way at 938 tokens, and 0.40 s against 0.52-0.55 s at 98."""
        if not self._together:
            return [[row] for row in rows]
        groups = {}
        for row in rows:
            same = groups.setdefault(len(row.prompt), [[]])
            if len(row.prompt) * (len(same[-1]) + 1) > PREFILL_TOKENS:
                same.append([])
            same[-1].append(row)
        return [group for same in groups.values() for group in same if group]

    @property
    def _together(self) -> bool:
        """Whether rows that arrive together are prefilled in one forward: a dynamic cache shared by the rows, and
        attention layers alone (full, windowed, chunked; no recurrent states, indexer, compressed spans or ALiBi)."""
        return (self.static is None and self.apart is None and self.facts.alibi is None
                and all(layer.kind in (FULL, SLIDING, CHUNKED, NONE) for layer in self.facts.layers))

    def _prefill(self, rows: list) -> None:
        """Prefill `rows` (started; several in one forward, left-padded as `generate` prefills a batch, though
        `_groups` gives prompts as long; the static cache's one row, into its one-row state), take each row's first
        token (learned first by a recycling row's M), and join the rows that go on to the batch."""
        if self.static is not None:  # into the one-row state, joined below
            row, = rows
            if not self.batches:
                self.batches.append(Batch(StaticServingLM(self.model, self.facts, self.limit, *self.static,
                                                          prefill=self._prefill_state)))
                self._prefill_state = self.target.pre
            one = self.target
            prompt = torch.from_numpy(row.prompt)[None].to(self.facts.device)
            logits = one.prefill_row(prompt, self.stats)[:, -1:]  # [1, 1, V]
        else:
            width = max(len(row.prompt) for row in rows)
            ids, mask = np.zeros((2, len(rows), width), dtype=np.int64)
            for i, row in enumerate(rows):  # left-padded
                ids[i, width - len(row.prompt):], mask[i, width - len(row.prompt):] = row.prompt, 1
            one = ServingLM(self.model, self.facts, torch.from_numpy(ids).to(self.facts.device),
                            torch.from_numpy(mask).to(self.facts.device))
            logits = one.prefill(self.stats)  # [k, 1, V]
        if self.metrics is not None:
            self.metrics.forwards.inc()
            self.metrics.prompt_tokens.inc(sum(len(row.prompt) for row in rows))
        going = []  # (batch row of `one`, row, first token) of the rows that go on
        for i, row in enumerate(rows):
            row.stats.add_forward(1)
            token = int(argmax_rows(logits[i:i + 1], torch.zeros(1, dtype=torch.long), 1)[0, 0]) \
                if row.sampling.greedy else \
                int(torch.multinomial(torch.softmax(row.sampling.warp(logits[i]), -1), 1, generator=row.generator))
            if row.recycles:  # the prefill's predictions after the prompt, learned before the index takes its token
                top, probs = (np.ascontiguousarray(t.numpy()) for t in top_k(logits[i], self._recycled.k))
                row.index.observe(_NONE, _NONE, 0, top, probs)
            if row.advance([token]):
                self._finished(row, row.finish)
            else:
                going.append((i, row, token))
        if not going:
            if one is not self.target:
                one.close()  # its hooks (recurrent states) leave the model with it
            return
        if self.static is not None:
            batch = self.batches[0]
            batch.target.join()
        else:
            if len(going) < len(rows):
                one.keep([i for i, _, _ in going])
            if self.apart is not None or not self.batches:
                batch = Batch(one)
                self.batches.append(batch)
            else:
                batch = self.batches[0]
                batch.target.join(one)
        for _, row, token in going:
            batch.admit(row, token)

    def _step(self, batch: Batch) -> None:
        # `StepTimes` prices the whole step, from the drafts to each row's advance: the host's work grows with the
        # drafts too (at 16 SmolLM2 rows here 22 ms a step with drafts, 12 without, beside 94-131 ms of forward and
        # acceptance), and a width that pays in the forward alone may not pay in the step; a step right after rows
        # joined or left is not timed (the cache's buffers are copied then)
        start, timed = time.perf_counter(), batch.settled
        rows, target = batch.rows, batch.target
        b = len(rows)
        self.peak = max(self.peak, b)
        # where a wider forward costs less (measured at batch 1; a greedy tree's by its own curve)
        tree = rows[0].tree is not None and rows[0].sampling.greedy and self._tree is not None
        target.pads = (self._tree[3] if tree else self.pads) if b == 1 else None
        most = getattr(target, "most", None)  # the static step's widest: no row verifies more
        fused = self._fused_for(batch, most)
        if fused is not None:
            return self._step_fused(fused, start, timed)
        # a batch of chains whose steps with drafts lost at this size (`StepTimes.drafts`) verifies only its sampling
        # rows' drafts: its greedy rows ask nothing of their policies (at 64 SmolLM2 rows 1-2 ms a step)
        drafting = b == 1 or not all(row.chain for row in rows) or self.times.drafts(b)
        budgets = [0 if row.sampling.greedy and not drafting else
                   row.budget(b) if most is None else min(row.budget(b), most) for row in rows]
        fill = target.padded(max(budgets))  # the columns the step computes anyway
        width = self._width(rows, budgets, fill, drafting) if b > 1 else None
        if width is not None:
            fill = width
        # what a greedy tree keeps (by its own curve), as `generate` sizes its trees
        padded = free_widths(target, self._tree[0] if self._tree else self.chain_cost)
        drafts = [row.draft(n, fill, width if row.sampling.greedy else None, padded) for row, n in zip(rows, budgets)]
        if most is not None:
            drafts = [d.head(most) if len(d) > most else d for d in drafts]
        if width is not None:  # what a row did not verify, it still learns from: the tokens that come
            for row, draft in zip(rows, drafts):
                if not len(draft):
                    row.watch()
        drafted = DraftBatch.pack(drafts, all(row.chain for row in rows))
        # the forward, the acceptance, the commit
        top = [] if any(row.recycles for row in rows) else None  # the step's top-k after every column, if wanted
        _, verdict = batch.step(drafted, lambda d, logits: self._accept(rows, d, logits, top), self.stats)
        if top:  # recycling rows learn the step's predictions before their indexes take its tokens
            self._recycling.learn(top[0], [row.index if row.recycles else None for row in rows], drafted)
        gained = verdict.gained(drafted)
        if self.metrics is not None:
            self.metrics.forwards.inc()
        paths = _paths(verdict)
        done = []
        for i, (row, draft) in enumerate(zip(rows, drafts)):
            row.learn(draft, paths[i])
            done.append(row.advance(gained[i]))
        if timed:
            self.times.record(b, drafted.width, time.perf_counter() - start, b + int(verdict.counts.sum()))
        self._drop(batch, done)

    def _fused_for(self, batch: Batch, most):
        """The fused step of a batch whose rows are all greedy chains from n-gram or suffix indexes, or all greedy
        trees from suffix or merged indexes, with or without a prediction (a chain's: `_predicted`; a tree drafts
        it from its index), and one set of eos ids (`_Fused`), kept across steps while the same rows run (made anew
        after any row joined or left: the batch's arrays are new then; each batch its own: rows that run apart step
        alone); None for any other batch (its rows draft as the engine's rows do)."""
        rows = batch.rows
        kept = self._fused.get(id(batch))
        if kept is not None and kept.batch is batch and batch.settled and kept.rows == rows:
            return kept
        self._fused.pop(id(batch), None)
        first = rows[0]
        predicting = [k for k, row in enumerate(rows) if row.prediction is not None and len(row.prediction)]
        if any(not row.sampling.greedy or (row.tree is None) != (first.tree is None) or row.index is None
                or row.eos != first.eos
                or (most is not None and most < (row.length.max_tokens if row.tree is None else row.tree.max_nodes))
                for row in rows):
            return None
        # each row's own most new tokens, in one `out` as wide as the longest: a row's tokens so far count from
        # where its room ends at that width (the kernels stop a row at lens == max_new)
        top = max(row.max_new for row in rows)
        trees = None if first.tree is None else [row.tree for row in rows]
        # the kernel cuts a batch of chains to the width that pays (`_widths`); with predictions, `_predicted` does
        widths = np.empty(first.length.max_tokens + 1) if len(rows) > 1 and trees is None and not predicting \
            else None
        reach = min(max(first.length.max_tokens, PREDICTION_TOKENS), most or PREDICTION_TOKENS) \
            if predicting and trees is None else 0
        step = for_rows(batch.target, [row.index for row in rows], [row.length for row in rows], first.eos, top,
                        self.stats, widths, trees, reach)
        if step is None:
            return None
        fused = self._fused[id(batch)] = _Fused(batch, step, widths)
        fused.predicting = predicting
        self._widths(fused)
        fused.state = step.start(fused, [top - row.max_new + len(row.out) for row in rows])  # its first draft
        if predicting and trees is None:  # a tree row drafts its prediction from its index (a document there)
            self._predicted(fused)
        return fused

    def _predicted(self, fused: "_Fused") -> None:
        """Rows with a prediction on the fused step: while a row's answer follows its prediction, its next step
        verifies the prediction's next tokens (`Row.predicted_draft`: as many as it holds, up to the row's room and
        `PREDICTION_TOKENS` or what its policy asks, whatever the cost curve says of short guesses), written over the
        draft the kernel made from its index, as the engine's own path drafts them (`Row.draft`). Several rows' drafts
        are then cut to the width that pays for the whole batch as on that path (`_width`: `batch_width` over each
        row's chance, a prediction's own record where it drafts one, and what it drafted; no width but 0 where
        drafting lost at this batch size, `StepTimes.drafts`)."""
        rows, s = fused.rows, fused.state
        d = s["now"]  # the next step's drafts: `s["batch"]` is their view
        sizes, widest = d.sizes, int(d.sizes.max(initial=0))
        chances = None if len(rows) == 1 else np.array([row.length.chance(m) for row, m in zip(rows, d.matches)])
        for k in fused.predicting:
            row = rows[k]
            tokens = None if row.done else row.predicted_draft(d.tokens.shape[1])
            if tokens is not None:
                n = len(tokens)
                d.tokens[k, :n] = tokens
                sizes[k], d.matches[k] = n, max(row.index.match_length, 1)
                if chances is not None:
                    chances[k] = row.prediction_chance
        width = int(sizes.max(initial=0))
        if chances is not None:
            b = len(rows)
            costs = self.times.costs(b, width)
            if not self.times.drafts(b):
                costs[1:] = np.inf
            width = batch_width(chances, sizes, costs)
            np.minimum(sizes, width, out=sizes)
        for k in range(len(rows)):  # zero past each size, as the kernels leave a batch's drafts
            d.tokens[k, sizes[k]:max(widest, width)] = 0
        s["batch"] = fused.fused._batch(d, width)

    def _step_fused(self, fused: "_Fused", start: float, timed: bool) -> None:
        """One step of a batch of greedy rows as `generate`'s fused path takes it (`fused.for_rows`): one
        kernel call after the forward accepts, teaches each row's policy, stops, extends each row's index and drafts
        the next step (cut to the width that pays for the whole batch, `_widths`); the rows then stream their tokens
        as any row does."""
        rows, s = fused.rows, fused.state
        before, drafted, width = s["lens"].copy(), s["batch"].sizes.tolist(), s["batch"].width
        tokens = [None] * len(rows)  # the drafts of the rows with a prediction, to count (tokens, a tree's parents)
        chain = s["batch"].chain
        for k in fused.predicting:
            tokens[k] = s["batch"].tokens[k, :drafted[k]].copy(), None if chain else s["batch"].parents[k].copy()
        self._widths(fused)  # for the next step's draft, which this step's kernel call makes
        fused.fused.step(fused, s)
        if self.metrics is not None:
            self.metrics.forwards.inc()
        counts, lens, out = s["rows"].counts.tolist(), s["lens"].tolist(), s["out"]
        done = []
        for k, row in enumerate(rows):
            row.counted(drafted[k], counts[k], *(tokens[k] or ()))
            done.append(row.advance(out[k, before[k]:lens[k]].tolist(), indexed=True))
        if any(done):
            self._fused.pop(id(fused.batch), None)
        else:
            if fused.predicting and rows[0].tree is None:
                self._predicted(fused)
            if len(rows) > 1 and rows[0].tree is None:  # a row the batch's width left out of the next step learns
                for row, size in zip(rows, s["batch"].sizes.tolist()):  # from the tokens that come, as on the
                    if not size:  # engine's path
                        row.watch()
        if timed:
            self.times.record(len(rows), width, time.perf_counter() - start, len(rows) + sum(counts))
        self._drop(fused.batch, done)

    def _widths(self, fused: "_Fused") -> None:
        """What the batch's next step costs at each draft width, as this engine's steps were timed
        (`StepTimes.costs`), into the fused step's `widths`, where its kernel chooses the width that pays for the
        whole batch (`policy.batch_width`, as `_width` does here); every width but 0 priced out where drafting lost
        at this batch size (`StepTimes.drafts`). A row alone drafts what its policy asks."""
        if fused.widths is None:
            return
        b = len(fused.rows)
        fused.widths[:] = self.times.costs(b, len(fused.widths) - 1)
        if not self.times.drafts(b):
            fused.widths[1:] = np.inf

    def _width(self, rows: list, budgets: list, fill: int, drafting: bool = True):
        """The most draft tokens a greedy row verifies in this step: the width with the most tokens expected per unit
        of cost for the whole batch (`policy.batch_width`; every row computes the widest row's columns, and at a
        large batch a step costs what all its tokens cost), the costs as this engine's steps were timed
        (`policy.StepTimes`), at least what sampling rows draft (theirs are their own: a seed replays); only that where
        `drafting` is False (a plain step first, or drafting gave 10% fewer tokens per second than plain steps at this
        batch size: `StepTimes.drafts`, asked once a step); None (each row as it asks) when a row drafts a tree."""
        if not drafting:
            return max((row.outlook(n, fill)[1] for row, n in zip(rows, budgets) if not row.sampling.greedy),
                       default=0)
        outlooks = [row.outlook(n, fill) for row, n in zip(rows, budgets)]
        if any(chance is None for chance, _ in outlooks):
            return None
        chances, reach = np.array(outlooks, dtype=float).T
        least = max((int(r) for row, (_, r) in zip(rows, outlooks) if not row.sampling.greedy), default=0)
        return batch_width(chances, reach, self.times.costs(len(rows), int(reach.max()), least))

    def sizing(self, row) -> tuple:
        """(the cost model, draft tokens, tree nodes) a row drafts by where its request leaves its budgets unset, as
        `generate` sizes a call: a greedy chain's cost curve measured to 20 tokens, a greedy tree's to its 32 nodes
        (measured at the first such row, then kept on disk), each budget widened to what costs no more by it
        (`budget`); a sampling row's, a fixed line (a seed replays) and the defaults."""
        if not row.sampling.greedy:
            return self.sampling_cost, self.num_draft_tokens, DRAFT_NODES
        if row.drafting.draft != "tree":
            return self.chain_cost, self.num_draft_tokens, DRAFT_NODES
        if self._tree is None:
            cost = _cost(self.model, self.facts, self._given, False, "tree")
            tokens, nodes = max(DRAFT_TOKENS, budget(cost, DRAFT_TOKENS)), max(DRAFT_NODES, budget(cost, DRAFT_NODES))
            self._tree = cost, tokens, nodes, cost.pads_within(max(tokens, nodes)) if isinstance(cost, CostCurve) \
                else None  # and the widths a lone tree's step pads to
        return self._tree[:3]

    def recycled(self) -> Recycled:
        """M, the target's top-k predictions after each token that recycling rows (``"lookup": "recycle"``,
        ``"suffix+recycle"``) draft from and learn from at every forward, shared by them and kept across requests:
        the memory's (`Memory.recycled`), or the engine's own, made at the first such row."""
        if self._recycled is None:
            self._recycled = table_for(self.model, self.facts, self.memory)
            self._recycling = Recycling(self._recycled.k)  # what a step takes from each forward for it, and teaches
        return self._recycled

    def _told(self, rows: int, paying: bool, drafted: float, plain: float) -> None:
        """Say that steps of up to `rows` rows start or stop verifying drafts (`StepTimes.drafts`): the
        `lookahead_drafting` metric, and a warning the first time a batch size's drafting is cut (later changes,
        which come and go near the point where drafts stop paying, at debug level), so that a speedup cut under load
        is never silent."""
        first = not paying and rows not in self._cut
        if not paying:
            self._cut.add(rows)
        logger.log(logging.WARNING if first else logging.DEBUG, "lookahead serve: steps of up to %d rows %s: with "
                   "drafts they gave %.1f tokens/s, plain steps %.1f%s", rows,
                   "verify drafts again" if paying else "stop verifying drafts", drafted, plain,
                   "" if paying else f" (one step in {self.times.PROBE} still tries them)")
        if self.metrics is not None:
            self.metrics.drafting.labels(str(rows)).set(int(paying))

    def _accept(self, rows: list, batch: DraftBatch, logits: torch.Tensor, top: list | None = None) -> Verdict:
        """Each row's accepted path and next token (`rules.by_row`): greedy rows together, sampling rows each with
        its own rule and generator; with a list `top`, the top-k after every column first, into it (for the rows
        that recycle: `Recycling.launch`)."""
        if top is not None:
            top.append(self._recycling.launch(logits))
        greedy = np.array([i for i, row in enumerate(rows) if row.sampling.greedy], dtype=np.int64)
        return by_row(batch, logits, greedy, lambda i: rows[i].pick(logits[i], batch.drafts[i]))

    def _drop(self, batch: Batch, done: list) -> None:
        """Remove the done and cancelled rows from the batch (and its cache)."""
        if not any(done):
            return
        for row, d in zip(batch.rows, done):
            if d:
                if row.cancelled and not row.done:
                    self.freed += 1
                self._finished(row, row.finish or "cancelled")
        batch.retire(done)
        if not batch.rows:
            self._release(batch)

    def _release(self, batch: Batch | None = None) -> None:
        """A batch is over (None: every batch): no rows, no target (whose hooks leave the model)."""
        for over in [batch] if batch is not None else list(self.batches):
            self._fused.pop(id(over), None)
            over.target.close()
            self.batches.remove(over)

    def _finished(self, row, finish: str) -> None:
        """Close a row, remember it (the memory), count it, log what it drafted."""
        row.close(finish)
        c = row.stats
        logger.info("lookahead serve: a row ended (%s): %d tokens in %d forwards; drafted %d, accepted %d; from the "
                    "prediction drafted %d, accepted %d", row.finish, len(row.out), c.forward_passes, c.draft_tokens,
                    c.accepted_tokens, c.prediction_accepted + c.prediction_rejected, c.prediction_accepted)
        if self.memory is not None and row.finish != "cancelled":
            self.memory.add_tokens(np.concatenate([row.prompt, np.asarray(row.out, dtype=np.int64)]))
        if self.metrics is not None:
            self.metrics.row_done(row)


class _Fused:
    """A batch of greedy rows stepped by `generate`'s fused step (`fused.for_rows`): what the step reads of
    the rows it steps (their indexes, ids, newest tokens, `step`), the batch's step costs per width it reads
    (`widths`, None for a row alone), and its state between steps."""

    def __init__(self, batch: Batch, fused, widths):
        self.batch, self.rows, self.fused, self.widths, self.state = batch, list(batch.rows), fused, widths, None
        self.predicting = []  # the rows with a prediction (`Engine._predicted`)
        self.indexes, self.ids = [row.index for row in self.rows], list(range(len(self.rows)))

    @property
    def last(self) -> np.ndarray:
        return self.batch.last

    def step(self, *args, **kwargs):
        """The batch's step (`Batch.step`)."""
        return self.batch.step(*args, **kwargs)


MAX_MODEL_LEN = 4096  # the static cache's tokens per row when max_model_len is not given and the model allows more
PREFILL_TOKENS = 8192  # the most prompt tokens of the rows prefilled in one forward
_NONE = np.zeros(0, dtype=np.int64)  # the prefill's draft: no tokens, no parents


def _static(model, facts: ModelFacts, cache_implementation, apart: str | None) -> tuple | None:
    """(graphs, compile_config) of a static cache, or None for the dynamic cache: as `generate` chooses for
    `cache_implementation` (`static.static_mode`).

    Raises:
        ValueError: an unknown cache_implementation, or "static" for a model whose layers keep recurrent states
            (served from the dynamic cache, each row its own state) or whose rows cannot share a cache (`apart`:
            each row its own dynamic cache)."""
    if cache_implementation not in (None, "static", "dynamic"):
        raise ValueError(f"cache_implementation must be 'static', 'dynamic' or None, not {cache_implementation!r}")
    mode = static_mode(facts, types.SimpleNamespace(cache_implementation=cache_implementation))
    if mode is None:
        return None
    if apart is not None:
        if cache_implementation is None:
            return None
        raise ValueError(f"cache_implementation='static': lookahead serve runs each row of {facts.name} in a dynamic "
                         f"cache of its own ({apart}); leave cache_implementation unset")
    if facts.recurrent == "" and state_layers(model):
        if cache_implementation is None:
            return None
        raise ValueError(f"cache_implementation='static': lookahead serve keeps the recurrent states of "
                         f"{facts.name} in the dynamic cache only; leave cache_implementation unset")
    return mode


def _paths(verdict: Verdict) -> list:
    if verdict.paths is not None:
        return verdict.paths
    return [list(range(c)) for c in verdict.counts.tolist()]


def _cost(model, facts: ModelFacts, given, sampling: bool, draft: str = "chain"):
    """A row's verification cost model, as `lookahead.generate` picks it (measured once per model on a CPU)."""
    settings = make_settings(draft_cost=given, draft=draft, lookup="suffix" if draft == "tree" else "ngram")
    return draft_cost(model, facts, settings, sampling)


@contextlib.contextmanager
def _fast(model):
    """The forwards as `lookahead.generate` runs them: packed grouped-query attention and linear weights, recurrent
    modules that cannot continue a state over several tokens stepping a token at a time."""
    with packed_attention(model), packed_linears(model), stepping(model), decoding_order(model):
        yield


def _drain(pending: queue.Queue) -> list:
    rows = []
    while True:
        try:
            row = pending.get_nowait()
        except queue.Empty:
            return [r for r in rows if r is not None]
        rows.append(row)
