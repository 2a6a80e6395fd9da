"""The course's FlashAttention kernel as measured on a GPU, every stored case: ``data/measurements/
nvidia-h200.json`` keeps one row per (head_dim, T, dtype, causal, kind) from ``benchmarks/
flash_attention_gpu.py``; ``flash_summary`` sets the kernel's speed against PyTorch's SDPA (itself a fused
FlashAttention-2 / cuDNN kernel) and against the naive three-pass attention, which is the baseline of Dao et
al.'s "2-4x". Introduced in 05_attention_kv_cache.ipynb."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlashSummary:
    """Speed ratios of the course kernel over every stored case (>1: the kernel is faster)."""

    device: str
    cases: int
    vs_sdpa: tuple[float, float]  # (min, max) of SDPA time ÷ kernel time
    vs_naive: tuple[float, float]  # (min, max) of naive time ÷ kernel time, over the cases naive ran
    naive_cases: int
    goal: float  # the stored goal (kernel ≥ goal × SDPA's speed)
    met: int

    def describe(self) -> str:
        return (
            f"the course kernel on an {self.device}, {self.cases} stored cases: {self.vs_sdpa[0]:.2f}-{self.vs_sdpa[1]:.2f}× "
            f"SDPA's speed (goal ≥ {self.goal:.1f}×: met in {self.met} of {self.cases}); "
            f"{self.vs_naive[0]:.0f}-{self.vs_naive[1]:.0f}× the naive attention's speed ({self.naive_cases} cases)"
        )


def flash_summary(stored: dict) -> FlashSummary:
    """Summarise ``stored["flash_attention"]`` (the parsed nvidia-h200.json)."""
    fa = stored.get("flash_attention") if isinstance(stored, dict) else None
    if not fa or "rows" not in fa:
        raise ValueError("stored must be the parsed nvidia-h200.json with a 'flash_attention' section of rows")
    by_case: dict[tuple, dict] = {}
    for r in fa["rows"]:
        key = (r["head_dim"], r["T"], r["dtype"], r["causal"])
        by_case.setdefault(key, {})[r["kind"]] = r["seconds"]
    sdpa = [c["sdpa"] / c["flash"] for c in by_case.values() if "sdpa" in c and "flash" in c]
    naive = [c["naive"] / c["flash"] for c in by_case.values() if "naive" in c and "flash" in c]
    summ = fa.get("summary", {})
    return FlashSummary(
        str(fa.get("meta", {}).get("device", stored.get("gpu", "?"))),
        len(sdpa),
        (min(sdpa), max(sdpa)),
        (min(naive), max(naive)) if naive else (float("nan"), float("nan")),
        len(naive),
        float(summ.get("goal", 0.9)),
        sum(x >= float(summ.get("goal", 0.9)) for x in sdpa),
    )
