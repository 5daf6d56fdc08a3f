"""The gated delta rule (Qwen3.5, Qwen3.5-MoE, Qwen3-Next, OLMo-hybrid, Lara-mini, Qwen4-exp) over a verification
forward's few tokens: one chunk from the cached state, and the state after any prefix of them, without running the
layer again.

transformers' CPU path for several tokens (`torch_chunk_gated_delta_rule`) pads them to chunks of 64 and scans the
chunks; a verification forward of T <= 64 tokens from a cached state is one chunk of T: the same algebra (the UT
transform's triangular solve, the chunk's read of the state, its update), unpadded. Its triangular system is lower
triangular, so the first n of the T transformed values depend on the first n tokens only: the state after the first n
tokens follows from the forward's own intermediates (`state_after`), the exact state a forward over those n tokens
would leave (to rounding), at the cost of one small product instead of the layer's rerun.

    >>> import torch
    >>> b, T, h, d = 1, 5, 2, 8
    >>> q, k, v = (torch.randn(b, T, h, d) for _ in range(3))
    >>> g, beta, start = -torch.rand(b, T, h), torch.rand(b, T, h), torch.randn(b, h, d, d)
    >>> out, final, record = one_chunk(q, k, v, g, beta, start)
    >>> torch.allclose(state_after(record, T), final, atol=1e-5)
    True
"""
from __future__ import annotations

import functools
import inspect
from typing import NamedTuple

import torch

SCAN = "torch_chunk_gated_delta_rule"  # the name transformers' gated delta nets call their multi-token scan by
MAX_TOKENS = 64  # longer forwards (a prefill) run transformers' own scan


class Record(NamedTuple):
    """What `state_after` needs of a chunk: the state it started from [b, h, dk, dv] (the caller's `initial_state`
    itself where it was fp32 already: a cache that overwrites it in place must give its copy back), its keys
    [b, h, T, dk] (fp32, normalized), the cumulative log decays [b, h, T] and the transformed values read off the
    state [b, h, T, dv]."""
    start: torch.Tensor
    key: torch.Tensor
    decay: torch.Tensor
    values: torch.Tensor


@functools.lru_cache(maxsize=None)
def scans(cls) -> bool:
    """Whether a module class's forward calls transformers' chunked gated delta rule by its module-level name (the
    name `one_chunk` stands in for during a verification forward)."""
    try:
        return f"{SCAN}(" in inspect.getsource(cls.forward)
    except (TypeError, OSError):
        return False


def _exp(x: torch.Tensor) -> torch.Tensor:
    """exp(x) for log decays, 0 below e^-40 (4e-18, far under fp32's rounding of anything it is added to): a steep
    decay's e^-100 would otherwise make subnormal floats, on which a CPU's products run ~70 times slower (a chunk of
    12 tokens of a random Qwen3.5 layer, g down to -22: 6.8 ms against 3.2 for transformers' chunks of 4)."""
    return torch.exp(x).masked_fill_(x < -40.0, 0.0)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)  # transformers' (and FLA's) l2norm


def one_chunk(query, key, value, g, beta, initial_state, use_qk_l2norm_in_kernel: bool = True):
    """The gated delta rule over all T tokens as one chunk from `initial_state` (transformers' argument layout:
    query/key [b, T, hk, dk], value [b, T, hv, dv], g and beta [b, T, hv], the state [b, hv, dk, dv]).

    Returns:
        (output [b, T, hv, dv] in the input's dtype, the final state [b, hv, dk, dv] fp32, its `Record`).
    """
    dtype = query.dtype
    heads, value_heads = key.shape[2], value.shape[2]
    if heads != value_heads:  # each query/key head serves value_heads // heads value heads
        query = query.repeat_interleave(value_heads // heads, dim=2)
        key = key.repeat_interleave(value_heads // heads, dim=2)
    query, key, value, beta, g = (x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                                  for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        query, key = _l2norm(query), _l2norm(key)
    query = query * query.shape[-1] ** -0.5
    length = key.shape[2]
    k_beta, v_beta = key * beta.unsqueeze(-1), value * beta.unsqueeze(-1)
    decay = g.cumsum(dim=-1)
    above = torch.ones(length, length, dtype=torch.bool, device=query.device).triu(1)
    pairs = _exp((decay.unsqueeze(-1) - decay.unsqueeze(-2)).masked_fill(above, float("-inf")))
    gains = _exp(decay)
    system = (k_beta @ key.transpose(-1, -2)) * pairs
    inside = (query @ key.transpose(-1, -2)) * pairs
    solved = torch.linalg.solve_triangular(system, torch.cat([v_beta, k_beta * gains.unsqueeze(-1)], dim=-1),
                                           upper=False, unitriangular=True)
    new_values, k_decayed = solved.split([v_beta.shape[-1], key.shape[-1]], dim=-1)
    start = initial_state.to(new_values)
    values = new_values - k_decayed @ start
    out = (query * gains.unsqueeze(-1)) @ start + inside @ values
    record = Record(start, key, decay, values)
    return out.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format), state_after(record, length), record


def state_after(record: Record, n: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The state after the chunk's first n tokens, of the batch rows `rows` (all when None)."""
    start, key, decay, values = record if rows is None else (x[rows] for x in record)
    last = decay[..., n - 1:n]
    return (start * _exp(last).unsqueeze(-1)
            + (key[..., :n, :] * _exp(last - decay[..., :n]).unsqueeze(-1)).transpose(-1, -2) @ values[..., :n, :])
