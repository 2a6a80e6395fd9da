"""Peaks measured once per machine: the in-process cache, then the peaks file, then a measurement."""

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

from course_lib.measure import hardware, microbench
from course_lib.measure.hardware import peaks_cache


class _FakeTiming:
    """Stands in for bench.Timing: one second per call."""

    def __init__(self, flops=None, bytes=None):
        self.flops, self.bytes = flops, bytes

    def rate(self, amount, best=False):
        return amount / 1.0


def _fake_measurements(monkeypatch, bandwidth) -> list:
    """Cheap fake STREAM and matmul measurements that log themselves: ``bandwidth(n)`` bytes/s for the n-th
    call so far, 0.4 TFLOP/s in fp32 and 0.1 in bf16. Returns the log."""
    log = []

    def fake_bw(kind, **kw):
        log.append(kind)
        return _FakeTiming(bytes=bandwidth(len(log)))

    def fake_mm(dtype, **kw):
        log.append(dtype)
        return _FakeTiming(flops=4e11 if dtype == "fp32" else 1e11)

    monkeypatch.setattr(microbench, "measure_bandwidth", fake_bw)
    monkeypatch.setattr(microbench, "measure_matmul", fake_mm)
    return log


@pytest.fixture
def calls(monkeypatch, tmp_path):
    """A private cache dir, an empty in-process cache, and fake measurements that differ on every call."""
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("COURSE_CACHE", raising=False)
    log = _fake_measurements(monkeypatch, lambda n: 3e9 * (1 + n))
    hardware.reset()
    yield log
    hardware.reset()


def _measurements(log):
    return log.count("copy")


def test_measured_peaks_cached_and_reset(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path))  # never the user's peaks file
    calls = _fake_measurements(monkeypatch, lambda n: 3e9)
    hardware.reset()
    assert hardware.cached_peaks("cpu") is None
    peaks = microbench.measured_peaks("cpu")
    assert microbench.measured_peaks("cpu") is peaks  # cached: measured once
    assert calls == ["copy", "triad", "fp32", "bf16"]
    assert peaks.bandwidth == pytest.approx(3e9)
    assert peaks.peak_flops("fp32") == pytest.approx(4e11) and peaks.peak_flops() == pytest.approx(4e11)
    assert peaks.ridge("bf16") == pytest.approx(1e11 / 3e9)
    with pytest.raises(ValueError, match="was not measured"):
        peaks.peak_flops("fp16")
    hardware.reset()
    assert hardware.cached_peaks("cpu") is None  # in-process only by default
    assert microbench.measured_peaks("cpu").from_cache  # the peaks file still has them: not re-measured
    assert len(calls) == 4
    hardware.reset(disk=True)  # forget the file too: the next call measures
    assert hardware.cached_peaks("cpu", disk=True) is None
    microbench.measured_peaks("cpu")
    assert len(calls) == 8
    hardware.reset()


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path))
    assert hardware.peaks_cache_path() == tmp_path / "peaks.json"
    monkeypatch.delenv("COURSE_CACHE_DIR")
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path / "c"))
    assert hardware.peaks_cache_path() == tmp_path / "c" / "peaks.json"
    monkeypatch.delenv("COURSE_CACHE")
    assert hardware.peaks_cache_path() == Path.home() / ".cache" / "course_lib" / "peaks.json"


def test_first_call_measures_and_writes_the_file(calls):
    peaks = microbench.machine_peaks("cpu")
    assert _measurements(calls) == 1 and not peaks.from_cache
    assert "just now" in peaks.provenance and peaks.measured_on in peaks.provenance
    raw = json.loads(hardware.peaks_cache_path().read_text())
    (entry,) = raw["entries"].values()
    assert entry["fingerprint"] == hardware.machine_fingerprint("cpu")
    assert entry["measured_at"] == peaks.measured_at and entry["matmul_tflops"] == peaks.matmul_tflops
    assert microbench.machine_peaks("cpu") is peaks  # same process: the same object


def test_next_chapter_reads_the_file(calls):
    first = microbench.machine_peaks("cpu")
    hardware.reset()  # what a new notebook process looks like
    again = microbench.machine_peaks("cpu")
    assert _measurements(calls) == 1  # not re-measured
    assert again.from_cache and again.measured_at == first.measured_at
    assert again.ridge("fp32") == first.ridge("fp32") and again.bandwidth == first.bandwidth
    assert again.provenance == f"peaks measured on {first.measured_on} (cached; pass refresh=True to re-measure)"
    assert microbench.measured_peaks("cpu") is again  # the old name is the same function


