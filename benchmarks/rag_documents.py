"""RAG documents: a retrieved passage given only as a document (not in the prompt) still drafts the answer.

Natural Questions (lost-in-the-middle oracle split): the answer is the annotated long answer, a span copied from the
gold passage. A small random-weight Llama (GPT-2 vocabulary) is forced to replay that answer
(`lookahead.bench.ForcedReplay`), so the numbers are those of a model that copies from the passage. Three ways to
run the same question:

- passage in prompt: "Question: q / Passage: title, text / Answer:" (the usual RAG prompt; the model reads it)
- passage as document: prompt "Question: q / Answer:", `documents=[passage]` (the index reads it, the model not)
- no passage: prompt "Question: q / Answer:" (nothing to copy from but the question and the answer so far)

    python benchmarks/rag_documents.py --limit 50
"""
from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import numpy as np
import torch

from traces import DEFAULT_DATA_DIR, load_tokenizer

from lookahead import GenerationStats, generate
from lookahead.bench import ForcedReplay

EOS = PAD = 50256
CUE = [33706, 25, 198]  # "Answer:\n" in GPT-2 tokens


def nq_rows(data_dir: Path, limit: int, max_answer: int) -> list:
    """(question ids, passage ids, answer ids) per NQ row, distinct questions only."""
    tok = load_tokenizer(data_dir)
    rows, seen = [], set()
    with gzip.open(Path(data_dir) / "rag" / "nq-open-oracle.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["question"] in seen:
                continue
            seen.add(row["question"])
            passage = next((c for c in row["ctxs"] if c.get("isgold")), row["ctxs"][0])
            question = tok.encode(f"Question: {row['question']}\n\n").ids
            text = tok.encode(f"Passage: {passage['title']}\n{passage['text']}\n\n").ids
            answer = tok.encode(row["nq_annotated_gold"]["long_answer"]).ids[:max_answer]
            rows.append((question, text, answer))
            if len(rows) >= limit:
                break
    return rows


def small_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=50257, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=4096, bos_token_id=EOS, eos_token_id=EOS,
                         pad_token_id=PAD)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def measure(model, rows, setting: str) -> tuple:
    """(GenerationStats summed over rows, prompt tokens per row) for one way of giving the passage."""
    cue = CUE
    prompts = [q + p + cue if setting == "passage in prompt" else q + cue for q, p, _ in rows]
    forced = ForcedReplay([(prompt, a) for prompt, (_, _, a) in zip(prompts, rows)], pad_token_id=PAD,
                          eos_token_id=EOS)
    total = GenerationStats()
    for prompt, (_, passage, answer) in zip(prompts, rows):
        docs = [passage] if setting == "passage as document" else None
        ids = torch.tensor(prompt, dtype=torch.long)[None]
        _, stats = generate(model, ids, max_new_tokens=len(answer) + 1, eos_token_id=EOS, pad_token_id=PAD,
                            logits_processor=forced, documents=docs, return_stats=True)
        for field in ("forward_passes", "row_forwards", "new_tokens", "draft_tokens", "accepted_tokens"):
            setattr(total, field, getattr(total, field) + getattr(stats, field))
    return total, float(np.mean([len(p) for p in prompts]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--max-answer", type=int, default=160)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = nq_rows(args.data_dir, args.limit, args.max_answer)
    model = small_llama()
    print(f"NQ questions: {len(rows)}, answer tokens per question: {np.mean([len(a) for *_, a in rows]):.0f}\n")
    print("| setting | prompt tokens | draft tokens | accepted | acceptance rate | tokens per forward |")
    print("|---|---|---|---|---|---|")
    for setting in ("passage in prompt", "passage as document", "no passage"):
        s, prompt_len = measure(model, rows, setting)
        print(f"| {setting} | {prompt_len:.0f} | {s.draft_tokens} | {s.accepted_tokens} | {s.acceptance_rate:.3f} | "
              f"{s.tokens_per_forward:.2f} |", flush=True)


if __name__ == "__main__":
    main()
