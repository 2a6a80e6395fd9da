"""The datasheet table, alias lookup, device detection, and the peak microbenchmarks (ratios, never absolute times)."""

import json

import pytest
import torch

import course_lib
from course_lib.core.paths import data_dir
from course_lib.measure import hardware, microbench
from course_lib.measure.hardware import cpu_probe, datasheet, device

# The datasheet figures (dense), as data/references.json cites them: name -> (bf16/fp16, fp8, TB/s, GB, ridge).
ANCHORS = {
    "H100 SXM": (989, 1979, 3.35, 80, 295),
    "H200 SXM": (989, 1979, 4.8, 141, 206),
    "A100 80GB SXM": (312, None, 2.039, 80, 153),
    "L4": (121, 242, 0.300, 24, 403),
    "T4": (65, None, 0.320, 16, 203),  # fp16; no bf16
}
REQUIRED = ("H100 SXM", "H200 SXM", "A100 40GB", "A100 80GB SXM", "L4", "T4", "A10G", "RTX 4090")


def test_every_entry_is_complete():
    raw = json.loads((data_dir() / "gpu_specs.json").read_text())["gpus"]
    assert {e["name"] for e in raw} >= set(REQUIRED)
    for entry in raw:
        for key in datasheet._SPEC_KEYS:
            assert key in entry, (entry["name"], key)
        assert entry["source"].strip(), entry["name"]
        assert entry["hbm_tbps"] > 0 and entry["memory_gb"] > 0
        for dt in hardware.SPEC_DTYPES:
            value = entry[f"{dt}_tflops"]
            # null exactly when the chip lacks the format, and then it says so
            assert (value is None) == (dt in entry["unsupported"]), (entry["name"], dt)
            assert value is None or value > 0
        assert entry["fp32_tflops"] is not None


@pytest.mark.parametrize("name", list(ANCHORS))
def test_anchor_values_match_and_cite(name):
    flops16, fp8, tbps, gb, ridge = ANCHORS[name]
    spec = hardware.gpu_spec(name)
    assert spec.tflops["fp16"] == flops16
    if name != "T4":
        assert spec.tflops["bf16"] == flops16
    assert spec.tflops["fp8"] == fp8
    assert spec.hbm_tbps == tbps and spec.memory_gb == gb
    dtype = "fp16" if name == "T4" else "bf16"
    assert spec.ridge(dtype) == pytest.approx(ridge, abs=1.0)
    assert "ANCHORS" not in spec.source and ("datasheet" in spec.source or "whitepaper" in spec.source)


@pytest.mark.parametrize("name", ["A100 40GB", "A10G", "RTX 4090"])
def test_other_entries_cite_their_datasheet(name):
    source = hardware.gpu_spec(name).source
    assert "ANCHORS" not in source and ("datasheet" in source or "whitepaper" in source)


@pytest.mark.parametrize(
    "alias,name",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("h100", "H100 SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("nvidia l4", "L4"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA H200", "H200 SXM"),
    ],
)
def test_alias_lookup(alias, name):
    assert hardware.gpu_spec(alias).name == name


def test_unknown_gpu_lists_valid_names():
    with pytest.raises(ValueError, match="unknown GPU name 'H900'.*H100 SXM"):
        hardware.gpu_spec("H900")
    with pytest.raises(ValueError, match="gpu name"):
        hardware.gpu_spec("")


def test_unsupported_dtype_on_a_gpu():
    with pytest.raises(ValueError, match="no bf16 support"):
        hardware.gpu_spec("T4").peak_flops("bf16")
    with pytest.raises(ValueError, match="unknown dtype"):
        hardware.gpu_spec("H100 SXM").peak_flops("fp33")


def test_spec_for_device_unknown(capsys):
    cpu = hardware.DeviceInfo("cpu", "Some CPU", 1.0)
    assert hardware.spec_for_device(cpu) is None
    assert "no datasheet entry" in capsys.readouterr().out
    gpu = hardware.DeviceInfo("cuda", "NVIDIA Imaginary 9000", 1.0, (9, 0))
    assert hardware.spec_for_device(gpu, quiet=True) is None
    known = hardware.DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", 80.0, (9, 0))
    assert hardware.spec_for_device(known).name == "H100 SXM"


