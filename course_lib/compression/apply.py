"""Put quantized weights into a running engine, through its linear seam, and measure what changed.

``quantize_engine`` replaces every projection of ``engine.model`` (q/k/v, o, gate/up, down and, unless
told not to, the LM head) by a ``WeightOnlyLinear``; the model code is untouched and the float
``transformers`` model keeps its own weights, so ``Engine(engine.hf_model, engine.tokenizer)`` builds
the float engine again. ``decode_step_s`` times one decode step the way chapter 02 does (N tokens minus
1 token, so prefill and set-up cancel). Introduced in 03_compression.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from course_lib.bottlenecks.engine_vs_hf import matmul_weight_bytes as linear_bytes  # bytes of every linear layer
from course_lib.compression.linear import WeightOnlyLinear
from course_lib.compression.quantize import QuantConfig, QuantizedWeight


@dataclass
class QuantReport:
    """What ``quantize_engine`` did: layer names, bytes a decode step reads before and after, the path."""

    config: QuantConfig
    layers: list[str] = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0
    paths: dict[str, int] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.bytes_before / max(self.bytes_after, 1)

    def __str__(self) -> str:
        paths = ", ".join(f"{n} on {p}" for p, n in self.paths.items())
        return (
            f"{self.config.name}: {len(self.layers)} layers ({paths}); linear weights "
            f"{self.bytes_before / 1e6:.2f} MB -> {self.bytes_after / 1e6:.2f} MB ({self.ratio:.2f}x fewer bytes)"
        )


def quantize_engine(
    engine,
    config: QuantConfig,
    *,
    qweights: dict[str, QuantizedWeight] | None = None,
    path: str = "auto",
    include_lm_head: bool = True,
) -> QuantReport:
    """Quantize ``engine``'s linear layers in place (round to nearest, or the given ``qweights``, e.g.
    from GPTQ). Raises if a layer is already quantized: build a fresh engine instead."""
    if not isinstance(config, QuantConfig):
        raise ValueError(f"config must be a QuantConfig, got {type(config).__name__}")
    report = QuantReport(config)
    for name, lin in list(engine.model.linears()):
        if name == "lm_head" and not include_lm_head:
            continue
        if isinstance(lin, WeightOnlyLinear):
            raise ValueError(f"layer {name!r} is already quantized; quantize a fresh Engine(engine.hf_model, ...)")
        qw = None if qweights is None else qweights.get(name)
        new = WeightOnlyLinear.from_linear(lin, config, path=path, qw=qw)
        report.bytes_before += lin.nbytes
        report.bytes_after += new.nbytes
        report.paths[new.path] = report.paths.get(new.path, 0) + 1
        report.layers.append(name)
        engine.model.set_linear(name, new)
    return report


@dataclass(frozen=True)
class GemvRow:
    """One decode-shaped product timed: ``batch`` rows through an (out, in) weight in one format.

    ``weight_bytes`` is what the kernel reads (``decode_formats.layer_bytes``: the CPU kernels' bf16
    scales and zeros). ``seconds`` is the median over ``samples``; with a ``working_set`` the calls cycle
    through ``copies`` copies of the weight (so the bytes come from DRAM, not from the cache), and
    ``hot_seconds`` is the median of the same product on one copy, called again and again (cache-resident
    where it fits)."""

    name: str
    path: str
    weight_bytes: int
    seconds: float
    samples: tuple = ()
    copies: int = 1
    hot_seconds: float | None = None

    @property
    def gbps(self) -> float:
        """Weight bytes streamed per second."""
        return self.weight_bytes / self.seconds / 1e9

    @property
    def working_set(self) -> int:
        """Bytes the timed calls cycle through (copies × the weight)."""
        return self.copies * self.weight_bytes


def _copy_for_timing(layer):
    """A copy of ``layer`` that owns what its forward reads (``linear.timing_copy``)."""
    from course_lib.compression.linear import timing_copy

    return timing_copy(layer)


def gemv_speed(
    out_features: int,
    in_features: int,
    configs,
    *,
    batch: int = 1,
    repeats: int = 20,
    device: str = "cpu",
    seed: int = 0,
    bf16: bool = False,
    working_set: int | None = None,
) -> list[GemvRow]:
    """Time ``batch`` rows through a random (out, in) matrix: fp32 ``F.linear`` (the baseline), then each
    ``QuantConfig`` in ``configs`` as a ``WeightOnlyLinear`` on its fastest path, then (``bf16=True``) bf16
    ``F.linear`` with bf16 activations. Medians, warm-up excluded. ``working_set`` (bytes, e.g. 4× the
    LLC): each format cycles through enough copies of its weight to read at least that many bytes, so no
    format is served from the cache; one copy at a time is built (the copies are freed after each row)."""
    from course_lib.compression.linear import layer_bytes
    from course_lib.engine.layers import Linear
    from course_lib.measure.bench import benchmark

    for name, v in (("out_features", out_features), ("in_features", in_features), ("batch", batch)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if working_set is not None and (
        isinstance(working_set, bool) or not isinstance(working_set, int) or working_set < 1
    ):
        raise ValueError(f"working_set must be None or a positive int (bytes), got {working_set!r}")
    gen = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=gen, device=device) * 0.02  # (out, in)
    x = torch.randn(batch, in_features, generator=gen, device=device)  # (batch, in)
    base = Linear(w)
    makers = [("fp32 F.linear", lambda: base)] + [
        (c.name, lambda c=c: WeightOnlyLinear.from_linear(base, c)) for c in configs
    ]
    if bf16:
        makers.append(("bf16 F.linear", lambda: Linear(w.to(torch.bfloat16))))
    rows = []
    for name, make in makers:
        layer = make()
        xi = x.to(torch.bfloat16) if name.startswith("bf16") else x
        with torch.inference_mode():
            layer(xi)  # the CPU kernels pack their layout on the first call
        nbytes = layer_bytes(layer)
        copies = 1 if working_set is None else max(1, -(-working_set // nbytes))
        layers = [layer] + [_copy_for_timing(layer) for _ in range(copies - 1)]
        turn = [0]

        def call(layers=layers, xi=xi, turn=turn):
            turn[0] = (turn[0] + 1) % len(layers)
            return layers[turn[0]](xi)

        with torch.inference_mode():
            t = benchmark(call, repeats=repeats, warmup=max(3, copies), device=device, label=name)
            hot = None
            if copies > 1:
                hot = benchmark(
                    lambda lay=layer, xi=xi: lay(xi), repeats=repeats, warmup=3, device=device, label=name
                ).median_s
        rows.append(GemvRow(name, getattr(layer, "path", "F.linear"), nbytes, t.median_s, t.samples_s, copies, hot))
        del layers, layer
    return rows


__all__ = ["GemvRow", "QuantReport", "gemv_speed", "linear_bytes", "quantize_engine"]
