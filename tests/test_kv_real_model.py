"""Chapter 05 on the chat model: KV budgets for MHA / GQA / MQA, one step with vs without the cache beside its
roofline floor, a paged pool swapped into an engine, and the formula against the real model's tensors."""

import dataclasses

import pytest
import torch

from course_lib.bottlenecks.capacity import device_bytes
from course_lib.engine import Engine, SamplingParams, SchedulerConfig
from course_lib.kv import budget, engine_check, paged_serving, recompute
from course_lib.measure.hardware.peaks_cache import MeasuredPeaks
from course_lib.models.accounting import ModelShape, kv_bytes_per_token, prefill_flops, weight_bytes

# SmolLM2-135M-Instruct's shape (data/models/smollm2-135m-instruct.md)
SMOL = ModelShape("smollm2-135m-instruct", 49152, 576, 1536, 30, 9, 3, 64, True, 8192)
# a stand-in for microbench.machine_peaks(): never measures in a test
PEAKS = MeasuredPeaks("test cpu", 30.0, 30.0, {"fp32": 0.1, "bf16": 0.2}, 1, 1)


@pytest.fixture(scope="module")
def tiny():
    return Engine("tiny-target", config=SchedulerConfig(max_num_seqs=4, max_model_len=96), linear="reference")


# ----------------------------------------------------------------------------- budgets
def test_head_variants_change_only_the_kv_heads():
    v = budget.head_variants(SMOL)
    assert list(v) == ["MHA (9 KV heads)", "GQA (3 KV heads)", "MQA (1 KV head)"]
    assert [s.num_kv_heads for s in v.values()] == [9, 3, 1]
    for s in v.values():
        assert dataclasses.replace(s, num_kv_heads=3, name=SMOL.name) == SMOL
    assert kv_bytes_per_token(v["MHA (9 KV heads)"], "fp32") == 3 * kv_bytes_per_token(SMOL, "fp32") == 3 * 46_080
    assert list(budget.head_variants("llama-2-7b")) == ["MHA (32 KV heads)", "MQA (1 KV head)"]  # no separate GQA


