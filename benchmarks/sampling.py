"""Sampling beside greedy: acceptance rate and tokens per forward at temperature 0.7 and 1.0, for n-gram chains,
suffix-index chains and suffix-index trees (sampled over sibling nodes, `lookahead/verify/tree.py`).

A target cannot be forced to a recorded *distribution*, so each workload samples from a model's own distribution,
with a high-copy prompt: the prompt holds the very text the model would write next (its own greedy continuation),
then repeats the tail that preceded it, so the index drafts exactly what greedy decoding would write.

- code-edit: the recorded CanItEdit prompts (GPT-2 tokens) and a random-weight Llama (4 layers, hidden 256).
- stories: the real pretrained stories260K Llama (../shared/models), its own greedy story as the prompt.

    python benchmarks/sampling.py --limit 8 --max-new 128 --threads 1
    python benchmarks/sampling.py --workloads stories --threads 1 --draft-cost 0   # as if verification were free
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from traces import DEFAULT_DATA_DIR, load_traces

import lookahead
from lookahead import GenerationStats
from lookahead.bench.arguments import positive_int

STORIES = DEFAULT_DATA_DIR.parent / "models" / "stories260K"
DECODINGS = {"greedy": {}, "T=0.7": dict(do_sample=True, temperature=0.7, top_k=0),
             "T=1.0": dict(do_sample=True, temperature=1.0, top_k=0)}
DRAFTS = {"ngram chain": {}, "suffix chain": dict(lookup="suffix"), "suffix tree": dict(lookup="suffix", draft="tree")}


def random_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=50257, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         bos_token_id=50256, eos_token_id=50256, pad_token_id=50256)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def high_copy(model, prompt: torch.Tensor, max_new: int, tail: int = 32) -> torch.Tensor:
    """prompt + the model's own greedy continuation + the prompt's last `tail` tokens again."""
    own = model.generate(prompt, do_sample=False, max_new_tokens=max_new, eos_token_id=None)[:, prompt.shape[1]:]
    return torch.cat([prompt, own, prompt[:, -tail:]], dim=1)


def workloads(name: str, limit: int, max_new: int, data_dir: Path):
    """(model, high-copy prompts) for a workload."""
    if name == "code-edit":
        model = random_llama()
        prompts = [torch.tensor(p[-600:], dtype=torch.long)[None] for p, _ in load_traces("code-edit", data_dir,
                                                                                           limit=limit)]
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(STORIES).eval()
        starts = torch.randint(3, 512, (limit,), generator=torch.Generator().manual_seed(0))
        prompts = [torch.tensor([[1, int(s)]]) for s in starts]
    return model, [high_copy(model, p, max_new) for p in prompts]


def measure(model, prompts, max_new: int, decoding: dict) -> GenerationStats:
    total = GenerationStats()
    for seed, ids in enumerate(prompts):
        _, stats = lookahead.generate(model, ids, max_new_tokens=max_new, eos_token_id=[], generator=seed,
                                      return_stats=True, **decoding)
        for field in ("forward_passes", "row_forwards", "new_tokens", "draft_tokens", "accepted_tokens"):
            setattr(total, field, getattr(total, field) + getattr(stats, field))
    return total


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["code-edit", "stories"])
    parser.add_argument("--limit", type=positive_int, default=8)
    parser.add_argument("--max-new", type=positive_int, default=128)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--drafts", nargs="+", default=list(DRAFTS), choices=list(DRAFTS))
    parser.add_argument("--draft-cost", type=float, default=None, help="lookahead's draft_cost (default: its own)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print("| workload | draft | decoding | acceptance rate | tokens per forward | draft tokens per step |")
    print("|---|---|---|---|---|---|")
    for name in args.workloads:
        model, prompts = workloads(name, args.limit, args.max_new, args.data_dir)
        for draft in args.drafts:
            for label, decoding in DECODINGS.items():
                s = measure(model, prompts, args.max_new, {**DRAFTS[draft], **decoding, "draft_cost": args.draft_cost})
                steps = max(s.forward_passes - len(prompts), 1)  # verification steps (one prefill per prompt)
                print(f"| {name} | {draft} | {label} | {s.acceptance_rate:.3f} | {s.tokens_per_forward:.2f} | "
                      f"{s.draft_tokens / steps:.1f} |", flush=True)


if __name__ == "__main__":
    main()
