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

from course_lib.compression.linear import WeightOnlyLinear
from course_lib.compression.quantize import QuantConfig, QuantizedWeight
from course_lib.engine.sampling import SamplingParams


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


def linear_bytes(engine) -> int:
    """Bytes of every linear layer's weights (what a decode step streams, besides embeddings and KV)."""
    return sum(lin.nbytes for _, lin in engine.model.linears())


@torch.inference_mode()
def decode_step_s(engine, batch: int = 1, new_tokens: int = 32, repeats: int = 3, prompt_ids=None) -> float:
    """Median seconds per decode step at ``batch``: (time for N tokens − time for 1) / (N − 1)."""
    from course_lib.bench import benchmark

    if not isinstance(new_tokens, int) or new_tokens < 2:
        raise ValueError(f"new_tokens must be an int >= 2, got {new_tokens!r}")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    ids = list(prompt_ids) if prompt_ids is not None else engine.tokenizer("import os\nimport sys\n")["input_ids"]

    def run(n: int) -> None:
        engine.generate([ids] * batch, SamplingParams(max_new_tokens=n, ignore_eos=True))

    long = benchmark(lambda: run(new_tokens), warmup=1, repeats=repeats, label=f"{new_tokens} tokens")
    short = benchmark(lambda: run(1), warmup=1, repeats=repeats, label="1 token")
    return max(long.median_s - short.median_s, 1e-9) / (new_tokens - 1)


__all__ = ["QuantReport", "decode_step_s", "linear_bytes", "quantize_engine"]