def test_capacity_rows_divide_the_budget_by_the_bytes_per_token():
    b = budget.Budget("test", 1e9, "fp32", "by hand")
    rows = {r.variant.split()[0]: r for r in budget.capacity_rows(SMOL, [b], context=1000)}
    assert rows["GQA"].tokens == int(1e9 // 46_080) and rows["GQA"].sequences == rows["GQA"].tokens // 1000
    assert rows["MHA"].tokens == int(1e9 // (3 * 46_080)) and rows["MQA"].tokens == int(1e9 // (46_080 / 3))
    assert rows["MQA"].tokens > rows["GQA"].tokens > rows["MHA"].tokens
    assert budget.capacity_rows(SMOL, [b])[0].context == 8192  # default: the model's window
    assert "GQA (3 KV heads)" in budget.format_capacity(budget.capacity_rows(SMOL, [b]))


def test_gpu_budgets_subtract_the_weights_in_the_chips_dtype():
    t4 = budget.gpu_budget(SMOL, "T4")  # no bf16 on a T4: fp16
    assert t4.kv_dtype == "fp16" and "gpu_specs.json" in t4.source
    assert t4.kv_bytes == pytest.approx(0.9 * device_bytes("T4") - weight_bytes(SMOL, "fp16"))
    h200 = budget.gpu_budget(SMOL, "H200 SXM")
    assert h200.kv_dtype == "bf16" and h200.kv_bytes == pytest.approx(0.9 * 141 * 2**30 - weight_bytes(SMOL, "bf16"))
    assert budget.gpu_budget("llama-2-70b", "T4").kv_bytes == 0  # the weights alone overflow
    ram = budget.ram_budget()
    assert ram.kv_bytes > 0 and ram.kv_dtype == "fp32"


def test_budget_errors_name_the_argument():
    with pytest.raises(ValueError, match="kv_bytes"):
        budget.Budget("x", -1, "fp32", "")
    with pytest.raises(ValueError, match="budgets must be"):
        budget.capacity_rows(SMOL, budget.ram_budget())
    with pytest.raises(ValueError, match="budgets must be"):
        budget.capacity_rows(SMOL, [])
    with pytest.raises(ValueError, match="gpu must be"):
        budget.gpu_budget(SMOL, "Voodoo 2")
    with pytest.raises(ValueError, match="usable"):
        budget.gpu_budget(SMOL, "T4", usable=1.5)
    with pytest.raises(ValueError, match="context"):
        budget.capacity_rows(SMOL, [budget.Budget("x", 1e9, "fp32", "")], context=0)


# ----------------------------------------------------------------------------- one step, cache vs recompute
def test_recompute_flops_count_the_lm_head_once():
    head = SMOL.vocab_size * SMOL.hidden_size
    for L in (2, 17, 512):
        n = L - 1
        assert recompute.recompute_step_flops(SMOL, L) == pytest.approx(prefill_flops(SMOL, n) - 2 * head * (n - 1))
    with pytest.raises(ValueError, match="length"):
        recompute.recompute_step_flops(SMOL, 1)


def _row(cached_flops, cached_bytes, recompute_s=None):
    return recompute.StepRow(
        64,
        0.02,
        (0.02, 0.03),
        cached_flops,
        cached_bytes,
        recompute_s,
        None if recompute_s is None else (recompute_s, recompute_s),
        1e10,
        5e8,
        1e11,
        1e10,
    )


def test_floors_take_the_slower_roof():
    bw = _row(cached_flops=2e8, cached_bytes=5e8)  # 2 ms of compute, 50 ms of bytes
    assert bw.bound(True) == "bandwidth" and bw.floor_s(True) == pytest.approx(0.05)
    cb = _row(cached_flops=1e10, cached_bytes=5e8)  # counter-example: 100 ms of compute beats 50 ms of bytes
    assert cb.bound(True) == "compute" and cb.floor_s(True) == pytest.approx(0.1)
    assert bw.bound(False) == "compute" and bw.predicted_speedup == pytest.approx(0.1 / 0.05)
    assert bw.speedup is None and _row(2e8, 5e8, recompute_s=0.2).speedup == pytest.approx(10)


def test_step_rows_time_both_paths_and_leave_the_cache_empty(tiny):
    free = tiny.backend.num_free_rows()
    rows = recompute.step_rows(tiny, lengths=(32, 8), recompute_max=8, repeats=2, peaks=PEAKS)
    assert [r.length for r in rows] == [8, 32]
    assert rows[0].recompute_s > 0 and rows[0].cached_s > 0 and rows[1].recompute_s is None
    assert rows[1].cached_bytes > rows[0].cached_bytes  # the cache it reads grew
    assert rows[0].recompute_flops == recompute.recompute_step_flops(recompute.engine_shape(tiny), 8)
    assert rows[0].flop_rate == 0.1e12 and rows[0].bandwidth == 30e9
    assert tiny.backend.num_free_rows() == free and not tiny.has_unfinished()
    text = recompute.format_step_rows(rows, "tiny-target")
    assert "not run" in text and "tiny-target" in text


def test_step_rows_reject_bad_input(tiny):
    with pytest.raises(ValueError, match="max_model_len"):
        recompute.step_rows(tiny, lengths=(97,), peaks=PEAKS)
    with pytest.raises(ValueError, match="lengths"):
        recompute.step_rows(tiny, lengths=(1,), peaks=PEAKS)
    with pytest.raises(ValueError, match="engine must be"):
        recompute.step_rows("tiny-target", peaks=PEAKS)
    with pytest.raises(ValueError, match="repeats"):
        recompute.step_rows(tiny, lengths=(8,), repeats=0, peaks=PEAKS)


# ----------------------------------------------------------------------------- paged pool in the same engine
def test_paged_pool_swapped_in_gives_the_same_tokens_and_reserves_less(tiny):
    own = tiny.backend
    prompts = ["def fibonacci(n):", "import os", "class Stack:"]
    run = paged_serving.paged_vs_contiguous(tiny, prompts, SamplingParams(max_new_tokens=10, ignore_eos=True))
    assert tiny.backend is own and tiny.scheduler.backend is own  # restored
    assert run.same_tokens and run.num_seqs == 3
    assert run.contiguous_peak == 3 * 96 * own.bytes_per_token  # 3 live rows of max_model_len slots
    assert run.paged_used_peak <= run.paged_peak < run.contiguous_peak
    assert run.paged_peak - run.paged_used_peak < 3 * run.block_size * own.bytes_per_token  # < a block per sequence
    assert run.contiguous_at_context == 3 * tiny.model.max_position * own.bytes_per_token
    assert run.pool_check.matches and run.pool_check.backend == "paged" and "block(s)" in str(run)


def test_with_backend_restores_after_an_error(tiny):
    own = tiny.backend
    with pytest.raises(RuntimeError, match="boom"):
        with paged_serving.with_backend(tiny, object()):
            raise RuntimeError("boom")
    assert tiny.backend is own and tiny.scheduler.backend is own


def test_paged_vs_contiguous_rejects_bad_input(tiny):
    p = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match="prompts"):
        paged_serving.paged_vs_contiguous(tiny, "import os", p)
    with pytest.raises(ValueError, match="contiguous"):
        paged_serving.paged_vs_contiguous(Engine("tiny-target", kv_cache="paged"), ["x"], p)
    with pytest.raises(ValueError, match="block_size"):
        paged_serving.paged_vs_contiguous(tiny, ["x"], p, block_size=0)


def test_engine_check_reads_the_paged_pool():
    paged = Engine("tiny-target", kv_cache="paged", config=SchedulerConfig(max_num_seqs=2, max_model_len=64))
    check = engine_check.engine_kv_check(paged)
    assert check.backend == "paged" and check.matches and check.max_len == 16  # block_size
    assert check.tensor_bytes == paged.backend.bytes_allocated()


# ----------------------------------------------------------------------------- the real model
def test_the_chat_models_cache_matches_the_formula(smollm2_cache, monkeypatch):
    monkeypatch.setenv("COURSE_CACHE_DIR", str(smollm2_cache))
    torch.manual_seed(0)
    smol = Engine("smollm2-135m-instruct", config=SchedulerConfig(max_model_len=32, max_num_seqs=1), linear="reference")
    shape = recompute.engine_shape(smol)
    assert dataclasses.replace(shape, name=SMOL.name) == SMOL
    check = engine_check.engine_kv_check(smol)
    assert check.formula_bytes_per_token == check.tensor_bytes_per_token == 30 * 2 * 3 * 64 * 4 == 46_080
    rows = recompute.step_rows(smol, lengths=(16,), repeats=1, peaks=PEAKS)
    # fp32 weights ≫ any cache: the cached step is bandwidth-bound, recomputing 15 tokens compute-bound
    assert rows[0].bound(True) == "bandwidth" and rows[0].bound(False) == "compute"


def test_from_folder_reads_its_own_copies_of_the_file(smollm2_cache):
    """models.gguf.from_folder (the chat model's load, RSS-bound in this chapter) reads each tensor with plain
    file reads: the same values as safetensors' own reader, in the dtype asked for, no tensor left on the map."""
    from safetensors.torch import load_file

    from course_lib.models import gguf

    folder = smollm2_cache / "models" / "smollm2-135m-instruct"
    stored = load_file(str(folder / "model.safetensors"))
    model, _ = gguf.from_folder(folder)
    params = dict(model.named_parameters())
    assert set(stored) <= set(params) | {n for n, _ in model.named_buffers()}
    for name, t in stored.items():
        assert torch.equal(params[name], t), name
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
    half, _ = gguf.from_folder(folder, torch.bfloat16)
    w = dict(half.named_parameters())["model.layers.0.mlp.down_proj.weight"]
    assert w.dtype == torch.bfloat16 and torch.equal(w, stored["model.layers.0.mlp.down_proj.weight"].bfloat16())
