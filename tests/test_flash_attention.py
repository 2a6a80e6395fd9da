"""FlashAttention forward against the spelled-out reference and SDPA (Triton through the interpreter on a CPU),
and the FlashBackend against the contiguous one inside the engine."""

import pytest
import torch
import torch.nn.functional as F

import course_lib  # noqa: F401  (TRITON_INTERPRET before Triton)
from course_lib.kernels import HAS_TRITON, launch
from course_lib.kernels import flash_attention as mod
from course_lib.kernels.flash_attention import attention_naive, flash_attention_fwd, flash_attention_torch, resolve_path
from course_lib.kernels.flash_attention_costs import (
    attention_flops,
    flash_attention_bytes,
    measure_peak_bytes,
    naive_attention_bytes,
)
from course_lib.kernels.online_softmax import online_softmax_steps
from tests.conftest import flat_step

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="Triton not installed")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def _qkv(b, h, hkv, tq, tk, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n, t, d, generator=g) for n, t in ((h, tq), (hkv, tk), (hkv, tk)))
    return q.to(dtype).to(DEV), k.to(dtype).to(DEV), v.to(dtype).to(DEV)


def _close(out, ref, dtype, name="out"):
    assert out.dtype == ref.dtype and out.shape == ref.shape, name
    tol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol, msg=lambda m: f"{name}: {m}")