def test_detect_cpu():
    info = hardware.detect_device("cpu")
    assert info.kind == "cpu" and info.cores >= 1 and info.name
    assert set(info.isa) <= set(hardware.ISA_FLAGS)
    assert info.torch_cpu_capability == str(torch.backends.cpu.get_cpu_capability())
    assert "CPU" in info.describe()


def test_cpu_theoretical_flops_counts_isa():
    base = dict(kind="cpu", name="x", memory_gb=1.0, cores=2, mhz=1000.0)
    avx2 = hardware.DeviceInfo(isa=("avx2", "fma"), **base)
    avx512 = hardware.DeviceInfo(isa=("avx2", "fma", "avx512f"), **base)
    assert hardware.cpu_theoretical_flops(avx2, threads=2) == 2 * 1e9 * 32
    assert hardware.cpu_theoretical_flops(avx512, threads=2) == 2 * hardware.cpu_theoretical_flops(avx2, threads=2)
    assert hardware.cpu_theoretical_flops(avx2, threads=1) == 1e9 * 32
    assert hardware.cpu_theoretical_flops(avx2, threads=8) == 2 * 1e9 * 32  # never more cores than exist
    assert hardware.cpu_theoretical_flops(hardware.DeviceInfo("cuda", "g", 1.0)) is None


def test_flop_per_cycle_reads_the_microarchitecture_not_the_flag():
    base = dict(kind="cpu", name="x", memory_gb=1.0, cores=2, mhz=1000.0, isa=("avx2", "fma", "avx512f"))
    zen4 = hardware.DeviceInfo(vendor="AuthenticAMD", cpu_family=25, cpu_model=17, **base)
    zen5 = hardware.DeviceInfo(vendor="AuthenticAMD", cpu_family=26, cpu_model=2, **base)
    xeon = hardware.DeviceInfo(vendor="GenuineIntel", cpu_family=6, cpu_model=143, **base)
    assert hardware.flop_per_cycle(zen4) == 32  # AVX-512 decoded, executed on 256-bit pipes
    assert "Zen 4" in hardware.vector_units(zen4)[1]
    assert hardware.flop_per_cycle(zen5) == 64 and hardware.flop_per_cycle(xeon) == 64
    zen3 = hardware.DeviceInfo(vendor="AuthenticAMD", cpu_family=25, cpu_model=33, **{**base, "isa": ("avx2", "fma")})
    assert hardware.flop_per_cycle(zen3) == 32
    assert hardware.flop_per_cycle(hardware.DeviceInfo(**{**base, "isa": ()})) == 8


def test_detect_cpu_reads_vendor_family_model():
    info = hardware.detect_device("cpu")
    if info.vendor:  # /proc/cpuinfo on x86 Linux
        assert info.vendor in ("AuthenticAMD", "GenuineIntel") or info.vendor
        assert info.cpu_family is None or info.cpu_family >= 1


def test_interpreter_set_without_cuda():
    import os

    if not torch.cuda.is_available():
        assert os.environ["TRITON_INTERPRET"] == "1"
    assert course_lib.__version__


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: microbench.measure_matmul("fp33", n=10**9), "unknown dtype"),
        (lambda: microbench.measure_matmul("int4", n=10**9), "dtype must be one of"),
        (lambda: microbench.measure_matmul("fp32", n=0), "n must be a positive int"),
        (lambda: microbench.measure_bandwidth("copy", n_bytes=-5), "n_bytes must be a positive int"),
        (lambda: microbench.measure_bandwidth("scale"), "kind must be 'copy' or 'triad'"),
        (lambda: microbench.measure_bandwidth("copy", dtype="int8", n_bytes=10**15), "dtype must be one of"),
    ],
)
def test_bad_input_raises_before_allocating(call, match):
    # Sizes are absurd on purpose: the check must come before torch tries to allocate them.
    with pytest.raises(ValueError, match=match):
        call()


