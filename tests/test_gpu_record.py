"""A GPU run's folder becomes data/measurements/<gpu>.json (course_lib.measure.gpu_record), on a CPU with a
hand-made run folder: new sections replace stored ones, the others keep their date, notebooks come from
the summary."""

import json

import pytest

from course_lib.measure.gpu_record import collect, gpu_slug, parse_summary

ENV = """GPU 0: NVIDIA H200 (UUID: GPU-1234)
NVIDIA H200, 143771 MiB, 1980 MHz, 3201 MHz, 580.159.04
3.12.3 (main) [GCC]
torch 2.11.0+cu130 triton 3.6.0 transformers 5.17.0
"""
SUMMARY = """== tests: rc=0 in 120 s (limit 170 s)
== quant: rc=1 in 12 s (limit 70 s)
== nb_00_setup_and_hardware: rc=0 in 9 s (limit 100 s)
== nb_04_decoding: rc=124 in 100 s (limit 100 s)
== nb_07_parallelism: skipped, 12 s left
== total 400 s
"""
JUNIT = """<?xml version="1.0"?><testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">
<testcase classname="tests.test_a" name="ok"/><testcase classname="tests.test_a" name="bad"><failure/></testcase>
<testcase classname="tests.test_a" name="skip"><skipped/></testcase></testsuite></testsuites>"""


def test_summary_lines_become_outcomes():
    got = parse_summary(SUMMARY)
    assert got["tests"] == "ran (120 s)" and got["quant"].startswith("failed (rc 1")
    assert got["nb_04_decoding"] == "timed out (100 s)" and got["nb_07_parallelism"] == "skipped (device time)"
    assert gpu_slug(ENV) == ("NVIDIA H200", "nvidia-h200")
    with pytest.raises(ValueError, match="names no GPU"):
        gpu_slug("no gpu here")


def test_collect_replaces_what_ran_and_dates_the_rest(tmp_path):
    out, data = tmp_path / "out", tmp_path / "data"
    out.mkdir()
    data.mkdir()
    (out / "env.log").write_text(ENV)
    (out / "summary.txt").write_text(SUMMARY)
    (out / "tests.xml").write_text(JUNIT)
    (out / "peaks.json").write_text(json.dumps({"copy_gbs": 4250.0}))
    (data / "nvidia-h200.json").write_text(
        json.dumps({"gpu": "NVIDIA H200", "measured_on": "2026-11-30", "peaks": {"copy_gbs": 1.0}, "serving": {"x": 1}})
    )
    path = collect(out, data, today="2026-12-02")
    rec = json.loads(path.read_text())
    assert rec["peaks"] == {"copy_gbs": 4250.0} and rec["serving"] == {"x": 1}
    assert rec["sections_from"]["peaks"] == "2026-12-02" and rec["sections_from"]["serving"] == "2026-11-30"
    assert rec["gpu_tests"]["failures"] == 1 and rec["gpu_tests"]["failed"] == ["tests.test_a::bad"]
    assert rec["notebooks_full_mode"] == {
        "00_setup_and_hardware": "ran (9 s)",
        "04_decoding": "timed out (100 s)",
        "07_parallelism": "skipped (device time)",
    }
    assert "143771 MiB" in rec["machine"] and "torch 2.11.0" in rec["software"]


def test_collect_refuses_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(ValueError, match="env.log"):
        collect(tmp_path, tmp_path / "data")
