"""Conversion of user token sequences to the contiguous int32 arrays the kernels take."""
from __future__ import annotations

import numpy as np

_INT32_MAX = np.iinfo(np.int32).max


def as_token_array(tokens) -> np.ndarray:
    """Return `tokens` (list, tuple, numpy array or 1-D torch tensor of integer ids) as a 1-D integer array.

    The range of the ids is checked by the kernels that consume them (cheaper there than a numpy pass).

    Raises:
        TypeError: the ids are not integers.
        ValueError: not one-dimensional.
    """
    if type(tokens) is np.ndarray and tokens.ndim == 1 and tokens.dtype.kind in "iu" and tokens.flags.c_contiguous:
        return tokens if tokens.dtype.kind == "i" else tokens.astype(np.int64)
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
    return np.ascontiguousarray(arr, dtype=np.int64)


def range_error(tokens: np.ndarray) -> ValueError:
    """The error for ids outside [0, int32 max], naming the offending values."""
    return ValueError(f"token ids must lie in [0, {_INT32_MAX}], got min {tokens.min()} and max {tokens.max()}")


def table_size(min_slots: int) -> int:
    """The power of two (at least 1024) that holds `min_slots` hash-table slots."""
    return 1 << max(10, int(min_slots - 1).bit_length())
