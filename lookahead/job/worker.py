"""What every engine runs: batches of similar length, and one call of `lookahead.generate` per batch."""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

import torch

from .. import models
from .._checks import DRAFTS, LOOKUPS, TREE_LOOKUPS
from ..generate import generate
from ..index.memory import Memory
from .lines import Line, Model


@dataclass(frozen=True)
class Options:
    """The `generate` settings a job applies to every batch (see `lookahead.generate`).

    Raises:
        ValueError: a setting out of range, or draft="tree" without a lookup that proposes trees.
    """

    lookup: str = "ngram"
    draft: str = "chain"
    max_new_tokens: int = 128
    batch_size: int = 8
    memory: int = 0  # tokens of a Memory shared by the lines one worker handles; 0: none
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.lookup not in LOOKUPS:
            raise ValueError(f"lookup must be one of {', '.join(LOOKUPS)}, got {self.lookup!r}")
        if self.draft not in DRAFTS:
            raise ValueError(f"draft must be one of {', '.join(DRAFTS)}, got {self.draft!r}")
        if self.draft == "tree" and self.lookup not in TREE_LOOKUPS:
            raise ValueError(f"draft='tree' needs lookup='suffix', 'recycle' or 'suffix+recycle', got "
                             f"lookup={self.lookup!r}")
        for name, low in (("max_new_tokens", 1), ("batch_size", 1), ("memory", 0), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not self.temperature > 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"temperature must be > 0 and top_p in (0, 1], got {self.temperature!r}, {self.top_p!r}")


class ModelSpec:
    """Where the model comes from: a folder or hub id (loaded by `lookahead.models.load`), or a factory.

    A factory is a picklable callable `() -> (model, tokenizer)`; it lets a benchmark run a model built in code.
    """

    def __init__(self, model=None, device: str | None = None, dtype: str = "fp32"):
        if model is not None and not isinstance(model, str) and not callable(model):
            raise TypeError(f"model must be a folder, a hub id or a callable () -> (model, tokenizer), got "
                            f"{type(model).__name__}")
        if dtype not in models.DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(models.DTYPES)}, got {dtype!r}")
        self.model = models.default_model_path() if model is None else model
        self.device, self.dtype = device, dtype

    def load(self) -> tuple:
        """(model, tokenizer) on this process's device (`device`, else CUDA when present, else CPU).

        Raises:
            ValueError: the model cannot be loaded (one line).
        """
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if not isinstance(self.model, str):
            model, tokenizer = self.model()
            return model.to(device).eval(), tokenizer
        model, tokenizer, _ = models.load(self.model, device=device, dtype=self.dtype)
        return model, tokenizer


def describe(model, tokenizer, max_new_tokens: int) -> Model:
    """The limits lines are checked against, from a loaded model or its config."""
    config = getattr(model, "config", model)
    limit = next((v for v in (getattr(config, a, None) for a in ("max_position_embeddings", "n_positions"))
                  if isinstance(v, int) and v > 0), None)
    return Model(tokenizer, int(config.vocab_size), limit, max_new_tokens)


def batches(lines: list, batch_size: int) -> list:
    """Lines `batch_size` at a time, grouped by prompt length (less padding), longest first, in input order inside."""
    ordered = sorted(lines, key=lambda line: (-len(line.input_ids), line.number))
    return [sorted(ordered[i:i + batch_size], key=lambda line: line.number)
            for i in range(0, len(ordered), batch_size)]


class Worker:
    """A model, its tokenizer and the `Memory` shared by the lines it handles: generates a batch of lines at a time.

    Example:
        >>> worker = Worker(model, tokenizer, Options(max_new_tokens=64))
        >>> results = worker(lines)   # one dict per line: id, number, record (JSON) or error, new_tokens, forwards
    """

    def __init__(self, model, tokenizer, options: Options, logits_processor=None):
        self.model, self.tokenizer, self.options = model, tokenizer, options
        self.logits_processor = logits_processor
        self.memory = Memory(max_tokens=options.memory) if options.memory else None
        eos = model.generation_config.eos_token_id
        fallback = eos[0] if isinstance(eos, list) and eos else eos
        self.pad = next((p for p in (tokenizer.pad_token_id, fallback) if isinstance(p, int)), 0)

    def __call__(self, lines: list) -> list:
        """One result per line; a batch that fails gives each of its lines the error instead of a record."""
        try:
            out, stats = self._generate(lines)
        except (ValueError, TypeError, RuntimeError) as error:
            reason = f"generation failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            return [_result(line, error=reason) for line in lines]
        width = max(len(line.input_ids) for line in lines)
        results = []
        for i, line in enumerate(lines):
            new, forwards = stats.new_tokens_by_row[i], stats.forwards_by_row[i]
            output_ids = out[i, width:width + new].tolist()
            record = {"id": line.id, "text": self.tokenizer.decode(output_ids, skip_special_tokens=True),
                      "output_ids": output_ids, "new_tokens": new, "forwards": forwards,
                      "tokens_per_forward": round(new / max(forwards, 1), 4)}
            results.append(_result(line, record=json.dumps(record), new_tokens=new, forwards=forwards))
        return results

    def _generate(self, lines: list):
        """Left-pad the batch (decoder-only models look at the last position) and generate."""
        o = self.options
        width = max(len(line.input_ids) for line in lines)
        ids = torch.full((len(lines), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(lines), width), dtype=torch.long)
        for i, line in enumerate(lines):
            ids[i, width - len(line.input_ids):] = torch.from_numpy(line.input_ids)
            mask[i, width - len(line.input_ids):] = 1
        docs = [line.documents or [] for line in lines]
        sampling = dict(temperature=o.temperature, top_p=o.top_p, generator=_seed(o.seed, lines)) if o.do_sample else {}
        device = self.model.device
        return generate(self.model, ids.to(device), attention_mask=mask.to(device), lookup=o.lookup, draft=o.draft,
                        max_new_tokens=o.max_new_tokens, memory=self.memory,
                        documents=docs if any(docs) else None, tokenizer=self.tokenizer,
                        logits_processor=self.logits_processor, do_sample=o.do_sample, pad_token_id=self.pad,
                        return_stats=True, **sampling)


def _seed(seed: int, lines: list) -> int:
    """A batch's sampling seed: the job's seed and the batch's first id, so batches draw different numbers."""
    return zlib.crc32(f"{seed}:{lines[0].key}".encode())


def _result(line: Line, record: str | None = None, error: str | None = None, new_tokens: int = 0,
            forwards: int = 0) -> dict:
    return {"key": line.key, "number": line.number, "record": record, "error": error, "new_tokens": new_tokens,
            "forwards": forwards}
