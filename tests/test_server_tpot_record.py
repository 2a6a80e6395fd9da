"""serving.server_tpot_record: the batch from token times, the step at a batch, the record and the ledger."""

import json
import statistics

import pytest

from course_lib.bottlenecks import ledger as L
from course_lib.serving import server_tpot_record as R
from course_lib.serving.loadgen.results import RequestResult

pytestmark = pytest.mark.usefixtures("one_thread")
GOAL = "server p50 TPOT at 8 req/s ÷ in-process step at the same batch"


def _req(i, first, gap, n=5):
    return RequestResult(i, first - 0.1, [first + k * gap for k in range(n)])


class _Fake:
    """A LoadResult's two parts that the record reads: ``results`` and ``p(metric)``."""

    def __init__(self, results, tpot, ttft=0.05):
        self.results, self._p = results, {"tpot": tpot, "ttft": ttft}

    def p(self, metric, q=50):
        return self._p[metric]


def test_decode_batch_counts_overlapping_spans():
    alone = [_req(0, 0.0, 0.01), _req(1, 1.0, 0.01)]  # one after the other: batch 1
    assert R.decode_batch(alone) == pytest.approx(1.0)
    two = [_req(0, 0.0, 0.01), _req(1, 0.0, 0.01)]  # the same span: batch 2 each
    assert R.decode_batch(two) == pytest.approx(2.0)
    half = [_req(0, 0.0, 0.01), _req(1, 0.02, 0.01)]  # each overlaps half of the other's 0.04 s
    assert R.decode_batch(half) == pytest.approx(1.5)
    assert R.decode_batch(alone + [RequestResult(9, 0.0, [0.5])]) == pytest.approx(1.0)  # 1 token: no span
    with pytest.raises(ValueError, match="results must"):
        R.decode_batch([RequestResult(0, 0.0, [0.1])])


def test_step_at_interpolates_and_never_extrapolates():
    steps = {1: 0.010, 2: 0.012, 4: 0.020}
    assert R.step_at(steps, 2) == 0.012
    assert R.step_at(steps, 1.5) == pytest.approx(0.011)
    assert R.step_at(steps, 3) == pytest.approx(0.016)
    for b in (0.5, 4.5):
        with pytest.raises(ValueError, match="outside"):
            R.step_at(steps, b)
    with pytest.raises(ValueError, match="steps is empty"):
        R.step_at({}, 1)


def _rounds(server_tpot):
    two = [_req(0, 0.0, 0.01), _req(1, 0.0, 0.01)]  # batch 2
    return {
        "in-process": [_Fake(two, 0.011), _Fake(two, 0.013)],
        "thread server": [_Fake(two, 0.030), _Fake(two, 0.030)],
        "process server": [_Fake(two, server_tpot), _Fake(two, server_tpot)],
    }


META = {"machine": "test CPU", "date": "2026-12-02", "command": "python benchmarks/server_overhead.py"}


@pytest.mark.parametrize("tpot,status", [(0.0125, "met"), (0.0175, "missed")])
def test_record_round_trip_and_the_ledger_reads_it(tmp_path, tpot, status):
    rounds = _rounds(tpot)
    assert R.batches_to_time(rounds) == [2]
    rec = R.build_record(rounds, {1: 0.008, 2: 0.010, 3: 0.012}, META | {"load_average_before": [1.5, 1, 1]})
    assert rec["ratio_run"] == "process server" and rec["ratio"] == pytest.approx(tpot / 0.010)
    m = rec["median_over_rounds"]
    assert m["thread server"]["tpot_over_step"] == pytest.approx(3.0)
    assert m["process server"]["tpot_over_in_process_tpot"] == pytest.approx(
        statistics.median([tpot / 0.011, tpot / 0.013])
    )
    assert m["in-process"]["batch"] == pytest.approx(2.0) and rec["rounds"][0]["in-process"]["step_ms_at_batch"] == 10
    (tmp_path / L.SERVER).write_text(json.dumps(rec))
    back = R.load_record(tmp_path / L.SERVER)
    assert back["ratio"] == rec["ratio"] and back["step_ms"] == {"1": 8.0, "2": 10.0, "3": 12.0}
    e = {g["goal"]: g for g in L.build_ledger(tmp_path)["goals"]}[GOAL]
    assert e["status"] == status and e["ratio"] == pytest.approx(tpot / 0.010)  # 1.25 met, 1.75 missed
    assert e["machine"] == "test CPU" and e["load_average_before"] == [1.5, 1, 1] and e["date"] == "2026-12-02"


def test_record_with_steps_timed_in_every_round():
    rounds = _rounds(0.0125)  # in-process 0.011 then 0.013; the process server 0.0125 in both
    rec = R.build_record(rounds, [{2: 0.010}, {2: 0.0125}], META)  # the second round's machine was slower
    assert [r["process server"]["tpot_over_step"] for r in rec["rounds"]] == pytest.approx([1.25, 1.0])
    assert rec["ratio"] == pytest.approx(1.125) and rec["step_ms"] == [{"2": 10.0}, {"2": 12.5}]
    with pytest.raises(ValueError, match="one per round"):
        R.build_record(rounds, [{2: 0.01}], META)


def test_record_bad_input(tmp_path):
    with pytest.raises(ValueError, match="in-process"):
        R.build_record({"process server": _rounds(0.01)["process server"]}, {2: 0.01}, META)
    r = _rounds(0.01)
    r["process server"] = r["process server"][:1]
    with pytest.raises(ValueError, match="same non-zero number of rounds"):
        R.build_record(r, {2: 0.01}, META)
    with pytest.raises(ValueError, match="meta has no 'command'"):
        R.build_record(_rounds(0.01), {2: 0.01}, {"machine": "m", "date": "d"})
    with pytest.raises(ValueError, match="outside"):  # a batch the steps were not timed at
        R.build_record(_rounds(0.01), {1: 0.01}, META)
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"meta": {}, "rounds": [], "step_ms": {}, "ratio": 1, "ratio_run": "x"}))
    with pytest.raises(ValueError, match="median_over_rounds"):
        R.load_record(p)


def test_step_times_on_tiny_target(target):
    steps = R.step_times(target, [1, 3], prompt_tokens=8, steps=4, repeats=1)
    assert sorted(steps) == [1, 3] and all(0 < s < 5 for s in steps.values())
    assert not target.has_unfinished()
    for bad, match in (([0], "batches"), ([1.5], "batches"), ([], "batches")):
        with pytest.raises(ValueError, match=match):
            R.step_times(target, bad)
    with pytest.raises(ValueError, match="steps must"):
        R.step_times(target, [1], steps=0)
