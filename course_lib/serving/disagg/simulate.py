"""Disaggregation at a real scale: a discrete-event model (a Llama-3-8B preset on datasheet H100s under
Poisson load) that shows when splitting prefill and decode pays. Prefill time from FLOPs (compute-bound),
decode steps from bytes (bandwidth-bound: weights + every running sequence's KV), transfers from link
bandwidth; colocated GPUs run prefill-first, so a prompt stalls every decode beside it.
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from course_lib.measure.metrics import SLO, percentiles
from course_lib.serving.disagg.handover import link_gbps
from course_lib.serving.traces import poisson_arrivals


@dataclass(frozen=True)
class SimConfig:
    """A serving scenario for the discrete-event model: a model preset on datasheet GPUs under Poisson load.

    Times are roofline lower bounds scaled by the efficiencies (1.0 = datasheet peak): prefill of k
    prompts = max(FLOPs / peak, bytes / bandwidth) (compute-bound for any real prompt), a decode step =
    (weights + every running sequence's KV) / bandwidth, a KV transfer = prompt KV bytes / link bandwidth.
    """

    model: str = "llama-3-8b"
    gpu: str = "H100 SXM"
    dtype: str = "bf16"
    prompt_len: int = 2048
    output_len: int = 256
    num_requests: int = 300
    max_batch: int = 128  # decode sequences per GPU
    max_prefill_tokens: int = 8192  # prompt tokens in one prefill batch (at least one prompt)
    link: str | float = "nvlink4"
    compute_efficiency: float = 1.0
    bandwidth_efficiency: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        from course_lib.measure.hardware.datasheet import gpu_spec
        from course_lib.models.accounting import ModelShape

        ModelShape.from_name(self.model)  # ValueError naming the presets
        gpu_spec(self.gpu)
        link_gbps(self.link)
        for name in ("prompt_len", "output_len", "num_requests", "max_batch", "max_prefill_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"SimConfig.{name} must be a positive int, got {v!r}")
        for name in ("compute_efficiency", "bandwidth_efficiency"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v <= 1:
                raise ValueError(f"SimConfig.{name} must be a number in (0, 1], got {v!r}")


class _Costs:
    """Step times of one scenario, from ``models.accounting`` and the GPU's datasheet."""

    def __init__(self, cfg: SimConfig) -> None:
        from course_lib.measure.hardware.datasheet import gpu_spec
        from course_lib.models.accounting import ModelShape, kv_bytes_per_token

        self.cfg = cfg
        self.shape = ModelShape.from_name(cfg.model)
        spec = gpu_spec(cfg.gpu)
        self.flops = spec.peak_flops(spec.best_dtype(cfg.dtype)) * cfg.compute_efficiency
        self.bw = spec.bandwidth * cfg.bandwidth_efficiency
        self.kv_per_token = kv_bytes_per_token(self.shape, cfg.dtype)
        self.link = link_gbps(cfg.link) * 1e9

    def prefill(self, n_prompts: int) -> float:
        from course_lib.bottlenecks.time_floors import prefill_time

        return prefill_time(self.shape, self.cfg.prompt_len, self.flops, self.bw, self.cfg.dtype, batch=n_prompts)

    def decode(self, contexts: list[int]) -> float:
        """(weights + KV of every running sequence) / bandwidth, or FLOPs / peak if larger."""
        from course_lib.models.accounting import decode_flops, weights_read_per_step

        b = len(contexts)
        by = weights_read_per_step(self.shape, b, self.cfg.dtype) + self.kv_per_token * sum(contexts)
        fl = decode_flops(self.shape, max(contexts), b)
        return max(by / self.bw, fl / self.flops)

    def transfer(self) -> float:
        return self.kv_per_token * self.cfg.prompt_len / self.link


@dataclass
class SimResult:
    """Per-request times of one simulated run (seconds); ``gpus`` = all GPUs of the setup."""

    setup: str
    rate: float
    gpus: int
    ttft: np.ndarray
    tpot: np.ndarray
    max_itl: np.ndarray  # the longest gap between two tokens of each request: the stall a user sees
    transfer_s: float  # one prompt's KV transfer (0 colocated)

    def attainment(self, slo: SLO) -> float:
        """Fraction of requests meeting both TTFT and TPOT targets."""
        ok = (self.ttft <= slo.ttft_s + 1e-12) & (self.tpot <= slo.tpot_s + 1e-12)
        return float(ok.mean())

    def goodput_per_gpu(self, slo: SLO) -> float:
        """Requests/s per GPU that meet the SLO (offered rate × attainment / GPUs)."""
        return self.rate * self.attainment(slo) / self.gpus

    def row(self, slo: SLO | None = None, ps=(50, 90, 99)) -> dict:
        out = {"setup": self.setup, "rate": self.rate, "gpus": self.gpus}
        out.update({f"ttft_p{p}": v for p, v in percentiles(self.ttft, ps).items()})
        out.update({f"tpot_p{p}": v for p, v in percentiles(self.tpot, ps).items()})
        out["max_itl_p99"] = percentiles(self.max_itl, (99,))[99]
        if slo is not None:
            out["attainment"] = self.attainment(slo)
            out["goodput_per_gpu"] = self.goodput_per_gpu(slo)
        return out


def _arrivals(cfg: SimConfig, rate: float) -> np.ndarray:
    return poisson_arrivals(rate, cfg.num_requests, cfg.seed)


def _decode_step(costs: _Costs, running: list[list], t: float, last: np.ndarray, itl: np.ndarray):
    """One decode step of every running request ([id, context, generated, last token time]) from time ``t``:
    each gets a token, its longest gap and (when done) its last token time are recorded. Returns the time
    after the step and the requests still running."""
    t += costs.decode([r[1] for r in running])
    for r in running:
        itl[r[0]] = max(itl[r[0]], t - r[3])
        r[1], r[2], r[3] = r[1] + 1, r[2] + 1, t
        if r[2] == costs.cfg.output_len:
            last[r[0]] = t
    return t, [r for r in running if r[2] < costs.cfg.output_len]


def _decode_gpu(costs: _Costs, ready: list[tuple[float, int]], first: np.ndarray, last: np.ndarray, itl: np.ndarray):
    """One decode GPU: requests (ready time, id) join at step boundaries (first token then), then one token
    per step until ``output_len``. Fills ``first`` / ``last`` token times and the longest gap."""
    cfg = costs.cfg
    ready = deque(sorted(ready))
    running: list[list] = []  # [id, context, generated, last token time]
    t = 0.0
    while ready or running:
        while ready and ready[0][0] <= t and len(running) < cfg.max_batch:
            _, i = ready.popleft()
            first[i] = t
            running.append([i, cfg.prompt_len + 1, 1, t])
            if cfg.output_len == 1:
                last[i] = t
                running.pop()
        if not running:
            t = max(t, ready[0][0])
            continue
        t, running = _decode_step(costs, running, t, last, itl)


def simulate_colocated(cfg: SimConfig, rate: float, num_gpus: int = 1) -> SimResult:
    """``num_gpus`` GPUs each doing both phases (requests round-robin), prefill-first as vLLM without chunked
    prefill: whenever prompts wait, the next step is their prefill and every running decode stalls for it."""
    if not isinstance(num_gpus, int) or isinstance(num_gpus, bool) or num_gpus <= 0:
        raise ValueError(f"num_gpus must be a positive int, got {num_gpus!r}")
    costs = _Costs(cfg)
    arr = _arrivals(cfg, rate)
    n = len(arr)
    first, last, itl = np.zeros(n), np.zeros(n), np.zeros(n)
    per_prefill = max(1, cfg.max_prefill_tokens // cfg.prompt_len)
    for g in range(num_gpus):
        mine = deque(range(g, n, num_gpus))
        waiting: deque = deque()
        running: list[list] = []
        t = 0.0
        while mine or waiting or running:
            while mine and arr[mine[0]] <= t:
                waiting.append(mine.popleft())
            if not waiting and not running:
                t = arr[mine[0]]
                continue
            room = cfg.max_batch - len(running)
            if waiting and room > 0:  # prefill-first: the decodes wait
                batch = [waiting.popleft() for _ in range(min(len(waiting), room, per_prefill))]
                t += costs.prefill(len(batch))
                for i in batch:
                    first[i] = t
                    if cfg.output_len == 1:
                        last[i] = t
                    else:
                        running.append([i, cfg.prompt_len + 1, 1, t])
                for r in running:
                    itl[r[0]] = max(itl[r[0]], t - r[3])
                continue
            t, running = _decode_step(costs, running, t, last, itl)
    tpot = (last - first) / max(cfg.output_len - 1, 1)
    return SimResult(f"colocated ×{num_gpus}", float(rate), num_gpus, first - arr, tpot, itl, 0.0)


def simulate_disaggregated(cfg: SimConfig, rate: float, num_prefill: int = 1, num_decode: int = 1) -> SimResult:
    """``num_prefill`` prefill GPUs (FIFO, prompts batched up to ``max_prefill_tokens``) and ``num_decode``
    decode GPUs. Each prompt's KV crosses ``cfg.link`` (serialised per prefill GPU) before its decode GPU
    admits it; the first token reaches the user then, so TTFT = queue + prefill + transfer."""
    for name, v in (("num_prefill", num_prefill), ("num_decode", num_decode)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    costs = _Costs(cfg)
    arr = _arrivals(cfg, rate)
    n = len(arr)
    ready = np.zeros(n)
    per_prefill = max(1, cfg.max_prefill_tokens // cfg.prompt_len)
    xfer = costs.transfer()
    for g in range(num_prefill):
        mine = deque(range(g, n, num_prefill))
        t = link_free = 0.0
        while mine:
            t = max(t, arr[mine[0]])
            batch = []
            while mine and arr[mine[0]] <= t and len(batch) < per_prefill:
                batch.append(mine.popleft())
            t += costs.prefill(len(batch))
            for i in batch:
                link_free = max(t, link_free) + xfer
                ready[i] = link_free
    first, last, itl = np.zeros(n), np.zeros(n), np.zeros(n)
    order = np.argsort(ready, kind="stable")
    for g in range(num_decode):
        _decode_gpu(costs, [(ready[i], int(i)) for i in order[g::num_decode]], first, last, itl)
    tpot = (last - first) / max(cfg.output_len - 1, 1)
    setup = f"disaggregated {num_prefill}P+{num_decode}D"
    return SimResult(setup, float(rate), num_prefill + num_decode, first - arr, tpot, itl, xfer)


def prefill_capacity_rps(cfg: SimConfig) -> float:
    """Prompts per second one prefill GPU can compute, batched as the simulation batches them: the arrival
    rate at which a single prefill GPU saturates and TTFT starts to climb without bound."""
    per_prefill = max(1, cfg.max_prefill_tokens // cfg.prompt_len)
    return per_prefill / _Costs(cfg).prefill(per_prefill)