def test_bandwidth_counts_reads_and_writes():
    copy = microbench.measure_bandwidth("copy", n_bytes=1 << 20, repeats=2)
    triad = microbench.measure_bandwidth("triad", n_bytes=1 << 20, repeats=2)
    assert copy.bytes == 2 * (1 << 20) and copy.flops is None
    assert triad.bytes == 3 * (1 << 20) and triad.flops == 2 * (1 << 20) / 4


def test_dram_triad_is_sized_past_the_llc_and_positive(monkeypatch):
    """``dram_triad_gbps``: arrays of half max(256 MiB, 4 × LLC) each (``benchmarks/gemv_roof.py``'s working set)."""
    seen = {}
    real = microbench.measure_bandwidth

    def spy(kind, **kw):
        seen.update(kw, kind=kind)
        return real(kind, **{**kw, "n_bytes": 1 << 20})  # the size is checked, a small array is timed

    monkeypatch.setattr(microbench, "measure_bandwidth", spy)
    llc = microbench.detect_device("cpu").cache_bytes or 0
    assert microbench.dram_triad_gbps(repeats=2) > 0
    assert seen["kind"] == "triad" and seen["n_bytes"] == max(256 * 2**20, 4 * llc) // 2 and seen["device"] == "cpu"
    assert microbench.dram_working_set_bytes() == max(256 * 2**20, 4 * llc)


@pytest.mark.slow
def test_real_peaks_are_plausible(monkeypatch, tmp_path):
    """On any machine: a matmul is far more FLOP-dense than a triad, and copy/triad agree within 4x."""
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path))
    hardware.reset()
    peaks = microbench.measured_peaks(refresh=True)
    assert not peaks.from_cache and peaks.measured_at
    assert 0.25 < peaks.copy_gbs / peaks.triad_gbs < 4
    triad_flops = peaks.triad_gbs * 1e9 * (2 / 12)  # triad: 2 FLOPs per 12 bytes
    assert peaks.peak_flops("fp32") > 3 * triad_flops
    hardware.reset()


def test_timing_threads_follow_idle_cores():
    import os

    cores = hardware.physical_cores()
    assert 1 <= cores <= os.cpu_count()
    assert hardware.timing_threads(idle=0.0) == 1  # a busy machine: one thread, never zero
    assert hardware.timing_threads(idle=float(cores)) == cores
    assert hardware.timing_threads(idle=cores + 5.0) == cores
    idle = hardware.idle_cores(0.05)
    assert idle is None or 0 <= idle <= os.cpu_count() + 1e-6
    with pytest.raises(ValueError, match="interval must be > 0"):
        hardware.idle_cores(0)


# ----------------------------------------------------------------------------- a T4 (Colab), simulated
T4 = hardware.DeviceInfo("cuda", "Tesla T4", 15.8, (7, 5), 40)
A100 = hardware.DeviceInfo("cuda", "NVIDIA A100-SXM4-80GB", 85.0, (8, 0), 108)


def test_t4_has_no_bf16():
    assert not T4.supports_bf16 and A100.supports_bf16
    assert hardware.DeviceInfo("cpu", "x", 1.0).supports_bf16  # torch runs bf16 on any CPU
    # capability unknown: the datasheet decides
    assert not hardware.DeviceInfo("cuda", "Tesla T4", 16.0).supports_bf16
    assert "bf16 no" in T4.describe() and "bf16 yes" in A100.describe()


def test_preferred_dtype_per_device():
    assert hardware.preferred_dtype(T4) == "fp16"
    assert hardware.preferred_dtype(A100) == "bf16"
    assert hardware.preferred_dtype(hardware.DeviceInfo("cpu", "x", 1.0)) == "fp32"
    assert hardware.preferred_dtype() in ("fp32", "bf16", "fp16")  # this machine, whatever it is


