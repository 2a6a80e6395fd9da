"""Which heads, KV heads and MLP features each tensor-parallel rank keeps, and which TP degrees a model allows.

Megatron-LM splits attention by heads: rank r of p keeps H/p query heads, so p must divide H. Grouped-query
attention (GQA, Ainslie et al. 2023) shares one KV head among H/Hkv query heads, and a KV head cannot be
split (its head_dim values are one vector). Two cases, as vLLM's ``QKVParallelLinear`` handles them:
- p ≤ Hkv: p must divide Hkv, and rank r keeps KV heads [r·Hkv/p, (r+1)·Hkv/p) — the ones its query heads use;
- p > Hkv: Hkv must divide p, and each KV head is **replicated** on p/Hkv ranks: rank r keeps KV head
  r // (p/Hkv), again the one its H/p query heads use (multi-query attention, Hkv = 1, puts it on every rank).
Replication costs memory, not communication: every rank stores its KV head's cache, so the KV bytes per
token per rank stop shrinking at p = Hkv (``kv_bytes_per_rank``). The MLP's intermediate features split
evenly, so p must divide them too. Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass


def _check_positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _problem(num_heads: int, num_kv_heads: int, ffn_size: int, p: int) -> str | None:
    """Why p cannot split this model (None when it can)."""
    if num_heads % p:
        return f"world_size={p} does not divide num_attention_heads={num_heads} (each rank keeps whole query heads)"
    if num_kv_heads % p and p % num_kv_heads:
        return (
            f"world_size={p} neither divides num_key_value_heads={num_kv_heads} (each rank keeps whole KV heads) "
            f"nor is a multiple of it (each KV head replicated on world_size / num_key_value_heads ranks)"
        )
    if ffn_size % p:
        return f"world_size={p} does not divide intermediate_size={ffn_size} (each rank keeps 1/p of the MLP features)"
    return None


def valid_tp_degrees(num_heads: int, num_kv_heads: int, ffn_size: int) -> list[int]:
    """Every world_size that splits this model: divisors of the heads that fit the KV heads and the MLP."""
    _check_heads(num_heads, num_kv_heads, ffn_size)
    return [p for p in range(1, num_heads + 1) if _problem(num_heads, num_kv_heads, ffn_size, p) is None]


def _check_heads(num_heads, num_kv_heads, ffn_size) -> None:
    for name, value in (
        ("num_attention_heads", num_heads),
        ("num_key_value_heads", num_kv_heads),
        ("intermediate_size", ffn_size),
    ):
        _check_positive(name, value)
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_key_value_heads={num_kv_heads} must divide num_attention_heads={num_heads} (query heads per KV head)"
        )


def check_tp_degree(num_heads: int, num_kv_heads: int, ffn_size: int, world_size: int) -> None:
    """Raise ValueError naming what world_size does not divide, and the world sizes this model allows."""
    _check_positive("world_size", world_size)
    _check_heads(num_heads, num_kv_heads, ffn_size)
    why = _problem(num_heads, num_kv_heads, ffn_size, world_size)
    if why is not None:
        valid = valid_tp_degrees(num_heads, num_kv_heads, ffn_size)
        raise ValueError(
            f"tensor parallelism cannot split this model: {why}; valid world_size for {num_heads} query heads, "
            f"{num_kv_heads} KV heads and intermediate_size={ffn_size}: {valid}"
        )


@dataclass(frozen=True)
class RankShard:
    """What rank ``rank`` of ``world_size`` keeps: its query heads, its KV heads and its MLP features."""

    rank: int
    world_size: int
    num_kv_heads: int  # of the whole model
    q_heads: range  # global indices of this rank's query heads
    kv_heads: range  # global indices of the KV heads those query heads use
    ffn: range  # this rank's intermediate features (of gate, of up; the input columns of down)

    @property
    def kv_replicas(self) -> int:
        """How many ranks hold each of this rank's KV heads (1: no replication)."""
        return max(1, self.world_size // self.num_kv_heads)

    def qkv_rows(self, head_dim: int, num_heads: int, num_kv_heads: int) -> list[tuple[int, int]]:
        """Row ranges of this rank's q, k and v in the fused (H + 2·Hkv)·hd rows of ``qkv``."""
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        q = (self.q_heads.start * head_dim, self.q_heads.stop * head_dim)
        k = (q_size + self.kv_heads.start * head_dim, q_size + self.kv_heads.stop * head_dim)
        v = (k[0] + kv_size, k[1] + kv_size)
        return [q, k, v]

    def o_columns(self, head_dim: int) -> tuple[int, int]:
        """Input columns of ``o`` this rank multiplies: the outputs of its query heads."""
        return self.q_heads.start * head_dim, self.q_heads.stop * head_dim

    def gate_up_rows(self, ffn_size: int) -> list[tuple[int, int]]:
        """Row ranges of this rank's gate and up features in the fused 2F rows of ``gate_up``."""
        return [(self.ffn.start, self.ffn.stop), (ffn_size + self.ffn.start, ffn_size + self.ffn.stop)]


def rank_shard(num_heads: int, num_kv_heads: int, ffn_size: int, rank: int, world_size: int) -> RankShard:
    """The heads and features rank keeps (``check_tp_degree`` first). With p > Hkv the KV head is
    r // (p / Hkv): the one that query heads [r·H/p, (r+1)·H/p) share."""
    check_tp_degree(num_heads, num_kv_heads, ffn_size, world_size)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    p, hq = world_size, num_heads // world_size
    if p <= num_kv_heads:
        step = num_kv_heads // p
        kv = range(rank * step, (rank + 1) * step)
    else:
        kv_head = rank // (p // num_kv_heads)
        kv = range(kv_head, kv_head + 1)
    f = ffn_size // p
    return RankShard(rank, p, num_kv_heads, range(rank * hq, (rank + 1) * hq), kv, range(rank * f, (rank + 1) * f))


def kv_heads_per_rank(num_kv_heads: int, world_size: int) -> int:
    """KV heads each rank stores: Hkv/p, or 1 (replicated) once p ≥ Hkv."""
    return max(1, num_kv_heads // world_size)


def kv_bytes_per_rank(num_layers: int, num_kv_heads: int, head_dim: int, world_size: int, dtype_bytes: int) -> int:
    """KV-cache bytes per token on one rank: 2 (K, V) · layers · its KV heads · head_dim · bytes."""
    for name, value in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("world_size", world_size),
        ("dtype_bytes", dtype_bytes),
    ):
        _check_positive(name, value)
    return 2 * num_layers * kv_heads_per_rank(num_kv_heads, world_size) * head_dim * dtype_bytes


def format_kv_per_rank(rows: list[tuple[str, object, int, int]]) -> str:
    """A table of the KV cache per token on each rank, for rows of (name, ModelShape, world_size, dtype bytes):
    the KV heads a rank holds, their bytes, and what replication adds over an even split of the whole."""
    head = f"{'model':<24}{'TP':>4}{'KV heads':>10}{'per rank':>20}{'KV B/token/rank':>17}{'Σ ranks ÷ one':>15}"
    lines = [head]
    for name, shape, p, nbytes in rows:
        check_tp_degree(shape.num_heads, shape.num_kv_heads, shape.intermediate_size, p)
        one = kv_bytes_per_rank(shape.num_layers, shape.num_kv_heads, shape.head_dim, 1, nbytes)
        per = kv_bytes_per_rank(shape.num_layers, shape.num_kv_heads, shape.head_dim, p, nbytes)
        held = kv_heads_per_rank(shape.num_kv_heads, p)
        note = f"{held} ({max(1, p // shape.num_kv_heads)}× replicated)" if p > shape.num_kv_heads else f"{held}"
        lines.append(f"{name:<24}{p:>4}{shape.num_kv_heads:>10}{note:>20}{per:>17,}{p * per / one:>14.1f}×")
    return "\n".join(lines)


__all__ = [
    "RankShard",
    "check_tp_degree",
    "format_kv_per_rank",
    "kv_bytes_per_rank",
    "kv_heads_per_rank",
    "rank_shard",
    "valid_tp_degrees",
]
