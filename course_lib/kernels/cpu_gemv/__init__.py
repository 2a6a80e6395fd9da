"""Hand-written GEMV kernels for a CPU: decode-shaped products at the bandwidth roof (issue 21).

A decode step multiplies every weight matrix by a handful of rows, so its time is the weight's bytes ÷
the memory bandwidth. torch's paths sit below that roof at one row: ``F.linear`` (MKL) and oneDNN's
packed kernel read fp32 weights at ~10-16 GB/s on the course's 2-core VM, where a copy moves 20-30 GB/s,
and the int8/int4 kernels round the activations to bf16. ``gemv.c`` (beside this file) streams each
weight once, a block of rows at a time over all threads, with the activations in fp32:
- ``gemv_f32(x, w)``: fp32 weights (out, in);
- ``gemv_int8(x, q, scale)``: int8 weights, one fp32 scale per output row (symmetric per channel);
- ``rms_norm(x, w, eps)``: RMSNorm of a decode step's few rows (torch's reduction costs 20-30 µs a call on
  the 2-core VM, ~60 calls a SmolLM2 step; this one a few µs);
- ``gemv_int4(x, layout)``: int4 in groups (``Int4Layout``: the nibbles, an fp16 scale and offset per
  group, llama.cpp's Q4_1 layout at groups of 32); on AVX-512 VNNI, rows of 64k inputs in groups of 32, 64
  or 128k run in integers: each block of 32 activations as 24-bit block floating point (three signed byte
  planes, exact to 2^-23 of the block's largest), 6 ``vpdpbusd`` per 128 weights;
- ``gemv_int4_q8(x, layout)``: the same weights with the activations rounded to int8 per block of 32
  first (llama.cpp's trade; AVX-512 VNNI, or AVX2's vpmaddubsw), opt-in: its error is what chapter 02-2 shows beside its speed.
Each is tested against ``F.linear`` on the dequantized weight (``tests/test_cpu_gemv.py``), for 1 to
``MAX_ROWS`` rows and awkward shapes (out not a multiple of the row block, in not of the vector width).

The C file is compiled on first use with the system's C compiler (``$CC``, else ``cc``/``gcc``; flags
``-O3 -march=native -fopenmp``, ``-march`` overridden by ``$COURSE_CPU_GEMV_MARCH``, and ``defines()``: where to prefetch, by CPU vendor) into ``core.paths.cache_dir()/kernels`` (about a second), keyed by the
source, the flags and the CPU, and loaded with ``ctypes``. Its OpenMP calls bind to the ``libgomp`` that
torch has already loaded, so the kernels and torch share one thread pool. Where there is no compiler, the
platform is not Linux, or ``COURSE_CPU_GEMV=0``, ``available()`` is False, ``unavailable_reason()`` says
why (one warning), and the layers that use these kernels keep to torch's paths.
"""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from course_lib.core import cbuild

SOURCE = Path(__file__).with_name("gemv.c")
STEP_SOURCE = Path(__file__).with_name("step.c")  # the whole decode step; it #includes gemv.c, and is what is built
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11")
# COURSE_CPU_GEMV_MARCH=haswell (or any gcc -march) builds for an older instruction set than this CPU's:
# the AVX2 paths can then be run and tested on an AVX-512 machine, or one build shared by several machines.
MARCH_ENV = "COURSE_CPU_GEMV_MARCH"
# How far ahead the kernels prefetch the weight, and into which cache (gemv.c's PF_LOC: __builtin_prefetch's
# locality). Measured, 4,096² fp32 at 2 threads against a 22.5 GB/s triad: on an Intel Sapphire Rapids VM a
# non-temporal prefetch (locality 0) goes to L1 only and lines two row blocks (~80 KB) ahead were evicted
# before use: fp32 read 8.8 GB/s, no prefetch 23.3, into L2 (locality 1) 25.2. On the AMD Zen 3 VM the
# non-temporal one was the fastest (int8 +10% over none). So: L2 on Intel, non-temporal elsewhere.
PREFETCH_LOCALITY = {"GenuineIntel": 1}
MAX_ROWS = 4  # the layers route 1..MAX_ROWS rows here; more rows are a GEMM (oneDNN, MKL)
INT4_GROUP_MULTIPLE = 32  # gemv_int4 takes groups of 32, 64, 128, ... inputs

_lock = threading.Lock()
_state: dict = {"tried": False, "lib": None, "why": None}


