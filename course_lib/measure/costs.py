"""FLOPs and bytes of the primitive operations the course times, counted by hand.

Every measured point on a roofline needs two numbers that do not come from the clock: how many
floating-point operations the work needs and how many bytes it must move to and from memory at
the very least (each input read once, each output written once). Their ratio, the arithmetic
intensity, decides whether the operation is bandwidth- or compute-bound on a given chip.
Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.core.dtypes import dtype_bytes


@dataclass(frozen=True)
class Cost:
    """FLOPs and minimum bytes moved by one call of an operation."""

    name: str
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """FLOP per byte moved (0 for pure data movement such as a copy)."""
        return self.flops / self.bytes


def check_positive_int(name: str, value) -> int:
    """Raise a ValueError naming ``name`` unless ``value`` is an int > 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def copy_cost(n: int, dtype: str = "fp32") -> Cost:
    """STREAM copy ``b = a``: reads n and writes n elements, no FLOPs.

    Like STREAM we count the bytes the program asks for; a CPU that write-allocates the
    destination cache line actually moves one more read, so the hardware works harder than we count.
    """
    check_positive_int("n", n)
    return Cost("copy", 0.0, 2.0 * n * dtype_bytes(dtype))


def triad_cost(n: int, dtype: str = "fp32") -> Cost:
    """STREAM triad ``a = b + s·c``: reads 2n, writes n elements, 2 FLOPs per element."""
    check_positive_int("n", n)
    return Cost("triad", 2.0 * n, 3.0 * n * dtype_bytes(dtype))


def matmul_cost(m: int, n: int, k: int, dtype: str = "fp32") -> Cost:
    """``C (m,n) = A (m,k) @ B (k,n)``: 2·m·n·k FLOPs; reads A and B once, writes C once.

    With m = 1 this is a GEMV (matrix-vector product): intensity ≈ 1/bytes-per-element,
    the shape of a batch-1 decode step.
    """
    for name, value in (("m", m), ("n", n), ("k", k)):
        check_positive_int(name, value)
    return Cost(f"matmul {m}x{k}x{n}", 2.0 * m * n * k, (m * k + k * n + m * n) * dtype_bytes(dtype))


def gemv_cost(n: int, k: int, dtype: str = "fp32") -> Cost:
    """``y (n) = W (n,k) @ x (k)``: 2·n·k FLOPs, reads W and x, writes y."""
    cost = matmul_cost(1, n, k, dtype)
    return Cost(f"gemv {n}x{k}", cost.flops, cost.bytes)


def conv2d_cost(batch: int, c_in: int, c_out: int, h: int, w: int, kernel: int = 3, dtype: str = "fp32") -> Cost:
    """A same-padded ``kernel×kernel`` convolution on a (batch, c_in, h, w) image:
    2·batch·c_out·h·w·c_in·kernel² FLOPs; reads input and weights once, writes the output once.
    Each weight is reused at every pixel, so the intensity grows with the image size."""
    for name, value in (("batch", batch), ("c_in", c_in), ("c_out", c_out), ("h", h), ("w", w), ("kernel", kernel)):
        check_positive_int(name, value)
    flops = 2.0 * batch * c_out * h * w * c_in * kernel * kernel
    elems = batch * c_in * h * w + c_out * c_in * kernel * kernel + c_out + batch * c_out * h * w
    return Cost(f"conv{kernel}x{kernel} {c_in}->{c_out} @ {h}x{w}", flops, elems * dtype_bytes(dtype))


def fma_chain_cost(n: int, k: int, dtype: str = "fp32") -> Cost:
    """The intensity kernel ``y = x; repeat k: y = y·a + b``: reads n, writes n, 2·k FLOPs per
    element. Its intensity, k / bytes-per-element, is a dial we turn to walk along the roofline."""
    check_positive_int("n", n)
    check_positive_int("k", k)
    return Cost(f"fma-chain k={k}", 2.0 * k * n, 2.0 * n * dtype_bytes(dtype))
