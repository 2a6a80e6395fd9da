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


def test_the_runner_shuts_down_each_chapters_kernel(tmp_path, monkeypatch):
    """nbclient leaves running a kernel it was handed; left alone, every finished chapter's kernel kept its memory."""
    import nbformat
    import psutil

    from course_lib import course

    src = tmp_path / "notebooks" / "00_probe.py"
    src.parent.mkdir()
    src.write_text("# %%\nimport os\nprint(os.getpid())\n")
    monkeypatch.setattr(course, "repo_root", lambda: tmp_path)
    monkeypatch.setattr(course, "chapter_sources", lambda root=None: [src])
    monkeypatch.setattr(
        course,
        "read_chapter",
        lambda path: nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src.read_text())]),
    )
    assert course.run("quick", tmp_path / "build") == 0
    executed = nbformat.read(tmp_path / "build" / "notebooks" / "00_probe.ipynb", as_version=4)
    kernel_pid = int(executed.cells[0].outputs[0]["text"])
    assert not psutil.pid_exists(kernel_pid) or psutil.Process(kernel_pid).status() == psutil.STATUS_ZOMBIE
    assert "| 00_probe.ipynb |" in (tmp_path / "build" / "REPORT.md").read_text()
