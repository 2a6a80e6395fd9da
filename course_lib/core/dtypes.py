"""Dtype names the course accepts, and how many bytes each element costs in memory."""

from __future__ import annotations

import torch

# name -> (torch dtype or None for packed formats, bytes per element)
_DTYPES: dict[str, tuple[torch.dtype | None, float]] = {
    "fp32": (torch.float32, 4.0),
    "fp16": (torch.float16, 2.0),
    "bf16": (torch.bfloat16, 2.0),
    "fp8": (getattr(torch, "float8_e4m3fn", None), 1.0),
    "int8": (torch.int8, 1.0),
    "int4": (None, 0.5),  # two values per byte; no native torch dtype
}
_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "e4m3": "fp8",
}
DTYPE_NAMES = tuple(_DTYPES)


def canonical(dtype: str | torch.dtype) -> str:
    """'float16', 'half', torch.float16 -> 'fp16'. Unknown names raise ValueError listing valid ones."""
    if isinstance(dtype, torch.dtype):
        for name, (tdt, _) in _DTYPES.items():
            if tdt == dtype:
                return name
        raise ValueError(f"dtype {dtype} is not one the course models; valid: {DTYPE_NAMES}")
    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be a string like 'fp16' or a torch.dtype, got {type(dtype).__name__}")
    key = dtype.strip().lower().removeprefix("torch.")
    key = _ALIASES.get(key, key)
    if key not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {DTYPE_NAMES} (aliases: {sorted(_ALIASES)})")
    return key


def dtype_bytes(dtype: str | torch.dtype) -> float:
    """Bytes one element occupies: fp32 4, fp16/bf16 2, fp8/int8 1, int4 0.5."""
    return _DTYPES[canonical(dtype)][1]


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype for a name; packed formats (int4) have none and raise ValueError."""
    name = canonical(dtype)
    tdt = _DTYPES[name][0]
    if tdt is None:
        raise ValueError(f"dtype {name!r} has no native torch dtype (it is a packed storage format)")
    return tdt
