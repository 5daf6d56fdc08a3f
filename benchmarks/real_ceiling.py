"""What any draft sizing could reach with copy drafts on a real model on this CPU: a hindsight bound beside
`lookahead bench real`'s figures.

For each of `bench real`'s prompts (SmolLM2-135M-Instruct, fp32, greedy): the greedy output; the cost of verifying
k drafts at that prompt's context, measured (`calibrate.forward_times`, in one-token forwards); and at every position
of the output the tokens the index's draft (a chain of up to 32, or a best-first tree of 32 nodes) would have got
accepted. A sizing policy that knew the acceptance in advance would draft exactly the accepted tokens: the fewest
one-token-forward equivalents to write the output is then a shortest path (from each position, draft k <= accepted,
pay costs[k], move k + 1). Whole-call ceiling = (prefill + greedy's per-token seconds x that cost) against greedy's
measured seconds; its ratio to HF prompt lookup's measured speedup (from a `bench real` output file) bounds what a
copying method can show against prompt lookup here, with no loop overhead at all.

    lookahead bench real --output real.jsonl          # the measured speedups
    python benchmarks/real_ceiling.py real.jsonl
    lookahead bench real --workloads agent --prompts 12 --output agent12.jsonl
    python benchmarks/real_ceiling.py agent12.jsonl --index ngram        # sums over the file's prompts per workload
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from lookahead import NgramIndex, SuffixIndex, models
from lookahead.bench.real import _until_eos
from lookahead.bench.real_cli import _eos
from lookahead.bench.real_workloads import WORKLOADS, load
from lookahead.decode.calibrate import forward_times, widths
from lookahead.decode.policy import CostCurve

SIZES = tuple(widths(33))  # what `draft_cost="auto"` times; steps pad past the others


def accepted(index_tokens: list, output: list, tree: bool, index_kind: str = "suffix") -> list:
    """Per output position p: how many of the draft proposed after prompt + output[:p] equal output[p:] (chains
    from `index_kind`'s index, trees from the suffix index)."""
    index = NgramIndex() if index_kind == "ngram" and not tree else SuffixIndex()
    index.extend(np.asarray(index_tokens, np.int64))
    out = []
    for p in range(len(output)):
        if tree:
            draft = index.propose_tree(32)
            tokens, parents = draft.tokens, draft.parents
            depth, node = 0, -1
            while True:  # follow the children that match the output
                kids = [i for i in range(len(tokens)) if parents[i] == node and p + depth < len(output)
                        and tokens[i] == output[p + depth]]
                if not kids:
                    break
                node, depth = kids[0], depth + 1
            out.append(depth)
        else:
            draft = index.propose(32).tolist()
            n = 0
            while n < len(draft) and p + n < len(output) and draft[n] == output[p + n]:
                n += 1
            out.append(n)
        index.extend(np.asarray([output[p]], np.int64))
    return out


def shortest(acc: list, costs: CostCurve) -> float:
    """The fewest one-token-forward equivalents to write the output, drafting at most acc[p] at position p."""
    n = len(acc)
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    for p in range(n):
        for k in range(acc[p] + 1):
            q = min(p + k + 1, n)
            best[q] = min(best[q], best[p] + float(costs(k)))
    return float(best[n])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="a `lookahead bench real` output file (the measured speedups)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--index", choices=("suffix", "ngram"), default="suffix",
                        help="the index whose chains bound the chain ceiling (trees: always the suffix index)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows, configs = {}, {}
    with open(args.results) as f:
        for line in f:
            record = json.loads(line)
            rows[record["workload"]] = {r["method"]: r for r in record["rows"]}
            configs[record["workload"]] = record["config"]
    model, tok, _ = models.load("smollm2")
    eos = _eos(model)
    print("| workload | prompts | prompt tokens | c(1) c(2) c(4) c(11) c(33) | greedy s | HF lookup | chain ceiling | "
          "tree ceiling | best measured lookahead | chain, tree ceiling ÷ HF |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for workload in [w for w in WORKLOADS if w in rows]:
        measured = rows[workload]
        greedy = measured["hf-greedy"]
        config = configs[workload]
        items = load([workload], tok, config["prompts"], config["max_prompt"])[workload]
        costs, prompt_tokens, new_tokens, first = np.zeros(2), 0, 0, None  # first: the first prompt's curve (printed)
        for item in items:
            ids = item.input_ids
            with torch.inference_mode():
                out = model.generate(torch.as_tensor(ids)[None], max_new_tokens=config["max_new"], do_sample=False,
                                     eos_token_id=eos, pad_token_id=eos)
            output = _until_eos(out[0, len(ids):].tolist(), eos)
            times = forward_times(model, SIZES, context=len(ids) + len(output) // 2)
            curve = CostCurve([times[n] / times[1] if n in times else np.inf for n in range(1, 34)])
            first = curve.costs if first is None else first
            for j, tree in enumerate((False, True)):  # the first token comes from the prefill
                costs[j] += shortest(accepted(list(ids), output, tree, args.index)[1:], curve)
            prompt_tokens, new_tokens = prompt_tokens + len(ids), new_tokens + len(output)
        if new_tokens != greedy["new_tokens"]:
            raise RuntimeError(f"{workload}: greedy wrote {new_tokens} tokens here, {greedy['new_tokens']} in "
                               f"{args.results} (another model or max_new?)")
        per_token = (greedy["seconds"] - greedy["prefill"]) / max(new_tokens - len(items), 1)
        ceilings = [greedy["seconds"] / (greedy["prefill"] + per_token * c) for c in costs]
        speed = {m: greedy["seconds"] / r["seconds"] for m, r in measured.items()}
        hf = speed["hf-prompt-lookup-2"]
        ours = max(v for m, v in speed.items() if m.startswith("lookahead"))
        print(f"| {workload} | {len(items)} | {prompt_tokens} | {first[0]:.2f} {first[1]:.2f} {first[3]:.2f} "
              f"{first[10]:.2f} {first[32]:.2f} | {greedy['seconds']:.2f} | {hf:.2f}x | {ceilings[0]:.2f}x | "
              f"{ceilings[1]:.2f}x | {ours:.2f}x | {ceilings[0] / hf:.2f}, {ceilings[1] / hf:.2f} |", flush=True)


if __name__ == "__main__":
    main()
