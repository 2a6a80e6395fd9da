"""What machine are we on, and what does its datasheet promise?

``device`` detects the GPU (name, memory, compute capability) or the CPU (``cpu_probe``: model,
physical cores, clock, vector ISA, last-level cache); ``cores`` turns a CPU into a FLOP ceiling and a
thread count to time with; ``datasheet`` is the table ``data/gpu_specs.json`` with lookup by name or
alias (``memory_levels``: the memory hierarchy of three of its GPUs, and TPU / LPU rows); ``peaks_cache`` keeps the peaks measured on this machine (by ``course_lib.measure.microbench``,
which times them with ``bench``) for the session and across chapters. The ratio of the two peaks is
the ridge point, Xiao & Zhu's "hardware arithmetic intensity". Introduced in 00_setup_and_hardware.ipynb.
"""

from course_lib.measure.hardware.cores import (
    bf16_flop_per_cycle,
    cpu_theoretical_flops,
    flop_per_cycle,
    idle_cores,
    timing_threads,
    vector_units,
)
from course_lib.measure.hardware.cpu_probe import ISA_FLAGS, physical_cores
from course_lib.measure.hardware.datasheet import SPEC_DTYPES, GpuSpec, gpu_names, gpu_spec, gpu_specs
from course_lib.measure.hardware.device import (
    DeviceInfo,
    cache_regime,
    detect_device,
    preferred_dtype,
    spec_for_device,
)
from course_lib.measure.hardware.peaks_cache import (
    MeasuredPeaks,
    cached_peaks,
    machine_fingerprint,
    peaks_cache_path,
    reset,
)

__all__ = [
    "DeviceInfo",
    "GpuSpec",
    "ISA_FLAGS",
    "MeasuredPeaks",
    "SPEC_DTYPES",
    "bf16_flop_per_cycle",
    "cache_regime",
    "cached_peaks",
    "cpu_theoretical_flops",
    "detect_device",
    "flop_per_cycle",
    "vector_units",
    "gpu_names",
    "gpu_spec",
    "gpu_specs",
    "idle_cores",
    "machine_fingerprint",
    "peaks_cache_path",
    "physical_cores",
    "preferred_dtype",
    "reset",
    "spec_for_device",
    "timing_threads",
]
