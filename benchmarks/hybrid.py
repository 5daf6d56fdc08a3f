"""Hybrid models on a CPU (issue 46): a random-weight model shaped like a small Qwen3.5 (hidden 1024, gated delta net
on 3 of 4 layers) against the same shape with every layer attention, both forced to replay recorded outputs
(`lookahead.bench.forcing.ForcedOutputs`), on code edits and summaries: speedup of `lookahead.generate` (defaults)
over `model.generate` greedy for each (whole calls, and their decoding alone: less a one-token greedy call's time,
the prefill both pay alike), the hybrid's speedup as a share of the attention model's, and the share of the hybrid's
call spent taking checkpoints and settling recurrent states on the accepted path.

    python benchmarks/hybrid.py                      # 4 traces per workload, 512-token contexts, 128 new tokens
    python benchmarks/hybrid.py --traces 2 --max-new 32 --layers 4   # a quick look
    python benchmarks/hybrid.py --shape recurrent_gemma               # Griffin blocks (RecurrentGemma) instead
    python benchmarks/hybrid.py --shape deepseek_v4                   # DeepSeek-V4's compressed attention
    python benchmarks/hybrid.py --shape xlstm                         # xLSTM (mLSTM layers only) against a Llama
    python benchmarks/hybrid.py --shape rwkv                          # RWKV (its `state`, no cache) against a Llama
    python benchmarks/hybrid.py --cache static                        # lookahead on the static cache (eager)

Each trace runs greedy and lookahead in turn, on both models, so drift in the machine's speed falls on all alike.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

EOS, VOCAB = 50256, 50257  # GPT-2's <|endoftext|>: never inside the recorded texts
WORKLOADS = ("code-edit", "summarization")


def model(kind: str, layers: int, shape: str = "qwen3_5"):
    """A random model of hidden 1024: "hybrid" (recurrent on 3 of every 4 layers) or "attention" (every layer),
    shaped like Qwen3.5-text (gated delta nets) or RecurrentGemma (Griffin blocks: a convolution and the RG-LRU)."""
    if shape == "recurrent_gemma":
        return griffin(kind, layers)
    if shape == "deepseek_v4":
        return deepseek_v4(kind, layers)
    if shape == "xlstm":
        return xlstm(kind, layers)
    if shape == "rwkv":
        return rwkv(kind, layers)
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * (layers // 4)
    if kind == "attention":
        types = ["full_attention"] * len(types)
    config = Qwen3_5TextConfig(vocab_size=VOCAB, hidden_size=1024, intermediate_size=3584, num_hidden_layers=len(types),
                               num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                               linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
                               layer_types=types, tie_word_embeddings=True, max_position_embeddings=4096,
                               bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS)
    torch.manual_seed(0)
    return Qwen3_5ForCausalLM(config).eval()


def deepseek_v4(kind: str, layers: int):
    """A random DeepSeek-V4 of hidden 1024 (8 heads of 128, window 128, 8 experts of 512, 2 per token): compressed
    sparse and heavily compressed attention in turns ("hybrid": entries every 4 and 128 tokens, an indexer keeping 64)
    or sliding-window attention alone ("attention")."""
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    types = ["compressed_sparse_attention", "heavily_compressed_attention"] * (layers // 2) if kind == "hybrid" \
        else ["sliding_attention"] * layers
    config = DeepseekV4Config(vocab_size=VOCAB, hidden_size=1024, num_hidden_layers=layers, layer_types=types,
                              num_attention_heads=8, head_dim=128, q_lora_rank=256, o_lora_rank=256, o_groups=2,
                              index_n_heads=8, index_head_dim=64, index_topk=64, n_routed_experts=8,
                              num_experts_per_tok=2, moe_intermediate_size=512, intermediate_size=512,
                              sliding_window=128, max_position_embeddings=4096, bos_token_id=EOS, eos_token_id=EOS,
                              pad_token_id=EOS)
    torch.manual_seed(0)
    return DeepseekV4ForCausalLM(config).eval()


def xlstm(kind: str, layers: int):
    """A random xLSTM of hidden 1024 (8 heads; every block an mLSTM layer and a feed-forward of 2752): its states in
    its own cache ("hybrid"), or a Llama of the same hidden size, layers and feed-forward ("attention"). Query-key
    heads as wide as the value heads: transformers 5.24's own generate fails on narrower ones."""
    from transformers import LlamaConfig, LlamaForCausalLM, xLSTMConfig, xLSTMForCausalLM

    torch.manual_seed(0)
    if kind == "attention":
        return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=1024, intermediate_size=2752,
                                            num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
                                            max_position_embeddings=4096, bos_token_id=EOS, eos_token_id=EOS,
                                            pad_token_id=EOS)).eval()
    config = xLSTMConfig(vocab_size=VOCAB, hidden_size=1024, num_hidden_layers=layers, num_heads=8, qk_dim_factor=1.0,
                         bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS)
    return xLSTMForCausalLM(config).eval()


