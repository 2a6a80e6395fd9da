"""KV caches without tensors for the simulator: the contiguous cache's slot accounting and the paged cache's
block accounting (reference counts, prefix cache) of the real backends, sized exactly as ``Engine`` sizes
them, so the very same ``Scheduler`` admits, preempts and finishes as it would. Introduced in
06_batching_serving.ipynb."""

from __future__ import annotations

from course_lib.engine.attention.contiguous import ContiguousBackend
from course_lib.engine.attention.paged import PagedBackend
from course_lib.engine.scheduler import SchedulerConfig

KV_CACHES = ("contiguous", "paged")


class SimContiguousBackend(ContiguousBackend):
    """The contiguous cache's slot accounting (rows, lengths, bytes) without its tensors."""

    name = "sim-contiguous"

    def _ensure_capacity(self, rows: int) -> None:
        pass  # bookkeeping only: never allocate the K/V tensors

    def prepare(self, *args, **kwargs):
        raise RuntimeError("a simulated backend holds no K/V: it cannot run a forward")

    forward = prepare


class SimPagedBackend(PagedBackend):
    """The paged cache's block accounting (``BlockManager``: blocks, reference counts) without its pools."""

    name = "sim-paged"

    def _ensure_capacity(self, blocks: int) -> None:
        pass

    def prepare(self, *args, **kwargs):
        raise RuntimeError("a simulated backend holds no K/V: it cannot run a forward")

    forward = prepare


def sim_backend(
    config: SchedulerConfig,
    kv_cache: str = "contiguous",
    block_size: int = 16,
    layout=(6, 2, 32),
    prefix_caching: bool = False,
):
    """A bookkeeping backend sized exactly as ``Engine`` sizes the real one for ``config`` (``max_model_len``
    must be set). ``layout``: (layers, kv_heads, head_dim), only for the byte counts. ``prefix_caching``
    (paged only): the paged backend's own prefix cache, blocks shared by reference count."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache must be one of {KV_CACHES}, got {kv_cache!r}")
    if prefix_caching and kv_cache != "paged":
        raise ValueError("prefix_caching needs kv_cache='paged' (blocks that sequences can share)")
    if config.max_model_len is None:
        raise ValueError("config.max_model_len must be set (the engine takes it from the model)")
    layers, heads, hd = (int(x) for x in layout)
    if kv_cache == "paged":
        tokens = config.max_kv_tokens or config.max_num_seqs * config.max_model_len
        blocks = -(-tokens // block_size)
        extra = {"prefix_caching": True} if prefix_caching else {}  # only where the backend has it
        return SimPagedBackend(layers, heads, hd, blocks, block_size, config.max_model_len, decode="gather", **extra)
    rows = config.max_num_seqs
    if config.max_kv_tokens is not None:
        rows = min(rows, config.max_kv_tokens // config.max_model_len)
        if rows == 0:
            raise ValueError("config.max_kv_tokens cannot hold one sequence of max_model_len tokens")
    return SimContiguousBackend(layers, heads, hd, config.max_model_len, rows)
