"""The KV cache: size formula vs the engine's tensors, the calculator and explorer, and cache on vs off."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_lib.bottlenecks.time_floors import generation_flops  # noqa: E402
from course_lib.kv import engine_check, explorer, formulas, on_off, plots  # noqa: E402
from course_lib.measure.hardware import gpu_names, gpu_spec  # noqa: E402
from course_lib.measure.references import reference  # noqa: E402
from course_lib.models.accounting import PRESETS, ModelShape, kv_bytes_per_token  # noqa: E402


@pytest.fixture(scope="module")
def engine():
    from course_lib.engine import Engine, SchedulerConfig

    return Engine("tiny-target", config=SchedulerConfig(max_num_seqs=1, max_model_len=64))


# ----------------------------------------------------------------------------- formula vs the engine's tensors
def test_formula_matches_the_engines_tensors_exactly(engine):
    check = engine_check.engine_kv_check(engine)
    shape = ModelShape.from_embedded("tiny-target")
    assert check.model == "tiny-target" and check.dtype == "fp32"
    assert check.formula_bytes_per_token == kv_bytes_per_token(shape, "fp32") == 2 * 6 * 2 * 32 * 4
    assert check.tensor_bytes_per_token == check.formula_bytes_per_token and check.matches
    assert check.max_len == 64 and check.tensor_bytes == engine.backend.bytes_allocated()
    assert "match" in str(check)


def test_kv_check_follows_the_cache_dtype(engine):
    from course_lib.engine import Engine
    from course_lib.engine.attention import ContiguousBackend, NoCacheBackend

    m = engine.model
    backend = ContiguousBackend(m.num_layers, m.num_kv_heads, m.head_dim, 48, 3, torch.bfloat16)
    bf16 = Engine(engine.hf_model, engine.tokenizer, backend=backend, linear="reference")
    check = engine_check.engine_kv_check(bf16)
    assert check.dtype == "bf16" and check.formula_bytes_per_token == check.tensor_bytes_per_token == 1536
    with pytest.raises(ValueError, match="engine must use the contiguous"):
        engine_check.engine_kv_check(
            Engine(engine.hf_model, engine.tokenizer, backend=NoCacheBackend(64), linear="reference")
        )
    with pytest.raises(ValueError, match="engine must be"):
        engine_check.engine_kv_check("tiny-target")


# ----------------------------------------------------------------------------- calculator
def test_llama2_7b_fp16_is_512_kib_per_token():
    published = reference("llama2_kv_bytes_per_token").value
    rows = {r.model: r for r in formulas.kv_table(["llama-2-7b", "llama-2-70b"], "fp16", 4096)}
    assert rows["llama-2-7b"].kv_bytes_per_token == published["Llama-2-7B fp16"] == 512 * 1024
    assert rows["llama-2-70b"].kv_bytes_per_token == published["Llama-2-70B fp16"]
    assert formulas.kv_gb("llama-2-7b", "fp16", 4096, 1) == 2 * 1024**3 / 1e9  # 2 GiB at 4k
    assert formulas.kv_gb("llama-2-7b", "fp8", 4096, 8) == 8 * formulas.kv_gb("llama-2-7b", "fp16", 4096, 1) / 2


def test_kv_table_attention_types():
    rows = {r.model: r for r in formulas.kv_table()}
    assert set(rows) == set(PRESETS)
    assert rows["llama-2-7b"].attention == "MHA" and rows["llama-3-8b"].attention == "GQA"
    assert rows["qwen2.5-7b"].kv_bytes_per_token == 2 * 28 * 4 * 128 * 2  # 56 KiB in bf16
    assert rows["mistral-7b"].kv_bytes_per_token == rows["llama-3-8b"].kv_bytes_per_token
    mqa = ModelShape("mqa", 100, 64, 96, 2, 4, 1, 16)
    assert formulas.kv_table([mqa])[0].attention == "MQA"
    text = formulas.format_kv_table(formulas.kv_table(["llama-2-7b"], "fp16", 4096), 4096)
    assert "512" in text and "MHA" in text


def test_usable_default_is_vllms():
    assert formulas.USABLE == reference("vllm_gpu_memory_utilization").value


def test_fit_requests_monotonic_in_context():
    for model in PRESETS:
        for gpu in ("H100 SXM", "H200 SXM", "L4"):
            counts = [formulas.fit_requests(model, gpu, "bf16", c) for c in explorer.CONTEXTS]
            assert counts == sorted(counts, reverse=True), (model, gpu, counts)
    # Llama-2-7B bf16 on an H100: (0.9 · 80 GiB − 13.5 GB) / (2 GiB per 4k request) = 29
    assert formulas.fit_requests("llama-2-7b", "H100 SXM", "bf16", 4096) == 29
    assert formulas.fit_requests("llama-2-7b", "H100 SXM", "fp8", 4096, weights_dtype="bf16") == 59
    assert formulas.fit_requests("llama-2-7b", "H100 SXM", "bf16", 4096, usable=1.0) > 29
    assert formulas.fit_requests("llama-3-70b", "L4", "bf16", 512) == 0  # the weights alone overflow


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: formulas.kv_gb("llama-9", "bf16", 512, 1), "model must be"),
        (lambda: formulas.kv_gb(7, "bf16", 512, 1), "model must be"),
        (lambda: formulas.kv_gb("llama-2-7b", "fp12", 512, 1), "dtype must be"),
        (lambda: formulas.kv_gb("llama-2-7b", "bf16", 0, 1), "context must be"),
        (lambda: formulas.kv_gb("llama-2-7b", "bf16", 512, -1), "batch must be"),
        (lambda: formulas.kv_gb("llama-2-7b", "bf16", 512.0, 1), "context must be"),
        (lambda: formulas.fit_requests("llama-2-7b", "H9000", "bf16", 512), "gpu must be"),
        (lambda: formulas.fit_requests("llama-2-7b", "H100 SXM", "bf16", 0), "context must be"),
        (lambda: formulas.fit_requests("llama-2-7b", "H100 SXM", "bf16", 512, "fp3"), "weights_dtype must be"),
        (lambda: formulas.fit_requests("llama-2-7b", "H100 SXM", "bf16", 512, usable=1.5), "usable must be"),
        (lambda: explorer.draw_kv("llama-2-7b", "H100 SXM", "bf16", 512, 0), "batch must be"),
        (lambda: explorer.draw_kv("llama-2-7b", "H100 SXM", "bf16", -5, 1), "context must be"),
        (lambda: formulas.kv_table("llama-2-7b"), "models must be"),
        (lambda: formulas.kv_table([]), "models must hold"),
        (lambda: on_off.kv_on_off("nope", [8, 16]), "engine_name must be"),
        (lambda: on_off.kv_on_off("tiny-target", []), "lengths must be"),
        (lambda: on_off.kv_on_off("tiny-target", [1, 8]), "lengths must be"),
        (lambda: on_off.kv_on_off("tiny-target", "8"), "lengths must be"),
        (lambda: on_off.kv_on_off("tiny-target", [8], repeats=0), "repeats must be"),
        (lambda: on_off.kv_on_off("tiny-target", [8], calib_tokens=0), "calib_tokens must be"),
        (lambda: on_off.kv_on_off("tiny-target", [8], prompt=""), "prompt must be"),
        (lambda: on_off.kv_on_off("tiny-target", [8, 5000]), "lengths must be <= tiny-target's"),
    ],
)
def test_bad_inputs_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------- explorer
def _controls(widget) -> dict:
    return {c.description: c for c in widget.children[:-1]}


def _cases():
    """Every GPU with every dtype (the pairs that can fail), cycling through every model and the smallest
    and largest context and batch the sliders offer."""
    controls = _controls(explorer.kv_explorer())
    models, contexts, batches = (controls[k].options for k in ("model", "context", "batch"))
    pairs = [(g, d) for g in controls["GPU"].options for d in controls["dtype"].options]
    for i, (gpu, dtype) in enumerate(pairs):
        yield (
            models[i % len(models)],
            gpu,
            dtype,
            (contexts[0], contexts[-1])[i // 2 % 2],
            (batches[0], batches[-1])[i % 2],
        )


def test_explorer_offers_what_the_issue_asks():
    controls = _controls(explorer.kv_explorer())
    assert set(controls["model"].options) == set(PRESETS)
    assert tuple(controls["GPU"].options) == gpu_names()
    assert controls["context"].options[0] == 512 and controls["context"].options[-1] == 128 * 1024
    assert controls["batch"].options[0] == 1 and controls["batch"].options[-1] == 256


def test_draw_kv_has_data_for_every_option():
    before = plt.get_fignums()
    cases = list(_cases())
    controls = _controls(explorer.kv_explorer())
    for name, key in (("model", 0), ("GPU", 1), ("dtype", 2), ("context", 3), ("batch", 4)):
        assert {c[key] for c in cases} >= {controls[name].options[0], controls[name].options[-1]}
    for name, key in (("model", 0), ("GPU", 1), ("dtype", 2)):  # every option of every dropdown is drawn
        assert {c[key] for c in cases} == set(controls[name].options)
    seen = set()
    for model, gpu, dtype, context, batch in cases:
        fig, text = explorer.draw_kv(model, gpu, dtype, context, batch)
        (ax,) = fig.axes
        assert ax.lines and ax.get_legend().get_texts() and ax.get_title(), (model, gpu, dtype)
        data = [line for line in ax.lines if not line.get_label().startswith("context window")]  # axvline: 0..1
        ys = [y for line in data for y in line.get_ydata()]
        assert ys and all(y > 0 for y in ys)
        assert "KiB per token" in text and "GB usable" in text
        if not gpu_spec(gpu).supports(dtype):
            assert f"no {dtype} support" in text
        else:
            assert "support (datasheet)" not in text
        if "weights alone" in text:
            seen.add("weights overflow")
        if "exceed" in text and "context window" in text:
            seen.add("past the window")
    assert seen == {"weights overflow", "past the window"}
    assert plt.get_fignums() == before  # no pyplot state touched


def test_every_slider_value_draws():
    assert len(explorer.CONTEXTS) == len(explorer.BATCHES)
    for context, batch in zip(explorer.CONTEXTS, explorer.BATCHES):
        fig, text = explorer.draw_kv("llama-3-8b", "H100 SXM", "bf16", context, batch)
        assert f"{batch} request(s) x {context:,} tokens" in text


def test_explorer_outputs_and_wiring():
    outs = explorer.kv_explorer_outputs("llama-2-7b", "H100 SXM", "bf16", 4096, 8)
    assert [o["output_type"] for o in outs] == ["stream", "display_data"] and outs[1]["data"]["image/png"]
    assert "512 KiB per token" in outs[0]["text"] and "at most 29" in outs[0]["text"]
    bad = explorer.kv_explorer_outputs("llama-2-7b", "H9000", "bf16", 4096, 8)
    assert bad[0]["text"].startswith("cannot size this combination") and "gpu must be" in bad[0]["text"]
    widget = explorer.kv_explorer()
    out = widget.children[-1]
    assert "llama-2-7b bf16 on H100 SXM" in out.outputs[0]["text"]  # drawn on construction
    controls = _controls(widget)
    controls["GPU"].value = "T4"  # a change redraws, with the note for bf16
    assert "no bf16 support" in out.outputs[0]["text"] and out.outputs[1]["data"]["image/png"]
    controls["model"].value = "qwen2.5-72b"
    assert "the weights alone" in out.outputs[0]["text"]
    controls["batch"].value = 256
    controls["context"].value = 128 * 1024
    assert "256 request(s) x 131,072 tokens" in out.outputs[0]["text"]


# ----------------------------------------------------------------------------- cache on vs off
def test_flop_model_matches_the_librarys():
    shape = ModelShape.from_embedded("tiny-target")
    assert formulas.total_flops(shape, 40, 5, True) == pytest.approx(generation_flops(shape, 5, 35))
    off = formulas.total_flops(shape, 40, 5, False)
    assert off > 10 * formulas.total_flops(shape, 40, 5, True)
    assert formulas.step_flops(shape, 6, 5, True) == formulas.step_flops(shape, 6, 5, False)  # both: the prefill
    with pytest.raises(ValueError, match="length must exceed prompt_len"):
        formulas.step_flops(shape, 5, 5, True)


def test_kv_on_off_rows_and_identical_tokens(engine):
    with pytest.raises(ValueError, match="lengths must all exceed the prompt"):
        on_off.kv_on_off(engine, [4, 16], prompt="def fib(n): return", calib_tokens=32)
    with pytest.raises(ValueError, match="max_model_len >= 129"):
        on_off.kv_on_off(engine, [8, 16], calib_tokens=128)
    result = on_off.kv_on_off(engine, [16, 8], repeats=1, calib_tokens=32, threads=1)
    assert result.same_tokens  # recomputing everything gives the same greedy tokens as the cache
    assert [r.length for r in result.rows] == [8, 16] and result.prompt_len == 5
    assert result.engine == "tiny-target" and result.threads == 1
    short, long = result.rows
    for r in result.rows:
        assert 0 < r.cached_step_s <= r.cached_total_s and 0 < r.nocache_step_s <= r.nocache_total_s
        assert r.nocache_flops > r.cached_flops and r.flop_ratio > 1
        assert r.predicted_cached_total_s < r.predicted_nocache_total_s
        assert (r.predicted_cached_total_s, r.predicted_nocache_total_s) == pytest.approx(
            result.predicted_totals(r.length)
        )
    assert long.cached_total_s > short.cached_total_s and long.nocache_total_s > short.nocache_total_s
    assert result.cost.fixed_s >= 0 and result.cost.flop_rate > 0
    assert "identical" in str(result) and "nothing fitted" in str(result)
    fig, ax = plots.plot_kv_on_off(result)
    assert ax.get_xscale() == "log" and len(ax.lines) == 4
    plt.close(fig)


def test_paged_step_times_rows_and_bad_input():
    from course_lib.kv.paged_timing import paged_step_times

    res = paged_step_times(batch=2, context=16, repeats=1, rounds=1)
    assert set(res) == {"contiguous", "paged"}
    assert all(r.step_s > r.attention_s > 0 for r in res.values())
    with pytest.raises(ValueError, match="context"):
        paged_step_times(batch=2, context=10**6)
    with pytest.raises(ValueError, match="batch"):
        paged_step_times(batch=0)


def test_beam_memory_shares_the_prompt():
    from course_lib.engine import Engine
    from course_lib.kv.paged_memory import beam_memory

    eng = Engine("tiny-target", kv_cache="paged")
    ids = list(range(10, 42))  # 32 tokens: two full blocks of 16 shared by every beam
    m = beam_memory(eng, ids, num_beams=3, max_new_tokens=6)
    assert 0 < m.peak_shared < m.peak_unshared and 0 < m.saving < 1
    assert "append" not in vars(eng.backend)  # the probe is removed
    assert eng.backend.bytes_used() == 0
    with pytest.raises(ValueError, match="paged"):
        beam_memory(Engine("tiny-target"), ids)
