"""``profile()``: this machine's profile (``measure.profile``) with what the engine makes of it.

The measured figures live in ``course_lib.measure.profile`` (below the engine in the package's layers);
this adds the two facts only the engine and the kernels can tell: whether the course's C kernels built
here, and which decode path ``Engine(decode="auto")`` takes. Every chapter's first code cell runs
``prof = course_lib.machine.profile(); print(prof.line())``.
"""

from __future__ import annotations

import dataclasses

import torch

from course_lib.engine.fast_decode import auto_decode
from course_lib.kernels import cpu_gemv
from course_lib.measure.profile import MachineProfile, machine_profile


def profile(device: str | None = None, *, refresh: bool = False) -> MachineProfile:
    """``measure.profile.machine_profile`` with ``kernels`` (built, or why not) and ``decode`` (the path
    ``decode="auto"`` takes for an fp32 model on a CPU, or the GPU's) filled in."""
    prof = machine_profile(device, refresh=refresh)
    if prof.kind == "cpu":
        kernels = "built" if cpu_gemv.available() else f"not built ({cpu_gemv.unavailable_reason()})"
    else:
        kernels = "CPU kernels not used on a GPU"
    mode, _ = auto_decode(prof.kind, torch.float32 if prof.kind == "cpu" else torch.bfloat16)
    return dataclasses.replace(prof, kernels=kernels, decode=f"auto -> {mode}")


__all__ = ["profile"]
