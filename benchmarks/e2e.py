"""End-to-end wall clock on this machine: plain greedy, Hugging Face prompt lookup and lookahead, same workload.

The target is a random-weight Llama of GPT-2-small shape (12 layers, hidden 768, GPT-2 vocabulary) whose greedy
choice is forced to replay recorded outputs (`lookahead.bench.ForcedReplay`): the forwards are real, the acceptance
pattern is that of the model that wrote the trace.

    python benchmarks/e2e.py --datasets code-edit summarization no-copy --limit 8 --batch 8
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from traces import DEFAULT_DATA_DIR, load_traces  # noqa: E402

from lookahead import generate  # noqa: E402
from lookahead.bench import ForcedReplay  # noqa: E402

EOS = PAD = 50256  # GPT-2's <|endoftext|>: never inside the recorded texts


def gpt2_small_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=50257, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                         num_attention_heads=12, max_position_embeddings=8192, bos_token_id=EOS, eos_token_id=EOS,
                         pad_token_id=PAD)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def workload(name: str, data_dir: Path, limit: int, max_prompt: int, max_new: int) -> list:
    """(prompt, output) pairs; `no-copy` pairs RAG questions with unrelated recorded summaries."""
    if name == "no-copy":
        questions = load_traces("rag", data_dir=data_dir, limit=4 * limit)
        summaries = load_traces("summarization", data_dir=data_dir, limit=4 * limit)
        pairs = [(q[0][:40], s[1]) for q, s in zip(questions, summaries[::-1])]
    else:
        pairs = load_traces(name, data_dir=data_dir, limit=4 * limit)
    pairs = [(p, o[:max_new]) for p, o in pairs if len(p) <= max_prompt and len(o) >= 16]
    return pairs[:limit]


def run_methods(model, pairs, methods, batch: int) -> dict:
    """Seconds and new tokens per method over the pairs, in batches; checks that all methods agree."""
    forced = ForcedReplay(pairs, pad_token_id=PAD, eos_token_id=EOS)
    totals = {m: [0.0, 0] for m in methods}
    for start in tqdm(range(0, len(pairs), batch), desc="batches", leave=False):
        chunk = pairs[start:start + batch]
        ids, mask = _left_pad([p for p, _ in chunk])
        max_new = max(len(o) for _, o in chunk) + 1
        outs = {}
        for method in methods:
            t0 = time.perf_counter()
            outs[method] = METHODS[method](model, ids, mask, max_new, forced)
            totals[method][0] += time.perf_counter() - t0
            totals[method][1] += int((outs[method][:, ids.shape[1]:] != PAD).sum())
        ref = outs[methods[0]]
        for method, out in outs.items():
            assert torch.equal(out, ref), f"{method} differs from {methods[0]}"
    return totals


def _left_pad(prompts):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.from_numpy(np.asarray(p, dtype=np.int64))
        mask[i, width - len(p):] = 1
    return ids, mask


def _hf(model, ids, mask, max_new, forced, **kw):
    from transformers import LogitsProcessorList

    return model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new, eos_token_id=EOS,
                          pad_token_id=PAD, logits_processor=LogitsProcessorList([forced]), **kw)


def _ours(model, ids, mask, max_new, forced, **kw):
    return generate(model, ids, attention_mask=mask, max_new_tokens=max_new, eos_token_id=EOS, pad_token_id=PAD,
                    logits_processor=forced, **kw)


METHODS = {
    "greedy": _hf,
    "hf-prompt-lookup": lambda *a: _hf(*a, prompt_lookup_num_tokens=10),
    "lookahead-none": lambda *a: _ours(*a, lookup="none"),
    "lookahead-ngram": lambda *a: _ours(*a, lookup="ngram", max_ngram=4),
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["code-edit", "summarization", "no-copy"])
    parser.add_argument("--methods", nargs="+", default=["greedy", "hf-prompt-lookup", "lookahead-ngram"])
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--batch", type=int, default=0, help="also run greedy vs lookahead at this batch size")
    parser.add_argument("--max-prompt", type=int, default=1024)
    parser.add_argument("--max-new", type=int, default=160)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args(argv)
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    model = gpt2_small_llama()
    print(f"| dataset | batch | {' | '.join(args.methods)} | speedup vs greedy | lookahead / HF lookup speedup |")
    print(f"|---|---|{'---|' * len(args.methods)}---|---|")
    for name in args.datasets:
        pairs = workload(name, args.data_dir, args.limit, args.max_prompt, args.max_new)
        _report(name, 1, run_methods(model, pairs[:1], args.methods, 1), args.methods, warm=True)
        _report(name, 1, run_methods(model, pairs, args.methods, 1), args.methods)
        if args.batch > 1:
            methods = [m for m in args.methods if m != "hf-prompt-lookup"]
            _report(name, args.batch, run_methods(model, pairs, methods, args.batch), methods)


def _report(name, batch, totals, methods, warm=False) -> None:
    if warm:
        return
    tps = {m: totals[m][1] / totals[m][0] for m in methods}
    cells = " | ".join(f"{tps[m]:.1f} tok/s" if m in tps else "-" for m in methods)
    ours = tps.get("lookahead-ngram", 0.0)
    speedup = ours / tps["greedy"]
    vs_hf = f"{speedup / (tps['hf-prompt-lookup'] / tps['greedy']):.2f}" if "hf-prompt-lookup" in tps else "-"
    print(f"| {name} | {batch} | {cells} | {speedup:.2f}x | {vs_hf} |", flush=True)


if __name__ == "__main__":
    main()
