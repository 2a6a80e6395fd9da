"""The intensity kernel against its torch reference: Triton (interpreter on CPU) and torch paths."""

import pytest
import torch

import course_lib  # noqa: F401  (TRITON_INTERPRET before Triton)
from course_lib.kernels import HAS_TRITON, launch
from course_lib.kernels.intensity import intensity, intensity_ref, intensity_sweep, intensity_torch

#: Triton runs compiled on a GPU, interpreted on a CPU: tests that force path="triton" use this device.
DEV = "cuda" if torch.cuda.is_available() else "cpu"

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="Triton not installed")
TOL = {torch.float32: 1e-5, torch.float16: 1e-2}


def _x(n, dtype, device="cpu"):
    gen = torch.Generator().manual_seed(n)
    return (torch.rand(n, generator=gen) * 4 - 2).to(dtype).to(device)


@needs_triton
@pytest.mark.parametrize("n", [1, 17, 1000, 4099])
@pytest.mark.parametrize("k", [1, 3, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_matches_reference(n, k, dtype):
    x = _x(n, dtype, "cuda" if torch.cuda.is_available() else "cpu")
    out = intensity(x, k, path="triton", block=256)
    ref = intensity_ref(x, k)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("n", [1, 17, 1000, 4099])
@pytest.mark.parametrize("k", [1, 5])
def test_torch_path_matches_reference(n, k):
    x = _x(n, torch.float32)
    torch.testing.assert_close(intensity(x, k, path="torch"), intensity_ref(x, k), atol=1e-5, rtol=1e-5)
    # chunk boundaries must not matter
    torch.testing.assert_close(intensity_torch(x, k, chunk=16), intensity_ref(x, k), atol=1e-5, rtol=1e-5)


@needs_triton
def test_paths_agree_and_shape_kept():
    x = _x(6 * 7, torch.float32).reshape(6, 7).to(DEV)
    a = intensity(x, 4, path="triton", block=64)
    b = intensity(x, 4, path="torch")
    assert a.shape == (6, 7)
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("path", ["torch", pytest.param("triton", marks=needs_triton)])
def test_out_parameter(path):
    x = _x(100, torch.float32).to(DEV if path == "triton" else "cpu")
    out = torch.empty_like(x)
    y = intensity(x, 3, path=path, out=out, block=64)
    assert y.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, intensity_ref(x, 3))
    with pytest.raises(ValueError, match="out must be a tensor of x's shape"):
        intensity(x, 3, path=path, out=torch.empty(99, device=x.device))
    with pytest.raises(ValueError, match="out must be a tensor"):
        intensity(x, 3, path=path, out=torch.empty(100, dtype=torch.float16, device=x.device))


def test_reference_really_changes_with_k():
    x = _x(64, torch.float32)
    assert not torch.allclose(intensity_ref(x, 1), intensity_ref(x, 2))


@pytest.mark.parametrize(
    "kwargs,err,match",
    [
        (dict(block=1000), ValueError, "block must be a power of two"),
        (dict(block=8), ValueError, "block must be a power of two"),
        (dict(k=0), ValueError, "k must be a positive int"),
        (dict(path="cuda"), ValueError, "path must be one of"),
    ],
)
def test_bad_arguments(kwargs, err, match):
    args = dict(k=2)
    args.update(kwargs)
    with pytest.raises(err, match=match):
        intensity(_x(8, torch.float32), **args)


def test_bad_tensors():
    with pytest.raises(ValueError, match="x.dtype must be one of"):
        intensity(torch.arange(8), 2)
    with pytest.raises(ValueError, match="contiguous"):
        intensity(torch.rand(8, 8).t(), 2)
    with pytest.raises(ValueError, match="at least one element"):
        intensity(torch.rand(0), 2)
    with pytest.raises(TypeError, match="torch.Tensor"):
        intensity([1.0, 2.0], 2)


def test_triton_path_without_triton(monkeypatch):
    monkeypatch.setattr(launch, "HAS_TRITON", False)
    with pytest.raises(RuntimeError, match="Triton is not installed"):
        intensity(_x(8, torch.float32), 2, path="triton")
    # auto falls back to torch
    torch.testing.assert_close(intensity(_x(8, torch.float32), 2), intensity_ref(_x(8, torch.float32), 2))


def test_triton_on_cpu_needs_interpreter(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    monkeypatch.setattr(launch, "interpreter_on", lambda: False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        intensity(_x(8, torch.float32), 2, path="triton")


def test_sweep_counts_bytes_and_flops():
    res = intensity_sweep([1, 8], n=4096, repeats=2, path="torch")
    (k1, t1), (k8, t8) = res
    assert (k1, k8) == (1, 8)
    assert t1.bytes == t8.bytes == 2 * 4096 * 4
    assert t8.flops == 8 * t1.flops == 8 * 2 * 4096
    assert t8.intensity == 8 * t1.intensity == 2.0
    with pytest.raises(ValueError, match="k must be a positive int"):
        intensity_sweep([0], n=16)
    with pytest.raises(ValueError, match="dtype must be one of"):
        intensity_sweep([1], n=16, dtype="int8")