def compiler() -> str | None:
    """The C compiler the kernels are built with: ``$CC``, else ``cc`` or ``gcc`` on the PATH."""
    return cbuild.compiler()


def _cpu_key() -> str:
    """What -march=native depends on: the CPU's model and feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(lines)))


def _vendor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def flags() -> tuple[str, ...]:
    """The compiler flags: ``FLAGS``, with ``-march`` from ``$COURSE_CPU_GEMV_MARCH`` where it is set."""
    march = os.environ.get(MARCH_ENV, "").strip()
    if not march:
        return FLAGS
    if not all(ch.isalnum() or ch in "-_." for ch in march):
        raise ValueError(f"{MARCH_ENV} must be a gcc -march name such as 'haswell' or 'x86-64-v3', got {march!r}")
    return tuple(f"-march={march}" if f == "-march=native" else f for f in FLAGS)


def defines() -> tuple[str, ...]:
    """The -D flags of this CPU (``PREFETCH_LOCALITY``)."""
    loc = PREFETCH_LOCALITY.get(_vendor())
    return () if loc is None else (f"-DPF_LOC={loc}",)


def library_path(cc: str) -> Path:
    """Where the compiled kernels of this source, compiler, flags and CPU live."""
    return cbuild.keyed_path(
        "cpu_gemv", SOURCE.read_bytes(), STEP_SOURCE.read_bytes(), cc, " ".join(flags() + defines()), _cpu_key()
    )


def _build(cc: str, out: Path) -> None:
    cbuild.build_shared(cc, [*flags(), *defines()], STEP_SOURCE, out)


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.gemv_float.argtypes = [p, p, p, p, i64, i64, i64, i32]
    lib.gemv_int8_t.argtypes = [p, p, p, p, i64, i64, i64, i32]
    lib.gemv_i4.argtypes = [p, p, p, p, p, i64, i64, i64, i64, i32]
    for f in (lib.gemv_float, lib.gemv_int8_t):
        f.restype = None
    lib.gemv_i4.restype = ctypes.c_int
    lib.gemv_i4_q8.argtypes = [p, p, p, p, p, i64, i64, i64, i64, i32]
    lib.gemv_i4_q8.restype = ctypes.c_int
    lib.rms_norm_rows.argtypes = [p, p, p, i64, i64, ctypes.c_float]
    lib.rms_norm_rows.restype = None
    lib.decode_step.argtypes = [p, p, p, p, i64, p, p, i32]
    lib.decode_step.restype = ctypes.c_int
    lib.decode_work_floats.argtypes = [p, i64]
    lib.decode_work_floats.restype = i64
    return lib


def library():
    """The compiled kernels (a ``ctypes.CDLL``), built on the first call; None where they cannot be."""
    if _state["tried"]:
        return _state["lib"]
    with _lock:
        if _state["tried"]:
            return _state["lib"]
        why = None
        cc = compiler()
        if os.environ.get("COURSE_CPU_GEMV", "1") == "0":
            why = "turned off by COURSE_CPU_GEMV=0"
        elif platform.system() != "Linux":
            why = f"built on Linux only (this is {platform.system()}): torch's own kernels are used"
        elif cc is None:
            why = "no C compiler found (set $CC, or install gcc): torch's own kernels are used"
        else:
            try:
                path = library_path(cc)
                if not path.exists():
                    _build(cc, path)
                _state["lib"] = _load(path)
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                why = f"could not build or load {STEP_SOURCE.name} (with {SOURCE.name}): {e}"
        if why is not None:
            warnings.warn(f"course_lib.kernels.cpu_gemv: {why}", RuntimeWarning, stacklevel=2)
        _state["why"], _state["tried"] = why, True
        return _state["lib"]


def available() -> bool:
    """Whether the hand-written kernels can run here (building them on the first call)."""
    return library() is not None


def unavailable_reason() -> str | None:
    """Why ``available()`` is False (None when it is True)."""
    library()
    return _state["why"]


def _threads(threads) -> int:
    if threads is None:
        return torch.get_num_threads()
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    return threads


def _check_cpu(name: str, t, dtype: torch.dtype, dims: int = 2) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu" or t.dtype != dtype or t.dim() != dims or not t.is_contiguous():
        raise ValueError(
            f"{name} must be a contiguous {dims}-D {dtype} tensor on the CPU, got {t.dtype} {tuple(t.shape)} on "
            f"{t.device} (contiguous: {t.is_contiguous()})"
        )


def _check_x(x, k: int) -> int:
    _check_cpu("x", x, torch.float32)
    if x.shape[1] != k:
        raise ValueError(f"x must have {k} columns (the weight's in_features), got {tuple(x.shape)}")
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"x must have 1..{MAX_ROWS} rows (a decode-shaped product), got {x.shape[0]}")
    return x.shape[0]


def _lib():
    lib = library()
    if lib is None:
        raise RuntimeError(f"the CPU GEMV kernels are unavailable: {_state['why']}")
    return lib


def gemv_f32(x: torch.Tensor, w: torch.Tensor, *, threads: int | None = None) -> torch.Tensor:
    """``x @ w.T`` for x (rows ≤ MAX_ROWS, in) fp32 and w (out, in) fp32, both contiguous on the CPU."""
    _check_cpu("w", w, torch.float32)
    _check_x(x, w.shape[1])
    nt = _threads(threads)
    _lib()
    return run_f32(x, w, nt)


def gemv_int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, *, threads: int | None = None) -> torch.Tensor:
    """``x @ (q · scale[:, None]).T`` for int8 q (out, in) and an fp32 scale per output row; x stays fp32."""
    _check_cpu("q", q, torch.int8)
    _check_cpu("scale", scale, torch.float32, dims=1)
    if scale.shape[0] != q.shape[0]:
        raise ValueError(f"scale must have shape ({q.shape[0]},) (one per output row), got {tuple(scale.shape)}")
    _check_x(x, q.shape[1])
    nt = _threads(threads)
    _lib()
    return run_int8(x, q, scale, nt)


@torch.library.custom_op("course::cpu_gemv_f32", mutates_args=())
def gemv_f32_op(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``gemv_f32`` as one opaque op, so that a compiled decode step (``engine.fast_decode``) calls the
    kernel instead of tracing into ``ctypes``."""
    return gemv_f32(x.contiguous(), w)


