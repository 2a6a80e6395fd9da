"""The whole decode step in one C call (``kernels/cpu_gemv/step.c``): the engine's ``decode="native"``.

``fast_decode`` cuts a step's torch ops; this removes them. On a CPU a small model's step is ~100 weight
products and ~1,000 small ops, each op a few microseconds of dispatch and each product a fork and join of
the thread pool; on SmolLM2-135M that overhead was ~8 ms of a ~45 ms step (issue 21). ``step.c`` runs
every layer inside one OpenMP parallel region, as llama.cpp does, with the products on ``gemv.c``'s
kernels, and returns only the logits. It is the same maths as ``model.run_layers`` (the reference beside
it): the tests hold its logits to the eager step's within 1e-5 and its greedy output to ``generate``'s.

What it takes (anything else runs the reference step, with one warning naming the reason):
- a pure decode step of 1..``cpu_gemv.MAX_ROWS`` sequences on the contiguous fp32 cache, on a CPU where
  ``kernels.cpu_gemv`` is built;
- every projection fp32 with its plain weight (``Linear``, ``SkinnyLinear``), or a ``WeightOnlyLinear``
  on the ``gemv`` path (int8 per channel, int4 groups): the products this file hands to C.

``NativeStep(model)`` describes the model once to C (pointers into its tensors, which stay owned by
torch) and re-describes it when a projection is replaced or the cache grows.
"""

from __future__ import annotations

import ctypes
import math

import torch

from course_lib.kernels import cpu_gemv

_i64, _f32, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
KIND_F32, KIND_INT8, KIND_INT4, KIND_INT4_Q8 = 0, 1, 2, 3  # step.c's lin_t kinds


class _Lin(ctypes.Structure):
    _fields_ = [("kind", _i64), ("N", _i64), ("K", _i64), ("gs", _i64), ("w", _ptr), ("s", _ptr), ("c", _ptr)]
    _fields_ += [("bias", _ptr)]


class _Layer(ctypes.Structure):
    _fields_ = [("attn_norm", _ptr), ("mlp_norm", _ptr), ("qkv", _Lin), ("o", _Lin), ("gate_up", _Lin)]
    _fields_ += [("down", _Lin), ("k", _ptr), ("v", _ptr)]


class _Model(ctypes.Structure):
    _fields_ = [(n, _i64) for n in ("n_layers", "D", "H", "Hkv", "hd", "F", "V", "max_len", "kmax")]
    _fields_ += [("eps", _f32), ("scale", _f32)]
    _fields_ += [(n, _ptr) for n in ("embed", "final_norm", "cos", "sin")]
    _fields_ += [("head", _Lin), ("layers", ctypes.POINTER(_Layer))]


class Unsupported(Exception):
    """A model, cache or step the C step does not take; the message says which part and why."""


def _fp32(name: str, t) -> int:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
        what = f"{t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise Unsupported(f"{name} must be a contiguous fp32 CPU tensor, is {what}")
    return t.data_ptr()


def describe_linear(name: str, lin, keep: list) -> _Lin:
    """The C description of one projection (its tensors appended to ``keep``), or ``Unsupported``."""
    from course_lib.engine.layers import Linear, SkinnyLinear

    bias = getattr(lin, "bias", None)
    b = 0 if bias is None else _fp32(f"{name}.bias", bias)
    if type(lin) in (Linear, SkinnyLinear):
        w = lin.weight
        _fp32(f"{name}.weight", w)
        if w.dim() != 2:
            raise Unsupported(f"{name}.weight must be 2-D, is {tuple(w.shape)}")
        keep += [w, bias]
        return _Lin(KIND_F32, w.shape[0], w.shape[1], 0, w.data_ptr(), 0, 0, b)
    # a quantized layer (compression.linear.WeightOnlyLinear, above this package) says what its kernels read
    operands = lin.gemv_operands() if callable(getattr(lin, "gemv_operands", None)) else None
    if operands is not None:
        keep += [operands, bias]
        N, K = lin.out_features, lin.in_features
        if operands[0] == "int8":
            _, q, scale = operands
            return _Lin(KIND_INT8, N, K, 0, q.data_ptr(), scale.data_ptr(), 0, b)
        g = operands[1]
        kind = KIND_INT4_Q8 if operands[0] == "int4-q8" else KIND_INT4  # int4-q8: activations rounded to int8
        return _Lin(kind, N, K, g.group_size, g.packed.data_ptr(), g.s.data_ptr(), g.c.data_ptr(), b)
    path = f" on path {lin.path!r}" if isinstance(getattr(lin, "path", None), str) else ""
    raise Unsupported(
        f"{name} is a {type(lin).__name__}{path}; the C step takes fp32 Linear/SkinnyLinear weights or a "
        f"WeightOnlyLinear on the 'gemv' or 'gemv-q8' path"
    )


