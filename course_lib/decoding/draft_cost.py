"""What a draft for SmolLM2 can cost and must accept: its bytes over the target's (the c a bandwidth-bound
decode step predicts), and the acceptance α a speed-up goal needs at that c.

At batch 1 both the draft's and the target's decode steps read all their weights once per token, so
c ≈ draft bytes / target bytes. SmolLM2-135M's tied LM head (V × D) is about a fifth of its bytes, so
a draft that keeps the whole head has c above that share however few layers it has; ``draft_bytes``
prices the alternatives from the model's own shapes, and ``alpha_needed`` inverts the formula
(1 − α^(γ+1)) / ((1 − α)(γc + 1)) at its best γ. Introduced in 04_decoding.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.engine.speculative.theory import best_gamma, expected_speedup


@dataclass
class DraftBytes:
    target: int  # every weight the target reads per decode step (embedding row excluded: one row)
    head: int  # the target's LM head, V × D
    layer: int  # one decoder layer
    draft: int  # k layers + an N-token head

    @property
    def head_share(self) -> float:
        return self.head / self.target

    @property
    def c_bytes(self) -> float:
        """The draft's cost per token in target forwards, if both are bound by the bytes they read."""
        return self.draft / self.target


def draft_bytes(engine, layers: int, vocab: int) -> DraftBytes:
    """Bytes per decode step of ``engine``'s model and of a draft with ``layers`` of its layers and an LM head
    over ``vocab`` tokens, both in the engine's dtype."""
    m = engine.model
    if not isinstance(layers, int) or isinstance(layers, bool) or not 1 <= layers <= m.num_layers:
        raise ValueError(f"layers must be an int in [1, {m.num_layers}], got {layers!r}")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or not 1 <= vocab <= m.vocab_size:
        raise ValueError(f"vocab must be an int in [1, {m.vocab_size}], got {vocab!r}")
    item = m.embed_weight.element_size()
    D = m.embed_weight.shape[1]
    q, kv, F = m.q_size, m.kv_size, m.ffn_size
    per_layer = (D * (q + 2 * kv) + q * D + 3 * D * F + 2 * D) * item  # qkv, o, gate/up/down, two norms
    head = m.vocab_size * D * item
    total = m.num_layers * per_layer + head + D * item
    return DraftBytes(total, head, per_layer, layers * per_layer + vocab * D * item + D * item)


def alpha_needed(goal: float, c: float, max_gamma: int = 16) -> float:
    """The smallest α (to 0.001) whose best-γ speed-up E(α, γ)/(γc + 1) reaches ``goal``; nan if none ≤ 0.999."""
    if not isinstance(goal, (int, float)) or isinstance(goal, bool) or goal < 1:
        raise ValueError(f"goal must be a speed-up ≥ 1, got {goal!r}")
    for k in range(1000):
        a = k / 1000
        if expected_speedup(a, best_gamma(a, c, max_gamma), c) >= goal:
            return a
    return float("nan")
