"""Verdicts read out of executed notebooks, stored, and compared between two runs (--compare)."""

import json

import pytest

from course_lib import course
from course_lib.measure import claims
from course_lib.measure import verdicts as V


def _line(capsys, *args, **kw) -> str:
    claims.claim(*args, **kw)
    return capsys.readouterr().out


def test_every_form_claim_prints_parses_back(capsys):
    held = V.parse_line(_line(capsys, "a GEMM reaches the roof", 0.88, at_least=0.5).splitlines()[0])
    assert held["status"] == "held" and held["measured"] == 0.88 and held["at_least"] == 0.5
    missed_text = _line(capsys, "bf16 is faster (x)", 1.9, at_least=3, at_most=20, unit="x", why_not="no units")
    missed = V.parse_line(missed_text.splitlines()[0])
    assert missed["status"] == "missed" and missed["at_most"] == 20 and missed["unit"] == "x"
    assert missed["statement"] == "bf16 is faster (x)"
    noisy = V.parse_line(_line(capsys, "tail within 10%", 1.05, at_most=1.1, spread=0.1).splitlines()[0])
    assert noisy["status"] == "noise" and noisy["spread"] == pytest.approx(0.1) and noisy["held"]
    rec = _line(capsys, "recorded", 2.0, at_least=1, where="in the recorded run (2026-12-06, Xeon)")
    assert V.parse_line(rec)["where"].startswith("in the recorded run")
    assert V.parse_line("an ordinary line ✅ not a verdict") is None


def _notebook(path, cells):
    nb = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    for text in cells:
        out = [{"output_type": "stream", "name": "stdout", "text": text}]
        nb["cells"].append({"cell_type": "code", "source": "", "outputs": out, "metadata": {}, "execution_count": 1})
    path.write_text(json.dumps(nb))


def test_compare_finds_a_flip_and_verdicts_present_in_one_run(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    same = _line(capsys, "prefill is compute-bound", 0.9, at_least=0.5)
    flip_a = _line(capsys, "decode reads 538 MB at 50% of STREAM", 0.6, at_least=0.5)
    flip_b = _line(capsys, "decode reads 95 MB at 50% of STREAM", 0.39, at_least=0.5, why_not="the LLC")
    only_a = _line(capsys, "a claim the other run lost", 3.0, at_most=4)
    _notebook(a / "01_x.ipynb", ["profile 0123456789 · CPU\n", same + flip_a, only_a])
    _notebook(b / "01_x.ipynb", ["profile abcdefabcd · CPU\n", same + flip_b])
    _notebook(b / "02_y.ipynb", [_line(capsys, "new here", 1.0, at_least=1)])
    ra, rb = V.collect(a), V.collect(b)
    assert ra["profiles"] == {"01_x.ipynb": "0123456789"}
    c = V.compare(ra, rb)
    assert c["same"] == 1 and len(c["flips"]) == 1  # matched though the statements quote different sizes
    ((_, va, vb),) = c["flips"]
    assert (va["status"], vb["status"], vb["why_not"]) == ("held", "missed", "the LLC")
    assert [v["statement"] for v in c["only_a"]] == ["a claim the other run lost"]
    assert [v["notebook"] for v in c["only_b"]] == ["02_y.ipynb"]
    V.write(b, tmp_path / "verdicts.json")  # a stored run compares like a folder
    assert V.compare(ra, V.collect(tmp_path / "verdicts.json"))["flips"] == c["flips"]
    assert course.main(["--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "1 agree, 1 flip, 1 only in" in out and "held at 0.6, " in out and "missed at 0.39" in out


def test_a_verdict_moved_to_another_chapter_is_still_compared(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    _notebook(a / "02_x.ipynb", [_line(capsys, "the int4 GEMV reads at 75% of STREAM", 0.8, at_least=0.75)])
    _notebook(b / "02_x.ipynb", ["nothing here\n"])
    _notebook(b / "03_y.ipynb", [_line(capsys, "the int4 GEMV reads at 75% of STREAM", 0.4, at_least=0.75)])
    c = V.compare(V.collect(a), V.collect(b))
    assert c["moved"] == 1 and not c["only_a"] and not c["only_b"] and len(c["flips"]) == 1
    assert "02_x.ipynb→03_y.ipynb" in V.format_compare(V.collect(a), V.collect(b))


def test_collect_rejects_what_is_not_a_run(tmp_path):
    with pytest.raises(ValueError, match="run must be"):
        V.collect(tmp_path / "missing")
    with pytest.raises(ValueError, match="no executed chapter"):
        V.collect(tmp_path)


def test_the_committed_run_parses_whole():
    data = V.collect(course.repo_root() / "notebooks")
    assert len(data["verdicts"]) > 100
    assert all(v["status"] in V.STATUSES for v in data["verdicts"])
