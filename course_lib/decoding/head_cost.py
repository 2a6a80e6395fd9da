"""What a Medusa head and an EAGLE draft weigh, from a model's config: the accounting behind "which proposer
is cheap".

A Medusa-1 head (Cai et al. 2024; ``engine.speculative.medusa``) is a residual block ``z + SiLU(W z + b)``
(D² + D weights) followed by *its own* D × V projection to the vocabulary: on a 7B Llama the projection is
131 M weights, so one head is ~2.2% of the model and five heads ~11%, all read at every step. EAGLE (Li et
al. 2024) drafts at the feature level instead: one decoder layer of the target's shape plus a 2D → D
fusion of the feature with the sampled token's embedding, and it *reuses* the target's embedding and LM
head, so its own weights are one layer's worth (~3% of a 7B model) however many tokens it drafts. Its
draft for token t+k sees the token sampled at t+k−1, which Medusa's head k never does; that is why its
acceptance falls far more slowly with k (the papers: Medusa ~2×, EAGLE ~3× on 13B chat models). Pure
arithmetic on ``models.accounting.ModelShape``. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.models.accounting import ModelShape, layer_params, param_count


@dataclass(frozen=True)
class ProposerWeights:
    model: str
    params: int  # the target's parameters
    medusa_head: int  # one Medusa-1 head: D² + D (residual block) + D·V (its own projection)
    eagle_draft: int  # EAGLE's own weights: one decoder layer + the 2D → D fusion (+ bias)
    eagle_reads: int  # weights one EAGLE draft token reads: its own + the target's LM head (shared, still read)

    def medusa_share(self, heads: int = 1) -> float:
        """``heads`` Medusa heads as a share of the target's parameters."""
        if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
            raise ValueError(f"heads must be an int ≥ 1, got {heads!r}")
        return heads * self.medusa_head / self.params

    @property
    def eagle_share(self) -> float:
        """EAGLE's own weights as a share of the target's."""
        return self.eagle_draft / self.params


def medusa_head_params(shape: ModelShape) -> int:
    """One Medusa-1 head of ``engine.speculative.medusa``: W (D×D) + b (D) + its own LM head (D×V)."""
    d = shape.hidden_size
    return d * d + d + d * shape.vocab_size


def eagle_draft_params(shape: ModelShape) -> int:
    """EAGLE's draft: one decoder layer of the target's shape + the fusion FC (2D → D, with bias)."""
    d = shape.hidden_size
    return layer_params(shape) + 2 * d * d + d


def proposer_weights(shape: ModelShape) -> ProposerWeights:
    if not isinstance(shape, ModelShape):
        raise ValueError(f"shape must be a ModelShape (e.g. ModelShape.from_name('llama-2-7b')), got {shape!r}")
    eagle = eagle_draft_params(shape)
    return ProposerWeights(
        shape.name, param_count(shape), medusa_head_params(shape), eagle, eagle + shape.vocab_size * shape.hidden_size
    )


def table(shapes, heads: int = 5) -> str:
    """One line per model: Medusa per head and for ``heads`` heads, EAGLE's own weights, as shares."""
    lines = [f"{'model':<22}{'params':>10}{'1 Medusa head':>15}{f'{heads} heads':>10}{'EAGLE draft':>13}"]
    for s in shapes:
        w = proposer_weights(s)
        lines.append(
            f"{w.model:<22}{w.params / 1e6:>9.1f}M{w.medusa_share(1):>15.1%}{w.medusa_share(heads):>10.1%}"
            f"{w.eagle_share:>13.1%}"
        )
    return "\n".join(lines)
