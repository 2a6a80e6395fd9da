"""The machine profile: its cache key and invalidation, the regime line, and the chapters reading it."""

import json
import re
from pathlib import Path

import pytest

from course_lib.measure import profile as P


def _fake_profile(key="k", llc=32 * 2**20, **kw) -> P.MachineProfile:
    base = dict(
        key=key,
        kind="cpu",
        device="Test CPU",
        cores=2,
        threads_all=2,
        torch_version="x",
        measured_at="2026-12-06T10:00:00+00:00",
        isa=("avx2", "fma"),
        caches={"L1d": 32768, "L2": 2**20, "L3": llc},
        llc=llc,
        clock_ghz=3.0,
        clock_os_mhz=2100.0,
        clock_os_note="base clock",
        matmul={"fp32": {"1": [0.1, 0.02], "all": [0.2, 0.03]}},
        matmul_isa={"fp32": "AVX2 FMA"},
        stream={"copy": {"1": [10.0, 0.05], "all": [20.0, 0.05]}, "triad": {"1": [12.0, 0.04], "all": [24.0, 0.1]}},
        stream_array_bytes=128 * 2**20,
        per_op_us=2.0,
        matmul_n={"fp32": 1024},
    )
    base.update(kw)
    return P.MachineProfile(**base)


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """A private cache dir and a fake measurement that counts its calls."""
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("COURSE_CACHE", raising=False)
    calls = []

    def fake(kind, key):
        calls.append(key)
        return _fake_profile(key)

    monkeypatch.setattr(P, "_measure", fake)
    P.forget()
    yield calls
    P.forget()


def test_profile_is_measured_once_then_read_from_disk(measured):
    first = P.machine_profile("cpu")
    assert len(measured) == 1 and not first.from_cache
    assert P.machine_profile("cpu") is first  # this process: the same object
    P.forget()
    again = P.machine_profile("cpu")
    assert again.from_cache and again.stream == first.stream and len(measured) == 1
    P.machine_profile("cpu", refresh=True)
    assert len(measured) == 2


def test_key_changes_with_what_the_profile_depends_on(measured, monkeypatch):
    fp = P.fingerprint("cpu")
    assert {"device", "cores", "torch", "version"} <= set(fp)
    key = P.profile_key(fp)
    P.machine_profile("cpu")
    monkeypatch.setattr(P.torch, "__version__", "9.9.9")  # another torch: another key, measured again
    assert P.profile_key(P.fingerprint("cpu")) != key
    P.forget()
    P.machine_profile("cpu")
    assert len(measured) == 2
    stored = json.loads(P.profile_path().read_text())
    assert len(stored) == 2  # both machines' entries are kept
    monkeypatch.setattr(P, "PROFILE_VERSION", P.PROFILE_VERSION + 1)  # a new measurement: every entry is stale
    P.forget()
    P.machine_profile("cpu")
    assert len(measured) == 3


def test_corrupted_or_implausible_entries_are_measured_again(measured):
    P.machine_profile("cpu")
    path = P.profile_path()
    P.forget()
    path.write_text("{not json")
    assert not P.machine_profile("cpu").from_cache and len(measured) == 2
    raw = json.loads(path.read_text())
    (entry,) = raw.values()
    entry["stream"]["triad"]["all"][0] = -1.0  # a negative bandwidth is no measurement
    path.write_text(json.dumps(raw))
    P.forget()
    assert not P.machine_profile("cpu").from_cache and len(measured) == 3


@pytest.mark.parametrize(
    ("n_bytes", "llc", "l2", "want"),
    [
        (538e6, 32 * 2**20, None, r"538 MB = 16\.0x this 32 MiB LLC: streamed from DRAM"),
        (538e6, 300 * 2**20, None, r"= 1\.7x this 300 MiB LLC: larger than the cache, so most"),
        (95e6, 300 * 2**20, None, r"95 MB = 0\.3x this 300 MiB LLC: fits the cache"),
        (1e6, 32 * 2**20, 2 * 2**20, r"within the 2 MiB L2"),
        (1e6, None, None, r"last-level cache size is unknown"),
    ],
)
def test_regime_line_on_synthetic_caches(n_bytes, llc, l2, want):
    assert re.search(want, P.regime(n_bytes, llc, l2=l2))


@pytest.mark.parametrize("bad", [-1, "big", None, float("nan")])
def test_regime_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match="n_bytes"):
        P.regime(bad, 2**20)
    with pytest.raises(ValueError, match="llc"):
        P.regime(1.0, -5)


