"""Prefill/decode disaggregation: prompts on one worker, decoding on another, the KV cache sent between.

Prefill is compute-bound (every weight meets hundreds of tokens), decode is bandwidth-bound (every
weight is read for one token per sequence). On one GPU the two interfere: a long prefill stalls every
running decode for its whole duration, so TPOT spikes whenever a prompt arrives. DistServe (Zhong et al.)
and Splitwise (Patel et al.; references ``distserve``, ``splitwise``) run them on different GPUs instead
(NVIDIA calls it *disaggregated serving*): the prefill GPU computes the prompt's KV cache and sends it —
2 · layers · kv_heads · head_dim · bytes per prompt token — over NVLink or InfiniBand to a decode GPU,
which continues from the first sampled token. The price is that transfer, and GPUs that each do only one
phase.

The parts:
- ``handover``: ``extract_kv`` / ``install_kv``, a sequence's K/V rows read out of, and written into, the
  contiguous backend's per-layer tensors; ``kv_transfer_bytes``, the formula they must match; links.
- ``workers`` and ``server``: ``DisaggregatedServer``, two real worker processes (``core.procs``: forked
  from a server that imported torch once), each with its own ``Engine``. The KV travels as one tensor through a ``torch.multiprocessing``
  queue (shared memory on a CPU); every transfer is accounted (``KVTransfer``). ``colocated``: the
  one-engine baseline, ``serve_colocated``; ``run``: the ``ServingRun`` both return.
- ``simulate``: ``simulate_colocated`` / ``simulate_disaggregated``, a discrete-event model at a real scale
  (a Llama-3-8B preset on datasheet H100s) that shows when disaggregation pays; ``chunked``: the
  colocated baseline with chunked prefill (``simulate_colocated_chunked``, ``best_chunk_budget``); ``sweep`` (``sweep_rates``,
  ``max_goodput_per_gpu``, ``goodput_margin``, ``side_by_side``) and ``plot`` (``plot_disagg_sweep``) for the notebook.
Introduced in 06_batching_serving.ipynb.
"""

from course_lib.serving.disagg.chunked import best_chunk_budget, simulate_colocated_chunked
from course_lib.serving.disagg.colocated import serve_colocated
from course_lib.serving.disagg.handover import (
    INFINIBAND_NDR_GBPS,
    KVTransfer,
    extract_kv,
    install_kv,
    kv_transfer_bytes,
    link_gbps,
)
from course_lib.serving.disagg.plot import plot_disagg_sweep
from course_lib.serving.disagg.run import ServingRun
from course_lib.serving.disagg.server import DisaggregatedServer, WorkerError
from course_lib.serving.disagg.simulate import SimConfig, SimResult, simulate_colocated, simulate_disaggregated
from course_lib.serving.disagg.sweep import goodput_margin, max_goodput_per_gpu, side_by_side, sweep_rates

# fmt: off
__all__ = [
    "DisaggregatedServer", "INFINIBAND_NDR_GBPS", "KVTransfer", "ServingRun", "SimConfig", "SimResult",
    "WorkerError", "best_chunk_budget", "extract_kv", "goodput_margin", "install_kv", "kv_transfer_bytes",
    "link_gbps", "max_goodput_per_gpu", "plot_disagg_sweep", "serve_colocated", "side_by_side",
    "simulate_colocated", "simulate_colocated_chunked", "simulate_disaggregated", "sweep_rates",
]
# fmt: on
