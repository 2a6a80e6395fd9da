"""The links between GPUs, with sourced figures: NVLink, PCIe and InfiniBand from ``data/interconnects.json``.

Each link is a per-direction datasheet bandwidth (1/β) and a typical latency (α), each with the
``data/references.json`` key it comes from (loading checks that every figure has a source). A datasheet
link moves data by DMA between buffers allocated once, so it keeps one β at every size; ``collective_time``
predicts a ring collective on one with the α–β model of ``course_lib.parallel.alpha_beta`` (a measured
``AlphaBetaFit`` passes through wherever a link is asked for). Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from course_lib.parallel.alpha_beta import AlphaBetaFit, ring_time


@dataclass(frozen=True)
class Interconnect:
    """One link of ``data/interconnects.json``: per-direction datasheet bandwidth and a typical latency."""

    key: str
    name: str
    gbps: float  # GB/s per GPU, one direction
    latency_us: float  # α: fixed cost of one message
    scope: str  # "node" (inside a server) or "cluster" (between servers)
    reference: str  # data/references.json key of the bandwidth
    latency_reference: str
    note: str = ""

    @property
    def alpha(self) -> float:
        """Seconds per message."""
        return self.latency_us * 1e-6

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 1.0 / (self.gbps * 1e9)


def interconnects_path() -> Path:
    from course_lib.core.paths import data_dir

    return data_dir() / "interconnects.json"


@lru_cache(maxsize=4)
def _load_links(path: str) -> dict[str, Interconnect]:
    from course_lib.measure.references import reference

    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    out = {}
    for entry in raw["links"]:
        link = Interconnect(**entry)
        if not (link.gbps > 0 and link.latency_us > 0):
            raise ValueError(f"{path}: link {link.key!r} needs gbps > 0 and latency_us > 0")
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
    ``nbytes`` over ``p`` ranks on ``link_key`` (a key of ``links()``, an Interconnect, or a fit)."""
    lk = link(link_key)
    if isinstance(lk, AlphaBetaFit):
        return lk.predict(op, nbytes, p)  # a measured fit may have two regimes
    return ring_time(op, nbytes, p, lk.alpha, lk.beta)


__all__ = ["Interconnect", "collective_time", "interconnects_path", "link", "links"]
