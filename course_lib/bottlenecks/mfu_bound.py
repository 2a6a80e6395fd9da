"""Training vs inference on the roofline: why a training step reaches a higher MFU than a decode step.

A training step over ``seqs`` × ``seq_len`` tokens reuses every weight for each token of the batch (far
right of the ridge: compute-bound, even with the optimizer's extra bytes); a decode step uses each weight
once per sequence (bandwidth-bound at small batch). ``training_vs_inference`` turns both intensities
into the highest MFU the roofline allows. First-principles predictions, nothing is measured.
Introduced in 02_metrics_2_throughput_utilization.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.core.dtypes import dtype_bytes
from course_lib.measure.hardware.datasheet import as_spec
from course_lib.models.accounting import ModelShape, as_shape, decode_cost, param_count, prefill_flops

ADAM_STATE_BYTES = 24.0  # per parameter: fp32 master weight, Adam m and v, each read and written once a step
# Activations a transformer layer stores per token for its backward pass, in 16-bit, in units of the hidden
# size: 34·D without the T×T attention scores, which FlashAttention recomputes instead of storing
# (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022, eq. 1: 34·s·b·h).
ACTIVATION_BYTES_PER_TOKEN_D = 34.0


def activation_bytes(shape: ModelShape, seq_len: int, seqs: int) -> float:
    """Bytes of activations a training step writes in the forward pass and reads back in the backward:
    2 × 34·D per token per layer (no recomputation, no stored attention matrix)."""
    for name, v in (("seq_len", seq_len), ("seqs", seqs)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    return 2 * ACTIVATION_BYTES_PER_TOKEN_D * shape.num_layers * shape.hidden_size * seq_len * seqs


def training_step_bytes(shape: ModelShape, dtype: str = "bf16") -> float:
    """Least bytes one mixed-precision Adam step moves, activations ignored: weights read in the forward
    and again in the backward pass, gradients written and read back by the optimizer, new weights
    written (5 × bytes per parameter), plus ``ADAM_STATE_BYTES``: 34 B/parameter in bf16."""
    return param_count(shape) * (5 * dtype_bytes(dtype) + ADAM_STATE_BYTES)


@dataclass(frozen=True)
class MfuBound:
    """A step's arithmetic intensity against a GPU's ridge: the highest MFU the roofline allows it."""

    phase: str
    flops: float
    bytes: float
    ridge: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def mfu_bound(self) -> float:
        """min(1, intensity / ridge): left of the ridge the step cannot keep the compute units busy."""
        return min(1.0, self.intensity / self.ridge)

    def __str__(self) -> str:
        return f"{self.phase}: {self.intensity:,.1f} FLOP/byte vs ridge {self.ridge:.0f} -> MFU <= {self.mfu_bound:.1%}"


def training_vs_inference(
    model,
    gpu,
    *,
    seq_len: int = 2048,
    seqs: int = 16,
    decode_batch: int = 1,
    context_len: int = 512,
    dtype: str = "bf16",
    activations: bool = True,
) -> tuple[MfuBound, MfuBound]:
    """Why training reaches a higher MFU than inference: the MFU ceiling of one training step over
    ``seqs`` × ``seq_len`` tokens (forward + backward = 3 × a prefill's FLOPs, i.e. 6·N per token plus
    attention, over ``training_step_bytes`` plus, with ``activations``, the activation traffic
    ``activation_bytes``) and of one decode step at ``decode_batch``, on ``gpu``'s datasheet roof in
    ``dtype``. A training step reuses each weight for every token of the batch; a decode step for one
    token per sequence. ``activations=False`` gives the weights-and-optimizer-only bound."""
    shape, spec = as_shape(model), as_spec(gpu)
    ridge = spec.ridge(dtype)
    moved = training_step_bytes(shape, dtype) + (activation_bytes(shape, seq_len, seqs) if activations else 0.0)
    train = MfuBound(
        f"training step ({seqs} x {seq_len} tokens{', activations counted' if activations else ', weights only'})",
        3 * prefill_flops(shape, seq_len, seqs),
        moved,
        ridge,
    )
    decode = MfuBound(
        f"decode step (batch {decode_batch}, context {context_len})",
        *decode_cost(shape, context_len, decode_batch, dtype),
        ridge,
    )
    return train, decode
