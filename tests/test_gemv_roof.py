"""compression.gemv_roof: the decode-shaped product timings, their verdicts and the recorded bandwidths."""

import pytest
import torch
import torch.nn.functional as F

from course_lib.compression import gemv_roof as gr
from course_lib.compression import peer_roof as pr
from course_lib.models.accounting import ModelShape


def test_rows_read_what_each_format_stores_and_cycle_copies():
    rows = gr.gemv_roof(64, 128, stream_gbps=10.0, rows=(1, 3), working_set=64 * 128 * 4 * 3, repeats=2)
    got = {(r.format, r.rows): r for r in rows}
    assert set(got) == {(f, n) for f in gr.available_formats() for n in (1, 3)}
    assert got["fp32", 1].weight_bytes == 64 * 128 * 4 == got["fp32 packed", 1].weight_bytes
    assert got["int8", 1].weight_bytes < got["fp32", 1].weight_bytes / 3.5
    assert got["int4", 1].weight_bytes < got["int8", 1].weight_bytes
    assert got["fp32", 1].copies == 3 and got["int4", 1].copies > got["int8", 1].copies > 3
    for r in rows:
        assert r.fraction == pytest.approx(r.gbps / 10.0) and r.spread >= 0


def test_clones_have_their_own_storage_and_give_the_same_answer():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 128, generator=g)  # in = 128: int4-q8 takes multiples of 128
    x = torch.randn(1, 128, generator=g)  # one row: a decode step's, on every format's own kernel
    for fmt in gr.available_formats():
        lay = gr._make(fmt, w)
        y = lay(x)
        c = gr._clone(lay)
        assert torch.equal(c(x), y)
        if fmt == "fp32 packed":
            assert c._packed is not lay._packed and c._packed.is_mkldnn
        elif fmt in ("fp32", "fp32 gemv"):
            assert c.weight.data_ptr() != lay.weight.data_ptr()
        elif fmt == "int8-dyn":
            assert c._prepared is not lay._prepared
        elif gr.PATH_OF[fmt] in ("gemv", "gemv-q8"):
            assert c._gemv is not lay._gemv
            a, b = (c._gemv[0], lay._gemv[0]) if fmt == "int8" else (c._gemv.packed, lay._gemv.packed)
            assert a.data_ptr() != b.data_ptr()
        else:
            assert c._prepared[1].data_ptr() != lay._prepared[1].data_ptr()
        ref = F.linear(x, w)
        # int8-dyn: fbgemm without VNNI (AVX2) sums u8·s8 pairs in int16 (vpmaddubsw), which saturates
        tol = 1e-5 if fmt.startswith("fp32") else 0.3 if fmt == "int8-dyn" else 0.2
        assert (y - ref).abs().max() / ref.abs().max() < tol


def test_the_course_kernels_are_listed_where_they_run():
    from course_lib.kernels import cpu_gemv

    fmts = gr.available_formats()
    assert ("fp32 gemv" in fmts) == cpu_gemv.available() == ("int8" in fmts) == ("int4" in fmts)
    with pytest.raises(ValueError, match="cannot run here") if "fp32 gemv" not in fmts else _nothing():
        gr.gemv_roof(16, 64, stream_gbps=1.0, formats=("fp32 gemv",), working_set=1, repeats=2)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="stream_gbps"):
        gr.gemv_roof(8, 8, stream_gbps=0)
    with pytest.raises(ValueError, match="formats"):
        gr.gemv_roof(8, 8, stream_gbps=1.0, formats=("fp16",))
    with pytest.raises(ValueError, match="rows"):
        gr.gemv_roof(8, 8, stream_gbps=1.0, rows=(0,))


def _row(fmt, frac, rows=1, samples=(1.0, 1.0)):
    # weight bytes chosen so that gbps / stream = frac with stream 10 GB/s and 1 s per call
    return gr.RoofRow(fmt, "p", rows, int(frac * 10e9), samples, 1, 10.0)


def test_verdicts_take_the_fastest_path_and_fail_below_the_goal():
    rows = [_row("fp32", 0.5), _row("fp32 packed", 0.8), _row("int8", 0.6), _row("int4", 0.9, rows=2)]
    best = gr.best_by_format(rows)
    assert best["fp32"].format == "fp32 packed" and "int4" not in best
    v = gr.roof_verdicts(rows)
    assert v["fp32"].held and not v["int8"].held  # 0.6 < 0.75: a false claim fails
    noisy = gr.roof_verdicts([_row("int8", 0.7, samples=(0.8, 1.0, 1.3))])
    assert noisy["int8"].inside_noise


