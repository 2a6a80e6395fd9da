"""Issue 28 (chapter 00): the memory hierarchy and accelerator rows of data/gpu_specs.json, the
FlashAttention traffic model, the CPU bf16 ceiling and its verdict, and the energy counters."""

from __future__ import annotations

import pytest

from course_lib.kernels import attention_io
from course_lib.measure import energy, half_precision
from course_lib.measure.hardware import DeviceInfo, bf16_flop_per_cycle, cpu_theoretical_flops, gpu_spec, memory_levels


def _cpu(isa, family=25, vendor="AuthenticAMD"):
    return DeviceInfo(
        "cpu",
        "test",
        8.0,
        cores=2,
        threads=2,
        isa=tuple(isa),
        mhz=2500.0,
        physical_cores=2,
        freq_source="max",
        vendor=vendor,
        cpu_family=family,
    )


# --- the hierarchy --------------------------------------------------------------------------------------
def test_every_recorded_hierarchy_is_ordered_and_matches_the_datasheet_row():
    for gpu in memory_levels.hierarchy_gpus():
        levels = memory_levels.hierarchy(gpu)
        names = [lv.level for lv in levels]
        assert names[0] == "registers" and names[1].startswith("SRAM") and names[-1].startswith("host")
        hbm = next(lv for lv in levels if lv.level.startswith("HBM"))
        assert hbm.bandwidth == pytest.approx(gpu_spec(gpu).hbm_tbps * 1e12)
        assert hbm.bytes == pytest.approx(gpu_spec(gpu).memory_gb * 1e9)
        known = [lv.bandwidth for lv in levels if lv.bandwidth]
        assert known == sorted(known, reverse=True), (gpu, "each level slower than the one above")
        assert all(lv.note for lv in levels)
        assert "https://" in memory_levels.hierarchy_source(gpu)


def test_derived_bandwidths_reproduce_nvidia_figures():
    # the H100's clock is the one its fp32 datasheet figure implies: 132 SMs x 128 lanes x 2 x clock = 67 TF
    assert 132 * 128 * 2 * 1.98e9 == pytest.approx(gpu_spec("H100 SXM").tflops["fp32"] * 1e12, rel=0.01)
    assert 108 * 64 * 2 * 1.41e9 == pytest.approx(gpu_spec("A100 80GB SXM").tflops["fp32"] * 1e12, rel=0.01)
    a100 = {lv.level.split(":")[0]: lv for lv in memory_levels.hierarchy("A100 80GB SXM")}
    assert a100["SRAM"].bandwidth == pytest.approx(19e12, rel=0.05)  # Dao et al.: "around 19TB/s"
    assert a100["SRAM"].derived and a100["L2 cache"].bandwidth == pytest.approx(5120 * 1.41e9)
    h100 = {lv.level.split(":")[0]: lv for lv in memory_levels.hierarchy("H100 SXM")}
    assert h100["L2 cache"].bandwidth is None and not h100["registers"].bandwidth  # NVIDIA publishes none


def test_a_gpu_without_a_hierarchy_names_those_with_one():
    with pytest.raises(ValueError, match="H100 SXM"):
        memory_levels.hierarchy("T4")


def test_accelerator_rows_and_the_lpu_trade():
    acc = {a.name: a for a in memory_levels.accelerators()}
    assert {"TPU v5e", "TPU v5p", "GroqChip (LPU)"} <= set(acc)
    for a in acc.values():
        assert a.bf16_tflops > 0 and a.tbps > 0 and a.memory_gb > 0 and "https://" in a.source
    lpu, h100 = acc["GroqChip (LPU)"], gpu_spec("H100 SXM")
    assert lpu.ridge < 5 < h100.ridge("bf16") / 10  # SRAM bandwidth: a ridge of a few FLOP/byte
    assert lpu.chips_to_hold(13.5e9) > 50 and acc["TPU v5p"].chips_to_hold(13.5e9) == 1
    with pytest.raises(ValueError, match="n_bytes"):
        lpu.chips_to_hold(0)


# --- FlashAttention's SRAM argument ------------------------------------------------------------------------
def _count_tiled(n, d, block):
    """Element reads/writes of the tiled loop, counted by walking it."""
    moved = 0
    for q0 in range(0, n, block):
        rows = min(block, n - q0)
        moved += 2 * rows * d  # Q block in, O block out
        for k0 in range(0, n, block):
            moved += 2 * min(block, n - k0) * d  # K and V blocks
    return moved


@pytest.mark.parametrize(("n", "d", "block"), [(100, 16, 7), (256, 64, 64), (1000, 32, 300)])
def test_tiled_bytes_match_the_loop(n, d, block):
    assert attention_io.tiled_attention_bytes(n, d, block, dtype_bytes=1) == _count_tiled(n, d, block)


def test_the_block_fits_and_the_saving_grows_with_the_sram():
    for sram in (16_000, 164_000, 228_000):
        b = attention_io.tile_block(128, sram)
        assert (4 * b * 128 + b * b) * 2 <= sram < (4 * (b + 1) * 128 + (b + 1) ** 2) * 2
    savings = [attention_io.attention_traffic(4096, 128, m).saving for m in (16_000, 164_000, 228_000, 1_000_000)]
    assert savings == sorted(savings) and savings[0] < 1 < savings[2]
    t = attention_io.attention_traffic(16384, 64, 228_000)
    assert t.saving == pytest.approx(2 * t.block / 64, rel=0.05)  # ≈ 2B/d for n >> B
    with pytest.raises(ValueError, match="sram_bytes"):
        attention_io.tile_block(128, 100)