def _sdpa(q, k, v, causal):
    """SDPA with repeated KV heads; Tq < Tk causal needs the end-aligned mask, not SDPA's top-left is_causal."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    tq, tk = q.shape[2], k.shape[2]
    mask = None
    if causal:
        mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


# ----------------------------------------------------------------------------- references
def test_online_softmax_steps_end_at_softmax():
    g = torch.Generator().manual_seed(0)
    s, vals = torch.randn(37, generator=g) * 3, torch.randn(37, 8, generator=g)
    steps = online_softmax_steps(s, 8, vals)
    assert len(steps) == 5 and steps[-1]["keys"] == (32, 37) and steps[0]["alpha"] == 0.0
    ref = torch.softmax(s.double(), 0) @ vals.double()
    torch.testing.assert_close(steps[-1]["out"], ref)
    assert steps[-1]["m"] == pytest.approx(float(s.max()))
    assert steps[-1]["l"] == pytest.approx(float(torch.exp(s.double() - s.max()).sum()))
    torch.testing.assert_close(online_softmax_steps(s, 5)[-1]["out"], torch.softmax(s.double(), 0))  # V = I
    ms = [st["m"] for st in steps]
    assert ms == sorted(ms)  # the running max never falls
    with pytest.raises(ValueError, match="block"):
        online_softmax_steps(s, 0)


@pytest.mark.parametrize("causal", [True, False])
def test_naive_matches_sdpa_and_torch_path(causal):
    q, k, v = _qkv(2, 4, 2, 5, 13, 16, torch.float32)
    ref = _sdpa(q, k, v, causal)
    _close(attention_naive(q, k, v, causal), ref, torch.float32, "naive")
    _close(flash_attention_torch(q, k, v, causal), ref, torch.float32, "torch path")
    q, k, v = _qkv(1, 2, 2, 9, 9, 16, torch.float32)
    _close(attention_naive(q, k, v, causal), F.scaled_dot_product_attention(q, k, v, is_causal=causal), torch.float32)


def test_byte_formulas_and_flops():
    assert naive_attention_bytes(1, 2, 1024) == 2 * 2 * 1024 * 1024 * 4
    assert naive_attention_bytes(1, 1, 8, torch.float16, head_dim=16, kv_len=32) == 2 * 8 * 32 * 4 + 8 * 16 * 2
    assert flash_attention_bytes(2, 4, 1024, torch.float16, head_dim=64) == 2 * 4 * 1024 * 64 * 2
    assert naive_attention_bytes(1, 1, 2048) / naive_attention_bytes(1, 1, 1024) == 4  # quadratic
    assert naive_attention_bytes(1, 2, 8, causal=True) == 2 * 2 * 64 * 4 + 64  # + the (T, T) bool mask
    assert attention_flops(1, 1, 4, 4, 8, causal=False) == 4 * 16 * 8
    assert attention_flops(1, 1, 4, 4, 8) == 4 * 10 * 8  # 10 visible pairs of a 4×4 causal mask


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="peak RSS via /proc is Linux-only")
def test_measured_peak_memory_naive_vs_tiled():
    """The T² score matrices show up in real memory; the tiled SDPA path stays far below them."""
    q, k, v = (t.cpu() for t in _qkv(1, 4, 4, 1024, 1024, 32, torch.float32))
    predicted = naive_attention_bytes(1, 4, 1024, head_dim=32, causal=True)  # 35 MB, 33.5 of them scores
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the tiled path's buffers are per thread: 16 threads hold ~9 MB, 2 hold ~2 MB
    try:
        attention_naive(q, k, v, True), flash_attention_torch(q, k, v, True)  # warm-up: first-call buffers
        _, naive = measure_peak_bytes(lambda: attention_naive(q, k, v, True))
        _, tiled = measure_peak_bytes(lambda: flash_attention_torch(q, k, v, True))
    finally:
        torch.set_num_threads(threads)
    assert 0.8 * predicted < naive < 1.4 * predicted, (naive, predicted)
    assert tiled < naive / 5, (tiled, naive)


# ----------------------------------------------------------------------------- the kernel
CASES = [
    # (B, H, Hkv, Tq, Tk, d, causal): lengths not multiples of 16, decode, chunks, GQA
    (1, 2, 2, 37, 37, 16, True),
    (2, 2, 1, 37, 37, 32, False),
    (1, 2, 2, 1, 45, 32, True),  # decode: one query sees every key
    (2, 4, 2, 1, 21, 16, False),
    (1, 2, 1, 20, 50, 64, True),  # a chunk of 20 new tokens after 30 cached ones
    (1, 1, 1, 50, 64, 16, False),
    (1, 2, 2, 64, 64, 16, True),  # exact multiples
]


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}H{}kv{}q{}k{}d{}{}".format(*c[:6], "c" if c[6] else ""))
def test_triton_matches_reference_and_sdpa(case, dtype):
    b, h, hkv, tq, tk, d, causal = case
    q, k, v = _qkv(b, h, hkv, tq, tk, d, dtype, seed=tq + tk)
    out = flash_attention_fwd(q, k, v, causal, path="triton", block_m=16, block_n=16)  # several blocks each way
    _close(out, attention_naive(q, k, v, causal), dtype, "vs naive")
    _close(out, _sdpa(q, k, v, causal), dtype, "vs sdpa")


@needs_triton
def test_default_tiles_sm_scale_and_strided_inputs():
    q, k, v = _qkv(1, 2, 1, 24, 40, 32, torch.float32, seed=3)
    ref = attention_naive(q, k, v, True, sm_scale=0.3)
    _close(flash_attention_fwd(q, k, v, True, 0.3, path="triton"), ref, torch.float32, "default tiles")
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, T, d) view of a (B, T, H, d) tensor
    kt, vt = (torch.cat([t, t], dim=-1)[..., :32] for t in (k, v))  # strided rows
    _close(flash_attention_fwd(qt, kt, vt, True, 0.3, path="triton", block_m=16), ref, torch.float32, "strided")


@needs_triton
@pytest.mark.parametrize("causal", [True, False])
def test_kv_lens_equal_per_sequence_calls(causal):
    """A padded batch with per-row key counts gives each row's own attention over its first kv_lens[b] keys."""
    tq = 3 if causal else 1
    q, k, v = _qkv(3, 4, 2, tq, 40, 16, torch.float32, seed=9)
    lens = [40, 17, 3]
    out = flash_attention_fwd(q, k, v, causal, kv_lens=torch.tensor(lens, device=DEV), path="triton", block_n=16)
    torch_path = flash_attention_fwd(q, k, v, causal, kv_lens=torch.tensor(lens, device=DEV), path="torch")
    for i, n in enumerate(lens):
        ref = attention_naive(q[i : i + 1], k[i : i + 1, :, :n], v[i : i + 1, :, :n], causal)
        _close(out[i : i + 1], ref, torch.float32, f"row {i}")
        _close(torch_path[i : i + 1], ref, torch.float32, f"torch row {i}")


def _spy_kernel(monkeypatch) -> list:
    """Count launches of the Triton kernel; returns the list the grids are appended to."""
    calls, kernel = [], mod._flash_fwd_kernel

    class Spy:
        def __getitem__(self, grid):
            calls.append(grid)
            return kernel[grid]

    monkeypatch.setattr(mod, "_flash_fwd_kernel", Spy())
    return calls


@needs_triton
def test_auto_path_and_bf16(monkeypatch):
    calls = _spy_kernel(monkeypatch)
    q, k, v = _qkv(1, 2, 2, 5, 5, 16, torch.float32)
    flash_attention_fwd(q, k, v)
    assert len(calls) == 1  # CUDA, or the interpreter (on whenever course_lib found no CUDA)
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    if DEV == "cpu":
        out = flash_attention_fwd(qb, kb, vb)  # auto: bf16 takes the SDPA path under the interpreter
        assert len(calls) == 1 and out.dtype == torch.bfloat16
        _close(out, attention_naive(qb, kb, vb), torch.bfloat16)
        with pytest.raises(ValueError, match="bf16"):
            flash_attention_fwd(qb, kb, vb, path="triton")
        monkeypatch.setattr(launch, "interpreter_on", lambda: False)
        flash_attention_fwd(q, k, v)
        assert len(calls) == 1  # a CPU without the interpreter: torch
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            flash_attention_fwd(q, k, v, path="triton")


