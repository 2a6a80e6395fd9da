"""The other "memory-bound": capacity. Do the weights and the KV cache fit in one GPU's memory at all?

``fits_in_memory`` counts a model's weights plus ``batch`` sequences of KV cache against a datasheet's
memory size (in binary units, times the share an engine may fill) and says what overflows and how
many sequences would fit. Nothing is measured: sizes come from the model's shape
(``models.accounting``) and the datasheet. Introduced in 01_bottlenecks_2_prefill_decode.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.measure.costs import check_positive_int
from course_lib.measure.hardware.datasheet import as_spec
from course_lib.models.accounting import as_shape, kv_bytes_per_token, weight_bytes


def device_bytes(gpu) -> float:
    """Bytes of memory on ``gpu`` (a name or a ``GpuSpec``). Datasheets say "GB" but GPU memory comes
    in binary units: an H100's "80GB" is 80 GiB = 85.9e9 bytes (torch sees ≈79 GiB of it after the
    driver's and ECC's reserve), so this is ``memory_gb`` × 2**30, an upper bound on what is usable."""
    return as_spec(gpu).memory_gb * 2**30


@dataclass(frozen=True)
class Capacity:
    """Whether ``batch`` sequences of ``context_len`` tokens fit in one GPU's memory: weights + KV cache
    (activations, the CUDA context and allocator slack are not counted). Sizes are printed in GB = 1e9
    bytes, the device's datasheet size also in GiB = 2**30 bytes."""

    model: str
    gpu: str
    batch: int
    context_len: int
    weights_bytes: float
    kv_bytes: float
    device_bytes: float  # the datasheet memory
    max_batch: int  # most sequences of context_len tokens that fit beside the weights (0 if none)
    usable: float = 1.0  # fraction of device_bytes the engine may fill

    @property
    def usable_bytes(self) -> float:
        return self.device_bytes * self.usable

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.usable_bytes

    @property
    def overflow(self) -> str | None:
        """'weights' if they alone exceed the memory, else 'kv cache' if weights + KV do, else None."""
        if self.weights_bytes > self.usable_bytes:
            return "weights"
        return None if self.fits else "kv cache"

    def __str__(self) -> str:
        sizes = (
            f"weights {self.weights_bytes / 1e9:.1f} GB + KV cache {self.kv_bytes / 1e9:.1f} GB = "
            f"{self.total_bytes / 1e9:.1f} GB {'<=' if self.fits else '>'} {self.usable_bytes / 1e9:.1f} GB "
            f"({self.usable:.0%} of the {self.gpu}'s {self.device_bytes / 2**30:g} GiB)"
        )
        seqs = f"{self.max_batch} sequences of {self.context_len} tokens fit"
        if self.overflow == "weights":
            return f"{sizes}: the weights alone overflow; no sequence fits on one GPU"
        if self.overflow == "kv cache":
            return f"{sizes}: the KV cache overflows; " + (
                f"at most {seqs}" if self.max_batch else f"not even one sequence of {self.context_len} tokens fits"
            )
        return (
            f"{sizes}: fits, {self.total_bytes / self.usable_bytes:.0%} full (activations not counted); at most {seqs}"
        )


def fits_in_memory(
    model, gpu, batch: int, context_len: int, dtype: str = "bf16", kv_dtype: str | None = None, usable: float = 0.9
) -> Capacity:
    """Capacity check for ``batch`` sequences each holding ``context_len`` tokens of KV cache beside
    ``model``'s weights (a ``ModelShape`` or preset name) on one ``gpu`` (a name or ``GpuSpec``).
    Returns a ``Capacity``; its ``str`` says what overflows and how many sequences would fit.
    ``usable``: the share of the memory an engine may fill (vLLM's ``gpu_memory_utilization`` default,
    0.9, data/references.json: vllm_gpu_memory_utilization; the rest holds the CUDA context, activations
    and allocator slack)."""
    check_positive_int("batch", batch)
    if isinstance(usable, bool) or not isinstance(usable, (int, float)) or not 0 < usable <= 1:
        raise ValueError(f"usable must be a fraction in (0, 1], got {usable!r}")
    check_positive_int("context_len", context_len)
    shape, spec = as_shape(model), as_spec(gpu)
    weights = weight_bytes(shape, dtype)
    per_seq = kv_bytes_per_token(shape, kv_dtype or dtype) * context_len
    memory = device_bytes(spec)
    max_batch = max(0, int((memory * usable - weights) // per_seq))
    return Capacity(shape.name, spec.name, batch, context_len, weights, per_seq * batch, memory, max_batch, usable)