# --- the bf16 ceiling and its verdict ------------------------------------------------------------------------
def test_bf16_ceiling_is_twice_fp32_with_vdpbf16ps_and_absent_without():
    zen4 = _cpu(["avx2", "fma", "avx512f", "avx512_bf16"])
    assert bf16_flop_per_cycle(zen4)[0] == 64
    assert cpu_theoretical_flops(zen4, 2, "bf16") == 2 * cpu_theoretical_flops(zen4, 2)
    plain = _cpu(["avx2", "fma"])
    assert bf16_flop_per_cycle(plain)[0] is None and cpu_theoretical_flops(plain, 2, "bf16") is None
    assert bf16_flop_per_cycle(_cpu(["avx512f", "avx512_bf16", "amx_bf16"], 6, "GenuineIntel"))[0] == 1024
    with pytest.raises(ValueError, match="dtype"):
        cpu_theoretical_flops(zen4, 2, "fp8")


def test_half_precision_verdict_needs_most_of_the_predicted_speedup():
    assert half_precision.half_precision_verdict(2.18, 2.0)
    assert not half_precision.half_precision_verdict(1.1, 2.0)  # faster than fp32, far from the 2x
    assert not half_precision.half_precision_verdict(8.0, 14.8)  # a GPU short of its tensor-core ratio
    assert half_precision.half_precision_verdict(0.1, None)  # emulated: slower, as claimed
    assert not half_precision.half_precision_verdict(1.3, None)  # emulation faster than fp32 contradicts it


# --- energy counters ---------------------------------------------------------------------------------------
def test_rapl_counter_reads_wraps_and_says_why_not(tmp_path):
    assert energy.energy_counter("cpu", powercap=tmp_path / "absent")[0] is None
    for i, (uj, top) in enumerate(((1_000_000, 10_000_000), (2_000_000, 10_000_000))):
        zone = tmp_path / f"intel-rapl:{i}"
        zone.mkdir()
        (zone / "energy_uj").write_text(str(uj))
        (zone / "max_energy_range_uj").write_text(str(top))
    sub = tmp_path / "intel-rapl:0:0"  # a subzone (core) must not be counted twice
    sub.mkdir()
    (sub / "energy_uj").write_text("999999999")
    counter, why = energy.energy_counter("cpu", powercap=tmp_path)
    assert why == "" and counter.read() == pytest.approx(3.0)
    assert counter.delta(9.5, 0.5) == pytest.approx(1.0)  # across a wrap at 10 J


def test_unreadable_rapl_is_reported(tmp_path, monkeypatch):
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "energy_uj").write_text("1")
    (zone / "max_energy_range_uj").write_text("10")
    real = type(zone).read_text

    def denied(self, *a, **k):
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return real(self, *a, **k)

    monkeypatch.setattr(type(zone), "read_text", denied)
    counter, why = energy.energy_counter("cpu", powercap=tmp_path)
    assert counter is None and "root" in why


def test_measure_energy_separates_idle_from_work(monkeypatch):
    state = {"j": 0.0, "t": 0.0}
    counter = energy.EnergyCounter("fake", lambda: state["j"])
    monkeypatch.setattr(energy.time, "perf_counter", lambda: state["t"])

    def sleep(s):  # idle: 2 W
        state["t"] += s
        state["j"] += 2.0 * s

    def work():  # 1 s at 7 W
        state["t"] += 1.0
        state["j"] += 7.0

    monkeypatch.setattr(energy.time, "sleep", sleep)
    r = energy.measure_energy(counter, work, idle_s=0.5)
    assert r.joules == pytest.approx(7.0) and r.seconds == pytest.approx(1.0)
    assert r.idle_watts == pytest.approx(2.0) and r.above_idle_j == pytest.approx(5.0)
    with pytest.raises(ValueError, match="device"):
        energy.energy_counter("tpu")
    with pytest.raises(ValueError, match="idle_s"):
        energy.measure_energy(counter, work, idle_s=0)


def test_plot_roofline_puts_each_hollow_marker_on_its_own_roof():
    import matplotlib

    matplotlib.use("Agg")
    from course_lib.measure import plots
    from course_lib.measure.roofline import Point, Roof

    fp32, bf16 = Roof("fp32", 100e9, 10e9, "measured"), Roof("bf16", 200e9, 10e9, "measured")
    pt = Point("matmul bf16", 2e9, 1e6, 0.012)  # intensity 2000: on the flat part of both roofs
    _, ax = plots.plot_roofline([fp32, bf16], [pt], point_roofs=[bf16])
    hollow = [ln for ln in ax.lines if ln.get_markerfacecolor() == "none"]
    assert hollow and hollow[0].get_ydata()[0] == pytest.approx(200e9)
    with pytest.raises(ValueError, match="point_roofs"):
        plots.plot_roofline([fp32], [pt], point_roofs=[])