def rwkv(kind: str, layers: int):
    """A random RWKV of hidden 1024 (time mixing of 1024, channel mixing of 4096: about a Llama's parameters per
    block), or a Llama of the same hidden size, layers and a feed-forward of 2752 ("attention")."""
    from transformers import RwkvConfig, RwkvForCausalLM

    if kind == "attention":
        return xlstm(kind, layers)
    torch.manual_seed(0)
    config = RwkvConfig(vocab_size=VOCAB, hidden_size=1024, attention_hidden_size=1024, intermediate_size=4096,
                        num_hidden_layers=layers, context_length=4096, bos_token_id=EOS, eos_token_id=EOS,
                        pad_token_id=EOS)
    return RwkvForCausalLM(config).eval()


def griffin(kind: str, layers: int):
    """A random RecurrentGemma of hidden 1024 (RG-LRU width 1024, 8 heads, one key/value head, window 2048): Griffin
    blocks on 3 of every 4 layers ("hybrid") or on none ("attention")."""
    from transformers import RecurrentGemmaConfig, RecurrentGemmaForCausalLM

    types = ["recurrent", "recurrent", "attention", "recurrent"] if kind == "hybrid" else ["attention"]
    config = RecurrentGemmaConfig(vocab_size=VOCAB, hidden_size=1024, lru_width=1024, intermediate_size=3584 * 2,
                                  num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=1,
                                  head_dim=128, attention_window_size=2048, block_types=types, bos_token_id=EOS,
                                  eos_token_id=EOS, pad_token_id=EOS)
    torch.manual_seed(0)
    return RecurrentGemmaForCausalLM(config).eval()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(models: dict, workloads: dict, max_new: int, **options) -> dict:
    """{(model, workload): {"greedy": [s], "lookahead": [s], "prefill": [s], "tpf": [...], "recurrent": [s]}},
    trace by trace ("prefill": a greedy call of one new token); `options`: lookahead.generate's own (the cache)."""
    import lookahead
    from lookahead.bench.forcing import ForcedOutputs

    results = {}
    prompt = torch.as_tensor(next(iter(workloads.values()))[0][0], dtype=torch.long)[None]
    for m in models.values():  # measures each model's draft cost curve (kept on disk) and loads the kernels; the
        lookahead.generate(m, prompt, max_new_tokens=8, **options)  # the first greedy call of a hybrid loads
        # transformers' fallbacks
        m.generate(prompt, do_sample=False, max_new_tokens=8)
    for workload, traces in workloads.items():
        for prompt, output in traces:
            for name, m in models.items():
                forced = ForcedOutputs([(prompt, output)], eos_token_id=EOS)
                handle = forced.attach(m)
                ids = torch.as_tensor(prompt, dtype=torch.long)[None]
                try:
                    forced.reset()
                    prefill = timed(lambda: m.generate(ids, do_sample=False, max_new_tokens=1))
                    forced.reset()
                    greedy = timed(lambda: m.generate(ids, do_sample=False, max_new_tokens=max_new))
                    forced.reset()
                    stats = {}
                    seconds = timed(lambda: stats.setdefault("s", lookahead.generate(
                        m, ids, max_new_tokens=max_new, return_stats=True, **options)[1]))
                finally:
                    handle.remove()
                row = results.setdefault((name, workload), {"greedy": [], "lookahead": [], "prefill": [], "tpf": [],
                                                            "recurrent": []})
                row["greedy"].append(greedy)
                row["prefill"].append(prefill)
                row["lookahead"].append(seconds)
                row["tpf"].append(stats["s"].tokens_per_forward)
                row["recurrent"].append(stats["s"].seconds.get("recurrent", 0.0))
                print(f"{name:9s} {workload:13s} prefill {prefill:5.2f} s  greedy {greedy:6.2f} s  lookahead {seconds:6.2f} s  "
                      f"{stats['s'].tokens_per_forward:.2f} tok/fwd", flush=True)
    return results