class NativeStep:
    """``step(backend, handles, ids, positions)`` → logits (B, V) for one new token per sequence."""

    def __init__(self, model) -> None:
        self.model = model
        self._key = None
        self._desc = None  # (_Model, _Layer array, kept tensors)
        self._work: dict[int, torch.Tensor] = {}

    # ------------------------------------------------------------ what it takes
    def why_not(self, backend, batch: int, max_context: int) -> str | None:
        """None when the C step takes this decode step, else the reason (the caller runs the reference)."""
        from course_lib.engine.attention.contiguous import ContiguousBackend

        m = self.model
        if not cpu_gemv.available():
            return f"kernels.cpu_gemv is unavailable ({cpu_gemv.unavailable_reason()})"
        if m.device.type != "cpu" or m.dtype != torch.float32:
            return f"the C step runs fp32 models on a CPU; this one is {m.dtype} on {m.device}"
        if type(backend) is not ContiguousBackend or backend.dtype != torch.float32:
            return f"the C step needs the contiguous fp32 cache, got {type(backend).__name__}"
        if not 1 <= batch <= cpu_gemv.MAX_ROWS:
            return f"the C step takes 1..{cpu_gemv.MAX_ROWS} sequences, got {batch}"
        if max_context > min(backend.max_len, m._cos.shape[0]):
            return f"context {max_context} is past the cache or the RoPE table"
        try:
            self._describe(backend)
        except Unsupported as e:
            return str(e)
        return None

    def _describe(self, backend):
        m = self.model
        key = (tuple(id(lin) for _, lin in m.linears()), tuple(t.data_ptr() for t in backend.k + backend.v))
        if key == self._key:
            return self._desc
        self._key, self._desc = None, None
        if len(backend.k) != m.num_layers:
            raise Unsupported("the cache has no tensors for this model's layers yet")
        keep: list = []
        layers = (_Layer * m.num_layers)()
        shape = (m.num_kv_heads, backend.max_len, m.head_dim)
        for i, w in enumerate(m.layers):
            k, v = backend.k[i], backend.v[i]
            if tuple(k.shape[1:]) != shape or tuple(v.shape[1:]) != shape:
                raise Unsupported(f"layer {i}'s cache is {tuple(k.shape)}, expected (rows, *{shape})")
            L = layers[i]
            L.attn_norm, L.mlp_norm = (
                _fp32(f"layers.{i}.attn_norm", w.attn_norm),
                _fp32(f"layers.{i}.mlp_norm", w.mlp_norm),
            )
            for name in ("qkv", "o", "gate_up", "down"):
                setattr(L, name, describe_linear(f"layers.{i}.{name}", getattr(w, name), keep))
            L.k, L.v = _fp32(f"layers.{i}.k cache", k), _fp32(f"layers.{i}.v cache", v)
            keep += [k, v]
        Q = (m.num_heads + 2 * m.num_kv_heads) * m.head_dim
        D, F_ = m.embed_weight.shape[1], m.ffn_size
        expect = {"qkv": (Q, D), "o": (D, m.q_size), "gate_up": (2 * F_, D), "down": (D, F_)}
        for name, (n, kk) in expect.items():
            got = getattr(layers[0], name)
            if (got.N, got.K) != (n, kk):
                raise Unsupported(f"layers.0.{name} is ({got.N}, {got.K}), expected ({n}, {kk})")
        if m.num_heads % m.num_kv_heads or m.head_dim % 2:
            raise Unsupported(f"heads {m.num_heads} / kv heads {m.num_kv_heads} / head_dim {m.head_dim}")
        head = describe_linear("lm_head", m.lm_head, keep)
        if (head.N, head.K) != (m.vocab_size, D):
            raise Unsupported(f"lm_head is ({head.N}, {head.K}), expected ({m.vocab_size}, {D})")
        desc = _Model(
            m.num_layers, D, m.num_heads, m.num_kv_heads, m.head_dim, F_, m.vocab_size, backend.max_len, max(D, F_, m.q_size),
            m.eps, 1.0 / math.sqrt(m.head_dim),
            _fp32("embed", m.embed_weight), _fp32("final_norm", m.final_norm), _fp32("cos table", m._cos),
            _fp32("sin table", m._sin), head, layers,
        )  # fmt: skip
        keep += [m.embed_weight, m.final_norm, m._cos, m._sin]
        self._desc, self._key = (desc, layers, keep), key
        self._work = {}
        return self._desc

    # ------------------------------------------------------------ the step
    def __call__(self, backend, handles: list, ids: list[int], positions: list[int]) -> torch.Tensor:
        m = self.model
        B = len(ids)
        reason = self.why_not(backend, B, max(positions) + 1)
        if reason is not None:
            raise Unsupported(reason)
        if min(ids) < 0 or max(ids) >= m.vocab_size:
            raise ValueError(f"token ids must be in [0, {m.vocab_size}), got {ids}")
        if min(positions) < 0:
            raise ValueError(f"positions must be >= 0, got {positions}")
        cap = backend.k[0].shape[0]
        if min(handles) < 0 or max(handles) >= cap:
            raise ValueError(f"cache rows must be in [0, {cap}), got {handles}")
        return self.run(ids, positions, handles)

    def run(self, ids: list[int], positions: list[int], handles: list) -> torch.Tensor:
        """The step without the checks: for a caller that has just had ``why_not`` say None for this step
        and got ids, positions and rows from the engine (``FastDecoder``)."""
        m = self.model
        B = len(ids)
        desc, _, _ = self._desc
        lib = cpu_gemv.library()
        work = self._work.get(B)
        if work is None:
            work = self._work[B] = torch.empty(lib.decode_work_floats(ctypes.byref(desc), B))
        t = torch.tensor([ids, positions, list(handles)], dtype=torch.int64)  # (3, B)
        logits = torch.empty(B, m.vocab_size)
        lib.decode_step(
            ctypes.byref(desc), t[0].data_ptr(), t[1].data_ptr(), t[2].data_ptr(), B, logits.data_ptr(),
            work.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        return logits
