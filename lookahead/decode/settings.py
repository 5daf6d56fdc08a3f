"""What lookahead adds to a generation call, checked once at the boundary, and what it refuses to do."""
from __future__ import annotations

import functools
import logging
import time
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np
import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.stopping_criteria import StopStringCriteria

from .. import _checks as V
from ..index.ngram import DEFAULT_MAX_NGRAM, MAX_NGRAM
from .policy import CostCurve


DEFAULT_MAX_NEW_TOKENS = 128


@dataclass
class GenerationStats:
    """Counters of one `generate` call. `row_forwards` counts each batch row once per forward it took part in."""

    forward_passes: int = 0
    row_forwards: int = 0
    new_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    new_tokens_by_row: list = field(default_factory=list)  # per batch row: its new tokens
    forwards_by_row: list = field(default_factory=list)  # per batch row: the forwards it took part in
    seconds: dict = field(default_factory=dict)  # host wall clock per phase of the loop: draft, forward, accept, ...
    # (a fused call drafts each next step inside its acceptance: its "draft" is the first draft of each batch)
    fallback: str | None = None  # why lookahead.generate ran model.generate's own decoding (no drafts), or None
    rows_apart: str | None = None  # why a batch's rows ran one after another, each alone, or None

    @property
    def tokens_per_forward(self) -> float:
        """New tokens a row gains per target forward pass (1.0 for plain decoding)."""
        return self.new_tokens / max(self.row_forwards, 1)

    @property
    def acceptance_rate(self) -> float:
        """Fraction of proposed draft tokens that the target accepted."""
        return self.accepted_tokens / max(self.draft_tokens, 1)

    def merge(self, other: "GenerationStats") -> None:
        """Add another call's counters to these: counts summed, per-row lists appended, seconds summed by phase."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, int):
                setattr(self, f.name, mine + theirs)
            elif isinstance(mine, list):
                mine.extend(theirs)
            elif isinstance(mine, dict):
                for key, value in theirs.items():
                    mine[key] = mine.get(key, 0.0) + value

    def add_forward(self, rows: int) -> None:
        """Count one target forward pass over `rows` batch rows."""
        self.forward_passes += 1
        self.row_forwards += rows

    def clock(self) -> "Clock":
        """A stopwatch adding host wall-clock seconds per phase of the loop to `seconds`."""
        return Clock(self.seconds)

    def as_dict(self) -> dict:
        return {**asdict(self), "tokens_per_forward": self.tokens_per_forward, "acceptance_rate": self.acceptance_rate}


class Clock:
    """Host wall-clock seconds per phase, added up in a dict: `lap(phase)` charges the time since the last lap."""

    def __init__(self, seconds: dict):
        self.seconds, self.start = seconds, time.perf_counter()
        self.last = self.start

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.last
        self.last = now

    def total(self) -> None:
        self.seconds["total"] = self.seconds.get("total", 0.0) + time.perf_counter() - self.start


# The options every entry point takes, with their defaults: the one place they are written (`generate`,
# `custom_generate`, `plugin`, `pipeline`, `lookahead serve`'s per-request `lookahead` options and the job read them
# here; tests/test_generate.py holds each signature to it).
OPTIONS = {"lookup": "ngram", "max_ngram": DEFAULT_MAX_NGRAM, "min_ngram": 1, "num_draft_tokens": None,
           "draft_cost": None, "draft": "chain", "max_draft_nodes": None, "memory": None, "documents": None,
           "tokenizer": None, "generator": None, "streamer": None}


@dataclass
class Settings:
    """Lookahead's own arguments of one call, checked (see `lookahead.generate` for their meaning)."""

    lookup: str = OPTIONS["lookup"]
    max_ngram: int = OPTIONS["max_ngram"]
    min_ngram: int = OPTIONS["min_ngram"]
    num_draft_tokens: int | None = None  # None: DRAFT_TOKENS, or what the static step's width holds
    draft_cost: object = None  # None, a number, (overhead, per_token), a CostCurve or "auto"
    draft: str = OPTIONS["draft"]
    max_draft_nodes: int | None = None  # None: DRAFT_NODES, or what the static step's width holds
    memory: object = None  # a lookahead.Memory
    documents: list | None = None  # None, or per-row lists of 1-D int64 arrays
    generator: torch.Generator | int | None = None
    streamer: object = None
    eos: tuple | None = None  # overrides the generation config's eos ids; () means none
    stats: GenerationStats = field(default_factory=GenerationStats)

    def widest(self) -> int:
        """Most draft tokens (or tree nodes) a row verifies per step, the defaults standing in for unset budgets."""
        tokens = DRAFT_TOKENS if self.num_draft_tokens is None else self.num_draft_tokens
        nodes = DRAFT_NODES if self.max_draft_nodes is None else self.max_draft_nodes
        return max(tokens, nodes if self.draft == "tree" else 0)

    def resolved(self, padded, most: int | None = None) -> "Settings":
        """These settings with unset budgets set to what the step's width for their default holds (`padded(n)`: the
        columns a step verifying n computes anyway), and given ones cut to `most`, the draft tokens or nodes a step
        verifies per row at most (with a warning; None: no bound); the same stats."""
        tokens = padded(DRAFT_TOKENS) if self.num_draft_tokens is None else _at_most(
            "num_draft_tokens", self.num_draft_tokens, most)
        nodes = self.max_draft_nodes
        if nodes is None:
            nodes = padded(DRAFT_NODES) if self.draft == "tree" else DRAFT_NODES
        elif self.draft == "tree":
            nodes = _at_most("max_draft_nodes", nodes, most)
        return replace(self, num_draft_tokens=tokens, max_draft_nodes=nodes)


