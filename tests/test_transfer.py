"""Host↔device transfer: link arithmetic, bad input, the CPU skip path and (on a GPU) real copies."""

import pytest
import torch

from course_lib.bottlenecks import transfer as tr

GB = 1e9


def test_pcie_rates_from_first_principles():
    assert tr.LINKS["pcie3_x16"].gbps == pytest.approx(15.75, rel=1e-3)
    assert tr.LINKS["pcie4_x16"].gbps == pytest.approx(31.5, rel=1e-3)
    assert tr.LINKS["pcie5_x16"].gbps == pytest.approx(63.0, rel=1e-3)
    assert tr.pcie_x16_gbps(16, lanes=8) == pytest.approx(tr.LINKS["pcie4_x16"].gbps / 2)
    assert all(link.theoretical and link.source for link in tr.LINKS.values())


def test_predict_load_time_arithmetic():
    assert tr.predict_load_time(tr.LINKS["pcie4_x16"].gbps * GB) == pytest.approx(1.0)
    assert tr.predict_load_time(63.0 * GB, "pcie5_x16") == pytest.approx(1.0, rel=1e-3)
    assert tr.predict_load_time(450 * GB, "nvlink4") == pytest.approx(1.0)
    assert tr.predict_load_time(13.5 * GB, "hbm3_h100") == pytest.approx(13.5 / 3350)
    assert tr.LLAMA2_7B_BF16_BYTES == pytest.approx(13.5 * GB, rel=0.01)


def test_load_table_puts_pcie_100x_behind_hbm():
    rows = {r.link.key: r for r in tr.load_time_table()}
    assert set(rows) == set(tr.HOST_LINKS) and "nvlink4" not in rows  # NVLink 4 joins GPUs, not host and GPU
    assert rows["hbm3_h100"].vs_hbm == pytest.approx(1.0)
    assert rows["pcie4_x16"].vs_hbm == pytest.approx(3350 / 31.5, rel=1e-3)  # ~106x
    assert rows["pcie4_x16"].seconds == pytest.approx(0.428, rel=0.01)
    assert rows["hbm3_h100"].max_tokens_per_s == pytest.approx(3350 / 13.48, rel=0.01)
    text = tr.format_load_table(list(rows.values()))
    assert "PCIe 4.0 x16" in text and "13.48 GB" in text


@pytest.mark.parametrize("n_bytes", [0, -1, float("nan"), float("inf"), "1e9", True, None])
def test_bad_n_bytes(n_bytes):
    with pytest.raises(ValueError, match="n_bytes"):
        tr.predict_load_time(n_bytes)


def test_bad_link_lists_the_choices():
    with pytest.raises(ValueError, match="link must be one of .*pcie4_x16"):
        tr.predict_load_time(1e9, "usb2")
    with pytest.raises(ValueError, match="link"):
        tr.load_time_table(links=["pcie9_x16"])
    with pytest.raises(ValueError, match="rows"):
        tr.format_load_table([])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"sizes_bytes": []}, "sizes_bytes"),
        ({"sizes_bytes": [0]}, "sizes_bytes"),
        ({"sizes_bytes": [1.5e6]}, "sizes_bytes"),
        ({"sizes_bytes": 1024}, "sizes_bytes"),
        ({"sizes_bytes": [1024], "pinned": "yes"}, "pinned"),
        ({"sizes_bytes": [1024], "directions": ["up"]}, "directions"),
        ({"sizes_bytes": [1024], "device": "cpu"}, "device"),
    ],
)
def test_bad_measure_input_is_a_value_error_everywhere(kwargs, name):
    with pytest.raises(ValueError, match=name):
        tr.measure_h2d(**kwargs)


def test_available_matches_torch():
    assert tr.available() == torch.cuda.is_available()


def test_skip_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tr.available() is False
    with pytest.raises(tr.NeedsCudaError, match="needs a CUDA GPU") as info:
        tr.measure_h2d([1 << 20])
    assert str(info.value) == tr.SKIP_MESSAGE


def test_cpu_copy_reuses_hardware_bandwidth(monkeypatch):
    from course_lib.measure import microbench

    calls = []
    monkeypatch.setattr(microbench, "measure_bandwidth", lambda *a, **k: calls.append((a, k)) or "timing")
    assert tr.measure_cpu_copy(1 << 20, repeats=2) == "timing"
    assert calls == [(("copy",), {"n_bytes": 1 << 20, "device": "cpu", "repeats": 2})]


def test_cpu_copy_measures():
    t = tr.measure_cpu_copy(1 << 20, repeats=2)
    assert t.device == "cpu" and t.gbps > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("pinned", [True, False])
def test_measure_h2d_on_cuda(pinned):
    rows = tr.measure_h2d([1 << 20, 16 << 20], pinned=pinned, repeats=3)
    assert [(r.direction, r.bytes) for r in rows] == [
        ("h2d", 1 << 20),
        ("d2h", 1 << 20),
        ("h2d", 16 << 20),
        ("d2h", 16 << 20),
    ]
    assert all(r.pinned is pinned and r.seconds > 0 for r in rows)
    # Somewhere between a slow PCIe link and NVLink-C2C: never faster than ~1 TB/s.
    assert all(0.1 < r.gbps < 1000 for r in rows)
    assert "GB/s" in tr.format_transfer_table(rows)
