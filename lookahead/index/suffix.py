"""SuffixIndex: drafts from the longest recurring suffix of any length, as a chain or a tree."""
from __future__ import annotations


import numpy as np

from .._checks import check_float, check_int
from ..runtime.jit import entry, kernels
from . import _suffix_build, _suffix_draft
from ._suffix_build import Automaton
from ._suffix_draft import Scratch
from ._tokens import as_token_array, draft_budget, grown, range_error, table_size as _table_size
from .draft import Draft

K = _suffix_build  # its constants; its kernels are bound per call (`kernels`)


_MIN_CAPACITY = 1024
MAX_BRANCH = 256  # the scratch of a proposal grows with budget * max_branch


class SuffixIndex:
    """Proposes what followed earlier occurrences of the longest suffix of the held tokens that recurs.

    An online suffix automaton (Blumer et al. 1985) holds every substring of the tokens seen: appending a token
    costs amortized O(1), and the state of the whole text links to the longest suffix that occurred before,
    whatever its length. Drafts walk the automaton from there: each state knows how often its strings occurred
    and where they first and last ended, so continuations are ranked without rescanning the tokens, and a
    continuation seen once is copied straight from the tokens.

    Evidence. A draft token's probability is P(the target continues with a known continuation | match length m,
    occurrences of the context), learned online from the tokens themselves (per bucket, shrunk to the prior
    m / (m + 2)), times the token's share among the continuations: its share of the occurrences, plus a bonus
    for the continuation of the copy in progress. The copy in progress is the occurrence the text has been
    following; when the text leaves it (an edit, a skipped phrase) and a new match starts, the index follows
    the first occurrence of the match within 64 tokens after where the copy broke off (text rejoins its source
    a little further on), else the first occurrence (sources are read front to back), or the most recent one
    where that has predicted the tokens clearly better so far (code reuses what it just wrote).

    Guesses. Where the last token was never seen before there is nothing to copy, yet the next token is often
    a frequent one (",", " the", a newline): the draft then guesses the ``max_guesses`` most frequent tokens
    held, each with its learned hit rate at such positions and followed by what followed it. A quarter as many
    are also guessed beside the continuations of a recurring suffix, for when the text is none of them. Guesses
    are the only draft tokens that are not copies; they cost a tree little where verifying costs little.

    Adaptive length. A path's probability is the product along it: a long match keeps it high (long drafts),
    a 1-token match seen once starts low. A draft token is proposed only while its path probability is at
    least ``min_prob``:

    - ``propose(k)``: the greedy path (the most probable continuation at each step), at most ``k`` tokens.
    - ``propose_tree(n)``: best-first, the ``n`` most probable nodes; it branches where the evidence is split
      and stops a branch where its probability falls below ``min_prob``. Its first path is the chain.

    A draft that catches up with the end of the tokens goes on from the longest suffix of tokens plus draft
    that has a continuation, so repetitive text extrapolates.

    ``extend`` costs amortized O(1) per token (counts are updated along at most 64 suffix links, the rejoin
    looks at most 64 tokens ahead); ``propose(k)`` and ``propose_tree(n)`` cost O(budget * max_branch)
    whatever the number of tokens held. Memory: about 150 bytes per token held (up to twice that just after
    the buffers grow).

    Args:
        min_prob: smallest path probability worth drafting, in [0, 1]. The default suits memory-bound decoding,
            where a rejected draft token costs next to nothing: long matches keep full drafts, a 1-token match
            seen once is cut after some 10-30 tokens (depending on what was learned). Raise it (0.02-0.1) when
            verifying more tokens costs compute; 0 drafts the whole budget whenever a continuation is known.
        max_branch: continuations considered per draft node (besides those of the most recent and the first
            occurrence), in [1, 256]. Bounds the cost of a proposal on states with many continuations.
        half_life: half-life, in tokens, of the learned statistics (> 0): the weight of what was learned halves
            every half_life tokens. Short half-lives adapt faster to the output (after a long prompt of a
            different kind), long ones are steadier.
        max_guesses: frequent tokens guessed after a never-seen token, in [0, 32] (0: drafts are copies only).

    Raises:
        TypeError: an argument of the wrong type (max_branch and max_guesses are ints, the others numbers).
        ValueError: an argument out of range, named with its limit.

    Example:
        >>> idx = SuffixIndex()
        >>> idx.extend([5, 6, 7, 8, 9, 5, 6])
        >>> idx.propose(3).tolist()
        [7, 8, 9]
        >>> idx.match_length
        2
    """

    def __init__(self, min_prob: float = 0.001, max_branch: int = 8, half_life: float = 512.0,
                 max_guesses: int = 32):
        self.min_prob = check_float("min_prob", min_prob, 0.0, 1.0)
        self.max_branch = check_int("max_branch", max_branch, 1, MAX_BRANCH)
        self.half_life = check_float("half_life", half_life, 0.0, low_open=True)
        self.max_guesses = check_int("max_guesses", max_guesses, 0, K.GK)
        self._allocate(_MIN_CAPACITY)
        self._buf = None
        self._buffers(32)

    def __len__(self) -> int:
        return int(self._sam.meta[K.N])

    def __repr__(self) -> str:
        return (f"SuffixIndex(min_prob={self.min_prob}, max_branch={self.max_branch}, half_life={self.half_life}, "
                f"max_guesses={self.max_guesses}, tokens={len(self)})")

    @property
    def match_length(self) -> int:
        """Length of the longest suffix of the held tokens that also occurs earlier (0 when none does)."""
        st, meta = self._sam.st, self._sam.meta
        link = st[meta[K.CUR], K.LINK]
        return int(st[link, K.LEN]) if link > 0 else 0

    def reset(self) -> None:
        """Forget every token held and everything learned."""
        self._allocate(_MIN_CAPACITY)

    def extend(self, tokens) -> None:
        """Append token ids (a list, a numpy array or a 1-D tensor of non-negative integers).

        Raises:
            TypeError: the ids are not integers.
            ValueError: not one-dimensional, or an id is negative or above 2**31 - 1 (nothing is appended).
        """
        kern = kernels(_suffix_build)
        new = as_token_array(tokens)
        if new.shape[0] == 0:
            return
        # the kernel checks the room itself (`K.fits`), so that tokens the fused step appended count without a
        # count of our own to keep in step
        args = (new, self._arrays)  # the index's arrays: one typing; the ids: one per dtype (`entry`)
        got = entry(kern.suffix_extend, new.dtype, args)(*args)
        if got == K.FULL:  # it wrote nothing: grow by its own rule, then append
            self.reserve(new.shape[0])
            got = kern.suffix_extend(new, self._arrays)
        if got < 0:
            raise range_error(new)

    def begin_request(self) -> None:
        """Hold the tokens so far as background (earlier requests, e.g. from a `lookahead.Memory`): a copy that starts
        anew then follows the first occurrence after this point where there is one, not the first overall.

        >>> idx = SuffixIndex(); idx.extend([1, 5, 6, 7, *range(100, 200)]); idx.begin_request()
        >>> idx.extend([1, 2, 3, 4, *range(300, 400), 1]); idx.propose(3).tolist()  # not 5, 6, 7
        [2, 3, 4]
        """
        self._sam.meta[K.BOUND] = self._sam.meta[K.N]

    def propose(self, max_tokens: int) -> np.ndarray:
        """The most probable continuation, up to ``max_tokens`` tokens (int64, empty when nothing recurs), and at
        most 4096 (``MAX_DRAFT``) whatever ``max_tokens`` asks: repetitive text extrapolates without end.

        Raises:
            TypeError: ``max_tokens`` is not an int.
            ValueError: ``max_tokens`` is negative.

        >>> idx = SuffixIndex(); idx.extend([1, 2, 3, 1]); idx.propose(5).tolist()
        [2, 3, 1, 2, 3]
        """
        kdraft = kernels(_suffix_draft)
        if type(max_tokens) is not int or max_tokens < 0 or max_tokens > self._buf.chain.shape[0]:
            max_tokens = draft_budget("max_tokens", max_tokens)
            self._buffers(max_tokens)
        args = (self._arrays, self._scratch, max_tokens)
        m = entry(kdraft.suffix_chain, None, args)(*args)
        return self._buf.chain[:m].copy()

    def propose_tree(self, max_nodes: int) -> Draft:
        """A draft tree of at most ``max_nodes`` nodes (and at most 4096, ``MAX_DRAFT``), most probable first.

        Returns:
            a `Draft`: ``tokens`` and ``parents`` (``parents[i]`` is the index of node i's parent, or -1 for a child
            of the last held token; parents come before their children), each node's estimated probability of
            being accepted in ``probs`` (non-increasing, so that the first n nodes are the best tree of n nodes and
            their sum is its expected number of accepted tokens), and ``match_length``.
        Raises:
            TypeError: ``max_nodes`` is not an int.
            ValueError: ``max_nodes`` is negative.

        >>> idx = SuffixIndex(); idx.extend([1, 2, 1, 3, 1]); idx.propose_tree(2).tokens.tolist()
        [3, 2]
        """
        kdraft = kernels(_suffix_draft)
        if type(max_nodes) is not int or max_nodes < 0 or max_nodes > self._buf.chain.shape[0]:
            max_nodes = draft_budget("max_nodes", max_nodes)
            self._buffers(max_nodes)
        args = (self._arrays, self._scratch, max_nodes)
        m = entry(kdraft.suffix_tree, None, args)(*args)
        tree = self._buf.tree[:, :m].copy()
        return Draft(tree[0], tree[1], self._buf.probs[:m].copy(), self.match_length)

    def copy(self) -> "SuffixIndex":
        """An independent index holding the same tokens and statistics, that proposes exactly what this one would
        from here on (a numpy copy of the state: cheaper than indexing the tokens again).

        >>> base = SuffixIndex(); base.extend([1, 5, 6, 7]); row = base.copy(); row.begin_request()
        >>> row.extend([1]); row.propose(2).tolist(), len(base)
        ([5, 6], 4)
        """
        twin = SuffixIndex.__new__(SuffixIndex)
        twin.min_prob, twin.max_branch, twin.half_life, twin.max_guesses = (
            self.min_prob, self.max_branch, self.half_life, self.max_guesses)
        sam, meta = self._sam, self._sam.meta
        twin._hold(Automaton(hist=grown(sam.hist, sam.hist.shape[0], len(self)),
                             st=grown(sam.st, sam.st.shape[0], int(meta[K.NS])),
                             ed=grown(sam.ed, sam.ed.shape[0], int(meta[K.NE])), table=sam.table.copy(),
                             meta=meta.copy(), stats=sam.stats.copy(), top=sam.top.copy()))
        twin._buf = None
        twin._buffers(self._buf.chain.shape[0])
        return twin

    def _allocate(self, capacity: int) -> None:
        """Empty arrays for `capacity` tokens, sized to the automaton's worst case (`K.fits`)."""
        st = np.empty((2 * capacity + 2, 9), dtype=np.int32)
        st[0, :] = -1
        st[0, K.LEN], st[0, K.CNT], st[0, K.DEG] = 0, 0, 0
        ed = np.empty((3 * capacity + 8, 4), dtype=np.int32)
        stats = np.zeros((K.MISS + K.GK, 3), dtype=np.float64)
        stats[K.PARAMS] = (self.min_prob, K.PRIOR_WEIGHT, 0.5 ** (1.0 / self.half_life))
        self._hold(Automaton(
            hist=np.empty(capacity, dtype=np.int32), st=st, ed=ed,
            table=np.full(_table_size(2 * ed.shape[0]), -1, dtype=np.int32),
            meta=np.array([0, 1, 0, 0, self.max_branch, -1, 0, -1, self.max_guesses, 0], dtype=np.int64),
            stats=stats, top=np.full((K.GK, 3), -1, dtype=np.int64)))

    def _hold(self, sam: Automaton) -> None:
        """Keep the automaton's arrays, by name and as the plain tuple the kernels take (see `_suffix_build`)."""
        self._sam, self._arrays = sam, tuple(sam)

    def reserve(self, extra: int) -> None:
        """Grow the buffers to the automaton's worst case for n + extra tokens (`K.fits`: 2n + 2 states, 3n + 8
        edges, a table of twice the edge rows), at least doubling them."""
        kern = kernels(_suffix_build)
        sam, held = self._sam, len(self)
        if held + extra > sam.hist.shape[0]:
            capacity = max(2 * sam.hist.shape[0], held + extra)
            ed = grown(sam.ed, 3 * capacity + 8, int(sam.meta[K.NE]))
            self._hold(sam._replace(hist=grown(sam.hist, capacity, held),
                                    st=grown(sam.st, 2 * capacity + 2, int(sam.meta[K.NS])), ed=ed,
                                    table=np.full(_table_size(2 * ed.shape[0]), -1, dtype=np.int32)))
            kern.suffix_rehash(self._arrays)

    def kernel_state(self, budget: int) -> tuple:
        """What the fused step's kernels take of this index, its scratch sized for proposals of up to `budget` tokens
        or nodes: (the automaton's arrays, the scratch arrays), each a tuple in `_suffix_build.Automaton`'s and
        `_suffix_draft.Scratch`'s order. They stay this index's until `reserve` or `extend` grows them."""
        self._buffers(budget)
        return self._arrays, self._scratch

    def _buffers(self, budget: int) -> None:
        """Scratch for proposals of up to `budget` tokens or nodes (each node pushes <= max_branch + 2, a guessing
        root <= GK). The kernels write at most as many tokens or nodes as chain and tree hold, and no candidate row
        past cand's (a full cand only cuts the draft short): this sizing makes both rare, not safe."""
        if self._buf is None or budget > self._buf.chain.shape[0]:
            rows, size = 1 + 2 * K.GK + (max(budget, 32) + 1) * (self.max_branch + 2), max(budget, 32)
            self._buf = Scratch(cand=np.empty((rows, 6), dtype=np.int32), cprob=np.empty(rows, dtype=np.float64),
                                heap=np.empty(rows, dtype=np.int32), chain=np.empty(size, dtype=np.int64),
                                tree=np.empty((2, size), dtype=np.int64), probs=np.empty(size, dtype=np.float64))
            self._scratch = tuple(self._buf)
