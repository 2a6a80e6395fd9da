"""Weight-only quantized skinny matmuls: ``y = x · Wᵀ`` with W stored as int8 or int4 and dequantized in registers.

A decode step multiplies a few rows of activations (M = 1..16) by every weight matrix of the model: it
is bandwidth-bound, and its time is the bytes of weight it streams (chapter 01). Storing W in 8 or 4
bits divides those bytes by 2 or ~4 against fp16, *provided* the kernel reads the integers and turns
them into floats in registers, never writing a float copy of W back to memory. That is what the two
kernels do:

- ``int8``: per output channel, symmetric; reference, kernel, launcher ``int8_matmul``, torch fallback.
- ``int4``: group-wise, asymmetric, two weights per byte; the same four parts, plus ``pack_int4`` /
  ``unpack_int4`` (the storage ``course_lib.compression.quantize`` writes).
- ``plan``: what both launchers share: the checks of x and of the scales, the path, the tile plan.

The names below are the public API of those modules, listed for notebooks and benchmarks
(``qm.int8_matmul``); code inside course_lib imports from the module that defines a name.
Introduced in 03_compression.ipynb.
"""

from course_lib.kernels.quant_matmul.int4 import (
    FAST_GROUP_SIZES,
    dequantize_int4,
    int4_matmul,
    int4_matmul_ref,
    int4_matmul_torch,
    int4_weight_bytes,
    pack_int4,
    unpack_int4,
)
from course_lib.kernels.quant_matmul.int8 import (
    dequantize_int8,
    int8_matmul,
    int8_matmul_ref,
    int8_matmul_torch,
    int8_weight_bytes,
)
from course_lib.kernels.quant_matmul.plan import MAX_TRITON_ROWS, resolve_path

__all__ = [
    "FAST_GROUP_SIZES",
    "MAX_TRITON_ROWS",
    "dequantize_int4",
    "dequantize_int8",
    "int4_matmul",
    "int4_matmul_ref",
    "int4_matmul_torch",
    "int4_weight_bytes",
    "int8_matmul",
    "int8_matmul_ref",
    "int8_matmul_torch",
    "int8_weight_bytes",
    "pack_int4",
    "resolve_path",
    "unpack_int4",
]
