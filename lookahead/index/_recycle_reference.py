"""The rules of `_recycle_kernels` in plain Python (dicts, lists, heapq): what the hypothesis tests hold the kernels
to. Slow, obvious, not used by the package."""
from __future__ import annotations

import heapq

import numpy as np

from ._recycle_kernels import BOTH, COPY, EDGES, FALLBACK, PROBES, RECYCLED


class ReferenceRecycled:
    """M and the two-token rows of `Recycled`, as dicts; `slot` is the kernels' hash, so evictions agree."""

    def __init__(self, vocab: int, k: int, pair_slots: int, decay: float, slot):
        self.vocab, self.k, self.slots, self.decay, self.slot = vocab, k, pair_slots, decay, slot
        self.rows = {}  # token -> [(id, score)] at most k, in slot order
        self.table = [None] * pair_slots  # slot -> (key, [(id, prob)], stamp)
        self.clock = 0
        self.calib = np.zeros((3, len(EDGES), 2))

    def update(self, token: int, prev: int, ids: list, probs: list) -> None:
        if not 0 <= token < self.vocab:
            return
        row = [[x, s * self.decay] for x, s in self.rows.get(token, [])]
        for x, p in zip(ids, probs):
            if not 0 <= x < self.vocab:
                continue
            known = [r for r in row if r[0] == x]
            if known:
                known[0][1] += p
            elif len(row) < self.k:
                row.append([x, p])
            else:
                weakest = min(range(len(row)), key=lambda i: (row[i][1], i))
                if p > row[weakest][1]:
                    row[weakest] = [x, p]
        self.rows[token] = sorted(row, key=lambda r: -r[1])
        if 0 <= prev < self.vocab:
            self._write(prev * self.vocab + token, ids, probs)

    def _write(self, key: int, ids: list, probs: list) -> None:
        home = self.slot(key)
        window = [(home + i) % self.slots for i in range(PROBES)]
        at = next((s for s in window if self.table[s] is not None and self.table[s][0] == key), None)
        if at is None:
            at = next((s for s in window if self.table[s] is None), None)
        if at is None:
            at = min(window, key=lambda s: (self.table[s][2], window.index(s)))
        self.clock += 1
        row = [(x, p) if 0 <= x < self.vocab else (-1, 0.0) for x, p in zip(ids[:self.k], probs[:self.k])]
        self.table[at] = (key, row, self.clock)

    def candidates(self, prev: int, token: int) -> list:
        """[(id, prob)] as `_recycle_kernels.candidates`."""
        if not 0 <= token < self.vocab:
            return []
        out = []
        pair = None
        if 0 <= prev < self.vocab:
            key = prev * self.vocab + token
            home = self.slot(key)
            for i in range(PROBES):
                entry = self.table[(home + i) % self.slots]
                if entry is not None and entry[0] == key:
                    pair = entry
                    break
        if pair is not None:
            out = [(x, p) for x, p in pair[1] if x >= 0]
        scale = (1.0 - self.decay) * (FALLBACK if pair is not None else 1.0)
        for x, s in self.rows.get(token, []):
            if len(out) >= self.k:
                break
            if x not in [o[0] for o in out]:
                out.append((x, min(s * scale, 1.0)))
        return out


def calibrated(calib, prior: float, source: int, estimate: float) -> float:
    b = int(np.searchsorted(EDGES, estimate, side="right") - 1)
    return (calib[source, b, 1] + prior * estimate) / (calib[source, b, 0] + prior)


def merged_tree(ref: ReferenceRecycled, prior: float, prev: int, last: int, base: list, keep: float,
                budget: int) -> list:
    """[(token, parent, source, estimate, value)] as `_recycle_kernels.merged_tree` writes them."""
    nodes = []  # [token, parent, source, estimate]
    for token, parent, prob in base[:budget]:
        if prob < keep:
            break
        up = base[parent][2] if parent >= 0 else 1.0
        nodes.append([token, parent, COPY, min(prob / up, 1.0) if up > 0 else 0.0])
    heap, pushed = [], 0

    def expand(node, before, token, value):
        nonlocal pushed
        for x, p in ref.candidates(before, token):
            heapq.heappush(heap, (-value * p, pushed, node, x, p))
            pushed += 1

    expand(-1, prev, last, 1.0)
    while heap and len(nodes) < budget:
        v, _, parent, token, p = heapq.heappop(heap)
        node = next((j for j, n in enumerate(nodes) if n[1] == parent and n[0] == token), -1)
        if node < 0:
            nodes.append([token, parent, RECYCLED, min(p, 1.0)])
            node = len(nodes) - 1
        elif nodes[node][2] == COPY:
            nodes[node][2] = BOTH
        expand(node, last if parent < 0 else nodes[parent][0], token, -v)
    values = []
    for token, parent, source, estimate in nodes:
        up = values[parent] if parent >= 0 else 1.0
        values.append(up * min(calibrated(ref.calib, prior, source, estimate), 1.0))
    order = sorted(range(len(nodes)), key=lambda j: (-values[j], j))
    where = {j: i for i, j in enumerate(order)}
    return [(nodes[j][0], where[nodes[j][1]] if nodes[j][1] >= 0 else -1, nodes[j][2], nodes[j][3], values[j])
            for j in order]


def learn(calib, decay: float, nodes: list, gained: list) -> None:
    """`_recycle_kernels.learn` over nodes [(token, parent, source, estimate)]."""
    calib *= decay
    node = -1
    for target in gained:
        nxt = -1
        for j, (token, parent, source, estimate) in enumerate(nodes):
            if parent == node:
                b = int(np.searchsorted(EDGES, estimate, side="right") - 1)
                calib[source, b, 0] += 1
                calib[source, b, 1] += token == target
                nxt = j if token == target else nxt
        if nxt < 0:
            return
        node = nxt
