"""The measured peaks of this machine, kept for the session and across chapters.

``MeasuredPeaks`` holds what ``microbench.machine_peaks`` measured: STREAM copy and triad bandwidth and
matmul FLOP/s per dtype. They are kept in this process and in ``peaks.json`` under ``$COURSE_CACHE_DIR``
(default ``~/.cache/course_lib``), keyed by a machine fingerprint (device, thread count, torch version,
course mode), so every chapter works with the same roof; a missing, unreadable or corrupted file only
means measuring again. ``cached_peaks`` never measures: it is what ``bench.benchmark`` compares a
timing with. Introduced in 00_setup_and_hardware.ipynb.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from course_lib.core.dtypes import canonical
from course_lib.core.mode import mode
from course_lib.core.paths import cache_dir
from course_lib.measure.hardware.device import detect_device, resolve_kind


@dataclass(frozen=True)
class MeasuredPeaks:
    """Peaks measured on this device. Bandwidth in GB/s, matmul in TFLOP/s.
    A peak is the best rate over the repeats (STREAM's convention): noise can only slow a run down.
    ``measured_at`` (local ISO time, "" when built by hand) and ``from_cache`` (read back from the
    peaks file rather than measured by this process) say where the numbers come from."""

    device: str
    copy_gbs: float
    triad_gbs: float
    matmul_tflops: dict[str, float]
    array_bytes: int  # bytes of one STREAM array
    matmul_n: int
    measured_at: str = ""
    from_cache: bool = False

    @property
    def bandwidth(self) -> float:
        """Best measured bandwidth in bytes/s (the roof's slope)."""
        return max(self.copy_gbs, self.triad_gbs) * 1e9

    def peak_flops(self, dtype: str | None = None) -> float:
        """Measured matmul FLOP/s for ``dtype`` (default: the fastest dtype measured)."""
        if dtype is None:
            return max(self.matmul_tflops.values()) * 1e12
        name = canonical(dtype)
        if name not in self.matmul_tflops:
            raise ValueError(f"dtype {name!r} was not measured on {self.device}; measured: {list(self.matmul_tflops)}")
        return self.matmul_tflops[name] * 1e12

    def ridge(self, dtype: str | None = None) -> float:
        """Measured ridge point in FLOP/byte."""
        return self.peak_flops(dtype) / self.bandwidth

    @property
    def measured_on(self) -> str:
        """``measured_at`` as 'YYYY-MM-DD HH:MM' (local time of the measurement), '' if unknown."""
        return self.measured_at[:16].replace("T", " ")

    @property
    def provenance(self) -> str:
        """One line for a notebook: when the peaks were measured and whether they came from the cache."""
        if not self.measured_at:
            return "peaks given by hand (not measured)"
        if self.from_cache:
            return f"peaks measured on {self.measured_on} (cached; pass refresh=True to re-measure)"
        return f"peaks measured on {self.measured_on} (just now; later chapters reuse them)"


_CACHE_VERSION = 1  # bump when the measurement itself changes: older entries are then re-measured
_PEAKS: dict[str, MeasuredPeaks] = {}  # in-process, by fingerprint key
_DISK_WARNED: list[bool] = []


def peaks_cache_path() -> Path:
    """Where measured peaks are kept across chapters: ``$COURSE_CACHE_DIR/peaks.json`` (else
    ``$COURSE_CACHE``, the corpus cache's variable, else ``~/.cache/course_lib``)."""
    return cache_dir() / "peaks.json"


def machine_fingerprint(device: str | None = None) -> dict[str, object]:
    """What must match for stored peaks to be reused: the device (CPU model and physical cores, or GPU
    name and compute capability), torch's thread count on a CPU (a change of thread count is a different
    machine), the torch version and the course mode (it sets the sizes measured)."""
    kind = resolve_kind(device)
    info = detect_device(kind)
    fp: dict[str, object] = {"version": _CACHE_VERSION, "kind": kind, "device": info.name}
    if kind == "cpu":
        fp.update(physical_cores=info.core_count, threads=torch.get_num_threads())
    else:
        fp.update(compute_capability=".".join(map(str, info.compute_capability or ())), sm_count=info.sm_count)
    fp.update(torch=torch.__version__, mode=mode())
    return fp


def _fingerprint_key(fp: dict[str, object]) -> str:
    return "|".join(f"{k}={v}" for k, v in fp.items())


def _warn_disk_once(message: str) -> None:
    if not _DISK_WARNED:
        import warnings

        _DISK_WARNED.append(True)
        warnings.warn(f"{message}; peaks are kept for this session only", RuntimeWarning, stacklevel=3)


def _read_cache_file() -> dict:
    """The peaks file's ``entries``; {} when it is missing, unreadable or corrupted (never raises)."""
    try:
        raw = json.loads(peaks_cache_path().read_text())
    except (OSError, ValueError):
        return {}
    entries = raw.get("entries") if isinstance(raw, dict) else None
    return entries if isinstance(entries, dict) else {}


def _peaks_from_entry(entry) -> MeasuredPeaks | None:
    import math

    try:
        tflops = {canonical(k): float(v) for k, v in entry["matmul_tflops"].items()}
        peaks = MeasuredPeaks(
            str(entry["device"]),
            float(entry["copy_gbs"]),
            float(entry["triad_gbs"]),
            tflops,
            int(entry["array_bytes"]),
            int(entry["matmul_n"]),
            str(entry["measured_at"]),
            from_cache=True,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    rates = (peaks.copy_gbs, peaks.triad_gbs, *tflops.values())
    if not tflops or not all(math.isfinite(r) and r > 0 for r in rates):
        return None
    return peaks


def _load_peaks(key: str) -> MeasuredPeaks | None:
    return _peaks_from_entry(_read_cache_file().get(key))


def _save_peaks(key: str, fp: dict[str, object], peaks: MeasuredPeaks) -> bool:
    """Add this machine's entry to the peaks file (atomically); False, with one warning, if unwritable."""
    path = peaks_cache_path()
    entries = _read_cache_file()  # a corrupted file is replaced
    entries[key] = {
        "fingerprint": fp,
        "measured_at": peaks.measured_at,
        "device": peaks.device,
        "copy_gbs": peaks.copy_gbs,
        "triad_gbs": peaks.triad_gbs,
        "matmul_tflops": peaks.matmul_tflops,
        "array_bytes": peaks.array_bytes,
        "matmul_n": peaks.matmul_n,
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"version": _CACHE_VERSION, "entries": entries}, indent=1))
        os.replace(tmp, path)
    except OSError as err:
        try:
            tmp.unlink()
        except OSError:
            pass
        _warn_disk_once(f"cannot write the peaks cache {path} ({err.strerror or err})")
        return False
    return True


def reset(disk: bool = False) -> None:
    """Forget the peaks measured in this process; the next ``machine_peaks()`` reads the peaks file
    again (so it does not re-measure). ``disk=True`` also deletes the peaks file, so the next call
    measures. To re-measure once without forgetting anything: ``machine_peaks(refresh=True)``."""
    _PEAKS.clear()
    if disk:
        try:
            peaks_cache_path().unlink()
        except FileNotFoundError:
            pass
        except OSError as err:
            _warn_disk_once(f"cannot delete the peaks cache {peaks_cache_path()} ({err.strerror or err})")


def cached_peaks(device: str | None = None, *, disk: bool = False) -> MeasuredPeaks | None:
    """Peaks already known for ``device``, or None — never measures. By default only those this process
    measured or loaded (what ``bench.benchmark`` compares with); ``disk=True`` also looks in the peaks file."""
    key = _fingerprint_key(machine_fingerprint(device))
    if key not in _PEAKS and disk:
        loaded = _load_peaks(key)
        if loaded is not None:
            _PEAKS[key] = loaded
    return _PEAKS.get(key)


def remember_peaks(device: str | None, peaks: MeasuredPeaks) -> MeasuredPeaks:
    """Keep freshly measured ``peaks`` of ``device`` for this process and write them to the peaks file
    (replacing this machine's entry; one warning, and in-process only, if the file is unwritable)."""
    fp = machine_fingerprint(device)
    key = _fingerprint_key(fp)
    _PEAKS[key] = peaks
    _save_peaks(key, fp, peaks)
    return peaks
