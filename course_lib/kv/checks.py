"""Argument checks shared by chapter 05's KV modules: a model, dtype or GPU given by name, and int ranges.

Each one turns what a learner types (``"llama-2-7b"``, ``"bfloat16"``, ``"H100 SXM"``, a list of contexts)
into the library's object, or raises a ``ValueError`` that names the argument and lists what is valid.
Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

from course_lib.core.dtypes import DTYPE_NAMES, canonical
from course_lib.models.accounting import PRESETS, ModelShape


def resolve_shape(model) -> ModelShape:
    """A ``ModelShape`` from a preset name (case-insensitive) or a ``ModelShape`` itself."""
    if isinstance(model, ModelShape):
        return model
    key = model.strip().lower() if isinstance(model, str) else None
    if key not in PRESETS:
        raise ValueError(f"model must be a preset name, one of {sorted(PRESETS)}, or a ModelShape; got {model!r}")
    return PRESETS[key]


def resolve_dtype(name: str, value) -> str:
    """The canonical dtype name of ``value`` (an alias such as 'bfloat16' included)."""
    try:
        return canonical(value)
    except (ValueError, TypeError):
        raise ValueError(f"{name} must be one of {list(DTYPE_NAMES)} (or an alias such as 'bfloat16'), got {value!r}")


def resolve_gpu(gpu):
    """A ``hardware.GpuSpec`` from a datasheet name (or NVIDIA's device name) or a ``GpuSpec`` itself."""
    from course_lib.measure.hardware.datasheet import GpuSpec, gpu_names, gpu_spec

    if isinstance(gpu, GpuSpec):
        return gpu
    try:
        return gpu_spec(gpu)
    except ValueError:
        raise ValueError(f"gpu must be one of {list(gpu_names())} (or NVIDIA's device name), got {gpu!r}") from None


def check_usable(usable) -> float:
    """A fraction of GPU memory in (0, 1]."""
    if isinstance(usable, bool) or not isinstance(usable, (int, float)) or not 0 < usable <= 1:
        raise ValueError(f"usable must be a fraction in (0, 1], got {usable!r}")
    return float(usable)


def check_int(name: str, value, minimum: int = 1) -> int:
    """``value`` if it is an int >= ``minimum`` (not a bool), else a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_ints(name: str, values, minimum: int = 1) -> tuple[int, ...]:
    """A non-empty tuple of ints >= ``minimum`` from one int or a list of them."""
    if isinstance(values, int) and not isinstance(values, bool):
        values = (values,)
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"{name} must be a non-empty list of ints >= {minimum}, got {values!r}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"{name} must be a non-empty list of ints >= {minimum}, got {values!r}")
    return tuple(values)
