"""Energy counters: joules a piece of work used, from NVML on an NVIDIA GPU or RAPL on a CPU.

An NVIDIA GPU (Volta and later) keeps a board energy counter in millijoules since the driver loaded
(NVML's ``nvmlDeviceGetTotalEnergyConsumption``); it is read here through ``pynvml`` where installed,
else straight from ``libnvidia-ml.so.1`` with ctypes. A Linux CPU exposes RAPL (Running Average Power
Limit) package counters in microjoules under ``/sys/class/powercap/intel-rapl:N/energy_uj`` (AMD parts
too, under the same name); they wrap at ``max_energy_range_uj`` and are readable only by root on most
kernels since 2020, and not at all inside most VMs and containers. ``energy_counter()`` returns a
counter or None with the reason; ``measure_energy`` runs a function between two readings and also
measures the idle draw over as long a pause, so the energy the work itself added can be told from the
power the chip draws anyway. Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

POWERCAP = Path("/sys/class/powercap")


@dataclass(frozen=True)
class EnergyCounter:
    """A monotonically growing energy counter: ``read()`` returns joules."""

    source: str  # e.g. "NVML (GPU 0, whole board)" or "RAPL package (2 domains)"
    read: Callable[[], float]
    wrap_j: float | None = None  # the counter wraps to 0 past this many joules (RAPL); None: never

    def delta(self, before: float, after: float) -> float:
        """Joules between two readings, across one wrap."""
        if after >= before or self.wrap_j is None:
            return after - before
        return after + self.wrap_j - before


def _nvml_counter(index: int) -> tuple[EnergyCounter | None, str]:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        return EnergyCounter(
            f"NVML via pynvml (GPU {index}, whole board)",
            lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3,
        ), ""
    except ImportError:
        pass
    except Exception as err:  # noqa: BLE001 - any NVML error means: no counter, say why
        return None, f"NVML via pynvml failed: {err}"
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as err:
        return None, f"libnvidia-ml.so.1 not loadable ({err}): no NVIDIA driver here"
    if lib.nvmlInit_v2() != 0:
        return None, "nvmlInit_v2 failed"
    handle = ctypes.c_void_p()
    if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
        return None, f"NVML has no GPU {index}"
    mj = ctypes.c_ulonglong()

    def read() -> float:
        rc = lib.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(mj))
        if rc != 0:
            raise RuntimeError(f"nvmlDeviceGetTotalEnergyConsumption returned {rc}")
        return mj.value / 1e3

    try:
        read()
    except RuntimeError as err:
        return None, f"{err} (the counter needs a Volta or later GPU)"
    return EnergyCounter(f"NVML via ctypes (GPU {index}, whole board)", read), ""


def _rapl_counter(root: Path) -> tuple[EnergyCounter | None, str]:
    if not root.is_dir():
        return None, f"{root} does not exist: no RAPL here (most VMs and containers hide it)"
    domains = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)  # packages, not subzones
    if not domains:
        return None, f"{root} has no intel-rapl:N package domains"
    files = [d / "energy_uj" for d in domains]
    try:
        wraps = [int((d / "max_energy_range_uj").read_text()) / 1e6 for d in domains]
        [int(f.read_text()) for f in files]
    except PermissionError:
        return None, f"{files[0]} is readable only by root on this kernel (sudo chmod a+r it, at your own risk)"
    except (OSError, ValueError) as err:
        return None, f"cannot read {files[0]}: {err}"

    def read() -> float:
        return sum(int(f.read_text()) for f in files) / 1e6

    return EnergyCounter(f"RAPL package ({len(files)} domain(s), the whole socket)", read, wrap_j=max(wraps)), ""


def energy_counter(device: str = "cpu", *, powercap: Path = POWERCAP) -> tuple[EnergyCounter | None, str]:
    """(counter, "") where this device's energy is readable, else (None, why not). ``device``: "cpu",
    "cuda" or "cuda:N"."""
    if not isinstance(device, str) or not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if device.startswith("cuda"):
        return _nvml_counter(int(device.split(":")[1]) if ":" in device else 0)
    return _rapl_counter(Path(powercap))


@dataclass(frozen=True)
class EnergyReading:
    """Joules and seconds of one run, and the idle draw measured beside it."""

    source: str
    joules: float
    seconds: float
    idle_watts: float

    @property
    def watts(self) -> float:
        return self.joules / self.seconds

    @property
    def above_idle_j(self) -> float:
        """The energy the work added over what the chip drew idle in the same time (can be < 0 in noise)."""
        return self.joules - self.idle_watts * self.seconds


def measure_energy(counter: EnergyCounter, fn: Callable[[], object], *, idle_s: float = 0.5) -> EnergyReading:
    """Run ``fn`` once between two readings of ``counter``; first sleep ``idle_s`` between two readings
    for the idle power. ``sync`` inside ``fn`` (e.g. ``torch.cuda.synchronize``) is the caller's job."""
    if not idle_s > 0:
        raise ValueError(f"idle_s must be > 0 seconds, got {idle_s!r}")
    e0, t0 = counter.read(), time.perf_counter()
    time.sleep(idle_s)
    e1, t1 = counter.read(), time.perf_counter()
    fn()
    e2, t2 = counter.read(), time.perf_counter()
    idle_w = counter.delta(e0, e1) / (t1 - t0)
    return EnergyReading(counter.source, counter.delta(e1, e2), t2 - t1, idle_w)
