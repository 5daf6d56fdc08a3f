"""Helpers shared by the indexes: token sequences as the integer arrays the kernels take, the draft budget, buffers."""
from __future__ import annotations

import numpy as np

from .._checks import check_int

_INT32_MAX = np.iinfo(np.int32).max
# Most tokens (or tree nodes) one proposal returns: more than a verification forward can use, and the bound on the
# scratch memory a proposal allocates (about budget * max_branch rows).
MAX_DRAFT = 4096


def as_token_array(tokens) -> np.ndarray:
    """Return `tokens` (list, tuple, numpy array or 1-D torch tensor of integer ids) as a 1-D integer array.

    The range of the ids is checked by the kernels that consume them (cheaper there than a numpy pass).

    Raises:
        TypeError: the ids are not integers.
        ValueError: not one-dimensional.
    """
    if type(tokens) is np.ndarray and tokens.ndim == 1 and tokens.dtype.kind == "i" and tokens.flags.c_contiguous:
        return tokens
    if hasattr(tokens, "detach") and hasattr(tokens, "cpu"):  # torch.Tensor, without importing torch here
        if tokens.is_floating_point() or tokens.is_complex() or str(tokens.dtype) == "torch.bool":
            raise TypeError(f"tokens must hold integer ids, got a tensor of dtype {tokens.dtype}")
        tokens = tokens.detach().cpu().numpy()
    arr = np.asarray(tokens)
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"tokens must hold integer ids, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"tokens must be one-dimensional, got shape {tuple(arr.shape)}")
    if arr.dtype == np.uint64 and arr.max() > _INT32_MAX:
        raise range_error(arr)  # before the conversion to int64 wraps the largest ids to negative ones
    return np.ascontiguousarray(arr, dtype=np.int64)


def range_error(tokens: np.ndarray) -> ValueError:
    """The error for ids outside [0, int32 max], naming the offending values."""
    return ValueError(f"tokens must hold ids in [0, {_INT32_MAX}], got min {tokens.min()} and max {tokens.max()}")


def draft_budget(name: str, value) -> int:
    """`value` as the number of tokens or nodes to propose: an int >= 0, clamped to MAX_DRAFT.

    Raises:
        TypeError: not an integer.
        ValueError: negative.
    """
    return min(check_int(name, value, 0), MAX_DRAFT)


def table_size(min_slots: int) -> int:
    """The power of two (at least 1024) that holds `min_slots` hash-table slots."""
    return 1 << max(10, int(min_slots - 1).bit_length())


def grown(array: np.ndarray, rows: int, used: int) -> np.ndarray:
    """A new array of `rows` rows (the rest of its shape as `array`'s) whose first `used` are those of `array`."""
    out = np.empty((rows,) + array.shape[1:], dtype=array.dtype)
    out[:used] = array[:used]
    return out
