"""The bf16 (or fp16) ceiling of a device, and whether a measured matmul reached the speed-up it predicts.

A large matmul is compute-bound: it reads each byte many times from cache, so halving the bytes per
value barely changes its time. What makes bf16 faster is the arithmetic: on a CPU, ``VDPBF16PS``
(AVX512_BF16) does two bf16 products per 32-bit lane where an fp32 FMA does one (2× the FLOPs per
instruction; AMX far more), and on a GPU the tensor cores (the datasheet's bf16 column against its fp32
one). ``ceiling`` gives the predicted FLOP/s per dtype (the ISA estimate on a CPU, the datasheet on a
GPU); ``half_precision_verdict`` holds a measured bf16 ÷ fp32 ratio to most of the predicted one, and
where the CPU has no native bf16, to the claim that the emulated path is slower. Introduced in
00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

from course_lib.measure.claims import Verdict, claim
from course_lib.measure.hardware.cores import cpu_theoretical_flops

#: A measured speed-up counts as "reaching" the predicted one from this share of it on.
SHARE_OF_PREDICTED = 0.75


def ceiling(device, spec, dtype: str, threads: int | None = None) -> float | None:
    """Predicted peak FLOP/s of ``dtype`` on ``device``: the CPU's cores × clock × FLOP/cycle of its
    instructions (fp32, or bf16 where it has native bf16), or the GPU datasheet ``spec``'s figure.
    None where there is no prediction (an unlisted GPU, bf16 on a CPU without it, a T4's bf16)."""
    if device.kind == "cpu":
        return cpu_theoretical_flops(device, threads, dtype) if dtype in ("fp32", "bf16") else None
    return spec.peak_flops(dtype, missing="none") if spec else None


def half_precision_verdict(measured_ratio: float, predicted_ratio: float | None, half: str = "bf16") -> Verdict:
    """``measured_ratio`` = half-precision ÷ fp32 matmul FLOP/s. With a ``predicted_ratio`` (native
    instructions or tensor cores) the claim is that the run reached ``SHARE_OF_PREDICTED`` of it; without
    one (a CPU that emulates bf16) the claim is that emulation is slower than fp32."""
    if predicted_ratio is None:
        return claim(
            f"{half} matmuls run slower than fp32 here: no native {half} instructions, torch converts "
            "every value and runs a fallback",
            measured_ratio,
            at_most=1.0,
            why_not="the matmul library found a fast path this check does not know about",
        )
    return claim(
        f"{half} matmuls reach {SHARE_OF_PREDICTED:.0%} or more of the {predicted_ratio:.3g}x over fp32 "
        "that the FLOPs per instruction predict",
        measured_ratio,
        at_least=SHARE_OF_PREDICTED * predicted_ratio,
        why_not="the matmul library did not use the native instructions for this shape, or other jobs "
        "took cycles from one of the two runs (each is the best of its repeats)",
    )