def test_matmul_dtypes_skip_bf16_on_a_t4():
    assert microbench.matmul_dtypes(info=T4) == ("fp16", "fp32")
    assert microbench.matmul_dtypes(info=A100) == ("fp16", "bf16", "fp32")
    assert microbench.matmul_dtypes("cpu") == ("fp32", "bf16")


def test_spec_of_a_missing_dtype_need_not_raise():
    t4 = hardware.spec_for_device(T4)
    assert t4.name == "T4" and t4.supported_dtypes == ("fp16", "fp32")
    assert not t4.supports("bf16") and t4.supports("float16")
    assert t4.peak_flops("bf16", missing="none") is None and t4.ridge("bf16", missing="none") is None
    assert t4.peak_flops("fp16", missing="none") == 65e12
    assert t4.best_dtype("bf16") == "fp16" and t4.best_dtype("fp8") == "fp16" and t4.best_dtype("fp32") == "fp32"
    h100 = hardware.gpu_spec("H100 SXM")
    assert h100.best_dtype("bf16") == "bf16" and h100.best_dtype("fp8") == "fp8"
    assert t4.peak_flops(t4.best_dtype(hardware.preferred_dtype(T4))) == 65e12
    with pytest.raises(ValueError, match="best_dtype"):
        t4.peak_flops("bf16")
    with pytest.raises(ValueError, match="missing must be"):
        t4.peak_flops("fp16", missing="skip")
    with pytest.raises(ValueError, match="unknown dtype"):
        t4.peak_flops("fp33", missing="none")  # a typo is still an error


