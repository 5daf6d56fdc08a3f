"""Replay traces from real recorded model outputs: ``(prompt_ids, output_ids)`` pairs.

A trace is what a real model wrote for a prompt, tokenized with the GPT-2 byte-level BPE in
``<data-dir>/tokenizers/gpt2``. Replaying it token by token (``replay.py``) measures how many tokens each
target forward would yield with a given drafter, without running any model.

Datasets (files under ``../shared/data``, see its README; nothing is copied into the repo):

- ``code-edit``: CanItEdit. Prompt ``"## Instruction:\\n{instr}\\n## Code Before:\\n{before}\\n## Code After:\\n"``
  where ``instr`` is the instruction named by the completion row's ``instr_kind``; output: the recorded
  Qwen2.5-Coder-7B-Instruct completion (the first of 20 per row, or ``completions_per_row`` of them).
- ``summarization``: CNN/DM from FRANK. Prompt ``"{article}\\n\\nSummary:\\n"``; output: the recorded ``bart``
  summary. FRANK stores system summaries PTB-tokenized (``"Locke 's team , 54 ,"``); by default they are
  detokenized back to plain text (``detokenize=False`` keeps them raw), since a deployed model writes plain text.
- ``rag``: Natural Questions (lost-in-the-middle oracle split). Prompt
  ``"Question: {q}\\n\\nPassage: {title}\\n{gold passage}\\n\\nAnswer:\\n"``; output: ``nq_annotated_gold.long_answer``.
- ``agent``: mini-swe-agent trajectories (Gemini 3 Pro, SWE-bench Verified). One trace per assistant turn:
  prompt = every earlier message as ``"<{role}>\\n{content}\\n"`` plus ``"<assistant>\\n"``; output = that turn.
  ``limit`` counts trajectories here (each gives ~20-60 traces), ``max_turns`` caps turns per trajectory.

Pieces of text are tokenized separately and their ids concatenated (a chat template does the same at message
boundaries). Token ids of each distinct piece are cached as pickles under ``benchmarks/.cache/`` (gitignored).

Example (``python benchmarks/traces.py --export DIR`` writes the traces as JSONL for ``lookahead bench``)::

    traces = load_traces("code-edit", limit=20)
    prompt_ids, output_ids = traces[0]
"""
from __future__ import annotations

import ast
import gzip
import hashlib
import json
import os
import pickle
import re
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"
DEFAULT_CACHE_DIR = Path(__file__).resolve().parent / ".cache"
CACHE_VERSION = 2

Trace = tuple[np.ndarray, np.ndarray]
TextTrace = tuple[tuple[str, ...], str]  # (prompt pieces, output text)


def load_tokenizer(data_dir: Path = DEFAULT_DATA_DIR):
    """The GPT-2 byte-level BPE tokenizer from ``<data_dir>/tokenizers/gpt2``."""
    from tokenizers import ByteLevelBPETokenizer

    folder = Path(data_dir) / "tokenizers" / "gpt2"
    return ByteLevelBPETokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))


def _literal(value):
    """Fields stored as Python reprs (lists, dicts) come back as objects."""
    return ast.literal_eval(value) if isinstance(value, str) else value


