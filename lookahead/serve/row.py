"""`Row`: one choice of one request, as the engine decodes it: its tokens, its index and draft policy, its sampling
rule, its text and its `RowStats`."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from ..decode.policy import DraftLength
from ..decode.settings import OPTIONS, GenerationStats
from ..decode.sizing import TreeSizing
from ..index.build import row_indexes
from ..index.recycle import RecycleIndex
from ..index.draft import Draft
from ..verify.batch import DraftBatch, Verdict
from .text import TextOut


@dataclass(frozen=True)
class Sampling:
    """How a row picks tokens: greedy (temperature 0) or sampling from the tempered, top-p-cut distribution."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        """Scores [n, V] to sample from, as `model.generate` processes them (temperature, then top-p)."""
        scores = TemperatureLogitsWarper(self.temperature)(None, logits.float())
        return TopPLogitsWarper(self.top_p)(None, scores) if self.top_p < 1.0 else scores


@dataclass(frozen=True)
class Drafting:
    """A request's `lookahead` options (see `lookahead.generate`); lookup "none": plain decoding."""

    lookup: str = OPTIONS["lookup"]
    draft: str = OPTIONS["draft"]
    num_draft_tokens: int | None = None  # None: the server's default
    max_draft_nodes: int | None = None  # None: the server's default
    max_ngram: int = OPTIONS["max_ngram"]
    min_ngram: int = OPTIONS["min_ngram"]


@dataclass
class RowStats(GenerationStats):
    """A row's `GenerationStats` (a forward counts once per step the row took part in), with the draft tokens that
    came from the request's prediction (a draft counts as the prediction's when its tokens appear in a row in the
    prediction), accepted or not."""

    prediction_accepted: int = 0
    prediction_rejected: int = 0


