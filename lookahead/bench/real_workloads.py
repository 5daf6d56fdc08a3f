"""The prompts of `lookahead bench real`: chat conversations from the real data in ``../shared/data``, each ending
where the model writes its own next turn.

- ``spec-bench/<category>``: Spec-Bench's 13 categories (MT-bench's eight, translation, summarization, qa,
  math_reasoning, rag), the first turn of each question.
- ``summarization``: CNN/DM articles (FRANK), "Summarize this article." and the article.
- ``code-edit``: CanItEdit tasks, the descriptive instruction and the code; the model writes the whole edited file.
- ``rag``: Natural Questions, the question with its gold Wikipedia passage.
- ``agent``: mini-swe-agent trajectories (SWE-bench Verified): the conversation so far (system, task, earlier
  assistant turns and tool outputs); the model writes the next assistant turn. One step per trajectory: the latest
  that fits ``max_prompt`` after at least one earlier assistant turn.

Every conversation goes through the model's chat template (`encode`). The data is read, never copied into the
repository; a missing folder or file is a `FileNotFoundError` that says where it looked.

Example::

    prompts = load(["summarization", "spec-bench/translation"], tokenizer, per_workload=2)
    for workload, items in prompts.items():
        print(workload, [len(p.input_ids) for p in items])
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

SPEC_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
              "translation", "summarization", "qa", "math_reasoning", "rag")
OTHERS = ("summarization", "rag", "code-edit", "agent")
WORKLOADS = tuple(f"spec-bench/{c}" for c in SPEC_BENCH) + OTHERS
FILES = {"spec-bench": "spec-bench/question.jsonl", "summarization": "summarization/cnndm_frank.jsonl",
         "code-edit": "code-edit/canitedit_105.jsonl", "rag": "rag/nq-open-oracle.jsonl.gz",
         "agent": "agent/mini-swe-agent_gemini-3-pro_swebench-verified.jsonl.gz"}


@dataclass(frozen=True)
class Prompt:
    """One conversation, ready for the model: ``key`` names its source row, ``input_ids`` the templated tokens."""

    key: str
    input_ids: np.ndarray


def default_data_dir() -> Path:
    """``../shared/data`` beside the repository this package runs from (an editable install)."""
    return Path(__file__).resolve().parents[3] / "shared" / "data"


def is_spec_bench(workload: str) -> bool:
    return workload.startswith("spec-bench/")


def check_names(names) -> list:
    """The workload names, in order, without repeats; ``spec-bench`` stands for its 13 categories.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    out = []
    for name in names:
        expanded = [w for w in WORKLOADS if is_spec_bench(w)] if name == "spec-bench" else [name]
        for workload in expanded:
            if workload not in WORKLOADS:
                raise ValueError(f"unknown workload {name!r}; expected spec-bench, one of its categories "
                                 f"(spec-bench/writing, ...) or one of {', '.join(OTHERS)}")
            if workload not in out:
                out.append(workload)
    return out