def _read_jsonl(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


# ---------------------------------------------------------------------------------------------------------------
# Text traces, one function per dataset
# ---------------------------------------------------------------------------------------------------------------

def code_edit_texts(data_dir: Path, limit: int | None = None, completions_per_row: int = 1) -> list[TextTrace]:
    """CanItEdit: instruction then ``before`` code as the prompt, a recorded Qwen2.5-Coder completion as output."""
    folder = Path(data_dir) / "code-edit"
    tasks = {row["full_name"]: row for row in _read_jsonl(folder / "canitedit_105.jsonl")}
    rows = list(_read_jsonl(folder / "qwen2.5-coder-7b-instruct_completions.jsonl"))[:limit]
    texts = []
    for row in rows:
        task = tasks[row["full_name"]]
        prompt = (f"## Instruction:\n{task[row['instr_kind']]}\n## Code Before:\n{task['before']}\n"
                  "## Code After:\n")
        for completion in _literal(row["completions"])[:completions_per_row]:
            texts.append(((prompt,), completion))
    return texts


_PTB_RULES = [
    (re.compile(r"\s+([.,;:!?%)\]}])"), r"\1"),       # "word ." -> "word."
    (re.compile(r"([(\[{$£€])\s+"), r"\1"),            # "( word" / "£ 5" -> "(word" / "£5"
    (re.compile(r"\s+(n't|'s|'re|'ve|'m|'ll|'d)\b", re.IGNORECASE), r"\1"),
    (re.compile(r"``\s*"), '"'),
    (re.compile(r"\s*''"), '"'),
    (re.compile(r"`\s*"), "'"),                          # "` quoted '" -> "'quoted'"
    (re.compile(r"\s+'(?=[\s.,;:!?]|$)"), "'"),
    (re.compile(r"\s+--\s+"), " - "),
]


def detokenize_ptb(text: str) -> str:
    """Undo PTB-style tokenization as stored in FRANK (``"Locke 's team , 54 ."`` -> ``"Locke's team, 54."``)."""
    for pattern, replacement in _PTB_RULES:
        text = pattern.sub(replacement, text)
    return text.strip()


def summarization_texts(data_dir: Path, limit: int | None = None, system: str = "bart",
                        detokenize: bool = True) -> list[TextTrace]:
    """CNN/DM (FRANK): the article as the prompt, a recorded system summary (``bart``) as output."""
    texts = []
    for row in _read_jsonl(Path(data_dir) / "summarization" / "cnndm_frank.jsonl"):
        summary = _literal(row["system_summaries"]).get(system)
        if not summary:
            continue
        summary = detokenize_ptb(summary) if detokenize else summary
        texts.append(((f"{row['article']}\n\nSummary:\n",), summary))
    return texts[:limit]


def rag_texts(data_dir: Path, limit: int | None = None) -> list[TextTrace]:
    """NQ: question and gold passage as the prompt, the annotated long answer (a copied span) as output."""
    texts = []
    for row in _read_jsonl(Path(data_dir) / "rag" / "nq-open-oracle.jsonl.gz"):
        gold = row["nq_annotated_gold"]
        passage = next((c for c in row["ctxs"] if c.get("isgold")), row["ctxs"][0])
        prompt = f"Question: {row['question']}\n\nPassage: {passage['title']}\n{passage['text']}\n\nAnswer:\n"
        texts.append(((prompt,), gold["long_answer"]))
        if limit is not None and len(texts) >= limit:
            break
    return texts


def agent_texts(data_dir: Path, limit: int | None = 10, max_turns: int | None = None) -> list[TextTrace]:
    """SWE-bench agent trajectories: one trace per assistant turn, prompt = all earlier messages.

    ``limit`` is the number of trajectories (file order); ``max_turns`` caps assistant turns per trajectory.
    """
    path = Path(data_dir) / "agent" / "mini-swe-agent_gemini-3-pro_swebench-verified.jsonl.gz"
    texts = []
    for i, row in enumerate(_read_jsonl(path)):
        if limit is not None and i >= limit:
            break
        pieces: list[str] = []
        turns = 0
        for message in row["messages"]:
            content = str(message["content"])
            header = f"<{message['role']}>\n"
            if message["role"] == "assistant" and (max_turns is None or turns < max_turns):
                texts.append((tuple(pieces) + (header,), content))
                turns += 1
            pieces += [header, content, "\n"]  # the output is a piece of later prompts: stored once
    return texts


DATASETS: dict[str, Callable[..., list[TextTrace]]] = {
    "code-edit": code_edit_texts,
    "summarization": summarization_texts,
    "rag": rag_texts,
    "agent": agent_texts,
}


# ---------------------------------------------------------------------------------------------------------------
# Tokenization and caching
# ---------------------------------------------------------------------------------------------------------------

# Tokenized texts: the ids of every distinct piece, and per trace (prompt piece numbers, output piece number).
Tokenized = tuple[list[np.ndarray], list[tuple[tuple[int, ...], int]]]


def tokenize_texts(texts: list[TextTrace], tokenizer) -> Tokenized:
    """Tokenize every distinct piece once (agent prompts share almost all their pieces)."""
    number: dict[str, int] = {}
    pieces: list[np.ndarray] = []

    def encode(piece: str) -> int:
        if piece not in number:
            number[piece] = len(pieces)
            pieces.append(np.asarray(tokenizer.encode(piece).ids, dtype=np.int32))
        return number[piece]

    return pieces, [(tuple(encode(p) for p in prompt), encode(output)) for prompt, output in texts]


def assemble(tokenized: Tokenized) -> list[Trace]:
    """``(prompt_ids, output_ids)`` per trace, each prompt the concatenation of its pieces."""
    pieces, index = tokenized
    empty = np.zeros(0, np.int32)
    return [(np.concatenate([empty, *(pieces[i] for i in prompt)]), pieces[output].copy())
            for prompt, output in index]


def _cache_path(cache_dir: Path, name: str, data_dir: Path, options: dict) -> Path:
    files = [*(data_dir / name).glob("*"), *(data_dir / "tokenizers" / "gpt2").glob("*")]
    stamp = sorted((p.name, p.stat().st_size, int(p.stat().st_mtime)) for p in files if p.is_file())
    key = repr((CACHE_VERSION, name, sorted(options.items()), stamp))
    return Path(cache_dir) / f"{name}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.pkl"


def load_traces(name: str, data_dir: Path | str = DEFAULT_DATA_DIR, limit: int | None = None,
                cache_dir: Path | str | None = DEFAULT_CACHE_DIR, **options) -> list[Trace]:
    """Token traces for dataset ``name`` (one of ``DATASETS``), from the cache when possible.

    Args:
        name: ``"code-edit"``, ``"summarization"``, ``"rag"`` or ``"agent"``.
        data_dir: the shared data folder.
        limit: rows to read (trajectories for ``agent``); ``None`` means the dataset's default (all rows,
            10 trajectories for ``agent``).
        cache_dir: where token traces are pickled; ``None`` disables the cache.
        **options: passed to the dataset's text function (``completions_per_row``, ``detokenize``, ``max_turns``).
    Returns:
        list of ``(prompt_ids, output_ids)``, both 1-D ``np.int32``.
    Raises:
        ValueError: unknown dataset name. FileNotFoundError: data missing.
    """
    if name not in DATASETS:
        raise ValueError(f"dataset must be one of {sorted(DATASETS)}, got {name!r}")
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"data folder not found: {data_dir} (pass --data-dir)")
    if limit is not None:
        options["limit"] = limit
    path = _cache_path(cache_dir, name, data_dir, options) if cache_dir is not None else None
    if path is not None and path.exists():
        with open(path, "rb") as f:
            return assemble(pickle.load(f))
    tokenized = tokenize_texts(DATASETS[name](data_dir, **options), load_tokenizer(data_dir))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(tokenized, f, protocol=pickle.HIGHEST_PROTOCOL)
        tmp.replace(path)
    return assemble(tokenized)