# ----------------------------------------------------------------------------- CPU probes, simulated
HT_CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz
cpu MHz\t\t: 2199.998
flags\t\t: fpu sse avx avx2 fma f16c avx512f
"""


def _fake_machine(monkeypatch, files=None, sysctl=None, counts=(None, None), psutil_mhz=None, ram=None):
    files, sysctl = files or {}, sysctl or {}
    monkeypatch.setattr(cpu_probe, "_read_text", lambda path: files.get(path))
    monkeypatch.setattr(cpu_probe, "_sysctl", lambda name: sysctl.get(name))
    monkeypatch.setattr(cpu_probe, "_cpu_counts", lambda: counts)
    monkeypatch.setattr(cpu_probe, "_psutil_max_mhz", lambda: psutil_mhz)
    monkeypatch.setattr(cpu_probe, "_ram_bytes", lambda: ram)


def test_hyperthreaded_machine_counts_physical_cores(monkeypatch):
    _fake_machine(monkeypatch, files={"/proc/cpuinfo": HT_CPUINFO}, counts=(4, 2), ram=16 * 10**9)
    info = device._detect_cpu()
    assert (info.cores, info.physical_cores, info.core_count) == (4, 2, 2)
    assert hardware.physical_cores() == 2
    # the ceiling multiplies physical cores: 4 threads on 2 cores do not double the FMA units
    assert hardware.cpu_theoretical_flops(info, threads=4) == hardware.cpu_theoretical_flops(info, threads=2)
    assert hardware.cpu_theoretical_flops(info, threads=4) == 2 * 2200e6 * 64
    assert hardware.timing_threads(idle=4.0) == 2
    assert hardware.timing_threads(idle=1.2) == 1
    # no psutil answer: the logical count
    monkeypatch.setattr(cpu_probe, "_cpu_counts", lambda: (4, None))
    assert hardware.physical_cores() == 4


def test_max_clock_preferred_over_current(monkeypatch):
    cpufreq = "/sys/devices/system/cpu/cpu0/cpufreq"
    files = {"/proc/cpuinfo": HT_CPUINFO, f"{cpufreq}/cpuinfo_max_freq": "3400000\n"}
    _fake_machine(monkeypatch, files=files, counts=(4, 2), psutil_mhz=3000.0)
    info = device._detect_cpu()
    assert (info.mhz, info.freq_source, info.clock_note) == (3400.0, "max", "max clock")
    assert "3400 MHz (max clock)" in info.describe()
    del files[f"{cpufreq}/cpuinfo_max_freq"]  # psutil's max next
    assert (device._detect_cpu().mhz, device._detect_cpu().freq_source) == (3000.0, "max")
    _fake_machine(monkeypatch, files=files, counts=(4, 2))  # then the nominal "@ 2.20GHz" of the name
    assert (device._detect_cpu().mhz, device._detect_cpu().freq_source) == (2200.0, "base")
    files["/proc/cpuinfo"] = HT_CPUINFO.replace(" @ 2.20GHz", "")  # only "cpu MHz" is left
    info = device._detect_cpu()
    assert (info.mhz, info.freq_source) == (2199.998, "current")
    assert "current clock; max not exposed" in info.describe()


def test_machine_exposing_nothing_says_unknown(monkeypatch):
    """macOS without sysctl answers (or any machine with no /proc and no /sys): unknown, never 0 MiB."""
    _fake_machine(monkeypatch, counts=(8, None))
    info = device._detect_cpu()
    assert info.mhz is None and info.freq_source == "" and info.cache_bytes is None and info.isa == ()
    text = info.describe()
    assert "LLC unknown" in text and "clock unknown" in text and "RAM unknown" in text
    assert "0 MiB" not in text and "0 MHz" not in text
    assert hardware.cpu_theoretical_flops(info) is None
    assert microbench.default_array_bytes("cpu") > 0


def test_macos_answers_through_sysctl(monkeypatch):
    sysctl = {
        "machdep.cpu.brand_string": "Apple M2 Pro",
        "hw.l3cachesize": "0",  # Apple silicon: no L3 exposed
        "hw.perflevel0.l2cachesize": str(16 * 2**20),
        "hw.memsize": str(32 * 10**9),
        "hw.physicalcpu": "10",
    }
    _fake_machine(monkeypatch, sysctl=sysctl, counts=(10, None))
    info = device._detect_cpu()
    assert info.name == "Apple M2 Pro" and info.physical_cores == 10
    assert info.cache_bytes == 16 * 2**20 and info.memory_gb == 32.0
    assert "LLC 16 MiB" in info.describe() and "clock unknown" in info.describe()


def test_cache_regime_is_computed_from_the_llc():
    from course_lib.measure.hardware import cache_regime

    mib = 2**20
    assert "streamed from DRAM on every pass" in cache_regime(540e6, 32 * mib) and "16.1x" in cache_regime(
        540e6, 32 * mib
    )
    assert "most of every pass comes from DRAM" in cache_regime(540e6, 300 * mib)  # 1.7x
    assert "fits the cache" in cache_regime(100e6, 300 * mib)  # int4 SmolLM2 on a 300 MiB LLC
    assert "last-level cache size is unknown" in cache_regime(1.0, 0)
    with pytest.raises(ValueError, match="n_bytes must be a number >= 0"):
        cache_regime(-1, 32 * mib)


def test_stream_arrays_and_working_sets_follow_the_llc_within_the_memory(monkeypatch):
    """Quick mode: STREAM arrays of 1x the LLC (a triad's three span 3x), copies of 2x; full mode STREAM's
    4x rule; never more than a share of the memory available (a 300 MiB LLC made 4 GB peaks)."""
    mib = 2**20
    big = device.DeviceInfo("cpu", "test CPU", 25.0, cache_bytes=300 * mib)
    monkeypatch.setattr(microbench, "detect_device", lambda kind=None: big)
    monkeypatch.setattr(microbench, "_memory_cap", lambda share: None)
    for which, want in ((0, (300 * mib, 600 * mib)), (1, (1200 * mib, 1200 * mib))):
        monkeypatch.setattr(microbench, "pick", lambda quick, full, w=which: (quick, full)[w])
        assert (microbench.default_array_bytes("cpu"), microbench.working_set_bytes("cpu")) == want
    monkeypatch.setattr(microbench, "_memory_cap", lambda share: int(share * 800 * mib))  # 800 MiB free
    assert (microbench.default_array_bytes("cpu"), microbench.working_set_bytes("cpu")) == (100 * mib, 200 * mib)
