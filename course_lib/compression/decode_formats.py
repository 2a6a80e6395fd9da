"""The whole chat model's decode at batch 1 in each weight format, with the bytes each step reads.

A decode step of SmolLM2-135M reads every linear weight once: 538 MB in fp32, ~17× the 32 MB LLC of the
course's CPU, so the bytes come from DRAM and the step is bandwidth-bound: its time should follow the
bytes. Each format runs at its best CPU path, said in its row:
- fp32: the course's GEMV (``kernels.cpu_gemv`` through ``SkinnyLinear``, on the plain weights, the LM
  head on the tied embedding itself) where a C compiler built it, else oneDNN's blocked ("packed") layout
  (``engine.layers.PackedLinear``, which *replaces* the plain weights, so the model is held once);
- bf16: oneDNN's packed bf16 kernel;
- int8: round to nearest per channel from the dequantized Q4_1 (the course's GEMV, fp32 activations, else
  ``aten._weight_int8pack_mm``);
- int4: llama.cpp's Q4_1 blocks imported bit-exact, no second rounding
  (``gguf_int4.quantize_engine_gguf``; the course's GEMV, else ``aten._weight_int4pack_mm_for_cpu``),
  with the LM head in fp32 or in int8 per channel. The LM head (49,152 × 576, tied to the embedding) is 21% of the parameters: in
  fp32 it is 113 MB, more than the whole int4 body, so it caps what int4 saves.
The row ``NULL`` ("no weights (t0)") times the same step with every linear a zero-byte
``step_model.NullLinear``: the fixed part t₀ of Amdahl's model, measured in the same repeats.
``step_bytes`` counts what the kernels read (the CPU int4 kernel's bf16 scales and zeros: 0.625 bytes per
weight, as Q4_1's 20 bytes per 32 weights). ``decode_speeds`` builds one format at a time and frees it
(``del`` + ``gc.collect()``) before the next, so no two copies of the weights live at once.
Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from course_lib.compression.linear import WeightOnlyLinear, layer_bytes  # layer_bytes: re-exported
from course_lib.compression.quantize import QuantConfig
from course_lib.compression.step_model import null_layers
from course_lib.core.memory import trim_heap
from course_lib.engine.layers import Linear, PackedLinear, SkinnyLinear
from course_lib.kernels import cpu_gemv


def kernel_name(layer) -> str:
    """The kernel a layer's one-row products run on, for a row's path."""
    if isinstance(layer, WeightOnlyLinear):
        return {
            "gemv": "the course's GEMV (fp32 activations)",
            "cpu": "aten._weight_int8pack_mm" if layer.qw.config.bits == 8 else "aten._weight_int4pack_mm_for_cpu",
        }.get(layer.path, layer.path)
    if isinstance(layer, SkinnyLinear) and layer.gemv_rows:
        return "the course's GEMV (kernels.cpu_gemv)"
    if isinstance(layer, PackedLinear):
        return f"mkldnn._linear_pointwise{' bf16' if layer.weight.dtype == torch.bfloat16 else ''}"
    return "F.linear"


MODEL = "smollm2-135m-instruct"
FP32 = "fp32"
BF16 = "bf16"  # oneDNN's packed bf16 kernel where this CPU packs bf16, else F.linear on bf16 weights
INT8 = QuantConfig(8, True, "channel")
#: every format ``decode_speeds`` knows, in three interleaved groups that share the fp32 baseline: all
#: formats of a group live in one fp32 engine and each repeat times every one of them in turn, so a slow
#: minute of a shared machine hits them alike. Three groups because all five at once would hold ~1.3 GB
#: of weights (Binder gives 1-2 GB): int4 first, then int8 and bf16, each made from the fp32 weights. bf16
#: weights run oneDNN's bf16 kernel through ``PackedLinear`` (input cast to bf16, output back, as the
#: int8/int4 kernels do with their bf16 activations); the fp32 LM head runs ``F.linear`` on the tied
#: embedding itself, so the 113 MB matrix is held once.
NULL = "no weights (t0)"  # every linear a zero-byte NullLinear: the step's fixed part, measured (step_model)
GROUPS = (
    (FP32, NULL, "int4 Q4_1, fp32 head", "int4 Q4_1, int8 head"),
    (FP32, "int8 per-channel"),
    (FP32, BF16),
)
FORMATS = tuple(dict.fromkeys(f for g in GROUPS for f in g))


def pack_float_engine(engine, skip=()) -> int:
    """Replace every linear layer of ``engine`` (but those named in ``skip``) by a ``PackedLinear`` and free
    the plain weights, one layer at a time: the ``transformers`` model's projections are emptied and
    ``engine.hf_model`` set to None (do not reuse it). The embedding stays (the engine looks tokens up in
    it). Returns the number of layers packed."""
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
        for name in [n for n, _ in engine.model.linears() if n not in skip]:
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
    """One format's decode step at batch 1: seconds (the median over repeats of each repeat's median
    ``engine.step()`` time), the per-repeat medians, and the bytes it reads (decoder layers, LM head)."""

    name: str
    path: str
    body_bytes: int
    head_bytes: int
    step_s: float
    samples: tuple = ()
    fp32_samples: tuple = ()  # the fp32 baseline's medians, timed in the same repeats as this row

    @property
    def bytes(self) -> int:
        return self.body_bytes + self.head_bytes

    @property
    def tok_s(self) -> float:
        return 1.0 / self.step_s

    @property
    def spread(self) -> float:
        """Relative run-to-run spread of the per-repeat medians (0 with one repeat)."""
        from course_lib.measure.claims import relative_spread

        return relative_spread(self.samples) if len(self.samples) > 1 else 0.0


def _median(xs) -> float:
    import statistics

    return statistics.median(xs)


def speedup(rows, slower: str, faster: str) -> tuple[float, float]:
    """(speed-up of ``faster`` over ``slower``, its relative run-to-run spread). Against fp32 it is the
    median of the per-repeat ratios (both timed in the same repeats, so a ratio compares like with like);
    between two other rows it is the ratio of their two speed-ups over the fp32 they were each timed
    with, and the spreads add."""
    from course_lib.measure.claims import relative_spread

    by = {r.name: r for r in rows}
    missing = [n for n in (slower, faster) if n not in by]
    if missing:
        raise ValueError(f"no row named {missing}; rows are {list(by)}")

    def over_fp32(r) -> tuple[float, float]:
        ref = r.fp32_samples or r.samples
        if len(ref) != len(r.samples) or not ref:
            raise ValueError(f"row {r.name!r} must carry as many fp32 repeats as its own")
        ratios = [x / y for x, y in zip(ref, r.samples)]
        return _median(ratios), (relative_spread(ratios) if len(ratios) > 1 else 0.0)

    fa, sa = over_fp32(by[faster])
    if by[slower].name == FP32:
        return fa, sa
    fs, ss = over_fp32(by[slower])
    return fa / fs, sa + ss


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


def build_formats(eng, formats, int4_qweights=None) -> dict[str, tuple[str, dict]]:
    """{format: (path description, {layer name: layer})} for the fp32 and int4 formats among ``formats``,
    made from the fp32 engine ``eng``'s plain layers, which the fp32 packing consumes (it frees each plain
    weight as it packs it), and from ``int4_qweights`` (``gguf_int4.engine_qweights``: read before the
    model is loaded, when the file's temporaries have the most room). The int4 rows share their LM head
    with the fp32 row, whose head is ``F.linear`` on the tied embedding, so no head is held twice."""
    plain = dict(eng.model.linears())
    out: dict[str, tuple[str, dict]] = {}
    if NULL in formats:
        out[NULL] = ("every linear a zero-byte NullLinear (step_model)", null_layers(plain))
    body4 = {}
    if any(f.startswith("int4") for f in formats):
        if int4_qweights is None:
            from course_lib.compression.gguf_int4 import engine_qweights
            from course_lib.models.gguf import gguf_file

            int4_qweights = engine_qweights(gguf_file(MODEL))
        body4 = {n: WeightOnlyLinear(qw, plain[n].bias) for n, qw in int4_qweights.items()}
        trim_heap()
    k4 = kernel_name(next(iter(body4.values()))) if body4 else ""
    if "int4 Q4_1, int8 head" in formats:
        head8 = WeightOnlyLinear(quantize_chunked(plain["lm_head"].weight, INT8))
        out["int4 Q4_1, int8 head"] = (f"{k4}, head int8", {**body4, "lm_head": head8})
    gemv = cpu_gemv.available()
    # the tied embedding itself, no copy: the course's GEMV where it is built, else F.linear
    head = SkinnyLinear(plain["lm_head"].weight, max_packed_rows=0) if gemv else Linear(plain["lm_head"].weight)
    if FP32 in formats:
        if gemv:  # the plain weights the engine already holds, on the course's GEMV
            # max_packed_rows=0: the prompt's rows run F.linear, never a second, packed copy of the weights
            fp32 = {
                n: SkinnyLinear(lin.weight, lin.bias, max_packed_rows=0) for n, lin in plain.items() if n != "lm_head"
            }
        else:
            del plain  # the engine's own references are the last ones: packing frees each plain weight
            pack_float_engine(eng, skip=("lm_head",))
            fp32 = dict(eng.model.linears())
        fp32["lm_head"] = head
        out[FP32] = (f"{kernel_name(fp32['layers.0.qkv'])}, head {kernel_name(head)}", fp32)
        trim_heap()
    if "int4 Q4_1, fp32 head" in formats:
        out["int4 Q4_1, fp32 head"] = (f"{k4}, head fp32 {kernel_name(head)}", {**body4, "lm_head": head})
    return {f: out[f] for f in formats if f in out}


def _plain_weight(lin) -> torch.Tensor:
    return lin.unpacked() if isinstance(lin, PackedLinear) else lin.weight


def int8_from(fp32_layers: dict) -> dict:
    """int8 per-channel ``WeightOnlyLinear``s of fp32 layers (a ``PackedLinear`` gives its plain weight
    back bit for bit with ``unpacked()``), one fp32 temporary at a time."""
    out = {}
    for n, lin in fp32_layers.items():
        w = _plain_weight(lin)
        out[n] = WeightOnlyLinear(quantize_chunked(w, INT8), lin.bias)
        del w
    return out


class Bf16Linear(Linear):
    """bf16 weights through ``F.linear``, the input cast to bf16 and the output back (as ``PackedLinear``
    does): torch's default bf16 path, where oneDNN cannot pack bf16 on this CPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = None if self.bias is None else self.bias.to(torch.bfloat16)
        return F.linear(x.to(torch.bfloat16), self.weight, b).to(x.dtype)


def bf16_path() -> str:
    """What the bf16 row runs on this CPU."""
    if PackedLinear.available(torch.zeros(1, 1, dtype=torch.bfloat16)):
        return "mkldnn._linear_pointwise bf16 (bf16 weights)"
    return "F.linear bf16 (oneDNN packs bf16 only with AVX-512 BW/VL/DQ or AVX-NE-CONVERT)"


def bf16_from(fp32_layers: dict) -> dict:
    """bf16 copies of fp32 layers: ``PackedLinear`` where oneDNN packs bf16 here, else ``Bf16Linear``
    (``PackedLinear.unpacked()`` gives the plain weight back bit for bit; a plain ``Linear`` gives its own),
    one fp32 temporary at a time."""
    packed = PackedLinear.available(torch.zeros(1, 1, dtype=torch.bfloat16))
    out = {}
    for n, lin in fp32_layers.items():
        w = _plain_weight(lin).to(torch.bfloat16)
        out[n] = PackedLinear(w, lin.bias) if packed else Bf16Linear(w, lin.bias)
        del w
    return out


def step_times(engine, *, steps: int, warmup: int, context_len: int = 16) -> list[float]:
    """Seconds of each of ``steps`` decode steps of ``engine.step()`` at batch 1 after ``warmup`` untimed
    ones (one request of ``context_len`` prompt tokens, prefilled first): chapter 01's TPOT measurement
    (``bottlenecks.decode_roofline.time_decode_steps``) for an engine whose layers are swapped."""
    import time

    from course_lib.engine.sampling import SamplingParams

    if engine.has_unfinished():
        raise ValueError("engine has unfinished requests: step_times needs an idle engine")
    vocab = engine.model.vocab_size
    prompt = [1 + (104_729 * j) % (vocab - 1) for j in range(context_len)]
    engine.add_request(prompt, SamplingParams(max_new_tokens=1 + warmup + steps, ignore_eos=True))
    engine.step()  # the prefill
    out = []
    with torch.inference_mode():
        for k in range(warmup + steps):
            t0 = time.perf_counter()
            engine.step()  # ends with .tolist(): synchronised
            if k >= warmup:
                out.append(time.perf_counter() - t0)
    while engine.has_unfinished():
        engine.step()
    return out


def decode_speeds(
    formats=FORMATS,
    *,
    steps: int = 16,
    warmup: int = 2,
    repeats: int = 3,
    context_len: int = 16,
    model: str = MODEL,
) -> list[DecodeRow]:
    """Seconds per decode step at batch 1 of ``model`` in each of ``formats`` (a subset of ``FORMATS``
    that holds fp32), group by group (``GROUPS``): each group's formats are built in one fp32 engine,
    then each repeat times every one of them in turn (``step_times``: ``steps`` engine steps after
    ``warmup``). A row's ``samples`` are its per-repeat medians, ``fp32_samples`` the fp32 baseline's in
    the same repeats; the fp32 row reports the first group's. Call ``core.memory.return_large_blocks`` first
    (the chapter does, with its own threshold), so that each group's freed layers leave the process."""
    from course_lib.engine import Engine
    from course_lib.engine.scheduler import SchedulerConfig
    from course_lib.models.load import load_model

    formats = list(formats)
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats or len(set(formats)) != len(formats):
        raise ValueError(f"formats must be a non-empty subset of {FORMATS} without repeats, got {formats!r}")
    if FP32 not in formats:
        raise ValueError(f"formats must include the baseline {FP32!r}: every speed-up is paired with it")
    for name, v, lo in (
        ("steps", steps, 2),
        ("warmup", warmup, 0),
        ("repeats", repeats, 1),
        ("context_len", context_len, 1),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    q4 = None
    if any(f.startswith("int4") for f in formats):  # the GGUF's temporaries, before the model takes its room
        from course_lib.compression.gguf_int4 import engine_qweights
        from course_lib.models.gguf import gguf_file

        q4 = engine_qweights(gguf_file(model))
        trim_heap()
    hf, tok = load_model(model, dtype="fp32")
    config = SchedulerConfig(max_model_len=context_len + warmup + steps + 2, max_num_seqs=1)
    eng = Engine(hf, tok, config=config, linear="reference")
    del hf
    built = build_formats(eng, [f for f in GROUPS[0] if f in formats], q4)
    del q4
    rows: dict[str, DecodeRow] = {}

    def run(eng, group: dict) -> None:
        samples = {f: [] for f in group}
        for _ in range(repeats):
            for fmt, (_, layers) in group.items():
                for name, lin in layers.items():
                    eng.model.set_linear(name, lin)
                samples[fmt].append(_median(step_times(eng, steps=steps, warmup=warmup, context_len=context_len)))
        for fmt, (path, layers) in group.items():
            for name, lin in layers.items():
                eng.model.set_linear(name, lin)
            if fmt not in rows:
                rows[fmt] = DecodeRow(
                    fmt, path, *step_bytes(eng), _median(samples[fmt]), tuple(samples[fmt]), tuple(samples[FP32])
                )
        for name, lin in group[FP32][1].items():  # the engine must not keep this group's layers alive
            eng.model.set_linear(name, lin)

    run(eng, built)
    fp32 = built[FP32]
    makers = {
        "int8 per-channel": (
            f"{kernel_name(WeightOnlyLinear(quantize_chunked(torch.zeros(16, 64), INT8)))}, head int8",
            int8_from,
        ),
        BF16: (bf16_path(), bf16_from),
    }
    for group in GROUPS[1:]:
        (fmt,) = [f for f in group if f != FP32]
        if fmt not in formats:
            continue
        built.clear()  # the previous group's layers go before the next copy comes
        trim_heap()
        path, make = makers[fmt]
        built.update({FP32: fp32, fmt: (path, make(fp32[1]))})
        trim_heap()
        run(eng, built)
    del eng, built, fp32
    trim_heap()
    return [rows[f] for f in formats]


def table(rows: list[DecodeRow], bandwidth: float | None = None) -> str:
    """The rows as a text table: bytes per step (layers, head), their ratio to fp32, step time with its
    run-to-run spread, tok/s, speed-up over fp32 and over bf16 (paired per repeat, ``speedup``), and the
    GB/s the step streamed."""
    names = {r.name for r in rows}
    fp32, bf16 = FP32, BF16
    by = {r.name: r for r in rows}
    head = f"{'format':<22}{'layers MB':>10}{'head MB':>8}{'bytes/fp32':>11}{'ms/step':>8}{'spread':>8}{'tok/s':>7}"
    head += f"{'vs fp32':>8}{'vs bf16':>8}{'GB/s':>6}  path"
    lines = [head]
    for r in rows:
        if r.name == NULL:  # no bytes: a time only
            lines.append(
                f"{r.name:<22}{0:>10.1f}{0:>8.1f}{0:>11.3f}{r.step_s * 1e3:>8.1f}{'±' + format(r.spread, '.0%'):>8}"
            )
            continue
        ratio = f"{r.bytes / by[fp32].bytes:>11.3f}" if fp32 in names else f"{'':>11}"
        v32 = f"{speedup(rows, fp32, r.name)[0]:>7.2f}x" if fp32 in names else f"{'':>8}"
        v16 = f"{speedup(rows, bf16, r.name)[0]:>7.2f}x" if bf16 in names else f"{'':>8}"
        lines.append(
            f"{r.name:<22}{r.body_bytes / 1e6:>10.1f}{r.head_bytes / 1e6:>8.1f}{ratio}{r.step_s * 1e3:>8.1f}"
            f"{'±' + format(r.spread, '.0%'):>8}{r.tok_s:>7.1f}{v32}{v16}{r.bytes / r.step_s / 1e9:>6.1f}  {r.path}"
        )
    if bandwidth:
        lines.append(f"(measured memory bandwidth of this machine: {bandwidth / 1e9:.1f} GB/s)")
    return "\n".join(lines)


__all__ = [
    "FP32",
    "NULL",
    "GROUPS",
    "bf16_from",
    "int8_from",
    "build_formats",
    "speedup",
    "step_times",
    "table",
    "FORMATS",
    "DecodeRow",
    "decode_speeds",
    "layer_bytes",
    "pack_float_engine",
    "quantize_chunked",
    "step_bytes",
]
