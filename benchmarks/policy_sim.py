"""Draft sizing replayed on real outputs: the shipped chain policy (`DraftLength`: one acceptance rate per match
length, the geometric model) against a two-rate model (the first draft token's acceptance apart from the
continuation's), on SmolLM2-135M-Instruct's greedy answers to `bench real`'s prompts, costs from the measured curve.

Each position's draft (the index's chain of up to 32 after prompt + output so far) and how much of it the target
accepts are fixed by the output, so a policy's choices can be replayed without the model: a step drafting k tokens
where a are accepted gains min(k, a) + 1 tokens and costs the curve's cost of k. Printed: each policy's cost in
one-token forwards to write each output (the prefill apart), and their ratio.

    python benchmarks/policy_sim.py                       # all 17 workloads, the n-gram index
    python benchmarks/policy_sim.py --index suffix --workloads rag agent
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from lookahead import NgramIndex, SuffixIndex, models
from lookahead.bench.real_workloads import WORKLOADS, load
from lookahead.decode.calibrate import measured_draft_cost
from lookahead.decode.policy import _BUCKETS, DraftLength


def replay_inputs(index, prompt: list, output: list) -> tuple:
    """Per output position p: the match length behind the draft after prompt + output[:p], and its accepted length."""
    index.extend(np.asarray(prompt, np.int64))
    matches, accepted = [], []
    for p in range(len(output)):
        draft = index.propose(32).tolist()
        n = 0
        while n < len(draft) and p + n < len(output) and draft[n] == output[p + n]:
            n += 1
        matches.append(index.match_length if draft else 0)
        accepted.append(n)
        index.extend(np.asarray([output[p]], np.int64))
    return matches, accepted


class TwoRates:
    """Per match-length bucket: the first draft token's acceptance p1 and the continuation's q, each a beta mean
    from (accepted, rejected) pseudo-counts; k maximizes (1 + p1 (1 + q + ... + q^(k-1))) / costs[k]."""

    def __init__(self, costs, prior=(3.0, 1.0)):
        self.costs = costs
        self.first = np.tile(np.asarray(prior, float), (len(_BUCKETS), 1))
        self.cont = np.tile(np.asarray(prior, float), (len(_BUCKETS), 1))

    def choose(self, match: int) -> int:
        if match <= 0:
            return 0
        b = np.searchsorted(_BUCKETS, match, side="right") - 1
        p1 = self.first[b, 0] / self.first[b].sum()
        q = self.cont[b, 0] / self.cont[b].sum()
        best, value, run = 0, 1.0 / self.costs[0], 0.0
        for k in range(1, len(self.costs)):
            run += q ** (k - 1)
            v = (1.0 + p1 * run) / self.costs[k]
            if v > value:
                best, value = k, v
        return best

    def update(self, match: int, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        b = np.searchsorted(_BUCKETS, match, side="right") - 1
        self.first[b, 0 if accepted >= 1 else 1] += 1
        if accepted >= 1:
            self.cont[b, 0] += accepted - 1
            self.cont[b, 1] += accepted < drafted


def replay(policy, matches: list, accepted: list, costs) -> float:
    """One-token-forward equivalents to write the output (the first token comes from the prefill)."""
    p, total, n = 1, 0.0, len(matches)
    while p < n:
        m, a = matches[p], accepted[p]
        if isinstance(policy, DraftLength):
            k = int(policy.choose(np.array([m]))[0])
        else:
            k = policy.choose(m)
        k = min(k, n - p - 1)
        gained = min(k, a)
        total += costs[k]
        if isinstance(policy, DraftLength):
            policy.update(np.array([m]), np.array([k]), np.array([gained]))
        else:
            policy.update(m, k, gained)
        p += gained + 1
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--index", choices=("ngram", "suffix"), default="ngram")
    parser.add_argument("--max-new", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, tok, _ = models.load("smollm2")
    curve = measured_draft_cost(model, 20)
    costs = curve.costs
    print(f"cost curve {curve}\n")
    print("| workload | new tokens | greedy forwards | shipped (geometric) | two rates | two rates ÷ shipped |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    totals = [0.0, 0.0]
    for workload, items in load(args.workloads, tok, 1).items():
        ids = items[0].input_ids
        with torch.inference_mode():
            out = model.generate(torch.as_tensor(ids)[None], max_new_tokens=args.max_new, do_sample=False)
        output = out[0, len(ids):].tolist()
        index = NgramIndex() if args.index == "ngram" else SuffixIndex()
        matches, accepted = replay_inputs(index, list(ids), output)
        shipped = replay(DraftLength(len(costs) - 1, cost=curve), matches, accepted, costs)
        two = replay(TwoRates(costs), matches, accepted, costs)
        totals[0] += shipped
        totals[1] += two
        print(f"| {workload} | {len(output)} | {len(output) - 1} | {shipped:.1f} | {two:.1f} | {shipped / two:.3f} |",
              flush=True)
    print(f"| all | | | {totals[0]:.1f} | {totals[1]:.1f} | {totals[0] / totals[1]:.3f} |")


if __name__ == "__main__":
    main()