def test_cached_peaks_never_measures(calls):
    assert hardware.cached_peaks("cpu") is None and hardware.cached_peaks("cpu", disk=True) is None
    microbench.machine_peaks("cpu")
    hardware.reset()
    assert hardware.cached_peaks("cpu") is None  # bench's default: this process only
    assert hardware.cached_peaks("cpu", disk=True).from_cache
    assert _measurements(calls) == 1


def test_refresh_measures_again_and_replaces_the_entry(calls):
    first = microbench.machine_peaks("cpu")
    fresh = microbench.machine_peaks("cpu", refresh=True)
    assert _measurements(calls) == 2 and not fresh.from_cache
    assert fresh.triad_gbs != first.triad_gbs  # the fake measures a different bandwidth each time
    hardware.reset()
    assert microbench.machine_peaks("cpu").triad_gbs == fresh.triad_gbs
    assert len(json.loads(hardware.peaks_cache_path().read_text())["entries"]) == 1


def test_another_fingerprint_measures(calls, monkeypatch):
    microbench.machine_peaks("cpu")
    monkeypatch.setenv("COURSE_MODE", "full" if hardware.machine_fingerprint("cpu")["mode"] == "quick" else "quick")
    microbench.machine_peaks("cpu")
    assert _measurements(calls) == 2
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    microbench.machine_peaks("cpu")
    assert _measurements(calls) == 3
    assert len(json.loads(hardware.peaks_cache_path().read_text())["entries"]) == 3


def test_another_thread_count_measures(calls):
    before = torch.get_num_threads()
    microbench.machine_peaks("cpu")
    try:
        torch.set_num_threads(1 if before > 1 else 2)
        microbench.machine_peaks("cpu")
    finally:
        torch.set_num_threads(before)
    assert _measurements(calls) == 2


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[1, 2, 3]",
        '{"version": 1, "entries": "oops"}',
        "",
    ],
)
def test_corrupted_file_is_ignored_and_replaced(calls, text):
    path = hardware.peaks_cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(text)
    peaks = microbench.machine_peaks("cpu")
    assert _measurements(calls) == 1 and not peaks.from_cache
    hardware.reset()
    assert microbench.machine_peaks("cpu").from_cache  # the file was rewritten, valid
    assert _measurements(calls) == 1


def test_corrupted_entry_is_ignored(calls):
    microbench.machine_peaks("cpu")
    path = hardware.peaks_cache_path()
    raw = json.loads(path.read_text())
    for entry in raw["entries"].values():
        entry["triad_gbs"] = "fast"
    path.write_text(json.dumps(raw))
    hardware.reset()
    assert not microbench.machine_peaks("cpu").from_cache
    assert _measurements(calls) == 2


def test_unwritable_cache_keeps_peaks_in_process(calls, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("COURSE_CACHE_DIR", str(blocker / "sub"))  # a directory under a file: cannot exist
    monkeypatch.setattr(peaks_cache, "_DISK_WARNED", [])
    with pytest.warns(RuntimeWarning, match="this session only"):
        peaks = microbench.machine_peaks("cpu")
    assert microbench.machine_peaks("cpu") is peaks and _measurements(calls) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        microbench.machine_peaks("cpu", refresh=True)  # the second failure is silent (warned once)
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_reset_disk_deletes_the_file(calls):
    microbench.machine_peaks("cpu")
    assert hardware.peaks_cache_path().exists()
    hardware.reset(disk=True)
    assert not hardware.peaks_cache_path().exists()
    hardware.reset(disk=True)  # nothing to delete: fine
    assert not microbench.machine_peaks("cpu").from_cache and _measurements(calls) == 2


def test_hand_built_peaks_say_so():
    peaks = hardware.MeasuredPeaks("cpu", 10.0, 20.0, {"fp32": 1.0}, 1, 1)
    assert not peaks.from_cache and peaks.measured_at == "" and "by hand" in peaks.provenance


def test_no_temp_files_left(calls):
    microbench.machine_peaks("cpu")
    microbench.machine_peaks("cpu", refresh=True)
    assert os.listdir(hardware.peaks_cache_path().parent) == ["peaks.json"]
