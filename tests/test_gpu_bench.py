"""The helpers the GPU kernel benchmarks share (course_lib.kernels.gpu_bench), on a CPU with a stub timer."""

import json

import pytest
import torch

from course_lib.kernels.gpu_bench import best_config, cuda_or_skip, rel_err, write_rows


def test_rel_err():
    ref = torch.tensor([1.0, -4.0, 2.0])
    assert rel_err(ref, ref) == 0
    assert rel_err(ref + torch.tensor([0.0, 0.0, 0.4]), ref) == pytest.approx(0.1)
    assert rel_err(torch.ones(2), torch.zeros(2)) > 1e6  # no division by zero


def test_best_config_skips_failures(capsys):
    def make(cfg):
        if cfg["block"] == 16:
            return lambda: (_ for _ in ()).throw(RuntimeError("out of shared memory\nmore"))
        return lambda: 1.0 / cfg["block"]

    t, cfg = best_config(make, [dict(block=16), dict(block=32), dict(block=64)], lambda fn: fn())
    assert (t, cfg) == (1 / 64, dict(block=64))
    assert "config {'block': 16} failed: RuntimeError: out of shared memory" in capsys.readouterr().err
    assert best_config(make, [dict(block=16)], lambda fn: fn()) == (float("inf"), {})


def test_skip_message_and_json(tmp_path, capsys):
    if not torch.cuda.is_available():
        assert not cuda_or_skip("x.py") and "x.py needs a CUDA GPU" in capsys.readouterr().out
    path = tmp_path / "rows.json"
    write_rows(str(path), [dict(a=1)], dict(device="cpu"), summary=dict(met=1))
    assert json.loads(path.read_text()) == dict(meta=dict(device="cpu"), summary=dict(met=1), rows=[dict(a=1)])
    assert "wrote 1 rows" in capsys.readouterr().out


def test_tinygemm_baseline_says_why_when_absent():
    """torch's CUDA int4 path has no CPU kernel: the baseline reports the reason instead of crashing."""
    import torch

    from course_lib.kernels.gpu_bench import tinygemm_int4

    packed = torch.randint(0, 256, (32, 64), dtype=torch.uint8)
    fn, why = tinygemm_int4(packed, torch.rand(32, 1), torch.rand(32, 1), 128)
    if torch.cuda.is_available():
        return  # on a GPU the op may exist; the benchmark checks its output against the reference
    assert fn is None and "Error" in why
