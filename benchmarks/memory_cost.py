"""What a `Memory` costs a call: building each row's index, with the memory rebuilt into every row's index (as
generate did) or copied from the memory's own index (`lookahead.index.row_indexes`), and without memory.

Batch 8, prompts of 64 tokens, a memory of 200k tokens in pieces of 2,000 (random ids in which spans recur,
`lookahead.bench.index_speed.synthetic_pool`). Per call: the row indexes, then the 8 rows' prompts and one new
token each added to the memory (which extends its indexes). With --generate, also `lookahead.generate` on a tiny
random Llama (batch 8, one new token) as it stands, with and without the memory.

    python benchmarks/memory_cost.py
    python benchmarks/memory_cost.py --memory-tokens 200000 --calls 5 --generate
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from lookahead import Memory
from lookahead.bench.index_speed import synthetic_pool
from lookahead.index import NgramIndex, SuffixIndex, row_indexes

BATCH, PROMPT, PIECE, VOCAB = 8, 64, 2000, 32000


def rebuilt_per_row(lookup: str, sources: list, memory: Memory) -> list:
    """Each row's index built from every piece the memory holds: what generate did before the memory kept indexes."""
    indexes = []
    for source in sources:
        index = NgramIndex(4, 1) if lookup == "ngram" else SuffixIndex()
        pieces = memory.documents()[0] if len(memory) else []
        for piece in pieces:
            index.extend(piece)
        if pieces and lookup == "suffix":
            index.begin_request()
        index.extend(source)
        indexes.append(index)
    return indexes


def one_call(build, lookup: str, sources: list, memory: Memory | None) -> float:
    """Seconds to build the row indexes of one call, then remember its rows (prompt + one token each)."""
    start = time.perf_counter()
    build(lookup, sources, memory)
    if memory is not None:
        for source in sources:
            memory.add_tokens(np.append(source, source[0]))
    return time.perf_counter() - start


def measure(pool: np.ndarray, memory_tokens: int, calls: int) -> dict:
    """{(lookup, method): (first call s, median of the later calls s)}, methods interleaved call by call."""
    methods = {"no memory": lambda lookup, sources, memory: row_indexes(lookup, 4, 1, sources),
               "memory, rebuilt per row (before)": rebuilt_per_row,
               "memory, row_indexes (after)": lambda lookup, sources, memory: row_indexes(lookup, 4, 1, sources,
                                                                                        memory=memory)}
    rng, results = np.random.default_rng(0), {}
    for lookup in ("ngram", "suffix"):
        memories = {}
        for name in methods:
            memories[name] = None if name == "no memory" else Memory(max_tokens=2 * memory_tokens)
            for start in range(0, memory_tokens if memories[name] is not None else 0, PIECE):
                memories[name].add_tokens(pool[start:start + PIECE])
        times = {name: [] for name in methods}
        for _ in range(calls):
            starts = rng.integers(0, len(pool) - PROMPT, BATCH)
            sources = [pool[s:s + PROMPT] for s in starts]
            for name, build in methods.items():
                times[name].append(one_call(build, lookup, sources, memories[name]))
        for name, seconds in times.items():
            results[lookup, name] = (seconds[0], float(np.median(seconds[1:] or seconds)))
    return results


def generate_cost(pool: np.ndarray, memory_tokens: int, calls: int) -> dict:
    """{label: median seconds} of `lookahead.generate` (batch 8, one new token) on a tiny random Llama."""
    import torch
    import transformers as T

    from lookahead import generate

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = T.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = T.AutoModelForCausalLM.from_config(config).eval()
    memory = Memory(max_tokens=2 * memory_tokens)
    for start in range(0, memory_tokens, PIECE):
        memory.add_tokens(pool[start:start + PIECE])
    rng, results = np.random.default_rng(1), {}
    for label, mem in (("generate, no memory", None), ("generate, 200k-token memory", memory)):
        for lookup in ("ngram", "suffix"):
            seconds = []
            for _ in range(calls):
                ids = torch.as_tensor(np.stack([pool[s:s + PROMPT] for s in rng.integers(0, len(pool) - PROMPT,
                                                                                           BATCH)]))
                start = time.perf_counter()
                generate(model, ids, lookup=lookup, max_new_tokens=1, memory=mem, pad_token_id=0)
                seconds.append(time.perf_counter() - start)
            results[f"{label} ({lookup})"] = float(np.median(seconds[1:] or seconds))
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memory-tokens", type=int, default=200_000)
    parser.add_argument("--calls", type=int, default=5, help="calls per method (the first builds the memory's index)")
    parser.add_argument("--generate", action="store_true", help="also time lookahead.generate end to end")
    args = parser.parse_args(argv)
    pool = synthetic_pool(args.memory_tokens + 10 * PIECE, vocab=VOCAB)
    SuffixIndex(), NgramIndex()  # compile or load the kernels before timing
    results = measure(pool, args.memory_tokens, args.calls)
    print(f"\nRow indexes of one call (batch {BATCH}, prompts of {PROMPT} tokens, a memory of "
          f"{args.memory_tokens:,} tokens), then its rows added to the memory: seconds, first call / median of "
          f"the next {args.calls - 1}\n")
    print("| lookup | method | first call | later calls |\n| --- | --- | ---: | ---: |")
    for (lookup, name), (first, later) in results.items():
        print(f"| {lookup} | {name} | {first:.4f} | {later:.4f} |")
    if args.generate:
        print("\n| lookahead.generate (batch 8, 1 new token, tiny Llama) | median seconds |\n| --- | ---: |")
        for label, seconds in generate_cost(pool, args.memory_tokens, args.calls).items():
            print(f"| {label} | {seconds:.4f} |")


if __name__ == "__main__":
    main()