@gemv_f32_op.register_fake
def _(x, w):
    return x.new_empty(x.shape[0], w.shape[0])


@dataclass(frozen=True)
class Int4Layout:
    """int4 weights as ``gemv_int4`` reads them: ``packed`` uint8 (out, in/2), low nibble the even input;
    ``s`` and ``c`` fp16 (out, in/group_size); the weight is u·s + c per group, u ∈ [0, 15]."""

    packed: torch.Tensor
    s: torch.Tensor
    c: torch.Tensor
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.packed.shape[0], self.packed.shape[1] * 2)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + 2 * self.s.numel() * 2

    def dequantize(self) -> torch.Tensor:
        """The fp32 (out, in) matrix the kernel multiplies by (its reference)."""
        p = self.packed
        u = torch.stack([p & 15, p >> 4], dim=-1).reshape(p.shape[0], -1).float()
        g = self.group_size
        return u * self.s.float().repeat_interleave(g, 1) + self.c.float().repeat_interleave(g, 1)


def int4_layout(packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> Int4Layout:
    """The kernel's layout of the course's int4 format (``compression.quantize``: (u − 8)·scale + zero):
    s = scale and c = zero − 8·scale, rounded to fp16 (exact for weights imported from a Q4_1 file)."""
    _check_cpu("packed", packed, torch.uint8)
    if not isinstance(group_size, int) or group_size < INT4_GROUP_MULTIPLE or group_size % INT4_GROUP_MULTIPLE:
        raise ValueError(f"group_size must be a multiple of {INT4_GROUP_MULTIPLE}, got {group_size!r}")
    n, k = packed.shape[0], packed.shape[1] * 2
    if k % group_size:
        raise ValueError(f"in_features ({k}) must be a multiple of group_size ({group_size})")
    shape = (n, k // group_size)
    for name, t in (("scale", scale), ("zero", zero)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} (out, in/group_size), got {getattr(t, 'shape', t)}")
    s = scale.float()
    c = zero.float() - 8.0 * s
    return Int4Layout(packed.contiguous(), s.half().contiguous(), c.half().contiguous(), group_size)


def gemv_int4(x: torch.Tensor, layout: Int4Layout, *, threads: int | None = None) -> torch.Tensor:
    """``x @ layout.dequantize().T`` without making the float weight: the nibbles become floats in registers
    (on AVX-512 VNNI, integer dot products with the activations as 24-bit block floating point)."""
    if not isinstance(layout, Int4Layout):
        raise ValueError(f"layout must be an Int4Layout (see int4_layout), got {type(layout).__name__}")
    n, k = layout.shape
    _check_x(x, k)
    _lib()
    return run_int4(x, layout, _threads(threads))


def gemv_int4_q8(x: torch.Tensor, layout: Int4Layout, *, threads: int | None = None) -> torch.Tensor:
    """``gemv_int4`` with the activations rounded to int8 per block of 32 first (llama.cpp's Q8 blocks), then
    nibbles times bytes (AVX-512 VNNI; AVX2's vpmaddubsw; a plain C loop elsewhere). The weight's in-features
    must be a multiple of 64. What the rounding costs: ``gemv_roof``'s error row, and chapter 02-2."""
    if not isinstance(layout, Int4Layout):
        raise ValueError(f"layout must be an Int4Layout (see int4_layout), got {type(layout).__name__}")
    n, k = layout.shape
    if k % 64:
        raise ValueError(f"gemv_int4_q8 needs in-features that are a multiple of 64, got {k}")
    _check_x(x, k)
    _lib()
    return run_int4_q8(x, layout, _threads(threads))


def vnni() -> bool:
    """Whether gemv_int4_q8 runs its AVX-512 VNNI path here (a native build; else AVX2's vpmaddubsw where the CPU
    has AVX2, else a plain C loop)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_vnni" in flags and " avx512bw" in flags


# The unchecked calls the layers make once they have checked their own shapes (engine.layers.SkinnyLinear,
# compression.linear.WeightOnlyLinear): x (rows, in) fp32 contiguous on the CPU, rows <= MAX_ROWS.
def run_f32(x: torch.Tensor, w: torch.Tensor, threads: int) -> torch.Tensor:
    (m, k), n = x.shape, w.shape[0]
    y = torch.empty(m, n)
    _state["lib"].gemv_float(x.data_ptr(), w.data_ptr(), None, y.data_ptr(), m, n, k, threads)
    return y


def run_int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, threads: int) -> torch.Tensor:
    (m, k), n = x.shape, q.shape[0]
    y = torch.empty(m, n)
    _state["lib"].gemv_int8_t(x.data_ptr(), q.data_ptr(), scale.data_ptr(), y.data_ptr(), m, n, k, threads)
    return y


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """``F.rms_norm(x, (D,), w, eps)`` for x (rows ≤ MAX_ROWS, D) fp32 and w (D,) fp32, on the CPU."""
    _check_cpu("w", w, torch.float32, dims=1)
    _check_x(x, w.shape[0])
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")
    _lib()
    return run_rms_norm(x, w, float(eps))


def run_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    y = torch.empty_like(x)
    _state["lib"].rms_norm_rows(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], eps)
    return y


def _run_int4(fn: str, x: torch.Tensor, layout: Int4Layout, threads: int) -> torch.Tensor:
    (m, k), n = x.shape, layout.packed.shape[0]
    y = torch.empty(m, n)
    rc = getattr(_state["lib"], fn)(
        x.data_ptr(), layout.packed.data_ptr(), layout.s.data_ptr(), layout.c.data_ptr(), y.data_ptr(),
        m, n, k, layout.group_size, threads,
    )  # fmt: skip
    if rc != 0:
        raise MemoryError(f"{fn}: could not allocate the scratch of {m} rows of {k} inputs")
    return y


def run_int4(x: torch.Tensor, layout: Int4Layout, threads: int) -> torch.Tensor:
    return _run_int4("gemv_i4", x, layout, threads)


def run_int4_q8(x: torch.Tensor, layout: Int4Layout, threads: int) -> torch.Tensor:
    return _run_int4("gemv_i4_q8", x, layout, threads)


__all__ = [
    "INT4_GROUP_MULTIPLE",
    "Int4Layout",
    "MAX_ROWS",
    "available",
    "compiler",
    "gemv_f32",
    "gemv_f32_op",
    "gemv_int4",
    "gemv_int4_q8",
    "gemv_int8",
    "int4_layout",
    "library",
    "library_path",
    "rms_norm",
    "vnni",
    "run_f32",
    "run_int4_q8",
    "run_rms_norm",
    "run_int4",
    "run_int8",
    "unavailable_reason",
]
