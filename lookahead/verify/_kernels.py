"""Numba kernels of the acceptance step: tree ancestry, greedy acceptance of chains and trees.

Module-level @njit functions over int arrays; each writes into buffers the caller owns and returns a count or
nothing. They replace per-row, per-depth Python loops whose cost grew with the batch and the tree. Their outputs are
allocated by their callers from the inputs' own shapes (`tree.ancestry`, `tree.greedy_tree_accept`,
`greedy.greedy_accept_with_bonus`, the fused step's buffers), which is what keeps the writes inside them.
"""

from numba import njit


@njit(cache=True)
def ancestry(parents, seen, depth):
    """seen[i, c, c'] = column c' is column c or one of its ancestors; depth[i, c] = edges from the root.

    parents [b, n] (-1: child of the root, column 0; parents before children); seen [b, n+1, n+1] bool and depth
    [b, n+1] int64, zeroed: every write is at a column <= n.
    """
    b, n = parents.shape
    for i in range(b):
        seen[i, 0, 0] = True
        for j in range(n):  # parents come first: the parent's row is complete when its child copies it
            col, up = j + 1, parents[i, j] + 1
            for c in range(col):
                seen[i, col, c] = seen[i, up, c]
            seen[i, col, col] = True
            depth[i, col] = depth[i, up] + 1


@njit(cache=True)
def greedy_chain(drafts, lens, targets, counts, bonus):
    """Per row, the longest draft prefix equal to the target's argmax (counts) and the argmax after it (bonus).

    drafts [b, d], lens [b] (<= d), targets [b, d+1]; counts and bonus [>= b] are written.
    """
    for i in range(drafts.shape[0]):
        a = 0
        while a < lens[i] and drafts[i, a] == targets[i, a]:
            a += 1
        counts[i] = a
        bonus[i] = targets[i, a]


@njit(cache=True)
def greedy_tree(tokens, parents, sizes, targets, paths, counts, bonus):
    """Per row, the longest root path whose every node equals the target's argmax at its parent.

    tokens, parents [b, n], sizes [b], targets [b, n+1]; writes the path's node indices into paths [b, >= n] (the
    path's nodes are distinct columns < n, whatever sizes says), its length into counts [b] and the argmax after its
    last node into bonus [b]. Among siblings the first match wins.
    """
    for i in range(tokens.shape[0]):
        col, a, size = 0, 0, min(sizes[i], tokens.shape[1])
        found = True
        while found:
            found = False
            want = targets[i, col]
            for j in range(col, size):  # children come after their parent: start the scan at it
                if parents[i, j] == col - 1 and tokens[i, j] == want:
                    paths[i, a] = j
                    a += 1
                    col = j + 1
                    found = True
                    break
        counts[i] = a
        bonus[i] = targets[i, col]