class Row:
    """One choice of one request.

    Args:
        prompt: [P] int64 prompt token ids.
        max_new: most new tokens.
        eos: token ids that end the row (the token is kept in the count, not in the text).
        sampling: the row's `Sampling`.
        drafting: its `Drafting`.
        tokenizer: decodes its text.
        stops: stop strings.
        prediction: [n] int64 token ids of the request's predicted output, or None.
        emit: called from the engine's thread with each event: ("text", str) then ("done", finish_reason).
        stream: whether the text is sent as it grows; False (a whole answer): no "text" events, and without stop
            strings no decode before the last step (`text` is then the whole text, decoded once).
    """

    def __init__(self, prompt: np.ndarray, max_new: int, eos: tuple, sampling: Sampling, drafting: Drafting,
                 tokenizer, stops: tuple = (), prediction: np.ndarray | None = None, emit=None, stream: bool = True):
        self.prompt, self.max_new, self.eos = np.asarray(prompt, dtype=np.int64), max_new, frozenset(eos)
        self.sampling, self.drafting, self.prediction = sampling, drafting, prediction
        self.text = TextOut(tokenizer, stops)
        self.emit, self.stream = emit or (lambda event: None), stream
        self.out: list = []
        self.stats = RowStats()
        self.predicted = 0 if prediction is not None and len(prediction) else None  # where the prediction goes on
        # after the answer so far (None: nowhere, or no prediction)
        self.index = self.length = self.tree = self.generator = None
        self.shadow = None  # (where in out it starts, tokens, match length): a draft the row did not verify
        self.finish: str | None = None  # "stop", "length" or "cancelled" once done
        self.cancelled = False
        self.submitted, self.first_token, self.finished = time.perf_counter(), None, None

    @property
    def done(self) -> bool:
        return self.finish is not None

    @property
    def chain(self) -> bool:
        return self.tree is None

    @property
    def recycles(self) -> bool:
        """Whether the row drafts from recycled predictions (`RecycleIndex`): it learns from every forward's top-k."""
        return isinstance(self.index, RecycleIndex)

    def start(self, memory, cost, num_draft_tokens: int, max_draft_nodes: int, device, recycled=None,
              most: int | None = None) -> None:
        """Build the row's index (its prediction, then its prompt, over the memory's tokens; for a recycling lookup
        over `recycled`, the server's `Recycled`), draft policy and generator; called in the engine's thread, which
        alone touches the memory. `cost`, `num_draft_tokens`, `max_draft_nodes`: the row's cost model and the
        budgets its request leaves unset (`Engine.sizing`); `most`: the most draft tokens or nodes a step verifies
        for a row (the static step's widest), which the request's own budgets are cut to, or None."""
        d = self.drafting
        n = num_draft_tokens if d.num_draft_tokens is None else d.num_draft_tokens
        nodes = max_draft_nodes if d.max_draft_nodes is None else d.max_draft_nodes
        if most is not None:
            n, nodes = min(n, most), min(nodes, most)
        documents = [[self.prediction]] if self.prediction is not None and len(self.prediction) else None
        self.index = row_indexes(d.lookup, d.max_ngram, d.min_ngram, [self.prompt], documents, memory, n,
                                 recycled)[0]
        if d.draft == "tree":
            self.tree = TreeSizing(nodes, n, cost)
        self.length = self.tree.length if self.tree is not None else DraftLength(n, cost)
        if not self.sampling.greedy:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(self.sampling.seed if self.sampling.seed is not None
                                       else int(np.random.SeedSequence().entropy % 2**63))

    def budget(self, batch: int) -> int:
        """Draft tokens the row's policy asks for in a batch of `batch` rows (0 without a match or an index)."""
        if self.index is None or self.index.match_length == 0:
            return 0
        batch = batch if self.sampling.greedy else 1  # a sampling row's drafts never depend on the others: a seed
        ask = self.length.choose(np.full(batch, self.index.match_length))[0]  # replays; greedy: the batch's costs
        return int(min(ask, self.max_new - 1 - len(self.out)))

    def draft(self, budget: int, fill: int, width: int | None = None, padded=None) -> Draft:
        """The row's draft: a tree (draft="tree"; a greedy row's keeps as many nodes as the forward computes anyway,
        `padded(n)`, the target's: `TreeSizing.draft`), else a chain of `budget` tokens, or up to `fill` (the columns
        the step computes anyway) for a greedy row with a match; a prediction's next tokens while the answer
        follows it. `width`: the most tokens the batch's step verifies (`batch_width`), or None."""
        if self.index is None:
            return Draft.empty()
        if self.tree is not None:  # a sampling row's tree never depends on the batch: a seed replays
            return self.tree.draft([self.index], np.array([max(self.room, 0)]),
                                   padded if self.sampling.greedy else None)[0]
        reach, prediction = self._reach(budget, fill)
        n = reach if width is None else min(reach, width)
        if prediction:
            return Draft.chain(self.prediction[self.predicted:self.predicted + n].copy(),
                               max(self.index.match_length, 1))
        return Draft.chain(self.index.propose(n), self.index.match_length) if n > 0 else \
            Draft.empty(self.index.match_length)

    def predicted_draft(self, most: int) -> np.ndarray | None:
        """The prediction's next tokens the row verifies while its answer follows it (as `draft` takes them, at most
        `most`), or None where it does not (no prediction, or the answer left it)."""
        if self.predicted is None or self.index is None:
            return None
        n, prediction = self._reach(self.budget(1), 0)
        return self.prediction[self.predicted:self.predicted + min(n, most)] if prediction else None

    @property
    def room(self) -> int:
        """Draft tokens the row can still use: its new tokens left, less the one every step gains."""
        return self.max_new - 1 - len(self.out)

    def _reach(self, budget: int, fill: int) -> tuple:
        """(the tokens the row drafts given its `budget` and a step `fill` columns wide, whether from the
        prediction): a prediction's next tokens while the answer follows it, whatever the cost curve says of short
        guesses (it is the answer the client expects); a greedy row with a match fills the columns computed anyway."""
        room, match = self.room, self.index.match_length
        if self.predicted is not None and self.predicted < len(self.prediction):
            n = min(len(self.prediction) - self.predicted, room, max(budget, PREDICTION_TOKENS))
            if n > 0:
                return n, True
        if self.sampling.greedy and match:
            budget = max(budget, min(fill, room, self.length.max_tokens))
        return (budget if match else 0), False

    def outlook(self, budget: int, fill: int) -> tuple:
        """(the chance that each of the row's draft tokens is accepted, given the one before; the most tokens it
        drafts in a step `fill` columns wide), for the batch's choice of width (`batch_width`); a tree's row
        (None, None)."""
        if self.index is None:
            return 0.0, 0
        if self.tree is not None:
            return None, None
        reach, prediction = self._reach(budget, fill)
        return (self.prediction_chance if prediction else self.length.chance(self.index.match_length)), reach

    @property
    def prediction_chance(self) -> float:
        """The chance that each of the prediction's draft tokens is accepted, given the one before: the prediction's
        own record so far, from 3 accepted to 1 rejected."""
        c = self.stats
        return (c.prediction_accepted + 3.0) / (c.prediction_accepted + c.prediction_rejected + 4.0)

    def watch(self) -> None:
        """Keep the draft the row would verify now (a greedy chain row with a match that drafts nothing in this
        step: the batch's width left it out) to score against the tokens that come, so that its policy learns its
        chance of acceptance without a forward paying for it (`advance`); one at a time."""
        if (self.shadow is None and self.tree is None and self.sampling.greedy and self.index is not None
                and self.index.match_length):
            tokens = self.index.propose(max(1, min(self.room, self.length.max_tokens)))
            if len(tokens):
                self.shadow = (len(self.out), tokens.tolist(), self.index.match_length)

    def _score_shadow(self) -> None:
        """Teach the policy what the tokens that came accepted of the kept draft, once they tell (a mismatch, or as
        many tokens as it has)."""
        start, tokens, match = self.shadow
        came = self.out[start:start + len(tokens)]  # a few tokens: Python's loop is faster than numpy's calls
        accepted = next((i for i, (t, d) in enumerate(zip(came, tokens)) if t != d), len(came))
        if accepted < len(came) or len(came) == len(tokens) or self.done:
            self.length.update(np.array([match]), np.array([len(tokens)]), np.array([accepted]))
            self.shadow = None

    def pick(self, logits: torch.Tensor, draft: Draft) -> tuple:
        """A sampling row's acceptance over its own columns logits [n + 1, V]: (accepted node indices, next)."""
        from ..verify.rules import sample

        batch = DraftBatch.pack([draft], self.chain or draft.is_chain)
        verdict = sample(batch, self.sampling.warp(logits[: len(draft) + 1])[None], self.generator)
        path = list(range(int(verdict.counts[0]))) if verdict.paths is None else verdict.paths[0]
        return path, int(verdict.bonus[0])

    def learn(self, draft: Draft, path: list) -> None:
        """Teach the draft policy what was accepted of `draft` (the accepted node indices `path`); count it."""
        self.counted(len(draft), len(path), draft.tokens, None if draft.is_chain else draft.parents)
        if self.index is None:
            return
        if self.tree is not None:
            batch = DraftBatch.pack([draft], False)
            self.tree.update(batch, Verdict.of_paths([list(path)], np.zeros(1, dtype=np.int64)))
        elif len(draft):  # a chain that drafted nothing teaches nothing (`_policy_kernels.record`)
            self.length.update(np.array([draft.match_length]), np.array([len(draft)]), np.array([len(path)]))

    def counted(self, drafted: int, accepted: int, tokens: np.ndarray | None = None,
                parents: np.ndarray | None = None) -> None:
        """Count a step the row took part in: one forward, its draft tokens and those accepted (`learn`, or a step the
        fused kernel took for the row, `engine.Engine._step_fused`, which taught its policy there); with the draft's
        `tokens` (and `parents`, a tree's), also as the prediction's where the draft's first path appears in it,
        token after token."""
        c = self.stats
        c.add_forward(1)
        c.draft_tokens += drafted
        c.accepted_tokens += accepted
        if tokens is None or not drafted or self.prediction is None or not len(self.prediction):
            return
        path = tokens[:drafted] if parents is None else tokens[_first_path(parents[:drafted])]
        if _contains(self.prediction, path):
            c.prediction_accepted += accepted
            c.prediction_rejected += drafted - accepted

    def advance(self, tokens: list, indexed: bool = False) -> bool:
        """Take the step's gained tokens (cut at an eos or the length limit), stream their text; True when done.
        `indexed`: the row's index holds them already (the fused step extended it)."""
        kept = 0
        for t in tokens:
            self.out.append(int(t))
            kept += 1
            if t in self.eos or len(self.out) >= self.max_new:
                self.finish = "stop" if t in self.eos else "length"
                break
        if self.index is not None and not indexed:
            self.index.extend(np.asarray(tokens[:kept], dtype=np.int64))
        if self.prediction is not None and len(self.prediction):
            self.predicted = _follow(self.prediction, self.predicted, self.out, kept)
        if self.shadow is not None:
            self._score_shadow()
        if self.first_token is None:
            self.first_token = time.perf_counter()
        if self.stream or self.text.stops or self.done:  # a whole answer's text waits for its end, unless a stop
            new = self.text.update(self.out, final=self.done)  # string may end it first
            if self.text.stopped:
                self.finish = "stop"
            if new and self.stream:
                self.emit(("text", new))
        if self.done:
            self.close(self.finish)
        return self.done

    def close(self, finish: str) -> None:
        """End the row: record why and when, send the last event."""
        if self.finished is None:
            self.finish, self.finished = finish, time.perf_counter()
            self.emit(("done", finish))


