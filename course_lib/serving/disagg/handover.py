"""The KV cache handover of disaggregated serving: what it moves, over which link, and how.

The prefill worker computes a prompt's KV cache and sends it — 2 · layers · kv_heads · head_dim · bytes per
prompt token (``kv_transfer_bytes``) — over NVLink or InfiniBand (``link_gbps``) to the decode worker.
``extract_kv`` / ``install_kv`` read a sequence's K/V rows out of, and write them into, the contiguous
backend's per-layer tensors (two copies: bandwidth-bound); ``KVTransfer`` records what one handover cost,
measured and predicted at a link's bandwidth. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from course_lib.engine.attention.contiguous import ContiguousBackend

#: GB/s per direction of the links a KV cache can cross. PCIe and NVLink 4 from ``course_lib.bottlenecks.transfer.LINKS``
#: (references ``pcie_x16_bandwidth``, ``nvlink4_h100_bandwidth``: 900 GB/s bidirectional); InfiniBand NDR: one
#: 400 Gb/s port per GPU (``infiniband_ndr_bandwidth``), the inter-node path of DistServe and Splitwise.
INFINIBAND_NDR_GBPS = 400 / 8


def link_gbps(link: str | float) -> float:
    """GB/s of ``link``: a key of ``transfer.LINKS`` ("pcie4_x16", "pcie5_x16", "nvlink4"), "infiniband_ndr",
    or a positive number of GB/s."""
    from course_lib.bottlenecks.transfer import LINKS

    if isinstance(link, (int, float)) and not isinstance(link, bool):
        if not math.isfinite(link) or link <= 0:
            raise ValueError(f"link must be a positive number of GB/s or a link name, got {link!r}")
        return float(link)
    if link == "infiniband_ndr":
        return INFINIBAND_NDR_GBPS
    if isinstance(link, str) and link in LINKS and link != "hbm3_h100":
        return LINKS[link].gbps
    names = sorted(k for k in LINKS if k != "hbm3_h100") + ["infiniband_ndr"]
    raise ValueError(f"link must be one of {names} or a positive number of GB/s, got {link!r}")


def link_latency_s(link: str | float) -> float:
    """The one-message latency of ``link`` in seconds, from ``data/interconnects.json`` (0 for a bare GB/s):
    one NCCL call over one hop, its per-call base (``base_latency_us``) plus one step's latency
    (``latency_us``), NCCL's own tuning constants (7.2 µs over NVLink, 9.3 µs over InfiniBand)."""
    import json

    from course_lib.core.paths import data_dir

    link_gbps(link)  # the same names, the same error
    if not isinstance(link, str):
        return 0.0
    key = "ib_ndr" if link == "infiniband_ndr" else link
    table = {e["key"]: e for e in json.loads((data_dir() / "interconnects.json").read_text())["links"]}
    if key not in table:
        return 0.0
    entry = table[key]
    return (float(entry.get("base_latency_us", 0.0)) + float(entry["latency_us"])) * 1e-6


def transfer_s(num_bytes: float, link: str | float = "nvlink4") -> float:
    """Seconds to ship ``num_bytes`` over ``link``: its message latency plus bytes ÷ datasheet bandwidth."""
    return link_latency_s(link) + num_bytes / (link_gbps(link) * 1e9)


def kv_transfer_bytes(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int, prompt_len: int) -> int:
    """Bytes of a prompt's KV cache: 2 (K and V) · layers · kv_heads · head_dim · bytes · prompt_len."""
    for name, value in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("dtype_bytes", dtype_bytes),
        ("prompt_len", prompt_len),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes * prompt_len


def _check_contiguous(backend) -> ContiguousBackend:
    if not isinstance(backend, ContiguousBackend):
        raise ValueError(
            f"backend must be a ContiguousBackend (per-layer K/V of shape (rows, kv_heads, max_len, head_dim)), "
            f"got {type(backend).__name__}"
        )
    return backend


def extract_kv(backend: ContiguousBackend, handle, length: int | None = None) -> torch.Tensor:
    """A copy of one sequence's K and V for positions ``0..length-1`` (default: all it holds), as one tensor
    (2, layers, kv_heads, length, head_dim): index 0 is K, 1 is V. Reads exactly ``kv_transfer_bytes``."""
    kv = _check_contiguous(backend)
    held = kv.length(handle)  # raises ValueError for a dead handle
    n = held if length is None else length
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= held:
        raise ValueError(f"length must be an int in [1, {held}] (tokens this sequence holds), got {length!r}")
    out = torch.empty((2, kv.num_layers, kv.num_kv_heads, n, kv.head_dim), dtype=kv.dtype, device=kv.device)
    for layer in range(kv.num_layers):
        out[0, layer] = kv.k[layer][handle, :, :n]  # (Hkv, n, hd) of the layer's (rows, Hkv, max_len, hd)
        out[1, layer] = kv.v[layer][handle, :, :n]
    return out


def install_kv(backend: ContiguousBackend, kv: torch.Tensor):
    """Allocate a new sequence in ``backend``, make room for the tokens of ``kv`` (2, layers, kv_heads, n,
    head_dim) and copy them into its slots; returns the handle (freed again if anything fails)."""
    be = _check_contiguous(backend)
    expected = (2, be.num_layers, be.num_kv_heads, None, be.head_dim)
    if (
        not isinstance(kv, torch.Tensor)
        or kv.dim() != 5
        or any(e is not None and s != e for s, e in zip(kv.shape, expected))
    ):
        shape = tuple(kv.shape) if isinstance(kv, torch.Tensor) else type(kv).__name__
        raise ValueError(
            f"kv must be a tensor (2, {be.num_layers}, {be.num_kv_heads}, n, {be.head_dim}) matching the backend, "
            f"got {shape}"
        )
    n = kv.shape[3]
    if not be.can_allocate(n):
        raise RuntimeError(f"no room for a {n}-token sequence: {be.num_free_rows()} free rows, max_len {be.max_len}")
    handle = be.allocate()
    try:
        be.append(handle, n)
        kv = kv.to(device=be.device, dtype=be.dtype)
        for layer in range(be.num_layers):
            be.k[layer][handle, :, :n] = kv[0, layer]  # (Hkv, n, hd)
            be.v[layer][handle, :, :n] = kv[1, layer]
    except BaseException:
        be.free(handle)
        raise
    return handle


@dataclass(frozen=True)
class KVTransfer:
    """One prompt's KV cache handed from the prefill worker to the decode worker, and what it cost."""

    request_id: str | int
    prompt_tokens: int
    bytes: int
    extract_s: float  # slicing the prefill cache into one buffer and moving it to shared memory
    queue_s: float  # put → get: pickling, fd passing, and waiting for the decode worker's step to end
    install_s: float  # allocate + copy into the decode worker's cache

    @property
    def seconds(self) -> float:
        """Measured, end to end: extract + queue + install."""
        return self.extract_s + self.queue_s + self.install_s

    @property
    def copy_gbps(self) -> float:
        """GB/s of the two copies alone (extract and install), the part a link would replace."""
        return self.bytes / max(self.extract_s + self.install_s, 1e-12) / 1e9

    def predicted_s(self, link: str | float = "nvlink4") -> float:
        """Seconds over ``link``: its latency (``data/interconnects.json``'s latency_us, the α of one message)
        plus the bytes at its datasheet bandwidth (a lower bound: no protocol overhead). A number of GB/s has
        no latency."""
        return transfer_s(self.bytes, link)