def encode(tokenizer, messages: list) -> np.ndarray:
    """The token ids of a conversation through the tokenizer's chat template, ready for the assistant's turn; for a
    base model (no chat template: Gemma 3 270M) the turns' texts one after the other, blank lines between, after
    the tokenizer's own start of text."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return np.asarray(tokenizer(text, add_special_tokens=False).input_ids, dtype=np.int64)
    text = "\n\n".join(m["content"] for m in messages) + "\n\n"
    return np.asarray(tokenizer(text).input_ids, dtype=np.int64)


def load(names, tokenizer, per_workload: int = 2, max_prompt: int = 2048, data_dir: Path | str | None = None,
         ) -> dict:
    """``{workload: [Prompt, ...]}``: the first `per_workload` conversations of each workload whose templated
    prompt holds at most `max_prompt` tokens.

    Args:
        names: workload names (`check_names`).
        tokenizer: a tokenizer (an instruct model's chat template, where it has one).
        per_workload: prompts per workload, >= 1.
        max_prompt: the most prompt tokens, >= 16.
        data_dir: the shared data folder (default `default_data_dir`).

    Raises:
        ValueError: an unknown workload or a bad count.
        FileNotFoundError: the data folder or a file of a requested workload is missing.
    """
    names = check_names(names)
    if isinstance(per_workload, bool) or not isinstance(per_workload, int) or per_workload < 1:
        raise ValueError(f"per_workload must be an int >= 1, got {per_workload!r}")
    if isinstance(max_prompt, bool) or not isinstance(max_prompt, int) or max_prompt < 16:
        raise ValueError(f"max_prompt must be an int >= 16, got {max_prompt!r}")
    folder = Path(data_dir) if data_dir is not None else default_data_dir()
    if not folder.is_dir():
        raise FileNotFoundError(f"no data folder at {folder} (the shared data: pass --data DIR)")
    prompts = {}
    for name in names:
        source = "spec-bench" if is_spec_bench(name) else name
        path = folder / FILES[source]
        if not path.is_file():
            raise FileNotFoundError(f"{name}: no file {path}")
        rows = _CONVERSATIONS[source](path, name.removeprefix("spec-bench/"), tokenizer, max_prompt)
        prompts[name] = _first(rows, tokenizer, per_workload, max_prompt)
    return prompts


def _first(rows: Iterator, tokenizer, count: int, max_prompt: int) -> list:
    """The first `count` conversations that fit, each prompt distinct (the forced replay tells rows by prompt)."""
    kept, seen = [], set()
    for key, messages in rows:
        ids = encode(tokenizer, messages)
        if len(ids) <= max_prompt and ids.tobytes() not in seen:
            seen.add(ids.tobytes())
            kept.append(Prompt(key, ids))
            if len(kept) == count:
                break
    return kept


def _rows(path: Path) -> Iterator[dict]:
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _user(text: str) -> list:
    return [{"role": "user", "content": text}]


def _spec_bench(path: Path, category: str, tokenizer, max_prompt: int) -> Iterator:
    for row in _rows(path):
        if row["category"] == category:
            yield f"question {row['question_id']}", _user(row["turns"][0])


def _summarization(path: Path, _, tokenizer, max_prompt: int) -> Iterator:
    for row in _rows(path):
        yield f"cnndm {row['id']}", _user(f"Summarize this article.\n\n{row['article']}")


def _code_edit(path: Path, _, tokenizer, max_prompt: int) -> Iterator:
    for row in _rows(path):
        yield f"canitedit {row['full_name']}", _user(
            f"{row['instruction_descriptive']}\n\n```python\n{row['before']}```\n\nReturn the whole edited file.")


def _rag(path: Path, _, tokenizer, max_prompt: int) -> Iterator:
    for number, row in enumerate(_rows(path)):
        passage = next((c for c in row["ctxs"] if c.get("isgold")), row["ctxs"][0])
        yield f"nq {number}", _user(f"Answer the question using the passage.\n\nPassage: {passage['title']}\n"
                                    f"{passage['text']}\n\nQuestion: {row['question']}")


def _agent(path: Path, _, tokenizer, max_prompt: int) -> Iterator:
    """Per trajectory, the latest assistant step (after at least one earlier) whose conversation fits."""
    for row in _rows(path):
        messages = [{"role": m["role"], "content": str(m["content"])} for m in row["messages"]]
        latest = None
        for i in [i for i, m in enumerate(messages) if m["role"] == "assistant"][1:]:
            if len(encode(tokenizer, messages[:i])) > max_prompt:
                break  # conversations only grow
            latest = i
        if latest is not None:
            yield f"{row['instance_id']} step {latest}", messages[:latest]


_CONVERSATIONS: dict[str, Callable] = {"spec-bench": _spec_bench, "summarization": _summarization,
                                       "code-edit": _code_edit, "rag": _rag, "agent": _agent}