def test_without_triton(monkeypatch):
    monkeypatch.setattr(launch, "HAS_TRITON", False)
    q, k, v = _qkv(1, 2, 1, 7, 11, 16, torch.float32)
    with pytest.raises(RuntimeError, match="Triton is not installed"):
        flash_attention_fwd(q, k, v, path="triton")
    _close(flash_attention_fwd(q, k, v), attention_naive(q, k, v), torch.float32)  # auto → torch


@pytest.mark.skipif(DEV != "cuda", reason="GPU-only: bf16 and head_dim 128 at real lengths need CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_long_sequences(dtype, d):
    q, k, v = _qkv(2, 8, 2, 1000, 1500, d, dtype, seed=d)
    for causal in (True, False):
        _close(flash_attention_fwd(q, k, v, causal, path="triton"), _sdpa(q, k, v, causal), dtype)


# ----------------------------------------------------------------------------- bad inputs
def _good():
    return _qkv(1, 2, 1, 4, 8, 16, torch.float32)


BAD = [
    (lambda q, k, v: (q[..., :8].repeat(1, 1, 1, 6), k[..., :8].repeat(1, 1, 1, 6), v[..., :8].repeat(1, 1, 1, 6)),
     "head_dim=48 is not supported.*16, 32, 64, 128"),
    (lambda q, k, v: (q[..., :8].repeat(1, 1, 1, 12), k[..., :8].repeat(1, 1, 1, 12), v[..., :8].repeat(1, 1, 1, 12)),
     "head_dim=96"),
    (lambda q, k, v: (q, k.half(), v), "share one dtype"),
    (lambda q, k, v: (q.int(), k.int(), v.int()), "dtype must be one of"),
    (lambda q, k, v: (q, k, v[:, :, :5]), "same shape"),
    (lambda q, k, v: (q[0], k, v), "4-D"),
    (lambda q, k, v: (q[..., :8], k, v), "head_dim=8.*to match q"),
    (lambda q, k, v: (q.repeat(2, 1, 1, 1), k, v), "B=2"),
    (lambda q, k, v: (q[:, :1].repeat(1, 3, 1, 1), k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1)), "multiple of KV heads"),
    (lambda q, k, v: (q.repeat(1, 1, 3, 1), k, v), "Tq <= Tk"),
    (lambda q, k, v: (q[:, :, :0], k, v), "must not be empty"),
    (lambda q, k, v: (q.numpy(), k, v), "torch.Tensor"),
]  # fmt: skip


@pytest.mark.parametrize("change, match", BAD)
def test_bad_inputs(change, match):
    q, k, v = _good()
    with pytest.raises(ValueError, match=match):
        flash_attention_fwd(*change(q.cpu(), k.cpu(), v.cpu()))


def test_bad_options_checked_before_any_path(monkeypatch):
    q, k, v = _good()
    monkeypatch.setattr(mod, "_flash_fwd_kernel", None)  # never reached
    monkeypatch.setattr(mod.torch, "empty", None)  # nothing is allocated before the checks
    for kwargs, match in [
        (dict(block_m=24), "block_m"),
        (dict(block_n=8), "block_n"),
        (dict(path="cuda"), "path must be one of"),
        (dict(sm_scale=-1.0), "sm_scale"),
        (dict(causal=1), "causal must be a bool"),
        (dict(kv_lens=torch.tensor([9], device=q.device)), r"kv_lens must lie in \[4, Tk=8\]"),
        (dict(kv_lens=torch.tensor([2.0], device=q.device)), "int32/int64"),
        (dict(kv_lens=torch.tensor([5, 5], device=q.device)), r"shape \(B=1,\)"),
    ]:
        with pytest.raises(ValueError, match=match):
            flash_attention_fwd(q, k, v, **kwargs)


# ----------------------------------------------------------------------------- the engine backend
@pytest.fixture(scope="module")
def tiny_target():
    from course_lib.engine import Engine

    return Engine("tiny-target")


