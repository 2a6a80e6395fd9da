"""The decode step with fewer ops: a fused forward, the same forward compiled, and CUDA-graph replay of it.

A small model's decode step is overhead-bound: every torch op costs microseconds to dispatch (and on a
GPU, to launch) however small its tensors. ``model.run_layers`` is the readable reference; this file is
the same maths over a pure-decode batch (one new token per sequence, contiguous KV cache) written for
fewer ops: the RoPE tables pre-signed once, RoPE applied in place, SwiGLU as ``silu_`` + ``mul_`` on the
gate/up product's own storage, the residual added in place, the mask built on the device from the
positions (no host round trip), q/k/v already one product (``Linear.fuse``). Three levers on top:
- ``mode="fused"``: that forward, eager;
- ``mode="compiled"``: ``torch.compile`` of it (inductor fuses the elementwise ops into a few loops), one
  graph per (batch bucket, key-length bucket): static shapes, as gpt-fast compiles its ``decode_one_token``;
- ``mode="cudagraph"``: nano-vllm's ``capture_cudagraph``: per batch bucket one CUDA graph over static
  input buffers, replayed each step (the keys padded to the cache length, masked on the device);
- ``mode="native"`` (a CPU): no torch ops at all: the whole step in one C call (``native_step.py``, over
  ``kernels/cpu_gemv/step.c``), as llama.cpp runs it; a step it does not take runs the reference, with one
  warning naming why.
The fused step attends over the exact keys (its logits equal the reference's, bit for bit, in the tests);
the compiled and graph steps pad the keys to a bucket and mask them (the softmax sums reassociate: ~1e-6
relative), and pad the batch to its bucket by repeating the last row (the same token at the same slot
writes the same K/V twice); only the real rows' logits come back. A compile or capture failure, or CUDA graphs asked
on a machine without CUDA, falls back to the fused eager forward with one warning. The engine takes it as
``Engine(..., decode=...)``; anything but a pure decode step runs the reference. Chapter 02-1 measures it.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from course_lib.engine.model import LlamaEngineModel, rms_norm

DECODE_MODES = ("auto", "eager", "fused", "compiled", "cudagraph", "native")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def bucket(n: int, buckets) -> int:
    """The smallest bucket ≥ n (n itself past the last one)."""
    return next((b for b in buckets if b >= n), n)


def kv_bucket(length: int, max_len: int, quantum: int = 64) -> int:
    """Keys a step attends over: the context rounded up to a multiple of ``quantum`` (at most ``max_len``),
    so a compiled step recompiles once per ``quantum`` tokens, not every token."""
    return min(max_len, -(-length // quantum) * quantum)


def signed_sin(model: LlamaEngineModel) -> torch.Tensor:
    """(P, hd) table of (−sin, sin): RoPE's rotate_half sign folded in once, not per step."""
    if getattr(model, "_ssin", None) is None:
        model._ssin = model._signed(model._sin)
    return model._ssin