def _at_most(name: str, value: int, most: int | None) -> int:
    """`value` of the budget `name`, cut to `most` (with a warning, once per process for each such value)."""
    if most is None or value <= most:
        return value
    _warn_cut(name, value, most)
    return most


@functools.cache
def _warn_cut(name: str, value: int, most: int) -> None:
    logging.getLogger("lookahead").warning(
        "lookahead: %s=%d is more than a static step verifies per row; drafting at most %d (pass "
        "cache_implementation='dynamic' for more)", name, value, most)


MAX_STEP = 1024  # most draft tokens or tree nodes verified per row and step: more cannot pay for a forward
DRAFT_TOKENS = 10  # num_draft_tokens when not given (a static step: as many as its width for 10 holds)
DRAFT_NODES = 32  # max_draft_nodes when not given (a static step: as many as its width for 32 holds)


def make_settings(*, tokenizer=None, eos=None, **options) -> Settings:
    """Check lookahead's options (the names of `OPTIONS`) and return them as `Settings`.

    Raises:
        TypeError, ValueError: an unknown option, or a value of the wrong type or out of range, named.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"unknown lookahead option {unknown[0]!r}; expected one of {', '.join(sorted(OPTIONS))}")
    o = {k: v for k, v in OPTIONS.items() if k != "tokenizer"} | options
    V.check_lookup(o["lookup"])
    V.check_int("max_ngram", o["max_ngram"], 1, MAX_NGRAM)
    V.check_int("min_ngram", o["min_ngram"], 1, MAX_NGRAM)
    if o["min_ngram"] > o["max_ngram"]:
        raise ValueError(f"min_ngram must be <= max_ngram, got min_ngram={o['min_ngram']} > max_ngram={o['max_ngram']}")
    if o["num_draft_tokens"] is not None:
        V.check_int("num_draft_tokens", o["num_draft_tokens"], 0, MAX_STEP)
    if o["max_draft_nodes"] is not None:
        V.check_int("max_draft_nodes", o["max_draft_nodes"], 1, MAX_STEP)
    if o["draft_cost"] is not None and not _is_cost(o["draft_cost"]):
        raise ValueError(f"draft_cost must be a number >= 0, a pair of them, a CostCurve, 'auto' or None, "
                         f"got {o['draft_cost']!r}")
    if o["draft"] not in ("chain", "tree"):
        raise ValueError(f"draft must be 'chain' or 'tree', got {o['draft']!r}")
    if o["draft"] == "tree" and o["lookup"] not in V.TREE_LOOKUPS:
        raise ValueError(f"draft='tree' needs lookup='suffix', 'recycle' or 'suffix+recycle' (an index that proposes "
                         f"trees), got lookup={o['lookup']!r}")
    if o["memory"] is not None and not hasattr(o["memory"], "add_tokens"):
        raise TypeError(f"memory must be a lookahead.Memory, got {type(o['memory']).__name__}")
    if o["generator"] is not None and not isinstance(o["generator"], torch.Generator):
        V.check_int("generator", o["generator"], 0, 2**64 - 1)
    o["documents"] = as_documents(o["documents"], tokenizer)
    return Settings(**o, eos=eos)


def _is_cost(value) -> bool:
    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0
    pair = isinstance(value, (tuple, list)) and len(value) == 2 and all(map(number, value))
    return number(value) or pair or isinstance(value, CostCurve) or (isinstance(value, str) and value == "auto")


def as_documents(documents, tokenizer=None) -> list | None:
    """Documents as per-row lists of int64 arrays (one shared list for every row, or one list per row).

    `documents` is a list of documents (each a string, which needs `tokenizer`, or a sequence of token ids), or a
    list with one such list per batch row.
    """
    if documents is None:
        return None
    if not isinstance(documents, (list, tuple)):
        raise TypeError(f"documents must be a list of strings or of token id sequences, got {type(documents).__name__}")
    per_row = all(isinstance(d, (list, tuple)) for d in documents) and any(d and not _is_ids(d) for d in documents)
    rows = documents if per_row else [documents]
    return [[_as_ids(d, tokenizer) for d in row] for row in rows]


def _is_ids(doc) -> bool:
    return all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in doc)


def _as_ids(doc, tokenizer) -> np.ndarray:
    if isinstance(doc, str):
        if tokenizer is None:
            raise ValueError("documents given as strings need tokenizer= to turn them into token ids")
        doc = tokenizer(doc, add_special_tokens=False)["input_ids"]
    if isinstance(doc, torch.Tensor):
        doc = doc.tolist()
    arr = np.asarray(doc)
    if arr.ndim != 1 or (arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0)):
        raise TypeError(f"each document must be a string or a 1-D sequence of token ids >= 0, got {str(doc)[:60]}")
    return arr.astype(np.int64)


def hf_kwargs(kwargs: dict, max_new_tokens, eos_token_id, pad_token_id, logits_processor) -> dict:
    """model.generate's keyword arguments for lookahead's own ones (None: leave to the generation config)."""
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = max_new_tokens
    elif "max_length" not in kwargs and kwargs.get("generation_config") is None:
        kwargs["max_new_tokens"] = DEFAULT_MAX_NEW_TOKENS
    if "do_sample" not in kwargs and kwargs.get("generation_config") is None:
        kwargs["do_sample"] = False  # greedy unless asked, whatever the model's generation config prefers
    if eos_token_id not in (None, []):
        kwargs["eos_token_id"] = eos_token_id
    if pad_token_id is not None:
        kwargs["pad_token_id"] = pad_token_id
    if logits_processor is not None and not isinstance(logits_processor, LogitsProcessorList):
        logits_processor = LogitsProcessorList(logits_processor if isinstance(logits_processor, list)
                                               else [logits_processor])
    kwargs["logits_processor"] = logits_processor
    return kwargs


def with_stop_strings(criteria, kwargs: dict, tokenizer) -> StoppingCriteriaList:
    """Stopping criteria with `stop_strings` turned into a criterion (transformers does not hand its tokenizer to a
    custom decoding loop, so it cannot build that criterion itself)."""
    criteria = StoppingCriteriaList(criteria or [])
    config = kwargs.get("generation_config")
    stops = kwargs.pop("stop_strings", None) or getattr(config, "stop_strings", None)
    if stops:
        if tokenizer is None:
            raise ValueError("stop_strings need tokenizer= to match strings against tokens")
        criteria.append(StopStringCriteria(tokenizer, stops))
        if getattr(config, "stop_strings", None):
            kwargs["generation_config"] = GenerationConfig.from_dict({**config.to_dict(), "stop_strings": None})
    return criteria


def eos_override(eos_token_id):
    """() when eos_token_id is [] (no eos at all), else None (transformers resolves it); TypeError if malformed."""
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool) else eos_token_id
    if not isinstance(ids, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise TypeError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
    return () if len(ids) == 0 else None


# generation_config fields that ask for a decoding lookahead does not do, with the value that means "off".
_REFUSED = {
    "num_beams": (1, "beam search"),
    "num_beam_groups": (1, "diverse beam search"),
    "penalty_alpha": (None, "contrastive search"),
    "dola_layers": (None, "DoLa decoding"),
    "guidance_scale": (None, "classifier-free guidance"),
    "prompt_lookup_num_tokens": (None, "transformers' prompt lookup (lookahead drafts by itself: max_ngram, "
                                       "num_draft_tokens)"),
    "assistant_early_exit": (None, "self-speculative early exit"),
    "output_attentions": (False, "the attentions of every step"),
    "output_hidden_states": (False, "the hidden states of every step"),
}
_MODEL_INPUTS = {"attention_mask", "position_ids", "logits_to_keep", "past_key_values", "cache", "use_cache",
                 "encoder_outputs", "cache_position", "decoder_attention_mask"}


def refuse_assistant(assistant_model) -> None:
    """Raise ValueError when an assistant (draft) model is given: lookahead's drafts come from its index."""
    if assistant_model is not None:
        raise ValueError("assistant_model: lookahead drafts from its n-gram index, not from an assistant model; "
                         "drop assistant_model= or call model.generate without custom_generate")


