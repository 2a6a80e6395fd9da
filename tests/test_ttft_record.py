"""serving.ttft_record: the recorded TTFT sweep (its command works, the file round-trips, the stored run loads)."""

import json

import pytest

from course_lib.serving import ttft_record


@pytest.fixture(scope="module")
def rec():
    return ttft_record.record_ttft((8, 24), repeats=1, model="tiny-target")


def test_record_measures_each_length_and_its_own_peak(rec):
    assert [p.prompt_len for p in rec.points] == [8, 24]
    assert all(p.ttft_s > 0 and len(p.samples_s) == 1 for p in rec.points)
    assert rec.matmul_peak_flops > 1e8 and rec.threads >= 1
    assert rec.command.startswith("python -m course_lib.serving.ttft_record --lengths 8 24")
    assert rec.model == "tiny-target" and rec.device == "cpu" and "torch" in rec.software
    assert rec.ttft() == {8: rec.points[0].ttft_s, 24: rec.points[1].ttft_s}
    assert rec.measured_at[:10] in rec.label() and rec.command in rec.label()
    assert len(rec.point_peaks_flops) == 2 and min(rec.point_peaks_flops) <= rec.matmul_peak_flops


def test_compare_uses_each_points_own_peak(rec):
    from course_lib.bottlenecks import time_floors
    from course_lib.models import accounting

    shape = accounting.ModelShape.from_embedded("tiny-target")
    rows = rec.compare(shape, 30e9)
    for r, p, peak in zip(rows, rec.points, rec.point_peaks_flops):
        assert r.size == p.prompt_len and r.measured_s == p.ttft_s
        assert r.floor_s == pytest.approx(time_floors.prefill_time(shape, p.prompt_len, peak, 30e9, "fp32"))


def test_save_and_load_round_trip(rec, tmp_path):
    path = ttft_record.save_record(rec, tmp_path / "r.json")
    assert ttft_record.load_record(path) == rec


def test_load_names_what_is_wrong(rec, tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m course_lib.serving.ttft_record"):
        ttft_record.load_record(tmp_path / "absent.json")
    path = ttft_record.save_record(rec, tmp_path / "r.json")
    d = json.loads(path.read_text())
    del d["matmul_peak_flops"]
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="matmul_peak_flops"):
        ttft_record.load_record(path)
    d = json.loads(ttft_record.save_record(rec, path).read_text())
    d["point_peaks_flops"] = d["point_peaks_flops"][:1]
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="one positive peak per point"):
        ttft_record.load_record(path)
    d = json.loads(ttft_record.save_record(rec, path).read_text())
    d["points"][0]["ttft_s"] = -1
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="positive ttft_s"):
        ttft_record.load_record(path)


def test_bad_lengths_are_refused_before_any_work():
    with pytest.raises(ValueError, match="lengths"):
        ttft_record.record_ttft((), model="tiny-target")


def test_the_stored_run_is_the_chat_model_at_long_prompts():
    stored = ttft_record.load_record()  # data/measurements/smollm2-135m-instruct-ttft-cpu.json
    assert stored.model == "smollm2-135m-instruct" and stored.dtype == "fp32"
    assert {1024, 2048} <= set(stored.ttft()) and stored.command.startswith(ttft_record.COMMAND)
    lens = sorted(stored.ttft())
    assert all(stored.ttft()[a] < stored.ttft()[b] for a, b in zip(lens, lens[1:]))  # longer prompts, longer TTFT