def test_lookups_ceiling_and_probe_errors():
    prof = _fake_profile()
    assert prof.bandwidth(1) == 12e9 and prof.bandwidth(2) == 24e9
    assert prof.peak_flops("fp32", 1) == 0.1e12 and prof.spread("triad", 2) == 0.1
    with pytest.raises(ValueError, match="dtype"):
        prof.peak_flops("fp8")
    frac, text = prof.utilization(30e9, flops=False, threads=2)  # 125% of 24 GB/s, beyond its ±10%
    assert frac == pytest.approx(1.25) and "probe error" in text
    assert "probe error" not in prof.utilization(25e9, flops=False, threads=2)[1]  # inside the spread
    assert "+10% drift" in prof.drift("triad", 26.4, 24.0, " GB/s")
    peaks = prof.peaks(2)
    assert peaks.triad_gbs == 24.0 and peaks.matmul_tflops == {"fp32": 0.2}
    assert "profile k ·" in prof.line(2) and "3.00 GHz measured" in prof.line(2)


def test_dram_working_set_is_four_llcs_within_memory():
    prof = _fake_profile(llc=300 * 2**20)
    assert prof.dram_bytes(budget=2**40) == 1200 * 2**20
    assert prof.dram_bytes(budget=2**29) == 2**29  # within the budget: the regime line then says so


def test_measured_clock_is_plausible():
    from course_lib.measure.hardware import clock

    ghz = clock.measure_clock(threads=1, adds=20_000_000, repeats=2)
    if ghz is None:
        pytest.skip(f"no clock probe here: {clock.unavailable_reason()}")
    assert 0.3 < ghz < 7.0
    with pytest.raises(ValueError, match="threads"):
        clock.measure_clock(threads=0)


PROBES = re.compile(r"\b(machine_peaks|measured_peaks|per_op_overhead_s|dram_triad_gbps|measure_matmul)\(")


def test_no_notebook_measures_peaks_except_through_the_profile():
    """A chapter reads the profile; one that re-measures a DRAM roof prints it beside the profile's (drift)."""
    root = Path(__file__).resolve().parents[1] / "notebooks"
    for src in sorted(root.glob("[0-9][0-9]_*.py")):
        text = src.read_text()
        cells = re.split(r"^# %%.*$", text, flags=re.M)
        assert "machine_profile(" in text, f"{src.name} does not load the profile"
        for cell in cells:
            code = "\n".join(ln for ln in cell.splitlines() if not ln.lstrip().startswith("#"))
            if src.name.startswith("00_") and ".drift(" in code:
                continue  # chapter 00 teaches the probes: every figure it re-measures is printed with its drift
            assert not PROBES.search(code), f"{src.name}: a peak probe outside the profile:\n{code[:300]}"
            for m in re.finditer(r"measure_bandwidth\(([^)]*)\)", code):
                assert "n_bytes" in m.group(1), f"{src.name}: a DRAM triad re-measured without a size"
                if "stream_array_bytes" in m.group(1):
                    assert ".drift(" in code, f"{src.name}: the roof re-measured without its drift"


def test_a_noisy_profile_is_measured_again_and_said_so(measured, monkeypatch):
    noisy = _fake_profile(matmul={"fp32": {"1": [0.1, 0.02], "all": [0.15, 0.28]}})
    calm = _fake_profile()
    runs = iter([noisy, calm])
    monkeypatch.setattr(P, "_measure", lambda kind, key: next(runs))
    prof = P.machine_profile("cpu", refresh=True)
    assert prof.matmul["fp32"]["all"] == [0.2, 0.03]  # the faster, calmer second run was kept
    assert P.noisiest(noisy) == ("fp32 at all threads", 0.28)
    assert "NOISY: fp32 at all threads ±28%" in noisy.line(2) and "NOISY" not in calm.line(2)


def test_bad_input_is_named():
    from course_lib.measure import microbench

    prof = _fake_profile()
    with pytest.raises(ValueError, match="rate"):
        prof.utilization(float("nan"), flops=True)
    with pytest.raises(ValueError, match="value"):
        prof.drift("triad", -1.0, 24.0)
    with pytest.raises(ValueError, match="llc"):
        microbench.stream_array_bytes(-5, None)
    mib = 2**20
    assert microbench.stream_array_bytes(300 * mib, None) == 1200 * mib  # STREAM's 4x rule
    assert microbench.stream_array_bytes(300 * mib, 100 * mib) == 100 * mib  # within the memory cap
    assert microbench.stream_array_bytes(None, 1 * mib) == 16 * mib  # never below 16 MiB
