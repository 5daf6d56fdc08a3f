"""Numba kernels that write a verification step's inputs and commit on the model's side: the dynamic cache's
step tokens, positions and masks (`causal.CausalLM`), the static step's input buffer and slot moves
(`static.StaticCausalLM`).

Module-level @njit functions over int arrays; each writes into buffers the caller owns (the caller sizes them: each
docstring says to what) and returns a count or nothing. Where the size comes from elsewhere than the call's own
arguments (the slot mask grown by an earlier call, a step buffer kept per width), the kernel compares it with what
it is about to write and answers -1, writing nothing, when it falls short.
"""
import numpy as np
from numba import njit

from ..verify._kernels import ancestry


@njit(cache=True)
def static_inputs(host, rows, last, tokens, parents, pos, write, width, bit):
    """Fill a static step's input buffer host [b, 3 * width + 1] (`lookahead.model.static`): per batch row its tokens
    [width] (the last token, then the draft nodes, zero padding), their positions [width], its next slot, and per
    query the step columns it sees as the bits of one int64 (bit[c] = 1 << c: itself, its ancestors, the root).

    rows [r]: the batch rows that run (< b), with last [r], tokens and parents [r, N] (parents before children, -1:
    a child of the root); pos and write [b]. The other rows and the padding columns get token 0 at their plain
    position, seeing themselves only. A node's position is its parent's plus one, so a chain's are consecutive.
    Returns r, or -1 (nothing written) unless N + 1 <= width <= bit's length and host has 3 * width + 1 columns.
    """
    if tokens.shape[1] + 1 > width or width > bit.shape[0] or host.shape[1] < 3 * width + 1:
        return -1
    for i in range(host.shape[0]):
        for c in range(width):
            host[i, c] = 0
            host[i, width + c] = pos[i] + c
            host[i, 2 * width + 1 + c] = bit[c]
        host[i, 2 * width] = write[i]
    for k in range(rows.shape[0]):
        i = rows[k]
        host[i, 0] = last[k]
        for j in range(tokens.shape[1]):
            col, up = j + 1, parents[k, j] + 1
            host[i, col] = tokens[k, j]
            host[i, width + col] = host[i, width + up] + 1
            host[i, 2 * width + 1 + col] = bit[col] | host[i, 2 * width + 1 + up]
    return rows.shape[0]


@njit(cache=True)
def advance(write, pos, rows, counts):
    """A static step's commit of r rows: write[rows[k]] and pos[rows[k]] move past its root and counts[k] drafts
    (rows < b, the length of write and pos; counts [>= r])."""
    for k in range(rows.shape[0]):
        write[rows[k]] += counts[k] + 1
        pos[rows[k]] += counts[k] + 1


@njit(cache=True)
def pack_moves(write, rows, cols, moves):
    """A static tree commit's slot moves (`SlotCache.move`) into moves [2, b, W]: each running row rows[k] reads the
    slots of its root and accepted nodes, write + cols[k] [W], and writes them behind its next slot, write + 0..W-1;
    every other batch row moves its next slot onto itself. write [>= b], rows [r] < b, cols [r, >= W]."""
    for i in range(moves.shape[1]):
        for j in range(moves.shape[2]):
            moves[0, i, j] = write[i]
            moves[1, i, j] = write[i]
    for k in range(rows.shape[0]):
        i = rows[k]
        for j in range(moves.shape[2]):
            moves[0, i, j] += cols[k, j]
            moves[1, i, j] += j


@njit(cache=True)
def chain_inputs(last, drafts, sizes, pos, steps, slots, start):
    """A chain step's inputs on the dynamic cache (`lookahead.model.causal.CausalLM`), b rows of N drafts: steps [2, b,
    N + 1] gets each row's tokens (its last token, then its draft, zero padding) and their positions (pos [b] on);
    slots [b, >= start + N + 1] at start + each column whether the row sees it (1: the root or a draft token, 0:
    padding). Returns b, or -1 (nothing written) when slots is narrower (the caller grows the slot mask first)."""
    b, n = drafts.shape
    if start + n + 1 > slots.shape[1]:
        return -1
    for i in range(b):
        steps[0, i, 0] = last[i]
        for c in range(n + 1):
            if c > 0:
                steps[0, i, c] = drafts[i, c - 1]
            steps[1, i, c] = pos[i] + c
            slots[i, start + c] = 1 if c <= sizes[i] else 0
    return b


@njit(cache=True)
def tree_inputs(last, tokens, parents, pos, slots, width, low, steps, mask):
    """A tree step's inputs on the dynamic cache, b rows of N nodes (parents before children, -1: a child of the
    root): steps [2, b, N + 1] gets each row's tokens (its last token, then its nodes) and their positions (pos [b]
    plus each column's depth, `ancestry`); mask [b, 1, N + 1, width + N + 1] the additive attention mask, 0 where a
    query sees a key and `low` where not: every query sees the row's cache slots that slots [b, >= width] marks, then
    its own column and its ancestors'. `seen` and `depth` are the kernel's own, sized from tokens."""
    b, n = tokens.shape
    seen, depth = np.zeros((b, n + 1, n + 1), dtype=np.bool_), np.zeros((b, n + 1), dtype=np.int64)
    ancestry(parents, seen, depth)
    for i in range(b):
        for c in range(n + 1):
            steps[0, i, c] = last[i] if c == 0 else tokens[i, c - 1]
            steps[1, i, c] = pos[i] + depth[i, c]
        for q in range(n + 1):
            for s in range(width):
                mask[i, 0, q, s] = 0.0 if slots[i, s] != 0 else low
            for c in range(n + 1):
                mask[i, 0, q, width + c] = 0.0 if seen[i, q, c] else low


@njit(cache=True)
def commit_slots(slots, start, width, counts, pos):
    """A dynamic-cache commit of b rows: slots [b, >= start + width] at start + c (c < width) 1 where the row kept
    column c (its root and counts[i] accepted drafts), else 0; pos [b] moves past them. width 0: the most any row
    kept. Returns the width, or -1 (nothing written) when slots is narrower: a tree's step writes no slot before its
    commit, so only the commit's own growth of the mask keeps it wide enough (issue 25)."""
    if width == 0:
        for i in range(counts.shape[0]):
            width = max(width, counts[i] + 1)
    if start + width > slots.shape[1]:
        return -1
    for i in range(counts.shape[0]):
        for c in range(width):
            slots[i, start + c] = 1 if c <= counts[i] else 0
        pos[i] += counts[i] + 1
    return width

