"""The links between GPUs, with sourced figures: NVLink, PCIe and InfiniBand from ``data/interconnects.json``.

Each link is a per-direction datasheet bandwidth (1/β), a latency per ring step (α) and a fixed cost per
collective call, the last two NCCL's own tuning constants for its low-latency ring protocol; each figure
names the ``data/references.json`` key it comes from and says whether it is *sourced* for that link or
*assumed* (loading checks both). A datasheet link moves data by DMA between buffers allocated once, so it
keeps one β at every size; ``collective_time`` predicts a ring collective on one with the α–β model of
``course_lib.parallel.alpha_beta`` plus the per-call cost (a measured ``AlphaBetaFit`` passes through
wherever a link is asked for); ``format_links`` tabulates the figures with their status. Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from course_lib.parallel.alpha_beta import AlphaBetaFit, ring_time


@dataclass(frozen=True)
class Interconnect:
    """One link of ``data/interconnects.json``: per-direction datasheet bandwidth, latency per ring step and
    per call, and whether each figure is sourced for this link or assumed."""

    key: str
    name: str
    gbps: float  # GB/s per GPU, one direction
    latency_us: float  # α: fixed cost of one ring step
    base_latency_us: float  # fixed cost of one collective call (launch, protocol), paid once
    gbps_status: str  # "sourced" or "assumed"
    latency_status: str
    scope: str  # "node" (inside a server) or "cluster" (between servers)
    reference: str  # data/references.json key of the bandwidth
    latency_reference: str
    note: str = ""

    @property
    def alpha(self) -> float:
        """Seconds per message."""
        return self.latency_us * 1e-6

    @property
    def base(self) -> float:
        """Seconds per collective call, on top of the ring steps."""
        return self.base_latency_us * 1e-6

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 1.0 / (self.gbps * 1e9)


def interconnects_path() -> Path:
    from course_lib.core.paths import data_dir

    return data_dir() / "interconnects.json"


STATUSES = ("sourced", "assumed")


@lru_cache(maxsize=4)
def _load_links(path: str) -> dict[str, Interconnect]:
    from course_lib.measure.references import reference

    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    out = {}
    for entry in raw["links"]:
        link = Interconnect(**entry)
        if not (link.gbps > 0 and link.latency_us > 0 and link.base_latency_us >= 0):
            raise ValueError(f"{path}: link {link.key!r} needs gbps > 0, latency_us > 0 and base_latency_us >= 0")
        if {link.gbps_status, link.latency_status} - set(STATUSES):
            raise ValueError(f"{path}: link {link.key!r}: gbps_status and latency_status must be one of {STATUSES}")
        reference(link.reference), reference(link.latency_reference)  # every figure has a source
        out[link.key] = link
    return out


def links() -> dict[str, Interconnect]:
    """Every link of ``data/interconnects.json`` by key: nvlink4, nvlink3, pcie5_x16, pcie4_x16, ib_ndr."""
    return dict(_load_links(str(interconnects_path())))


def link(key) -> Interconnect | AlphaBetaFit:
    """A link by key (an Interconnect or an AlphaBetaFit passes through); ValueError naming the keys."""
    if isinstance(key, (Interconnect, AlphaBetaFit)):
        return key
    table = links()
    if key not in table:
        raise ValueError(f"link must be one of {sorted(table)} (or an Interconnect / AlphaBetaFit), got {key!r}")
    return table[key]


def collective_time(op: str, nbytes: float, p: int, link_key="nvlink4") -> float:
    """Predicted seconds of a ring ``op`` ("all_reduce", "all_gather", "reduce_scatter", "send") of
    ``nbytes`` over ``p`` ranks on ``link_key`` (a key of ``links()``, an Interconnect, or a fit): on a
    datasheet link the per-call base plus the ring model (nothing for p = 1, where nothing is sent)."""
    lk = link(link_key)
    if isinstance(lk, AlphaBetaFit):
        return lk.predict(op, nbytes, p)  # a measured fit may have two regimes
    ring = ring_time(op, nbytes, p, lk.alpha, lk.beta)
    return ring + (lk.base if (p > 1 or op == "send") else 0.0)


#: NCCL's low-latency (LL) protocol constants, µs (reference nccl_tuning_latency): base per call, per step
NCCL_LL = {"ring_base": 6.6, "tree_base": 6.8, "nvlink": 0.6, "net_ring": 2.7, "net_tree": 5.0}


def nccl_latency_us(algorithm: str, nodes: int, gpus_per_node: int = 8) -> float:
    """NCCL's latency model for a small all-reduce (LL protocol; NCCL's per-topology corrections left out):
    ring  base + (2(n − 1) − 2·nodes)·NVLink step + 2·nodes·network step   (one node: all 2(n − 1) on NVLink);
    tree  base + 2·((gpus_per_node − 1)·NVLink step + log2(nodes)·network step). n = nodes · gpus_per_node.
    The ring's latency grows with every GPU, the tree's with the log of the nodes."""
    import math

    for name, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    c, n = NCCL_LL, nodes * gpus_per_node
    if algorithm == "ring":
        inter = 2 * nodes if nodes > 1 else 0
        return c["ring_base"] + (2 * (n - 1) - inter) * c["nvlink"] + inter * c["net_ring"]
    if algorithm == "tree":
        return c["tree_base"] + 2 * ((gpus_per_node - 1) * c["nvlink"] + math.log2(nodes) * c["net_tree"])
    raise ValueError(f"algorithm must be 'ring' or 'tree', got {algorithm!r}")


def bus_bandwidth(op: str, nbytes: float, seconds: float, p: int) -> tuple[float, float]:
    """(algorithm bandwidth, bus bandwidth) in bytes/s as nccl-tests reports them: algbw = nbytes / seconds;
    busbw = algbw × 2(p − 1)/p for all-reduce, × (p − 1)/p for all-gather and reduce-scatter — the rate
    each link ran at, comparable with the link's bandwidth whatever p is."""
    from course_lib.parallel.alpha_beta import coefficients

    if not (seconds > 0 and nbytes > 0):
        raise ValueError(f"nbytes and seconds must be > 0, got {nbytes!r}, {seconds!r}")
    alg = nbytes / seconds
    return alg, alg * coefficients(op, p)[1]


def format_links(keys=None) -> str:
    """The links' figures with their sources and whether each is sourced or assumed, and what a small (16 KB)
    all-reduce over 8 GPUs costs on each."""
    table = links()
    keys = list(table) if keys is None else [link(k).key for k in keys]
    head = f"{'link':<9}{'GB/s':>7}{'':>9}{'α/step µs':>11}{'per call µs':>13}{'':>9}{'16 KB AR, p=8':>15}  sources"
    lines = [head, "-" * len(head)]
    for k in keys:
        lk = table[k]
        t = collective_time("all_reduce", 16e3, 8, lk)
        lines.append(
            f"{lk.key:<9}{lk.gbps:>7g}{lk.gbps_status:>9}{lk.latency_us:>11g}{lk.base_latency_us:>13g}"
            f"{lk.latency_status:>9}{t * 1e6:>12.1f} µs  {lk.reference}, {lk.latency_reference}"
        )
    return "\n".join(lines)


__all__ = [
    "NCCL_LL",
    "STATUSES",
    "Interconnect",
    "bus_bandwidth",
    "collective_time",
    "format_links",
    "interconnects_path",
    "link",
    "links",
    "nccl_latency_us",
]