@pytest.mark.slow
def test_flash_backend_logits_equal_contiguous(tiny_target, monkeypatch):
    """Prefill (ragged), a chunk after a cached prefix next to decodes (mixed), then ragged and uniform decode
    steps: every step's logits equal the contiguous (SDPA) backend's."""
    from course_lib.engine.attention import ContiguousBackend
    from course_lib.engine.attention.flash import FlashBackend

    m = tiny_target.model
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 4096, (n,), generator=g).tolist() for n in (11, 5, 19)]
    steps = [
        ([0, 1], [prompts[0], prompts[1]]),  # ragged prefill
        ([2], [prompts[2][:7]]),  # single: first chunk
        ([0, 1, 2], [[7], [8], prompts[2][7:]]),  # mixed: two decodes + a chunk after 7 cached tokens
        ([0, 1, 2], [[9], [10], [11]]),  # decode, ragged lengths (kv_lens)
        ([0, 1], [[12], [13]]),
        ([1], [[14]]),  # single decode
    ]
    calls = _spy_kernel(monkeypatch) if HAS_TRITON else []
    outs = []
    with torch.no_grad():
        for backend in (
            ContiguousBackend(m.num_layers, m.num_kv_heads, m.head_dim, 64, 3),
            FlashBackend.from_model(m, 64, 3),
        ):
            handles = [backend.allocate() for _ in prompts]
            outs.append([flat_step(m, backend, [handles[i] for i in ids], chunks) for ids, chunks in steps])
    for i, (ref, out) in enumerate(zip(*outs)):
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4, msg=lambda s: f"step {i}: {s}")
    if resolve_path("auto", m.device, m.dtype) == "triton":  # the kernel ran: per layer 1 a step, 2 a mixed one
        assert len(calls) == m.num_layers * 8


@pytest.mark.slow
def test_flash_backend_greedy_identical(tiny_target):
    from course_lib.engine import Engine, SamplingParams
    from course_lib.engine.attention.flash import FlashBackend

    params = SamplingParams(max_new_tokens=8)
    prompts = ["def fibonacci(n):", "x"]
    ref = [r.output_ids for r in tiny_target.generate(prompts, params)]
    backend = FlashBackend.from_model(tiny_target.model, 64, 2)
    engine = Engine(tiny_target.hf_model, tiny_target.tokenizer, backend=backend)
    assert [r.output_ids for r in engine.generate(prompts, params)] == ref


def test_flash_backend_rejects_unsupported_head_dim():
    from course_lib.engine.attention.flash import FlashBackend

    with pytest.raises(ValueError, match="head_dim=48"):
        FlashBackend(2, 2, 48, 64, 2)
    with pytest.raises(ValueError, match="path"):
        FlashBackend(2, 2, 32, 64, 2, path="fast")


def test_plan_fits_shared_memory(monkeypatch):
    """The GPU tile heuristic (pure Python): covers short queries with >= 16 rows, fits a 64 KiB T4 and keeps
    big tiles on a 227 KiB H100; the caller's tiles are kept."""
    gpu = torch.device("cuda")
    for limit in (64 * 1024, 227 * 1024):
        monkeypatch.setattr(mod, "_smem_limit", lambda device, limit=limit: limit)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            elem = 4 if dtype == torch.float32 else 2
            for d in (16, 32, 64, 128):
                for tq in (1, 7, 100, 4096):
                    p = mod._plan(tq, d, dtype, gpu, None, None)
                    assert p["BLOCK_M"] >= 16 and p["BLOCK_N"] >= 16 and p["num_stages"] >= 1
                    assert mod.smem_bytes(p["BLOCK_M"], p["BLOCK_N"], d, elem, p["num_stages"]) <= limit
        big = mod._plan(4096, 128, torch.float16, gpu, None, None)
        if limit > 200 * 1024:
            assert (big["BLOCK_M"], big["BLOCK_N"], big["num_stages"], big["num_warps"]) == (128, 64, 3, 8)
        assert mod._plan(4096, 128, torch.float16, gpu, 64, 32)["BLOCK_M"] == 64
    assert mod._plan(1, 32, torch.float32, torch.device("cpu"), None, None)["BLOCK_M"] == 16


def test_benchmark_script_without_gpu_and_verdict(capsys):
    """The GPU benchmark exits cleanly on a CPU, and its verdict comes from the rows."""
    import importlib.util

    from course_lib.core.paths import repo_root

    spec = importlib.util.spec_from_file_location("flash_bench", repo_root() / "benchmarks" / "flash_attention_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    if DEV == "cpu":
        assert bench.main([]) == 0 and "needs a CUDA GPU" in capsys.readouterr().out
    rows = [
        dict(kind="flash", T=512, vs_sdpa=0.5, head_dim=64, dtype="fp16", causal=True),
        dict(kind="flash", T=1024, vs_sdpa=0.95, head_dim=64, dtype="fp16", causal=True),
        dict(kind="flash", T=2048, vs_sdpa=0.85, head_dim=128, dtype="bf16", causal=False),
        dict(kind="sdpa", T=2048, vs_sdpa=1.0, head_dim=128, dtype="bf16", causal=False),
    ]
    verdict = bench.summary(rows)
    assert verdict["cases"] == 2 and verdict["met"] == 1 and verdict["worst"]["T"] == 2048