def test_cache_roof_times_one_copy_and_names_the_lower_roof():
    formats = gr.available_formats(gr.CACHE_FORMATS)
    rows = gr.cache_roof(128, stream_gbps=10.0, out_features=32, calls=2, repeats=2, formats=formats)
    assert [r.format for r in rows] == list(formats) and all(r.copies == 1 and r.rows == 1 for r in rows)
    assert all(r.gbps > 0 and len(r.samples) == 2 for r in rows)
    # by hand: a kernel at 0.6 of STREAM in DRAM and 0.65 in cache is bound by its arithmetic, at 92% of it;
    # one at 0.8 and 1.5 is bound by memory
    dram = [_row("int4", 0.6), _row("fp32 gemv", 0.8), _row("int8", 0.9, rows=4)]
    cache = [_row("int4", 0.65), _row("fp32 gemv", 1.5), _row("int8", 2.0)]
    b = {r["format"]: r for r in gr.bound_verdicts(dram, cache)}
    assert set(b) == {"int4", "fp32 gemv"}  # int8 has no 1-row DRAM row
    assert b["int4"]["lower_roof"] == "arithmetic" and b["int4"]["of_lower_roof"] == pytest.approx(0.6 / 0.65)
    assert not b["int4"]["reachable"]  # 0.65 < the 0.75 goal: no loads can make up for it
    assert b["fp32 gemv"]["lower_roof"] == "memory" and b["fp32 gemv"]["of_lower_roof"] == pytest.approx(0.8)
    assert b["fp32 gemv"]["reachable"] and "arithmetic" in gr.bound_table(list(b.values()))
    with pytest.raises(ValueError, match="stream_gbps"):
        gr.cache_roof(128, stream_gbps=-1.0)
    with pytest.raises(ValueError, match="calls"):
        gr.cache_roof(128, stream_gbps=1.0, calls=0)
    with pytest.raises(ValueError, match="formats must be among"):
        gr.cache_roof(128, stream_gbps=1.0, formats=("int3",))


def test_paired_stream_samples_set_each_ratio():
    """Each sample divided by the STREAM pass timed just before it: a machine that slows down mid-run moves
    both sides of a pair, where one STREAM figure from the start would make the late samples look slow."""
    # 1e9 bytes: 1 s at 1 GB/s; the second half of the run at half speed, memory and kernel alike
    slow = gr.RoofRow("int4", "gemv", 1, 10**9, (1.0, 1.0, 2.0, 2.0, 2.0), 1, 10.0, (2.0, 2.0, 1.0, 1.0, 1.0))
    assert slow.fraction == pytest.approx(0.5)  # every pair reads 0.5 of its STREAM
    assert slow.gbps / 2.0 == pytest.approx(0.25)  # against the first STREAM figure: half of that
    assert slow.best_fraction == pytest.approx(0.5)
    unpaired = gr.RoofRow("int4", "gemv", 1, 10**9, (1.0, 2.0), 1, 4.0)
    assert unpaired.fraction == pytest.approx(unpaired.gbps / 4.0) and unpaired.best_fraction == pytest.approx(0.25)
    sample = gr.triad_sampler(4 * 2**20)
    assert sample() > 0
    rows = gr.gemv_roof(64, 128, stream_gbps=1.0, formats=("fp32",), working_set=1, repeats=3, stream_sample=sample)
    (row,) = rows
    assert len(row.stream_samples) == 3 and row.stream_gbps == sorted(row.stream_samples)[1]
    cache = gr.cache_roof(
        128,
        stream_gbps=1.0,
        out_features=32,
        calls=2,
        repeats=2,
        formats=gr.available_formats(gr.CACHE_FORMATS)[:1],
        stream_sample=sample,
    )
    assert all(len(r.stream_samples) == 2 for r in cache)  # none where the course's kernels cannot build
    with pytest.raises(ValueError, match="n_bytes"):
        gr.triad_sampler(0)
    with pytest.raises(ValueError, match="passes"):
        gr.triad_sampler(1024, passes=0)


def test_bf16_activation_error_is_small_but_not_zero():
    errs = gr.bf16_activation_error(64, 128)
    assert set(errs) <= set(gr.PATH_OF) and {"int8 bf16", "int4 bf16"} & set(errs)
    for fmt, e in errs.items():
        if gr.PATH_OF[fmt] == "gemv":  # fp32 activations: fp32 rounding for int8, fp16 scales for int4
            assert e < (1e-5 if fmt == "int8" else 2e-3)
        else:
            assert 0 < e < 2e-2
    if "int8" in errs and "int8 bf16" in errs:
        assert errs["int8"] < errs["int8 bf16"] / 10  # what keeping the activations in fp32 buys


def _shape():
    return ModelShape(
        name="smollm2", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
        num_heads=9, num_kv_heads=3, head_dim=64, tie_embeddings=True,
    )  # fmt: skip