PREDICTION_TOKENS = 32  # most prediction tokens a step verifies (more when the row's policy asks for more)
ALIGN = 4  # answer tokens found in the prediction to go on after them, once the answer left it


def _follow(prediction: np.ndarray, at, out: list, new: int):
    """Where the prediction goes on after the answer `out`, whose last `new` tokens are new: past them where the
    prediction holds them at `at`, else after the first place (from `at` on, then anywhere) that holds the answer's
    last `ALIGN` tokens; None where none does."""
    tail = np.asarray(out[-new:], dtype=np.int64) if new else np.zeros(0, dtype=np.int64)
    if at is not None and np.array_equal(prediction[at:at + len(tail)], tail):
        return at + len(tail)
    key = np.asarray(out[-ALIGN:], dtype=np.int64)
    if len(key) < min(ALIGN, len(prediction)):
        return None
    for start in ([at] if at is not None else []) + [0]:
        found = _find(prediction, key, start)
        if found is not None:
            return found + len(key)
    return None


def _find(haystack: np.ndarray, needle: np.ndarray, start: int):
    """The first index >= start where `needle` runs in `haystack`, or None."""
    hay, pin = haystack.astype(np.int64).tobytes(), needle.astype(np.int64).tobytes()
    at = hay.find(pin, 8 * start)
    while at >= 0 and at % 8:
        at = hay.find(pin, at + 1)
    return None if at < 0 else at // 8


def _first_path(parents: np.ndarray) -> np.ndarray:
    """Node indices of a best-first tree's first path (the first child at each depth)."""
    path, at = [], -1
    for j, p in enumerate(parents):
        if p == at:
            path.append(j)
            at = j
    return np.array(path, dtype=np.int64)


def _contains(haystack: np.ndarray, needle: np.ndarray) -> bool:
    """Whether `needle` occurs in `haystack` as a contiguous run (both int64 token arrays)."""
    return 0 < len(needle) <= len(haystack) and _find(haystack, needle, 0) is not None