def speedups(r: dict) -> tuple:
    """(whole calls, decoding alone) speedup of lookahead over greedy, summed over the traces."""
    greedy, ours, prefill = sum(r["greedy"]), sum(r["lookahead"]), sum(r["prefill"])
    return greedy / ours, (greedy - prefill) / (ours - prefill)


def table(results: dict) -> str:
    lines = ["| workload | model | prefill s | greedy s | lookahead s | speedup: call; decoding | tokens/forward | "
             "recurrent states |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (name, workload), r in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        call, decoding = speedups(r)
        share = sum(r["recurrent"]) / sum(r["lookahead"])
        lines.append(f"| {workload} | {name} | {sum(r['prefill']):.1f} | {sum(r['greedy']):.1f} | "
                     f"{sum(r['lookahead']):.1f} | {call:.2f}x; {decoding:.2f}x | {statistics.mean(r['tpf']):.2f} | "
                     f"{share:.1%} of the call |")
    for workload in sorted({w for _, w in results}):
        (hc, hd), (ac, ad) = speedups(results[("hybrid", workload)]), speedups(results[("attention", workload)])
        lines.append(f"\n{workload}: the hybrid's speedup is {hc / ac:.0%} of the attention model's "
                     f"(decoding alone: {hd / ad:.0%})")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=4, help="traces per workload (default 4)")
    parser.add_argument("--context", type=int, default=512, help="longest prompt in tokens (default 512)")
    parser.add_argument("--max-new", type=int, default=128, help="new tokens per call (default 128)")
    parser.add_argument("--layers", type=int, default=4, help="layers, a multiple of 4 (default 4)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--data-dir", default=None, help="../shared/data by default")
    parser.add_argument("--shape", default="qwen3_5", choices=("qwen3_5", "recurrent_gemma", "deepseek_v4", "xlstm", "rwkv"),
                        help="the hybrid's recurrent layers: gated delta nets (qwen3_5, default), Griffin blocks, "
                             "DeepSeek-V4's compressed attention against its sliding window alone, or xLSTM's and "
                             "RWKV's recurrent blocks against a Llama")
    parser.add_argument("--cache", default=None, choices=("static",),
                        help="lookahead's cache_implementation (default: the dynamic cache; greedy keeps its own)")
    args = parser.parse_args(argv)
    from traces import DEFAULT_DATA_DIR, workload

    torch.set_num_threads(args.threads)
    data = Path(args.data_dir) if args.data_dir else DEFAULT_DATA_DIR
    workloads = {w: workload(w, data, args.traces, args.context, args.max_new) for w in WORKLOADS}
    models = {kind: model(kind, args.layers, args.shape) for kind in ("hybrid", "attention")}
    with torch.inference_mode():
        results = run(models, workloads, args.max_new, **({"cache_implementation": args.cache} if args.cache else {}))
    print(table(results))


if __name__ == "__main__":
    main()
