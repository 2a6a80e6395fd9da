"""benchmarks/vs_llamacpp.py: its arguments, and the skip without llama.cpp (the timing itself is a benchmark)."""

import importlib.util
import sys
from pathlib import Path

import pytest

_path = Path(__file__).resolve().parents[1] / "benchmarks" / "vs_llamacpp.py"
_spec = importlib.util.spec_from_file_location("vs_llamacpp", _path)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_tiny_target_runs_fp32_only():
    assert bench._parse(["--model", "tiny-target"]).formats == ["fp32"]
    assert bench._parse([]).formats == ["fp32", "int8", "int4"]


def test_tiny_target_refuses_the_gguf_formats_by_name(capsys):
    with pytest.raises(SystemExit):
        bench._parse(["--model", "tiny-target", "--formats", "int8"])
    assert "runs fp32 only" in capsys.readouterr().err


def test_a_count_below_one_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench._parse(["--tokens", "0"])
    assert "--tokens must be >= 1" in capsys.readouterr().err


def test_without_llamacpp_it_says_so_and_exits_0(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError
    assert bench.main(["--tokens", "1"]) == 0
    assert "llama.cpp is not installed" in capsys.readouterr().out


class _Side:
    """A fake side whose decode takes the next of ``tpots`` (seconds per token)."""

    def __init__(self, tpots, prefill=1.0):
        self.tpots, self.pre = list(tpots), prefill

    def decode(self):
        return self.tpots.pop(0), [1, 2, 3]

    def prefill(self):
        return self.pre


def test_paired_rounds_take_the_median_of_each_rounds_ratio():
    # the machine slows 2x in round 2: each round's ratio is 0.5 whatever the drift
    got = bench.paired_rounds(_Side([0.02, 0.04, 0.02]), _Side([0.01, 0.02, 0.01], prefill=2.0), repeats=3)
    assert got["ratio"] == pytest.approx(0.5) and got["ratio_range"] == [pytest.approx(0.5), pytest.approx(0.5)]
    assert got["engine_tpot_s"] == pytest.approx(0.02) and got["prefill_ratio"] == pytest.approx(2.0)
    assert len(got["rounds"]) == 3
    # a ratio that moves is reported with its range, the median in the middle
    got = bench.paired_rounds(_Side([0.02, 0.02, 0.02]), _Side([0.01, 0.02, 0.03]), repeats=3)
    assert got["ratio"] == pytest.approx(1.0) and got["ratio_range"] == [pytest.approx(0.5), pytest.approx(1.5)]
