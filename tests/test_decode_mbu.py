"""MBU of a decode step (course_lib.bottlenecks.decode_mbu) on a CPU with a small random shape, and a GPU run's
files reaching the performance ledger: the engine, MBU and lever records in the formats the benchmarks
write, through gpu_collect into data/measurements/<gpu>.json, read by the ledger's GPU goals."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.bottlenecks import decode_mbu as D
from course_lib.bottlenecks import ledger as L
from course_lib.bottlenecks import step_levers
from course_lib.measure.gpu_record import collect
from course_lib.models.accounting import ModelShape, decode_step_bytes, param_count

ROOT = Path(__file__).resolve().parents[1]
SMALL = ModelShape("small", 4096, 64, 128, 2, 4, 2, 16, True, 256)


@pytest.fixture(scope="module")
def rows():
    return D.mbu_rows(SMALL, "cpu", "fp32", ["eager", "fused"], context=16, steps=2, repeats=2, bandwidth_gbps=10.0)


def test_random_llama_has_the_shape():
    model, tok = D.random_llama(SMALL, "cpu", "bf16")
    assert sum(p.numel() for p in model.parameters()) == param_count(SMALL)
    assert next(model.parameters()).dtype.is_floating_point and str(next(model.parameters()).dtype) == "torch.bfloat16"
    assert model.config.num_key_value_heads == 2 and model.config.tie_word_embeddings
    assert D.SHAPES["llama-3.2-1b"].num_layers == 16
    assert 1.23e9 < param_count(D.SHAPES["llama-3.2-1b"]) < 1.24e9  # Llama-3.2-1B: 1,235,814,400 parameters


def test_rows_divide_the_bytes_by_the_time(rows):
    assert [r.lever for r in rows] == ["eager", "fused"]
    for r in rows:
        assert r.bytes_per_step == decode_step_bytes(SMALL, 16, 1, "fp32")
        assert r.gbps == pytest.approx(r.bytes_per_step / (r.step_us * 1e-6) / 1e9)
        assert r.mbu == pytest.approx(r.gbps / 10.0) and r.bandwidth_gbps == 10.0
    assert D.best(rows).mbu == max(r.mbu for r in rows)
    rec = D.as_record(rows, "cmd", "machine")
    assert len(rec["rows"]) == 2 and rec["best"]["mbu"] == D.best(rows).mbu and rec["meta"]["command"] == "cmd"
    assert "small" in D.format_rows(rows)


def test_goal_verdict_holds_and_fails(rows):
    r = rows[0]
    assert D.goal_verdict(dataclasses.replace(r, mbu=0.7, spread=0.0)).held
    assert not D.goal_verdict(dataclasses.replace(r, mbu=0.3, spread=0.0)).held


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"shape": "llama-9b"}, "shape must be"),
        ({"levers": ["warp"]}, "levers must be"),
        ({"levers": []}, "levers must be"),
        ({"context": 0}, "context must be"),
        ({"context": 300}, "context must be"),
        ({"dtype": "int3"}, "dtype must be"),
        ({"bandwidth_gbps": 0.0}, "bandwidth_gbps must be"),
        ({"steps": 0}, "steps must be"),
        ({"repeats": 1}, "repeats must be"),
    ],
)
def test_bad_input_is_named(kwargs, match):
    args = {"shape": SMALL, "device": "cpu", "dtype": "fp32", "bandwidth_gbps": 10.0} | kwargs
    with pytest.raises(ValueError, match=match):
        D.mbu_rows(**args)


def test_a_vocabulary_smaller_than_the_tokenizer_is_refused():
    with pytest.raises(ValueError, match="vocabulary"):
        D.random_llama(dataclasses.replace(SMALL, vocab_size=100))


ENV = """GPU 0: NVIDIA H200 (UUID: GPU-1234)
NVIDIA H200, 143771 MiB, 1980 MHz, 3201 MHz, 580.159.04
torch 2.11.0+cu130 triton 3.6.0 transformers 5.17.0
"""


def test_a_gpu_runs_files_reach_the_ledger(tmp_path, rows):
    """The engine, MBU and lever files as the benchmarks write them (here on a CPU, the MBU rows relabelled
    as the goal's shape and dtype), collected, then read by the two GPU goals."""
    out, data = tmp_path / "out", tmp_path / "data"
    out.mkdir()
    data.mkdir()
    (out / "env.log").write_text(ENV)
    (out / "summary.txt").write_text("== engine_vs_hf: rc=0 in 20 s (limit 45 s)\n== mbu: rc=0 in 60 s (limit 90 s)\n")
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "engine_vs_hf.py"), "--batches", "1", "--new-tokens", "4",
         "--repeats", "2", "--decode", "fused", "--json", str(out / "engine_vs_hf.json")],
        check=True, capture_output=True, cwd=ROOT,
    )  # fmt: skip
    goal_rows = [dataclasses.replace(r, shape=L.MBU_SHAPE, dtype=L.MBU_DTYPE) for r in rows]
    (out / "decode_mbu.json").write_text(json.dumps(D.as_record(goal_rows, "cmd", "machine")))
    step_levers.main(["--levers", "eager", "--json", str(out / "step_levers.json")])
    path = collect(out, data, today="2026-12-06")
    assert path.name == L.GPU
    ledger = L.build_ledger(data, [g for g in L.GOALS if g.gpu])
    step, mbu = ledger["goals"]
    assert step["status"] in ("met", "missed") and step["ratio"] > 0 and step["date"] == "2026-12-06"
    assert step["context"]["decode"] == "fused" and set(step["context"]["step_us_per_lever"]) == {"eager"}
    assert mbu["status"] in ("met", "missed") and mbu["ratio"] == pytest.approx(D.best(rows).mbu)
    assert mbu["context"]["best_lever"] == D.best(rows).lever
    text = L.summary(ledger)
    assert "best lever" in text and "decode mode: fused" in text


def test_stored_runs_are_every_file_and_gpu_section(tmp_path, rows, capsys):
    rec = D.as_record(rows, "cmd", "a CPU")
    (tmp_path / "decode-mbu-cpu.json").write_text(json.dumps(rec))
    (tmp_path / "nvidia-h200.json").write_text(json.dumps({"gpu": "H200", "decode_mbu": rec}))
    (tmp_path / "other.json").write_text(json.dumps({"rows": [1]}))
    runs = D.stored_runs(tmp_path)
    assert [(r["where"], r["gpu"]) for r in runs] == [("decode-mbu-cpu.json", False), ("nvidia-h200.json", True)]
    assert "a CPU" in D.format_stored(runs) and "MBU divides by that machine's measured 10 GB/s" in D.format_stored(
        runs
    )
    verdicts = D.stored_verdicts(runs)
    assert len(verdicts) == 2 and "in the recorded run (nvidia-h200.json" in capsys.readouterr().out
    with pytest.raises(ValueError, match="measurements must be a folder"):
        D.stored_runs(tmp_path / "nope")


def test_the_ledger_reads_the_old_list_form_too():
    old = {"engine_vs_hf": [{"batch": 1, "step_ms_engine": 3.4}]}
    assert L._gpu_step_ms(old) == 3.4 and L._gpu_mbu(old) is None
    other = {"decode_mbu": {"rows": [{"shape": "smollm2-135m", "dtype": "bf16", "mbu": 0.9}]}}
    assert L._gpu_mbu(other) is None  # another shape is not the goal's
