"""Pruning: fewer weights. Three kinds, and the measurement of whether they pay on hardware.

- **Unstructured magnitude pruning** (``magnitude``: ``magnitude_masks`` + ``apply_masks``): zero the
  smallest |w|, per layer or globally. The matrices keep their shape, so a dense kernel still reads every
  zero and a decode step is exactly as slow.
- **Structured pruning** (``structured``: ``prune_mlp_channels``): drop whole MLP intermediate channels,
  so the matrices really shrink and every kernel reads fewer bytes.
- **2:4 semi-structured sparsity** (``two_four``: ``two_four_mask`` / ``apply_two_four``): 2 of every 4
  consecutive input weights, which sparse tensor cores (Ampere on) skip; elsewhere only a mask.
- **Does it pay?** (``timing``: ``dense_vs_sparse_time``): one decode-shaped product in every format.
- **Recovery** (``finetune``: ``recover``): a short fine-tune with the masks held.
- ``targets``: the layers all of them act on (``prunable``) and the size of the model (``model_size``).

The names below are the public API of those modules, listed for the notebook (``prune.apply_masks``);
code inside course_lib imports from the module that defines a name. Introduced in 03_compression.ipynb.
"""

from course_lib.compression.prune.finetune import check_in_sync, recover
from course_lib.compression.prune.magnitude import (
    SCOPES,
    apply_masks,
    layer_sparsity,
    magnitude_masks,
    sparsity_of,
)
from course_lib.compression.prune.structured import StructuredReport, channel_importance, prune_mlp_channels
from course_lib.compression.prune.targets import model_size, prunable
from course_lib.compression.prune.timing import dense_vs_sparse_time
from course_lib.compression.prune.two_four import (
    SPARSE_KERNEL_CHOICES,
    SemiStructuredLinear,
    TwoFourReport,
    apply_two_four,
    semi_structured_shape_problem,
    sparse_kernel_problem,
    to_semi_structured,
    two_four_mask,
)

__all__ = [
    "SCOPES",
    "SPARSE_KERNEL_CHOICES",
    "SemiStructuredLinear",
    "StructuredReport",
    "TwoFourReport",
    "apply_masks",
    "apply_two_four",
    "channel_importance",
    "check_in_sync",
    "dense_vs_sparse_time",
    "layer_sparsity",
    "magnitude_masks",
    "model_size",
    "prunable",
    "prune_mlp_channels",
    "recover",
    "semi_structured_shape_problem",
    "sparse_kernel_problem",
    "sparsity_of",
    "to_semi_structured",
    "two_four_mask",
]
