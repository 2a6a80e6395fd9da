"""Weight-only int8/int4 matmul kernels against their torch references (Triton through the interpreter on a CPU)."""

import pytest
import torch

import course_lib  # noqa: F401  (TRITON_INTERPRET before Triton)
from course_lib.kernels import HAS_TRITON, launch
from course_lib.kernels.quant_matmul import int4, int8, plan
from course_lib.kernels.quant_matmul.int4 import (
    dequantize_int4,
    int4_matmul,
    int4_matmul_ref,
    int4_weight_bytes,
    pack_int4,
    unpack_int4,
)
from course_lib.kernels.quant_matmul.int8 import int8_matmul, int8_matmul_ref, int8_weight_bytes
from course_lib.kernels.quant_matmul.plan import MAX_TRITON_ROWS

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="Triton not installed")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.float16: 1e-2}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _x(m, k, dtype, seed=0):
    return torch.randn(m, k, generator=_gen(seed)).to(dtype).to(DEV)


def _int8_weights(n, k, seed=1, scale_dtype=torch.float32):
    g = _gen(seed)
    q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, generator=g) * 0.02 + 0.001).to(scale_dtype)
    return q.to(DEV), scale.to(DEV)


def _int4_weights(n, k, group_size, seed=2, param_dtype=torch.float32):
    g = _gen(seed)
    packed = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    scales = (torch.rand(n, k // group_size, generator=g) * 0.1 + 0.01).to(param_dtype)
    zeros = (torch.randn(n, k // group_size, generator=g) * 0.1).to(param_dtype)
    return packed.to(DEV), scales.to(DEV), zeros.to(DEV)


def _close(out, ref, dtype):
    """Relative to the output's scale: sums of K products cancel, so elementwise rtol alone is too strict."""
    assert out.dtype == ref.dtype and out.shape == ref.shape
    tol = TOL[dtype]
    scale = ref.float().abs().max().item() + 1e-6
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol * scale)


# ----------------------------------------------------------------------------- helpers and references
def test_unpack_nibble_order():
    packed = torch.tensor([[0x21, 0xF0], [0x0F, 0x87]], dtype=torch.uint8)
    assert unpack_int4(packed).tolist() == [[1, 2, 0, 15], [15, 0, 7, 8]]  # low nibble first


@pytest.mark.parametrize("shape", [(1, 2), (3, 64), (7, 130)])
def test_pack_unpack_round_trip(shape):
    u = torch.randint(0, 16, shape, generator=_gen(3), dtype=torch.uint8)
    packed = pack_int4(u)
    assert packed.dtype == torch.uint8 and packed.shape == (shape[0], shape[1] // 2) and packed.is_contiguous()
    assert torch.equal(unpack_int4(packed), u)
    every_byte = torch.arange(256, dtype=torch.uint8).reshape(2, 128)
    assert torch.equal(pack_int4(unpack_int4(every_byte)), every_byte)
    assert torch.equal(pack_int4(u.to(torch.int64)), packed)  # any integer dtype in range


def test_pack_unpack_errors():
    with pytest.raises(ValueError, match="even number of columns"):
        pack_int4(torch.zeros(2, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"in \[0, 15\]"):
        pack_int4(torch.full((2, 2), 16, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"in \[0, 15\]"):
        pack_int4(torch.full((2, 2), -1, dtype=torch.int32))
    with pytest.raises(ValueError, match="2-D integer"):
        pack_int4(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="2-D integer"):
        pack_int4(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="2-D uint8"):
        unpack_int4(torch.zeros(2, 2, dtype=torch.int8))


def test_references_follow_the_formats():
    """Element by element, the formula of the brief: int8 q·scale[n]; int4 (u − 8)·s[n, k//g] + z[n, k//g]."""
    x = _x(2, 8, torch.float32).cpu()
    q, scale = _int8_weights(3, 8)
    w8 = torch.tensor([[q[n, k].item() * scale[n].item() for k in range(8)] for n in range(3)])
    torch.testing.assert_close(int8_matmul_ref(x, q.cpu(), scale.cpu()), x @ w8.t(), rtol=1e-5, atol=1e-5)
    packed, s, z = (t.cpu() for t in _int4_weights(3, 8, 4))
    w4 = torch.empty(3, 8)
    for n in range(3):
        for k in range(8):
            byte = packed[n, k // 2].item()
            u = byte & 0xF if k % 2 == 0 else byte >> 4
            w4[n, k] = (u - 8) * s[n, k // 4].item() + z[n, k // 4].item()
    torch.testing.assert_close(dequantize_int4(packed, s, z, 4), w4)
    torch.testing.assert_close(int4_matmul_ref(x, packed, s, z, 4), x @ w4.t(), rtol=1e-5, atol=1e-5)


def test_references_keep_x_dtype():
    x = _x(2, 64, torch.bfloat16)
    assert int8_matmul(x, *_int8_weights(5, 64), path="torch").dtype == torch.bfloat16
    y = int4_matmul(x, *_int4_weights(5, 64, 32), 32, path="torch")
    assert y.dtype == torch.bfloat16 and y.shape == (2, 5)


def test_weight_bytes():
    assert int8_weight_bytes(4096, 4096) == 4096 * 4096 + 4096 * 4
    assert int4_weight_bytes(4096, 4096, 128) == 4096 * 2048 + 2 * 4096 * 32 * 2


# ----------------------------------------------------------------------------- Triton vs reference
@needs_triton
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("n", [1, 3, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_int8_triton_matches_reference(m, n, dtype):
    for k in (64, 100):  # a multiple of the K chunk and not (masked edge)
        x = _x(m, k, dtype, seed=m + n + k)
        q, scale = _int8_weights(n, k, seed=n * k)
        _close(int8_matmul(x, q, scale, path="triton", block_k=32), int8_matmul_ref(x, q, scale), dtype)


@needs_triton
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("n", [1, 3, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group_size", [32, 64])
def test_int4_triton_matches_reference(m, n, dtype, group_size):
    for k in (group_size, 3 * group_size):  # one group, three groups
        x = _x(m, k, dtype, seed=m + n + k)
        packed, s, z = _int4_weights(n, k, group_size, seed=n * k)
        out = int4_matmul(x, packed, s, z, group_size, path="triton")
        _close(out, int4_matmul_ref(x, packed, s, z, group_size), dtype)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_params_in_x_dtype(dtype):
    x = _x(3, 64, dtype)
    q, scale = _int8_weights(20, 64, scale_dtype=dtype)
    _close(int8_matmul(x, q, scale, path="triton"), int8_matmul_ref(x, q, scale), dtype)
    packed, s, z = _int4_weights(20, 64, 32, param_dtype=dtype)
    _close(int4_matmul(x, packed, s, z, 32, path="triton"), int4_matmul_ref(x, packed, s, z, 32), dtype)


@needs_triton
@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("split_k", [2, 3])
def test_split_k_and_block_overrides(m, split_k):
    """Split-K partial sums (also with a ragged last chunk) and every block override."""
    dtype = torch.float32
    x = _x(m, 200, dtype)
    q, scale = _int8_weights(40, 200)
    out = int8_matmul(x, q, scale, path="triton", block_n=16, block_k=32, split_k=split_k)
    _close(out, int8_matmul_ref(x, q, scale), dtype)
    x = _x(m, 256, dtype)
    packed, s, z = _int4_weights(40, 256, 64)
    out = int4_matmul(x, packed, s, z, 64, path="triton", block_n=32, block_k=32, split_k=split_k)
    _close(out, int4_matmul_ref(x, packed, s, z, 64), dtype)


@needs_triton
@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize(
    "group_size,k,block_k",
    [(16, 96, None), (48, 96, None), (32, 96, 64), (64, 192, 128)],  # groups smaller than, or across, a chunk
)
def test_int4_group_gather_path(m, group_size, k, block_k):
    dtype = torch.float16
    x = _x(m, k, dtype)
    packed, s, z = _int4_weights(33, k, group_size)
    out = int4_matmul(x, packed, s, z, group_size, path="triton", block_k=block_k)
    _close(out, int4_matmul_ref(x, packed, s, z, group_size), dtype)


@needs_triton
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m", [2, 7, 33, 64])
def test_larger_shapes(dtype, m):
    """Several programs per axis, default plan, up to 64 rows (BLOCK_M 64)."""
    x = _x(m, 512, dtype)
    q, scale = _int8_weights(300, 512)
    _close(int8_matmul(x, q, scale, path="triton"), int8_matmul_ref(x, q, scale), dtype)
    packed, s, z = _int4_weights(300, 512, 128)
    _close(int4_matmul(x, packed, s, z, 128, path="triton"), int4_matmul_ref(x, packed, s, z, 128), dtype)


@needs_triton
def test_realistic_weights():
    """Weights that are a real matrix's round-to-nearest quantization: the kernels track F.linear."""
    k, n, g = 128, 48, 32
    w = torch.randn(n, k, generator=_gen(7)) * 0.05
    x = _x(2, k, torch.float32).cpu()
    scale = w.abs().amax(dim=1) / 127
    q = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8)
    y8 = int8_matmul(x.to(DEV), q.to(DEV), scale.to(DEV), path="triton").cpu()
    wg = w.reshape(n, k // g, g)
    lo, hi = wg.amin(-1), wg.amax(-1)
    s = (hi - lo) / 15
    z = lo + 8 * s  # u = 0 maps to lo
    u = torch.round((wg - lo[..., None]) / s[..., None]).clamp(0, 15).reshape(n, k).to(torch.uint8)
    y4 = int4_matmul(x.to(DEV), pack_int4(u).to(DEV), s.to(DEV), z.to(DEV), g, path="triton").cpu()
    ref = x @ w.t()
    assert (y8 - ref).abs().max() < 0.02 * ref.abs().max()
    assert (y4 - ref).abs().max() < 0.1 * ref.abs().max()


# ----------------------------------------------------------------------------- paths
class _Spy:
    def __init__(self, monkeypatch):
        self.calls = 0
        for mod, name in ((int8, "_int8_matmul_kernel"), (int4, "_int4_matmul_kernel")):
            if hasattr(mod, name):
                kernel = getattr(mod, name)
                monkeypatch.setattr(mod, name, self._wrap(kernel))

    def _wrap(self, kernel):
        spy = self

        class Wrapped:
            def __getitem__(self, grid):
                spy.calls += 1
                return kernel[grid]

        return Wrapped()


@needs_triton
def test_auto_runs_triton_when_it_can(monkeypatch):
    spy = _Spy(monkeypatch)
    x = _x(1, 64, torch.float32)
    int8_matmul(x, *_int8_weights(4, 64))
    int4_matmul(x, *_int4_weights(4, 64, 32), 32)
    assert spy.calls == 2  # CUDA, or the interpreter (on whenever course_lib found no CUDA)
    if DEV == "cpu":
        monkeypatch.setattr(launch, "interpreter_on", lambda: False)
        int8_matmul(x, *_int8_weights(4, 64))
        assert spy.calls == 2  # a CPU without the interpreter: torch
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            int8_matmul(x, *_int8_weights(4, 64), path="triton")


@needs_triton
def test_prefill_rows_fall_back_to_torch(monkeypatch):
    spy = _Spy(monkeypatch)
    x = _x(MAX_TRITON_ROWS + 1, 64, torch.float32)
    q, scale = _int8_weights(4, 64)
    torch.testing.assert_close(int8_matmul(x, q, scale, path="triton"), int8_matmul_ref(x, q, scale))
    packed, s, z = _int4_weights(4, 64, 32)
    torch.testing.assert_close(int4_matmul(x, packed, s, z, 32, path="triton"), int4_matmul_ref(x, packed, s, z, 32))
    assert spy.calls == 0


def test_without_triton(monkeypatch):
    monkeypatch.setattr(launch, "HAS_TRITON", False)
    x = _x(1, 64, torch.float32)
    q, scale = _int8_weights(4, 64)
    with pytest.raises(RuntimeError, match="Triton is not installed"):
        int8_matmul(x, q, scale, path="triton")
    torch.testing.assert_close(int8_matmul(x, q, scale), int8_matmul_ref(x, q, scale))  # auto → torch


def test_plan_fills_a_gpu(monkeypatch):
    """The GPU heuristic (pure Python): tiles cover N, splits cover K without empty ones, enough programs,
    int4 chunks inside one group when g allows it."""
    if not HAS_TRITON:
        pytest.skip("the plan uses triton.cdiv")
    monkeypatch.setattr(plan, "_sm_count", lambda device: 132)
    gpu = torch.device("cuda")
    for n, k in [(4096, 4096), (14336, 4096), (1024, 4096), (128, 4096), (1, 256), (100, 768)]:
        for m in (1, 4, 16, 64):
            for block_k, group_size in [(None, None), (32, None), (256, None), (None, 128), (None, 256), (None, 48)]:
                p = plan.plan_launch(m, n, k, gpu, None, block_k, None, group_size)
                tiles, splits = p["grid"]
                bk = p["BLOCK_K"]
                assert tiles * p["BLOCK_N"] >= n > (tiles - 1) * p["BLOCK_N"]
                assert p["K_PER_SPLIT"] % bk == 0
                assert splits * p["K_PER_SPLIT"] >= k > (splits - 1) * p["K_PER_SPLIT"]
                assert p["USE_DOT"] == (m > 1) and (p["BLOCK_M"] == 1 or p["BLOCK_M"] >= max(16, m))
                assert p["BLOCK_N"] >= (16 if m == 1 else 32)
                assert p["EVEN_K"] == (k % bk == 0)
                if block_k is None and m == 1:
                    assert p["BLOCK_N"] * bk <= plan.GEMV_TILE
                if group_size in (128, 256) and block_k is None:
                    assert group_size % bk == 0 and bk >= 32  # one group per chunk
                if group_size == 48:
                    assert bk >= 32
                if n >= 4096:
                    assert tiles * splits >= 132
    cpu = plan.plan_launch(1, 4096, 4096, torch.device("cpu"), None, None, None)
    assert cpu["grid"] == (64, 1)


# ----------------------------------------------------------------------------- bad inputs
def _good8():  # CPU tensors: the checks run before any path is chosen
    q, scale = (t.cpu() for t in _int8_weights(4, 64))
    return dict(x=_x(2, 64, torch.float32).cpu(), q=q, scale=scale)


def _good4():
    packed, s, z = (t.cpu() for t in _int4_weights(4, 64, 32))
    return dict(x=_x(2, 64, torch.float32).cpu(), packed=packed, scales=s, zeros=z, group_size=32)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(x=torch.randn(64)), r"x must be 2-D \(M, K\)"),
        (dict(x=torch.randn(2, 64).to(torch.int32)), "x.dtype must be one of"),
        (dict(x=torch.randn(64, 2).t()), "x must be contiguous"),
        (dict(x=torch.randn(0, 64)), "at least one row"),
        (dict(x=[[1.0]]), "x must be a torch.Tensor"),
        (dict(q=torch.zeros(4, 64)), "q must be a 2-D int8"),
        (dict(q=torch.zeros(4, 63, dtype=torch.int8)), "q must have x's K=64 columns"),
        (dict(q=torch.zeros(64, 4, dtype=torch.int8).t()), "q must be contiguous"),
        (dict(q=torch.zeros(0, 64, dtype=torch.int8)), "at least one row"),
        (dict(q=torch.zeros(4, 64, dtype=torch.int8, device="meta")), "q must be on x's device"),
        (dict(scale=torch.ones(5)), r"scale must have shape \(4,\)"),
        (dict(scale=torch.ones(4, 1)), r"scale must have shape \(4,\)"),
        (dict(scale=torch.ones(4, dtype=torch.float16)), "scale.dtype must be torch.float32 or x's dtype"),
        (dict(scale=torch.ones(8)[::2]), "scale must be contiguous"),
        (dict(scale=None), "scale must be a torch.Tensor"),
        (dict(path="gpu"), "path must be one of"),
        (dict(block_n=24), "block_n must be None or a power of two"),
        (dict(block_n=8), "block_n must be None or a power of two"),
        (dict(block_k=1024), "block_k must be None or a power of two"),
        (dict(split_k=0), "split_k must be None"),
    ],
)
def test_int8_bad_inputs(change, match):
    args = _good8()
    args.update(change)
    x, q, scale = args.pop("x"), args.pop("q"), args.pop("scale")
    with pytest.raises(ValueError, match=match):
        int8_matmul(x, q, scale, path=args.pop("path", "torch"), **args)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(x=torch.randn(2, 63), group_size=63), "group_size must be an even int"),
        (dict(x=torch.randn(2, 63), group_size=2), "x must have an even K"),
        (dict(x=torch.randn(2, 96), group_size=64), r"K=96 \(x.shape\[1\]\) must be a multiple of group_size=64"),
        (dict(group_size=48), "K=64 .* must be a multiple of group_size=48"),
        (dict(group_size=0), "group_size must be an even int"),
        (dict(group_size=32.0), "group_size must be an even int"),
        (dict(packed=torch.zeros(4, 32, dtype=torch.int8)), "packed must be a 2-D uint8"),
        (dict(packed=torch.zeros(4, 64, dtype=torch.uint8)), "packed must have K/2=32 columns"),
        (dict(packed=torch.zeros(32, 4, dtype=torch.uint8).t()), "packed must be contiguous"),
        (dict(scales=torch.ones(4, 3)), r"scales must have shape \(4, 2\)"),
        (dict(scales=torch.ones(4, 2, dtype=torch.float64)), "scales.dtype must be torch.float32"),
        (dict(zeros=torch.ones(5, 2)), r"zeros must have shape \(4, 2\)"),
        (dict(zeros=torch.ones(2, 4).t()), "zeros must be contiguous"),
        (dict(zeros=torch.ones(4, 2, device="meta")), "zeros must be on x's device"),
        (dict(block_k=16), "block_k must be None or a power of two between 32"),
    ],
)
def test_int4_bad_inputs(change, match):
    args = _good4()
    args.update(change)
    x, packed, s, z, g = (args.pop(name) for name in ("x", "packed", "scales", "zeros", "group_size"))
    with pytest.raises(ValueError, match=match):
        int4_matmul(x, packed, s, z, g, path="torch", **args)


def test_bad_inputs_checked_before_the_triton_path():
    args = _good4()
    args["group_size"] = 48
    with pytest.raises(ValueError, match="multiple of group_size"):
        int4_matmul(*args.values(), path="triton")
