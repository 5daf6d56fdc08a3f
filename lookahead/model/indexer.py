"""Sparse attention whose indexer picks each query's keys (DeepSeek-V3.2's DSA, GLM-MoE-DSA, Hunyuan v4, AXK2), with
every query of a multi-token forward picking the keys it picks decoding alone.

The indexer scores every key for every query and keeps the k best (`index_scores.topk(k)`, [b, S, T]; the keys a
query must not see scored -inf). Decoding alone, a query's row holds the keys it sees and nothing else (p + 1 keys
at position p); in a verification forward the row is as wide as the cache plus the draft, the keys of other
branches, later draft tokens and left padding masked. Many keys score exactly the same (the indexer sums ReLUs: a
key no head likes scores 0), and which of them the top k keeps depends on the row's width: on tiny models
`model.generate`'s own one-forward prefill attends to other keys than its token-by-token decode at 20 of 40
positions. `decoding_order(model)` makes each indexer pick from a row of just the keys its query sees, in cache
order, as decoding alone does (the keys of a prefill: the row's prompt without its padding); the picks then equal
decoding's wherever the scores do (fp32: they differ in the last bits, as every multi-token forward's do).

Reference: DeepSeek-V3.2-Exp, "DeepSeek Sparse Attention" (the lightning indexer); transformers'
`DeepseekV32Indexer`.
"""
from __future__ import annotations

import contextlib
import functools
import inspect

import torch
from torch.overrides import TorchFunctionMode


def indexers(model) -> list:
    """The model's indexer modules: those that keep the `index_topk` best keys per query."""
    return [m for m in model.modules() if hasattr(m, "index_topk") and type(m).__name__.endswith("Indexer")]


def reads_key_positions(model) -> bool:
    """Whether `model` keeps its indexers' key positions in its cache (`indexer_position_ids`: Qwen4-Exp's QSA
    indexer pools blocks of keys and rotates each by its first key's position)."""
    return any(_reads_key_positions(type(m)) for m in model.modules())


@functools.lru_cache(maxsize=None)
def _reads_key_positions(cls) -> bool:
    try:
        return "indexer_position_ids" in inspect.getsource(cls.forward)
    except (TypeError, OSError):
        return False


@contextlib.contextmanager
def decoding_order(model):
    """Inside the block, every indexer of `model` picks each query's keys from the keys it sees alone (no-op for a
    model without indexers); the modules' forwards are set back as they were when the block ends, also on an error
    (blocks nest: measuring a cost curve inside a call)."""
    found = indexers(model)
    before = [module.__dict__.get("forward") for module in found]  # an enclosing block's, kept for its end
    for module in found:
        module.forward = _picking_alone(module, module.forward)
    try:
        yield
    finally:
        for module, forward in zip(found, before):
            if forward is None:
                del module.forward
            else:
                module.forward = forward


def _picking_alone(module, forward):
    def run(*args, **kwargs):
        with _PickAlone(module.index_topk):
            return forward(*args, **kwargs)

    return run


class _PickAlone(TorchFunctionMode):
    """Within one indexer forward: its `topk` over the scores [b, S, T] picks from each query's visible keys."""

    def __init__(self, index_topk: int):
        super().__init__()
        self.index_topk = index_topk

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.topk, torch.topk):
            scores, k = args[0], (args[1] if len(args) > 1 else kwargs.get("k"))
            dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
            if scores.dim() == 3 and dim in (-1, 2) and k == min(self.index_topk, scores.shape[-1]):
                return pick_alone(scores, k)
        return func(*args, **kwargs)


def pick_alone(scores: torch.Tensor, k: int):
    """`scores.topk(k)` for index scores [b, S, T] (-inf, or the mask's most negative value, where a query must not
    look), each query's top k taken from a row of only the keys it sees, as decoding alone scores them; a query that
    sees fewer than k keys fills its picks with keys it does not see (masked after, as transformers' own top k
    does). A prefill (no query sees a key from before the forward) takes each row's keys after its left padding for all
    of its queries, as the row's prompt alone would. Returns torch's (values, indices) [b, S, k]."""
    b, s, t = scores.shape
    visible = scores > torch.finfo(scores.dtype).min / 2  # [b, S, T]
    if bool(visible.all()):
        return torch.topk(scores, k, dim=-1)
    indices = torch.empty((b, s, k), dtype=torch.long, device=scores.device)
    for row in range(b):
        if _prefill(visible[row], s):  # the row's prompt without its padding, what its last query sees
            keys = visible[row, -1].nonzero()[:, 0]
            indices[row] = _picks(scores[row, :, keys], k, keys, t)
            continue
        for q in range(s):
            keys = visible[row, q].nonzero()[:, 0]
            indices[row, q] = _picks(scores[row, q:q + 1, keys], k, keys, t)[0]
    return torch.return_types.topk((scores.gather(-1, indices), indices))


def _prefill(visible: torch.Tensor, s: int) -> bool:
    """Whether a row's visible keys [S, T] are a prefill's: its last query sees no more keys than the forward has
    queries, and every query that sees more than itself (a left padding query sees itself alone) sees only keys
    the last one sees. A verification step's last query may be a padding column, which sees the committed keys and
    itself, but not the step's draft columns that the others see."""
    last = visible[-1]
    if int(last.sum()) > s:
        return False
    many = visible.sum(-1) > 1
    return not bool((visible[many] & ~last).any())


def _picks(rows: torch.Tensor, k: int, keys: torch.Tensor, t: int) -> torch.Tensor:
    """[S', k] key indices: the top min(k, n) of rows [S', n] (scores of the keys `keys` [n]) mapped back to the
    keys' slots, then slots outside `keys` up to k."""
    n = keys.numel()
    picked = keys[torch.topk(rows[None], min(k, n), dim=-1).indices[0]]  # [S', min(k, n)]: as a [1, S', n] row
    if n >= k:
        return picked
    outside = torch.ones(t, dtype=torch.bool, device=keys.device)
    outside[keys] = False
    rest = outside.nonzero()[: k - n, 0]
    return torch.cat([picked, rest.expand(picked.shape[0], -1)], dim=1)