def check_supported(generation_config, model_kwargs: dict) -> None:
    """Raise ValueError naming the first argument whose meaning lookahead cannot keep."""
    for name, (off, what) in _REFUSED.items():
        value = getattr(generation_config, name, off)
        if value is not None and value != off and not (name == "guidance_scale" and value == 1):
            raise ValueError(f"{name}={value!r} asks for {what}, which lookahead does not do (it decodes greedily or by "
                             f"sampling); leave {name} unset")
    for key, value in model_kwargs.items():
        if key not in _MODEL_INPUTS and value is not None:
            raise ValueError(f"model input {key}= is not supported by lookahead, which decodes from token ids only")
    for key in ("past_key_values", "cache"):  # transformers 5.24 renamed past_key_values to cache
        cache = model_kwargs.get(key)
        if cache is not None and _holds_tokens(cache):
            raise ValueError(f"{key}: lookahead starts from an empty cache; pass the full prompt instead")


def _holds_tokens(cache) -> bool:
    """Whether a cache passed in already holds tokens: keys and values, or (layers with recurrent states only, whose
    cache cannot count tokens) a state."""
    try:
        return cache.get_seq_length() > 0
    except ValueError:  # recurrent layers only
        return any(any(layer.has_previous_state.values()) for layer in cache.layers)