@torch.library.custom_op("course::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """oneDNN's packed product as one opaque op: inductor cannot lower ``mkldnn._linear_pointwise`` on a
    weight packed outside the graph, so the compiled step calls the kernel through this op instead."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, None, "none", [], "")


@packed_linear.register_fake
def _(x, packed, out_features):
    return x.new_empty(x.shape[0], out_features)


def opaque_linear(layer, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)``, with a ``SkinnyLinear`` product routed through ``cpu_gemv_f32`` or ``packed_linear``
    (opaque ops, for the compiler), as the eager layer would route it."""
    if x.shape[0] <= getattr(layer, "gemv_rows", 0) and x.dtype == torch.float32:
        from course_lib.kernels.cpu_gemv import gemv_f32_op

        y = gemv_f32_op(x, layer.weight)
        return y if layer.bias is None else y + layer.bias
    packed = getattr(layer, "_packed", None)
    if (
        packed is not None
        and getattr(layer, "enabled", True)
        and x.shape[0] <= getattr(layer, "max_packed_rows", x.shape[0])
        and layer.weight.dtype == x.dtype == torch.float32
    ):
        y = packed_linear(x, packed, layer.out_features)
        return y if layer.bias is None else y + layer.bias
    return layer(x)


def _call(layer, x):
    return layer(x)


def rms_norm_spelled(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in plain ops (fp32), for the compiler: inductor fuses these into one loop, while it calls
    ``F.rms_norm`` as a separate kernel."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def decode_forward(
    model: LlamaEngineModel,
    K: list,
    V: list,
    input_ids,
    positions,
    rows,
    L: int,
    key_pos=None,
    lin=_call,
    norm=rms_norm,
) -> torch.Tensor:
    """Logits (B, V) of one new token per sequence: ids/positions/rows (B,) tensors, K/V the contiguous
    cache's per-layer (rows, Hkv, max_len, hd) tensors, L the keys attended over (≥ every position + 1).
    The same maths as ``model.forward`` on a decode step, in fewer ops and allocations. ``lin(layer, x)``
    runs each projection (``opaque_linear`` when compiled), ``norm`` each RMSNorm (``rms_norm_spelled``)."""
    B = input_ids.shape[0]
    H, Hkv, hd, qs, kvs = model.num_heads, model.num_kv_heads, model.head_dim, model.q_size, model.kv_size
    half = hd // 2
    x = F.embedding(input_ids, model.embed_weight)  # (B, D)
    cos = model._cos[positions][:, None]  # (B, 1, hd)
    sin = signed_sin(model)[positions][:, None]
    if key_pos is None:
        key_pos = torch.arange(L, device=x.device)
    mask = (key_pos[None, :] <= positions[:, None])[:, None, None]  # (B, 1, 1, L), on the device
    for i, w in enumerate(model.layers):
        qkv = lin(w.qkv, norm(x, w.attn_norm, model.eps))  # (B, (H + 2·Hkv)·hd): one product
        qk = qkv[:, : qs + kvs].view(B, H + Hkv, hd)
        rot = qk.roll(half, dims=-1)
        qk.mul_(cos).addcmul_(rot, sin)  # RoPE in place on q and k together
        k, v = qk[:, H:], qkv[:, qs + kvs :].view(B, Hkv, hd)
        K[i][rows, :, positions] = k  # (B, Hkv, hd) into each row's slot
        V[i][rows, :, positions] = v
        keys, values = K[i][:, :, :L].index_select(0, rows), V[i][:, :, :L].index_select(0, rows)
        o = F.scaled_dot_product_attention(qk[:, None, :H].transpose(1, 2), keys, values, mask, enable_gqa=Hkv != H)
        x = x.add_(lin(w.o, o.reshape(B, H * hd)))  # the residual, in place
        gu = lin(w.gate_up, norm(x, w.mlp_norm, model.eps))  # (B, 2F)
        gate = gu[:, : model.ffn_size]
        x = x.add_(lin(w.down, F.silu(gate, inplace=True).mul_(gu[:, model.ffn_size :])))  # SwiGLU on gu's storage
    return lin(model.lm_head, norm(x, model.final_norm, model.eps))


def auto_decode(device_type: str, dtype: torch.dtype) -> tuple[str, str]:
    """(mode, why) that ``decode="auto"`` takes on this device: on a CUDA GPU, CUDA-graph replay; on a CPU
    in fp32 where the course's C kernels build, the native step (the fastest path measured on every CPU
    the course has run on: ``benchmarks/step_levers.py``); else the fused forward. A step the chosen path
    cannot take runs the next one (native, then fused, then the reference), silently: ``FastDecoder.ran``
    counts which path ran how often."""
    if device_type == "cuda":
        return "cudagraph", "a CUDA GPU: one graph replay per step"
    if device_type == "cpu" and dtype == torch.float32:
        from course_lib.kernels import cpu_gemv

        if cpu_gemv.available():
            return "native", "the course's C kernels built: the whole step in one C call"
        return "fused", f"the C kernels are unavailable ({cpu_gemv.unavailable_reason()}): the fused torch step"
    return "fused", f"{dtype} on {device_type}: the C step is fp32-only, so the fused torch step"


class FastDecoder:
    """``decoder(backend, handles, ids, positions)`` → logits (B, V), or None when it cannot take the step
    (the caller runs the reference). ``mode``: one of ``DECODE_MODES`` except "eager"."""

    def __init__(self, model: LlamaEngineModel, mode: str = "fused", batch_buckets=BATCH_BUCKETS) -> None:
        if mode not in DECODE_MODES or mode == "eager":
            raise ValueError(f"mode must be one of {tuple(m for m in DECODE_MODES if m != 'eager')}, got {mode!r}")
        self.auto = mode == "auto"
        if self.auto:
            mode, self.auto_why = auto_decode(model.device.type, model.dtype)
        self.model, self.requested, self.mode = model, ("auto" if self.auto else mode), mode
        self.ran: dict[str, int] = {}  # steps taken per path ("native", "fused", ...; "reference" by the caller)
        self.batch_buckets = tuple(batch_buckets)
        self._compiled = None
        self._norm = rms_norm_spelled if model.dtype == torch.float32 else rms_norm
        self._graphs: dict = {}  # batch bucket → (graph, static inputs, static logits)
        self._graph_key = None  # identity of the cache tensors the graphs were captured on
        self._native, self._native_said = None, set()
        if mode == "native":
            from course_lib.engine.native_step import NativeStep

            self._native = NativeStep(model)
        if mode == "cudagraph" and model.device.type != "cuda":
            self._fall_back(f"CUDA graphs need a CUDA device, the model is on {model.device.type}")

    def _fall_back(self, why: str) -> None:
        warnings.warn(f"decode mode {self.mode!r} unavailable ({why}); the decode step runs the fused eager forward")
        self.mode = "fused"
        self._compiled, self._graphs = None, {}

    def supports(self, backend, query_lens: list[int], contexts: list[int]) -> bool:
        """A pure decode step on the plain contiguous cache, inside the RoPE table; anything else: the reference."""

        if self.mode == "native":
            if not all(q == 1 for q in query_lens):
                return False
            why = self._native.why_not(backend, len(query_lens), max(contexts))
            if why is not None and self.auto:  # auto: the next-best path, silently (``ran`` says which)
                self._step = "fused" if self._fused_ok(backend, query_lens, contexts) else None
                return self._step is not None
            self._step = "native"
            if why is not None and why not in self._native_said:  # once per reason, not once per step
                self._native_said.add(why)
                warnings.warn(f"decode mode 'native' does not take this step ({why}); it runs the reference forward")
            return why is None
        self._step = self.mode
        return self._fused_ok(backend, query_lens, contexts)

    def _fused_ok(self, backend, query_lens: list[int], contexts: list[int]) -> bool:
        from course_lib.engine.attention.contiguous import ContiguousBackend

        return (
            type(backend) is ContiguousBackend
            and backend.use_sdpa
            and all(q == 1 for q in query_lens)
            and max(contexts) <= min(backend.max_len, self.model._cos.shape[0])
        )

    @torch.no_grad()  # decode needs no gradients; with grad on, a tied head (a Parameter) made inductor trace a backward
    def __call__(self, backend, handles: list, ids: list[int], positions: list[int]) -> torch.Tensor:
        step = getattr(self, "_step", self.mode)
        self.ran[step] = self.ran.get(step, 0) + 1
        if step == "native":  # supports() has just checked this step
            return self._native.run(ids, positions, handles)
        B, dev = len(ids), self.model.device
        mode = "fused" if step == "fused" else self.mode
        Bp = bucket(B, self.batch_buckets) if mode != "fused" else B
        pad = Bp - B  # repeat the last row: same token, same slot, same K/V written twice
        ids_t = torch.tensor(ids + ids[-1:] * pad, device=dev)
        pos_t = torch.tensor(positions + positions[-1:] * pad, device=dev)
        rows_t = torch.tensor(list(handles) + list(handles[-1:]) * pad, device=dev)
        L = max(positions) + 1  # eager: the exact keys, so the sums run as the reference's (bit for bit)
        if mode != "fused":  # static shapes: keys padded to the bucket and masked (fp sums reassociate)
            L = kv_bucket(L, backend.max_len)
        if mode == "cudagraph":
            out = self._replay(backend, ids_t, pos_t, rows_t)
            if out is not None:
                return out[:B]
        if mode == "compiled":
            try:
                if self._compiled is None:
                    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
                    decode_forward(self.model, backend.k, backend.v, ids_t, pos_t, rows_t, L)  # packs the weights
                    self._compiled = torch.compile(decode_forward, dynamic=False)
                return self._compiled(
                    self.model, backend.k, backend.v, ids_t, pos_t, rows_t, L, None, opaque_linear, self._norm
                )[:B]
            except Exception as err:  # an old compiler, no toolchain, an unsupported op: eager from now on
                self._fall_back(f"torch.compile failed: {type(err).__name__}: {str(err).splitlines()[0][:160]}")
        return decode_forward(self.model, backend.k, backend.v, ids_t, pos_t, rows_t, L)[:B]

    # ------------------------------------------------------------ CUDA graphs (nano-vllm's capture_cudagraph)
    def _replay(self, backend, ids_t, pos_t, rows_t):
        key = (id(backend.k[0]), backend.max_len)
        if key != self._graph_key:  # the cache grew (new tensors): the old graphs point at freed memory
            self._graphs, self._graph_key = {}, key
        Bp = ids_t.shape[0]
        if Bp not in self._graphs:
            try:
                self._graphs[Bp] = self._capture(backend, Bp)
            except Exception as err:
                self._fall_back(f"CUDA graph capture failed: {type(err).__name__}: {str(err).splitlines()[0][:160]}")
                return None
        graph, (s_ids, s_pos, s_rows), s_out = self._graphs[Bp]
        s_ids.copy_(ids_t)
        s_pos.copy_(pos_t)
        s_rows.copy_(rows_t)
        graph.replay()
        return s_out

    def _capture(self, backend, Bp: int):
        dev, L = self.model.device, backend.max_len
        free_row = torch.full((Bp,), 0, dtype=torch.long, device=dev)
        static = (
            torch.zeros(Bp, dtype=torch.long, device=dev),
            torch.zeros(Bp, dtype=torch.long, device=dev),
            free_row,
        )
        key_pos = torch.arange(L, device=dev)
        run = lambda: decode_forward(self.model, backend.k, backend.v, *static, L, key_pos)  # noqa: E731
        kept = [(t, t[0, :, 0].clone()) for t in backend.k + backend.v]  # the warm-up writes row 0's slot 0
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up outside the graph (allocations, lazy kernel loads)
            run()
        torch.cuda.current_stream().wait_stream(stream)
        for t, saved in kept:
            t[0, :, 0] = saved
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run()
        return graph, static, out
