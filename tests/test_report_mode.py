"""Report collection, quick/full switch and path discovery."""

import json

import pytest

from course_lib.core import paths
from course_lib.core.mode import is_quick, mode, pick
from course_lib.measure import report


def test_mode_switch(monkeypatch):
    monkeypatch.setenv("COURSE_MODE", "quick")
    assert is_quick() and pick(1, 2) == 1
    monkeypatch.setenv("COURSE_MODE", "FULL")
    assert not is_quick() and pick(1, 2) == 2
    monkeypatch.setenv("COURSE_MODE", "fast")
    with pytest.raises(ValueError, match="COURSE_MODE"):
        mode()


def test_repo_root_and_override(tmp_path, monkeypatch):
    root = paths.repo_root()
    assert (root / "data").is_dir() and (root / "course_lib").is_dir()
    monkeypatch.setenv("COURSE_ROOT", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="COURSE_ROOT"):
        paths.repo_root()


def test_record_and_write_report(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_BUILD_DIR", str(tmp_path))
    report.record("01_x", "bw", 12.5, "GB/s", theory=20.0, note="triad")
    report.record("01_x", "bw", 13.0, "GB/s")  # same key: replaced
    report.record("00_y", "ridge", 3.9, "FLOP/byte")
    data = json.loads((tmp_path / "results" / "01_x.json").read_text())
    assert data["bw"]["value"] == 13.0 and data["bw"]["machine"]
    out = report.write_report(tmp_path / "results", tmp_path / "REPORT.md", {"00_y.ipynb": 1.5})
    text = out.read_text()
    assert text.index("## 00_y") < text.index("## 01_x")
    assert "| bw | 13 | GB/s |" in text and "Measured on: " in text and "| 00_y.ipynb | 1.5 |" in text
    with pytest.raises(ValueError, match="finite"):
        report.record("01_x", "bad", float("nan"), "s")
    with pytest.raises(ValueError, match="non-empty"):
        report.record("", "k", 1.0, "s")


def test_the_run_table_shows_the_machine_probe_beside_each_notebook(tmp_path):
    from course_lib.course import machine_speed

    speed = machine_speed(copies=2)
    assert speed["python_mloops"] > 0 and speed["copy_gbs"] > 0
    (tmp_path / "results").mkdir()
    out = report.write_report(
        tmp_path / "results",
        tmp_path / "REPORT.md",
        {"00_y.ipynb": 1.5, "01_x.ipynb": 2.0},
        {"00_y.ipynb": 800.0},
        {"00_y.ipynb": {"python_mloops": 20.04, "copy_gbs": 9.96}},
    )
    text = out.read_text()
    assert "| 00_y.ipynb | 1.5 | 800 | 20.0 | 10.0 |" in text and "| 01_x.ipynb | 2.0 | — | — | — |" in text
    with pytest.raises(ValueError, match="copies"):
        machine_speed(copies=0)
