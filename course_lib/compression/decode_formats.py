"""The whole chat model's decode at batch 1 in each weight format, with the bytes each step reads.

A decode step of SmolLM2-135M reads every linear weight once: 538 MB in fp32, ~17× the 32 MB LLC of the
course's CPU, so the bytes come from DRAM and the step is bandwidth-bound: its time should follow the
bytes. Each format runs at its best CPU path, said in its row:
- fp32 and bf16: oneDNN's blocked ("packed") layout (``engine.layers.PackedLinear``; ``SkinnyLinear`` packs
  a second copy beside the plain one, this one *replaces* it, so the model is held once), and bf16 also
  through plain ``F.linear`` (torch's default bf16 path) to show what packing buys;
- int8: round to nearest per channel from the dequantized Q4_1 (``aten._weight_int8pack_mm``);
- int4: llama.cpp's Q4_1 blocks imported bit-exact, no second rounding
  (``gguf_int4.quantize_engine_gguf``, ``aten._weight_int4pack_mm_for_cpu``), with the LM head in fp32 or
  in int8 per channel. The LM head (49,152 × 576, tied to the embedding) is 21% of the parameters: in
  fp32 it is 113 MB, more than the whole int4 body, so it caps what int4 saves.
``step_bytes`` counts what the kernels read (the CPU int4 kernel's bf16 scales and zeros: 0.625 bytes per
weight, as Q4_1's 20 bytes per 32 weights). ``decode_speeds`` builds one format at a time and frees it
(``del`` + ``gc.collect()``) before the next, so no two copies of the weights live at once.
Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from course_lib.compression.linear import WeightOnlyLinear
from course_lib.compression.quantize import QuantConfig
from course_lib.core.memory import return_large_blocks, trim_heap
from course_lib.engine.layers import PackedLinear

MODEL = "smollm2-135m-instruct"
INT8 = QuantConfig(8, True, "channel")
#: every format ``decode_speeds`` knows, in the order it builds them (the fp32 weights are shared until
#: "fp32 oneDNN packed", which consumes them; the bf16 rows load the model again in bf16)
FORMATS = (
    "int8 per-channel",
    "int4 Q4_1, fp32 head",
    "int4 Q4_1, int8 head",
    "fp32 oneDNN packed",
    "bf16 F.linear",
    "bf16 oneDNN packed",
)


def pack_float_engine(engine) -> int:
    """Replace every linear layer of ``engine`` by a ``PackedLinear`` and free the plain weights: the
    ``transformers`` model's projections are emptied and ``engine.hf_model`` set to None (do not reuse it).
    The embedding stays (the engine looks tokens up in it). Returns the number of layers packed."""
    if not hasattr(engine, "model") or not hasattr(engine.model, "linears"):
        raise ValueError(f"engine must be a course Engine, got {type(engine).__name__}")
    hf = engine.hf_model
    if hf is None:
        raise ValueError("this engine's weights were already packed (engine.hf_model is None)")
    embed = hf.get_input_embeddings().weight
    by_storage: dict[int, list[torch.nn.Linear]] = {}  # the HF projections are views of the engine's weights
    for module in hf.modules():
        if isinstance(module, torch.nn.Linear) and module.weight is not embed:
            by_storage.setdefault(module.weight.untyped_storage().data_ptr(), []).append(module)
    n = 0
    with torch.no_grad():
        for name in [n for n, _ in engine.model.linears()]:
            lin = dict(engine.model.linears())[name]
            if isinstance(lin, WeightOnlyLinear):
                raise ValueError(f"layer {name!r} is quantized; pack a float engine")
            key = lin.weight.untyped_storage().data_ptr()
            engine.model.set_linear(name, PackedLinear(lin.weight, lin.bias))
            del lin
            for module in by_storage.pop(key, []):  # free this layer's plain copy before packing the next
                module.weight.data = torch.empty(0, dtype=module.weight.dtype)
            n += 1
    engine.hf_model = None
    gc.collect()
    return n


def layer_bytes(lin) -> int:
    """Bytes one decode-shaped forward of ``lin`` reads, as its kernel stores them."""
    if isinstance(lin, WeightOnlyLinear) and lin.path == "cpu":
        n, k = lin.qw.shape
        if lin.qw.config.bits == 8:
            return n * k + n * 2  # int8 + one bf16 scale per row
        return n * k // 2 + (k // lin.qw.group_size) * n * 2 * 2  # nibbles + a bf16 (scale, zero) per group
    return int(lin.nbytes)


def step_bytes(engine) -> tuple[int, int]:
    """(bytes of the decoder layers' weights, bytes of the LM head) one decode step reads."""
    body = head = 0
    for name, lin in engine.model.linears():
        if name == "lm_head":
            head += layer_bytes(lin)
        else:
            body += layer_bytes(lin)
    return body, head


@dataclass(frozen=True)
class DecodeRow:
    """One format's decode step at batch 1: seconds, and the bytes it reads (decoder layers, LM head)."""

    name: str
    path: str
    body_bytes: int
    head_bytes: int
    step_s: float

    @property
    def bytes(self) -> int:
        return self.body_bytes + self.head_bytes

    @property
    def tok_s(self) -> float:
        return 1.0 / self.step_s


def quantize_chunked(w: torch.Tensor, config: QuantConfig, rows: int = 4096):
    """``quantize.quantize`` a block of ``rows`` rows at a time (exact: scales are per row or per group of a
    row), so the temporaries of a 49,152-row LM head stay a few MB instead of several copies of it."""
    from course_lib.compression.gguf_int4 import concat_rows
    from course_lib.compression.quantize import quantize

    if config.granularity == "tensor":
        raise ValueError("quantize_chunked needs per-channel or per-group scales, not per-tensor")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be a positive int, got {rows!r}")
    return concat_rows(*(quantize(w[i : i + rows], config) for i in range(0, w.shape[0], rows)))


def _apply(fmt: str, eng, plain: dict) -> str:
    """Put ``fmt``'s layers into ``eng`` (whose float layers are ``plain``); returns the path description."""
    from course_lib.compression.gguf_int4 import quantize_engine_gguf
    from course_lib.models.gguf import gguf_file

    if fmt == "int8 per-channel":
        for name, lin in plain.items():
            eng.model.set_linear(name, WeightOnlyLinear(quantize_chunked(lin.weight, INT8), lin.bias))
        return "aten._weight_int8pack_mm, head int8"
    if fmt.startswith("int4 Q4_1"):
        quantize_engine_gguf(eng, gguf_file(MODEL))  # every projection; the head is left to us
        head = plain["lm_head"]
        if fmt.endswith("int8 head"):
            eng.model.set_linear("lm_head", WeightOnlyLinear(quantize_chunked(head.weight, INT8)))
            return "aten._weight_int4pack_mm_for_cpu, head int8"
        eng.model.set_linear("lm_head", PackedLinear(head.weight))
        return "aten._weight_int4pack_mm_for_cpu, head fp32 oneDNN"
    if fmt.endswith("oneDNN packed"):
        pack_float_engine(eng)
        return "mkldnn._linear_pointwise"
    if fmt == "bf16 F.linear":
        return "F.linear (torch's default)"
    raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")


def decode_speeds(
    formats=FORMATS, *, new_tokens: int = 16, repeats: int = 3, max_model_len: int = 128, model: str = MODEL
) -> list[DecodeRow]:
    """Seconds per decode step at batch 1 (``compression.evaluate.decode_step_time``) of ``model`` in each
    of ``formats`` (a subset of ``FORMATS``, built in that order). One fp32 engine serves the fp32 formats:
    each puts its layers in through the linear seam, is timed, and gives the float layers back; "fp32
    oneDNN packed" consumes the float weights last. The bf16 rows load the model again, in bf16."""
    from course_lib.compression.evaluate import decode_step_time
    from course_lib.engine import Engine
    from course_lib.engine.scheduler import SchedulerConfig
    from course_lib.models.load import load_model

    formats = list(formats)
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ValueError(f"formats must be a non-empty subset of {FORMATS}, got {formats!r}")
    for name, v in (("new_tokens", new_tokens), ("repeats", repeats), ("max_model_len", max_model_len)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (2 if name == "new_tokens" else 1):
            raise ValueError(f"{name} must be an int >= {2 if name == 'new_tokens' else 1}, got {v!r}")
    config = SchedulerConfig(max_model_len=max_model_len, max_num_seqs=1)
    return_large_blocks()  # core.memory
    rows: list[DecodeRow] = []
    for dtype, group in (("fp32", FORMATS[:4]), ("bf16", FORMATS[4:])):
        todo = [f for f in group if f in formats]
        if not todo:
            continue
        hf, tok = load_model(model, dtype=dtype)
        eng = Engine(hf, tok, config=config, linear="reference")
        del hf
        plain = dict(eng.model.linears())
        for fmt in todo:
            if fmt.endswith("oneDNN packed"):
                plain = None  # the packing frees the float weights: nothing to give back afterwards
            path = _apply(fmt, eng, plain)
            step = decode_step_time(eng, batch=1, new_tokens=new_tokens, repeats=repeats)
            rows.append(DecodeRow(fmt, path, *step_bytes(eng), step))
            if plain is not None:
                for name, lin in plain.items():
                    eng.model.set_linear(name, lin)
            trim_heap()
        del eng, plain
        trim_heap()
    order = {f: i for i, f in enumerate(formats)}
    return sorted(rows, key=lambda r: order[r.name])


def table(rows: list[DecodeRow], bandwidth: float | None = None) -> str:
    """The rows as a text table: bytes per step (layers, head), their ratio to fp32, step time, tok/s,
    speed-up over fp32 and over the fastest bf16 row, and the GB/s the step streamed."""
    by = {r.name: r for r in rows}
    fp32 = by.get("fp32 oneDNN packed")
    bf16 = min((r for r in rows if r.name.startswith("bf16")), key=lambda r: r.step_s, default=None)
    head = f"{'format':<22}{'layers MB':>10}{'head MB':>8}{'bytes/fp32':>11}{'ms/step':>8}{'tok/s':>7}"
    head += f"{'vs fp32':>8}{'vs bf16':>8}{'GB/s':>6}  path"
    lines = [head]
    for r in rows:
        ratio = f"{r.bytes / fp32.bytes:>11.3f}" if fp32 else f"{'':>11}"
        v32 = f"{fp32.step_s / r.step_s:>7.2f}x" if fp32 else f"{'':>8}"
        v16 = f"{bf16.step_s / r.step_s:>7.2f}x" if bf16 else f"{'':>8}"
        lines.append(
            f"{r.name:<22}{r.body_bytes / 1e6:>10.1f}{r.head_bytes / 1e6:>8.1f}{ratio}{r.step_s * 1e3:>8.1f}"
            f"{r.tok_s:>7.1f}{v32}{v16}{r.bytes / r.step_s / 1e9:>6.1f}  {r.path}"
        )
    if bandwidth:
        lines.append(f"(measured memory bandwidth of this machine: {bandwidth / 1e9:.1f} GB/s)")
    return "\n".join(lines)


__all__ = [
    "table",
    "FORMATS",
    "DecodeRow",
    "decode_speeds",
    "layer_bytes",
    "pack_float_engine",
    "quantize_chunked",
    "step_bytes",
]
