"""The host→device link is a bandwidth bottleneck: weights must live in GPU memory.

A GPU reads its own HBM at terabytes per second, but everything that crosses from host memory goes
over PCIe at tens of GB/s — about a hundred times slower. Loading a model pays that once; offloading
weights to the host (to fit a bigger model) pays it on every decode step, putting PCIe on the
critical path (NVIDIA, "Mastering LLM Techniques: Inference Optimization"; Xiao & Zhu). Here we
predict the time to move a model's weights over each link from the spec rates, measure real
host↔device copies (pinned vs pageable memory) where there is a CUDA GPU, and, on a CPU-only
machine, measure the nearest thing: a copy within DRAM. Introduced in 01_bottlenecks_2_prefill_decode.ipynb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: Llama-2-7B: 6,738,415,616 parameters × 2 bytes (bf16) ≈ 13.5 GB of weights.
LLAMA2_7B_BF16_BYTES = 6_738_415_616 * 2

SKIP_MESSAGE = (
    "Skipped: measuring host→device copies needs a CUDA GPU, and torch sees none here. "
    "The prediction (predict_load_time) holds anyway; on this CPU the 'transfer' is a memcpy "
    "within DRAM, measured by measure_cpu_copy()."
)


class NeedsCudaError(RuntimeError):
    """Raised by measure_h2d on a machine without a CUDA GPU; its message is SKIP_MESSAGE."""


def available() -> bool:
    """True where measure_h2d can run (torch sees a CUDA GPU)."""
    return torch.cuda.is_available()


# ----------------------------------------------------------------------------- prediction
def pcie_x16_gbps(gt_per_s: float, lanes: int = 16) -> float:
    """Theoretical GB/s per direction of a PCIe link: GT/s per lane × lanes × 128/130 (the
    128b/130b line code of PCIe 3.0-5.0) / 8 bits per byte. Packet headers cost another ~10-20%."""
    return gt_per_s * lanes * 128 / 130 / 8


@dataclass(frozen=True)
class Link:
    key: str
    name: str
    gbps: float  # GB/s in the direction the weights travel
    theoretical: bool  # a spec/datasheet rate, not a measurement
    source: str


# Rates per direction. PCIe: PCI-SIG "PCI Express Base Specification" revisions 3.0 (8 GT/s),
# 4.0 (16 GT/s) and 5.0 (32 GT/s). NVLink 4: NVIDIA H100 Tensor Core GPU datasheet, "NVLink: 900 GB/s"
# total bidirectional over 18 links, i.e. 450 GB/s each way: a GPU↔GPU link (chapters 06-07), not host→device.
# NVLink-C2C: NVIDIA GH200 Grace Hopper Superchip datasheet, "900 GB/s" bidirectional between the Grace CPU
# and the H100, i.e. 450 GB/s each way: the one host→device link that is not PCIe. HBM3: NVIDIA H100 SXM
# datasheet, 3.35 TB/s.
LINKS: dict[str, Link] = {
    link.key: link
    for link in (
        Link("pcie3_x16", "PCIe 3.0 x16", pcie_x16_gbps(8), True, "PCI Express Base Specification 3.0"),
        Link("pcie4_x16", "PCIe 4.0 x16", pcie_x16_gbps(16), True, "PCI Express Base Specification 4.0"),
        Link("pcie5_x16", "PCIe 5.0 x16", pcie_x16_gbps(32), True, "PCI Express Base Specification 5.0"),
        Link("nvlink4", "NVLink 4 (H100), per direction", 450.0, True, "NVIDIA H100 datasheet: 900 GB/s bidirectional"),
        Link(
            "nvlink_c2c",
            "NVLink-C2C (Grace→H100, GH200)",
            450.0,
            True,
            "NVIDIA GH200 datasheet: 900 GB/s bidirectional",
        ),
        Link("hbm3_h100", "HBM3 (H100 SXM), read once", 3350.0, True, "NVIDIA H100 SXM datasheet: 3.35 TB/s"),
    )
}
HBM = "hbm3_h100"
#: The links weights cross from host memory to a GPU, and HBM as the yardstick (NVLink 4 joins GPUs: not one).
HOST_LINKS = ("pcie3_x16", "pcie4_x16", "pcie5_x16", "nvlink_c2c", HBM)


def _check_bytes(n_bytes) -> float:
    ok = isinstance(n_bytes, (int, float)) and not isinstance(n_bytes, bool) and math.isfinite(n_bytes)
    if not ok or n_bytes <= 0:
        raise ValueError(f"n_bytes must be a positive finite number of bytes, got {n_bytes!r}")
    return float(n_bytes)


def predict_load_time(n_bytes: float, link: str = "pcie4_x16") -> float:
    """Seconds to move ``n_bytes`` over ``link`` (a key of LINKS) at its theoretical rate: a lower
    bound — real PCIe copies reach about 80-90% of it, and only from pinned memory."""
    n_bytes = _check_bytes(n_bytes)
    if link not in LINKS:
        raise ValueError(f"link must be one of {sorted(LINKS)}, got {link!r}")
    return n_bytes / (LINKS[link].gbps * 1e9)


@dataclass(frozen=True)
class LoadRow:
    link: Link
    n_bytes: float
    seconds: float
    vs_hbm: float  # how many times longer than reading the same bytes once from HBM

    @property
    def max_tokens_per_s(self) -> float:
        """Decode tokens/s if every step had to bring all the weights over this link."""
        return 1.0 / self.seconds


def load_time_table(n_bytes: float = LLAMA2_7B_BF16_BYTES, links=None) -> list[LoadRow]:
    """predict_load_time for each link (default: the host→device ``HOST_LINKS``), compared with one read from HBM."""
    keys = list(HOST_LINKS) if links is None else list(links)
    hbm = predict_load_time(n_bytes, HBM)
    return [LoadRow(LINKS[k], float(n_bytes), t, t / hbm) for k in keys for t in [predict_load_time(n_bytes, k)]]


def format_load_table(rows: list[LoadRow]) -> str:
    if not rows:
        raise ValueError("rows must be a non-empty list of LoadRow (from load_time_table)")
    head = f"{'link':<32} {'GB/s':>8} {'time':>9} {'× HBM':>7} {'max tok/s':>10}"
    lines = [f"moving {rows[0].n_bytes / 1e9:.2f} GB (theoretical rates, one direction)", head, "-" * len(head)]
    for r in rows:
        t = f"{r.seconds * 1e3:.1f} ms" if r.seconds < 1 else f"{r.seconds:.2f} s"
        lines.append(f"{r.link.name:<32} {r.link.gbps:>8.1f} {t:>9} {r.vs_hbm:>7.1f} {r.max_tokens_per_s:>10.1f}")
    lines.append("max tok/s: decode speed if every step streamed all the weights over that link (offloading)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- measurement
@dataclass(frozen=True)
class TransferRow:
    direction: str  # "h2d" or "d2h"
    pinned: bool
    bytes: int
    seconds: float  # median
    gbps: float


def _check_sizes(sizes_bytes) -> tuple[int, ...]:
    sizes = tuple(sizes_bytes) if isinstance(sizes_bytes, (list, tuple)) else None
    if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n <= 0 for n in sizes):
        raise ValueError(f"sizes_bytes must be a non-empty list of positive ints, got {sizes_bytes!r}")
    return sizes


def _cuda_device(device) -> torch.device:
    dev = torch.device("cuda" if device is None else device)
    if dev.type != "cuda":
        raise ValueError(f"device must be a CUDA device ('cuda', 'cuda:0', ...) or None, got {device!r}")
    if not available():
        raise NeedsCudaError(SKIP_MESSAGE)
    return dev


def measure_h2d(
    sizes_bytes=None,
    pinned: bool = True,
    device=None,
    *,
    directions=("h2d", "d2h"),
    repeats: int | None = None,
) -> list[TransferRow]:
    """Time host→device (and device→host) copies of each size with ``bench.benchmark`` (CUDA
    events, warm-up excluded, median of the repeats). ``pinned``: page-locked host memory, which the
    GPU's DMA engines read directly; pageable memory is staged through a pinned buffer by the driver
    (slower). Raises NeedsCudaError (message: SKIP_MESSAGE) where there is no CUDA GPU."""
    from course_lib.core.mode import pick
    from course_lib.measure.bench import benchmark

    sizes = _check_sizes(
        pick((1 << 20, 16 << 20, 64 << 20), (1 << 16, 1 << 20, 16 << 20, 256 << 20, 1 << 30))
        if sizes_bytes is None
        else sizes_bytes
    )
    if not isinstance(pinned, bool):
        raise ValueError(f"pinned must be True or False, got {pinned!r}")
    directions = tuple(directions) if isinstance(directions, (list, tuple)) else (directions,)
    if not directions or any(d not in ("h2d", "d2h") for d in directions):
        raise ValueError(f"directions must be a non-empty subset of ('h2d', 'd2h'), got {directions!r}")
    dev = _cuda_device(device)
    rows = []
    with torch.cuda.device(dev):
        for n in sizes:
            host = torch.ones(n, dtype=torch.uint8, pin_memory=pinned)  # filled: pages exist before timing
            gpu = torch.ones(n, dtype=torch.uint8, device=dev)
            for d in directions:
                dst, src = (gpu, host) if d == "h2d" else (host, gpu)
                t = benchmark(
                    lambda dst=dst, src=src: dst.copy_(src, non_blocking=pinned),
                    bytes=n,
                    device="cuda",
                    warmup=2,
                    repeats=repeats or pick(5, 20),
                    label=f"{d} {'pinned' if pinned else 'pageable'} {n} B",
                    peaks=False,
                )
                rows.append(TransferRow(d, pinned, n, t.median_s, t.gbps))
            del host, gpu
    return rows


def format_transfer_table(rows: list[TransferRow]) -> str:
    if not rows:
        raise ValueError("rows must be a non-empty list of TransferRow (from measure_h2d)")
    head = f"{'direction':<9} {'host memory':<11} {'MiB':>9} {'median':>10} {'GB/s':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        t = f"{r.seconds * 1e3:.3f} ms" if r.seconds >= 1e-3 else f"{r.seconds * 1e6:.1f} us"
        mem = "pinned" if r.pinned else "pageable"
        lines.append(f"{r.direction:<9} {mem:<11} {r.bytes / 2**20:>9.3f} {t:>10} {r.gbps:>7.1f}")
    return "\n".join(lines)


def measure_cpu_copy(n_bytes: int | None = None, repeats: int | None = None):
    """On a CPU the "host→device copy" is a memcpy within DRAM: ``microbench.measure_bandwidth("copy")``.
    Returns its ``bench.Timing``; ``gbps`` counts bytes read + written (STREAM's convention), so the
    payload moved per second is half of it — compare that half with measure_h2d's GB/s."""
    from course_lib.measure import microbench

    return microbench.measure_bandwidth("copy", n_bytes=n_bytes, device="cpu", repeats=repeats)
