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
