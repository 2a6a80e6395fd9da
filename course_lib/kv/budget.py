"""How much KV cache fits a memory budget: tokens and whole-context sequences, for MHA / GQA / MQA of one shape.

A budget is bytes left for the cache once the weights are in place: this machine's free RAM (the weights
already loaded), or ``usable`` (vLLM's 0.9) of a GPU's datasheet memory minus the weights in the KV dtype
(``data/gpu_specs.json``, with its source). ``head_variants`` gives the same model with a KV head per
query head (MHA), its own grouping, and one KV head (MQA): only the cache changes, 2 · layers · kv_heads ·
head_dim · bytes per token, so capacity scales by the ratio of KV heads. Arithmetic only; the engine's
tensors are checked against the formula by ``engine_check``. Introduced in 05_attention_kv_cache.ipynb.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from course_lib.kv.checks import check_int, check_usable, resolve_dtype, resolve_gpu, resolve_shape
from course_lib.kv.formulas import USABLE, attention_kind
from course_lib.models.accounting import ModelShape, kv_bytes_per_token, weight_bytes


def head_variants(shape) -> dict[str, ModelShape]:
    """``shape`` (a ``ModelShape`` or preset name) as MHA (num_kv_heads = num_heads), as it is, and as MQA
    (one KV head), keyed 'MHA (9 KV heads)', 'GQA (3 KV heads)', 'MQA (1 KV head)'; duplicates dropped
    (an MHA model has no separate GQA row)."""
    shape = resolve_shape(shape)
    out: dict[str, ModelShape] = {}
    for kv in (shape.num_heads, shape.num_kv_heads, 1):
        s = dataclasses.replace(shape, num_kv_heads=kv, name=f"{shape.name} ({kv} KV)")
        label = f"{attention_kind(s)} ({kv} KV head{'s' if kv > 1 else ''})"
        out.setdefault(label, s)
    return out


@dataclass(frozen=True)
class Budget:
    """Bytes of memory the KV cache may fill, in ``kv_dtype``, and where the number comes from."""

    name: str
    kv_bytes: float
    kv_dtype: str
    source: str

    def __post_init__(self) -> None:
        if isinstance(self.kv_bytes, bool) or not isinstance(self.kv_bytes, (int, float)) or self.kv_bytes < 0:
            raise ValueError(f"Budget.kv_bytes must be a number of bytes >= 0, got {self.kv_bytes!r}")


def ram_budget(kv_dtype: str = "fp32") -> Budget:
    """This machine's available RAM now (psutil), all of it for the cache: the weights are already loaded."""
    import psutil

    avail = psutil.virtual_memory().available
    return Budget("this machine's free RAM", float(avail), resolve_dtype("kv_dtype", kv_dtype), "psutil, measured now")


def gpu_budget(shape, gpu, dtype: str = "bf16", usable: float = USABLE) -> Budget:
    """``usable`` of ``gpu``'s datasheet memory (binary units, as ``bottlenecks.capacity.device_bytes``) minus
    the weights, both in ``dtype``; a GPU without ``dtype`` (a T4 has no bf16) uses its nearest
    (``GpuSpec.best_dtype``). The weights are counted for the model's own shape: MHA/MQA variants differ
    only by their K/V projections, < 3% of SmolLM2's weights."""
    from course_lib.bottlenecks.capacity import device_bytes

    shape, spec = resolve_shape(shape), resolve_gpu(gpu)
    dtype = spec.best_dtype(resolve_dtype("dtype", dtype))
    usable = check_usable(usable)
    free = max(0.0, device_bytes(spec) * usable - weight_bytes(shape, dtype))
    src = f"data/gpu_specs.json: {spec.source.split(',')[0]}; {usable:.0%} usable, minus {dtype} weights"
    return Budget(f"{spec.name} ({spec.memory_gb:g} GB)", free, dtype, src)


@dataclass(frozen=True)
class CapacityRow:
    """One variant in one budget: bytes per token, tokens of cache that fit, whole-context sequences."""

    variant: str
    budget: str
    kv_dtype: str
    bytes_per_token: float
    tokens: int
    sequences: int  # of ``context`` tokens
    context: int


def capacity_rows(shape, budgets, context: int | None = None) -> list[CapacityRow]:
    """For every ``head_variants(shape)`` and every ``Budget``: how many tokens of KV cache fit, and how many
    sequences of ``context`` tokens (default: the model's whole context window)."""
    shape = resolve_shape(shape)
    context = shape.max_position if context is None else check_int("context", context)
    if isinstance(budgets, Budget) or not budgets or not all(isinstance(b, Budget) for b in budgets):
        raise ValueError(f"budgets must be a non-empty list of Budget (ram_budget, gpu_budget), got {budgets!r}")
    rows = []
    for b in budgets:
        for label, s in head_variants(shape).items():
            per = kv_bytes_per_token(s, b.kv_dtype)
            tokens = int(b.kv_bytes // per)
            rows.append(CapacityRow(label, b.name, b.kv_dtype, per, tokens, tokens // context, context))
    return rows


def format_capacity(rows) -> str:
    """``capacity_rows`` as a table, one block per budget."""
    lines = [
        f"{'budget':<26} {'KV dtype':<8} {'variant':<18} {'KB/token':>9} {'tokens':>13} {'seqs @ ' + str(rows[0].context):>11}"
    ]
    for r in rows:
        lines.append(
            f"{r.budget:<26} {r.kv_dtype:<8} {r.variant:<18} {r.bytes_per_token / 1e3:>9.1f} {r.tokens:>13,} {r.sequences:>11,}"
        )
    return "\n".join(lines)