def test_bytes_per_token_and_achieved_bandwidth():
    s = _shape()
    fp32 = pr.decode_bytes_per_token(s, "fp32")
    assert fp32 == pytest.approx(4 * (30 * (576 * 64 * 24 + 3 * 576 * 1536) + 49152 * 576))
    assert pr.decode_bytes_per_token(s, "int4", "int8") < pr.decode_bytes_per_token(s, "int8") < fp32
    rec = {"rows": [{"format": "fp32", "engine_tok_s": 10.0, "llama_tok_s": 20.0, "goal": 0.9}]}
    (row,) = pr.achieved_bandwidth(rec, s, stream_gbps=fp32 * 40 / 1e9)
    assert row["ratio"] == 0.5 and row["engine_fraction"] == pytest.approx(0.25)
    assert row["llama_fraction"] == pytest.approx(0.5)
    paired = {"format": "fp32", "engine_tok_s": 10.0, "llama_tok_s": 20.0, "ratio": 0.6, "ratio_range": [0.4, 0.7]}
    (row,) = pr.achieved_bandwidth({"rows": [paired]}, s, stream_gbps=1.0)
    assert row["ratio"] == 0.6  # the record's paired median, as the ledger reads it, not 10 / 20
    assert "0.40-0.70" in pr.peer_table([row])
    with pytest.raises(ValueError, match="record"):
        pr.achieved_bandwidth([], s, 1.0)
    with pytest.raises(ValueError, match="format"):
        pr.achieved_bandwidth({"rows": [{"format": "fp8"}]}, s, 1.0)


@pytest.mark.parametrize("shape", [(37, 53), (1, 7), (256, 96)])
def test_dynamic_path_matches_its_reference_on_awkward_shapes(shape):
    from course_lib.compression.linear import WeightOnlyLinear, dynamic_supports
    from course_lib.compression.quantize import QuantConfig, quantize
    from course_lib.engine.layers import Linear

    n, k = shape
    w = torch.randn(n, k)
    qw = quantize(w, QuantConfig(bits=8))
    if not dynamic_supports(qw):
        pytest.skip("no fbgemm in this torch build")
    engine_before = torch.backends.quantized.engine
    lay = WeightOnlyLinear(qw, path="dynamic", max_rows=4)
    for rows in (1, 3):
        x = torch.randn(rows, k)
        ref = lay.reference(x)
        y = lay(x)
        assert y.shape == (rows, n) and y.dtype == torch.float32
        scale = (x.abs() @ w.abs().T).max()  # the products' magnitude: an output can cancel to ~0
        assert (y - ref).abs().max() <= 0.02 * scale  # 8-bit activations: ~1% of the range
    assert torch.backends.quantized.engine == engine_before  # no global side effect
    x = torch.randn(2, 5, k)  # batched leading dims keep their shape
    assert lay(x).shape == (2, 5, n)
    big = torch.randn(9, k)  # more rows than max_rows: the reference path, exactly
    assert torch.equal(lay(big), lay.reference(big))
    xb = torch.randn(1, k, dtype=torch.bfloat16)  # not fp32: the reference path
    assert torch.equal(lay(xb), lay.reference(xb))
    with pytest.raises(ValueError, match="dynamic"):
        WeightOnlyLinear(quantize(w, QuantConfig(bits=8, symmetric=False)), path="dynamic")
    bias = torch.randn(n)
    lb = WeightOnlyLinear.from_linear(Linear(w, bias), QuantConfig(bits=8), path="dynamic")
    xs = torch.randn(1, k)
    assert (lb(xs) - lb.reference(xs)).abs().max() <= 0.02 * (xs.abs() @ w.abs().T).max()


def test_peer_verdicts_follow_the_goals():
    rows = [
        {"format": "fp32", "ratio": 0.95, "goal": 0.9},
        {"format": "int8", "ratio": 0.41, "goal": 0.8},  # a false claim: must fail
        {"format": "int4", "ratio": 0.7, "goal": None},  # no goal: no verdict
    ]
    v = pr.peer_verdicts(rows)
    assert set(v) == {"fp32", "int8"} and v["fp32"].held and not v["int8"].held
    rec = {"rows": [dict(r, engine_tok_s=r["ratio"], llama_tok_s=1.0) for r in rows]}
    table = pr.peer_table(pr.achieved_bandwidth(rec, _shape(), 10.0))
    assert "0.41" in table and table.count("\n") == 3


def test_recorded_llamacpp_loads_or_names_the_command(tmp_path):
    rec = pr.recorded_llamacpp()
    assert {"meta", "rows"} <= set(rec) and "command" in rec["meta"] and "machine" in rec["meta"]
    with pytest.raises(FileNotFoundError, match="vs_llamacpp.py"):
        pr.recorded_llamacpp(tmp_path / "missing.json")