def workload(name: str, data_dir: Path | str = DEFAULT_DATA_DIR, limit: int = 8, max_prompt: int = 1024,
             max_new: int = 160) -> list[Trace]:
    """Traces for timing runs: at most ``limit`` with distinct prompts of at most ``max_prompt`` tokens and outputs of
    at least 16 tokens, cut to ``max_new``. ``"no-copy"`` pairs the first 40 tokens of RAG prompts (the question)
    with unrelated recorded summaries: nothing to copy."""
    from lookahead.bench.forcing import distinct_prompts

    if name == "no-copy":
        questions = load_traces("rag", data_dir=data_dir, limit=4 * limit)
        summaries = load_traces("summarization", data_dir=data_dir, limit=4 * limit)
        pairs = [(q[0][:40], s[1]) for q, s in zip(questions, summaries[::-1])]
    else:
        pairs = load_traces(name, data_dir=data_dir, limit=None if name != "agent" else limit)
    pairs = [(p, o[:max_new]) for p, o in pairs if len(p) <= max_prompt and len(o) >= 16]
    return distinct_prompts(pairs)[:limit]


def export_jsonl(traces: list[Trace], path: Path) -> None:
    """Write traces as ``{"prompt_ids": [...], "output_ids": [...]}`` lines, the format ``lookahead bench`` reads."""
    with open(path, "w", encoding="utf-8") as f:
        for prompt, output in traces:
            f.write(json.dumps({"prompt_ids": prompt.tolist(), "output_ids": output.tolist()}) + "\n")


def main(argv=None) -> None:
    """``python benchmarks/traces.py --export DIR``: one JSONL file of token ids per dataset (``lookahead bench``)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--export", type=Path, required=True, help="folder to write <dataset>.jsonl into")
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument("--limit", type=int, default=None, help="rows per dataset (trajectories for agent)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args(argv)
    args.export.mkdir(parents=True, exist_ok=True)
    for name in args.datasets:
        traces = load_traces(name, args.data_dir, args.limit)
        export_jsonl(traces, args.export / f"{name}.jsonl")
        print(f"{args.export / f'{name}.jsonl'}: {len(traces)} traces")


if __name__ == "__main__":
    main()
