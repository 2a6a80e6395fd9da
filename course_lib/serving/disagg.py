"""Prefill/decode disaggregation: prompts on one worker, decoding on another, the KV cache sent between.

Prefill is compute-bound (every weight meets hundreds of tokens), decode is bandwidth-bound (every
weight is read for one token per sequence). On one GPU the two interfere: a long prefill stalls every
running decode for its whole duration, so TPOT spikes whenever a prompt arrives. DistServe (Zhong et al.)
and Splitwise (Patel et al.; references ``distserve``, ``splitwise``) run them on different GPUs instead (NVIDIA calls it *disaggregated
serving*): the prefill GPU computes the prompt's KV cache and sends it — 2 · layers · kv_heads ·
head_dim · bytes per prompt token — over NVLink or InfiniBand to a decode GPU, which continues from
the first sampled token. The price is that transfer, and GPUs that each do only one phase.

This module has three parts:
- ``extract_kv`` / ``install_kv``: a sequence's K/V rows read out of, and written into, the contiguous
  backend's per-layer tensors; ``kv_transfer_bytes`` is the formula they must match.
- ``DisaggregatedServer``: two real worker processes (``torch.multiprocessing``, spawn), each with its own
  ``Engine``. The KV travels as one tensor through a ``torch.multiprocessing`` queue (shared memory on a
  CPU). Every transfer is accounted (``KVTransfer``: bytes, measured seconds, predicted seconds at a link's
  bandwidth). On a 2-core CPU the two workers *share* the cores, so nothing here is faster than the
  colocated engine: the point is the mechanism and the accounting, not the speed.
- ``simulate_colocated`` / ``simulate_disaggregated``: a discrete-event model at a real scale (a Llama-3-8B
  preset on datasheet H100s) that shows when disaggregation pays: prefill time from FLOPs, decode steps
  from bytes, transfers from link bandwidth; ``sweep_rates`` and ``plot_disagg_sweep`` for the notebook.
Introduced in 06_batching_serving.ipynb.
"""

from __future__ import annotations

import math
import os
import queue
import time
import traceback
from collections import deque
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.multiprocessing as mp

from course_lib.engine.attention.contiguous import ContiguousBackend
from course_lib.engine.sampling import SamplingParams
from course_lib.measure.metrics import SLO, RequestTrace, percentiles
from course_lib.serving.traces import poisson_arrivals
from course_lib.serving.workload import Request

# ----------------------------------------------------------------------------- links
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


# ----------------------------------------------------------------------------- KV slices
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


# ----------------------------------------------------------------------------- the two workers
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
        """Seconds at ``link``'s datasheet bandwidth (a lower bound: no protocol overhead)."""
        return self.bytes / (link_gbps(link) * 1e9)


@dataclass
class _Prefilled:
    """What the prefill worker sends: the request, its first token and its KV (a shared-memory tensor)."""

    request_id: str | int
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float
    first_token: int
    kv: torch.Tensor  # (2, layers, Hkv, n, hd)
    generator_state: torch.Tensor | None  # the seeded generator after the first draw
    extract_s: float
    sent: float  # perf_counter after put()


class WorkerError(RuntimeError):
    """A worker process failed or died; the message holds its role and traceback."""


_POLL_S = 0.05


def _parent_alive() -> bool:
    parent = mp.parent_process()
    return parent is None or parent.is_alive()


def _drain(q, block: bool) -> list:
    """Everything waiting in ``q``; when ``block``, wait for at least one message (or the parent's death)."""
    items = []
    while block and not items:
        try:
            items.append(q.get(timeout=_POLL_S))
        except queue.Empty:
            if not _parent_alive():
                raise SystemExit(0) from None
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items


def _token_msg(ev) -> tuple:
    return ("token", ev.request, ev.token_id, ev.time, ev.index, ev.finished, ev.finish_reason)


def _exit(code: int, *queues) -> None:
    """Flush what this worker put on ``queues``, then leave at once: a normal exit would spend seconds
    finalising torch and transformers, and the server's ``close()`` would wait for it."""
    for q in queues:
        q.close()
        q.join_thread()
    os._exit(code)


def _worker_setup(model, config, threads):
    from course_lib.engine import Engine

    torch.set_num_threads(threads)
    return Engine(model, config=config, kv_cache="contiguous")


def _prefill_worker(model, config, threads, inq, kvq, outq, done, fault) -> None:
    """Run prompts to their first token, ship each KV cache to the decode worker, free it here."""
    try:
        engine = _worker_setup(model, config, threads)
        outq.put(("ready", "prefill", None))
        seqs, stopping = {}, False
        while True:
            for msg in _drain(inq, block=not engine.has_unfinished()):
                if msg is None:
                    stopping = True
                    continue
                if fault == "prefill":
                    raise RuntimeError("injected fault in the prefill worker")
                rid, ids, params, arrival = msg
                seqs[rid] = engine.add_request(ids, params, request_id=rid, arrival=arrival)
            if stopping and not engine.has_unfinished():
                break
            for ev in engine.step():  # continuous batching of prompts; each leaves after its first token
                seq = seqs.pop(ev.request)
                if ev.finished:  # EOS, a stop string or max_new_tokens=1: nothing to hand over
                    outq.put(_token_msg(ev))
                    continue
                t0 = time.perf_counter()
                kv = extract_kv(engine.backend, seq.kv, seq.num_prompt_tokens)  # (2, L, Hkv, n, hd)
                kv.share_memory_()  # the queue then passes a file descriptor, not the bytes
                state = seq.generator.get_state() if seq.generator is not None else None
                engine.abort(ev.request)  # frees this worker's copy of the KV
                extract_s = time.perf_counter() - t0
                item = _Prefilled(
                    ev.request, seq.prompt_ids, seq.params, seq.arrival, ev.token_id, kv, state, extract_s, 0.0
                )
                item.sent = time.perf_counter()
                kvq.put(item)
        kvq.put(None)
        # shared-memory tensors are fetched from this process when unpickled: stay until the decode side is done
        while not done.wait(_POLL_S):
            if not _parent_alive():
                break
    except BaseException:  # noqa: BLE001 - every failure is reported, then the worker exits
        outq.put(("error", "prefill", traceback.format_exc()))
        kvq.put(None)
        code = 1
    else:
        code = 0
    _exit(code, kvq, outq)


def _admit_prefilled(engine, item: _Prefilled, received: float, outq) -> None:
    """Install a handed-over sequence as RUNNING with its prompt cached; the next step decodes it."""
    from course_lib.engine.sequence import Sequence, SequenceStatus

    t0 = time.perf_counter()
    handle = install_kv(engine.backend, item.kv)
    seq = Sequence(item.request_id, item.prompt_ids, item.params, item.arrival, engine.device)
    if item.generator_state is not None and seq.generator is not None:
        seq.generator.set_state(item.generator_state)  # the same random stream as a colocated run
    now = time.perf_counter()
    seq.token_ids.append(item.first_token)
    seq.token_times.append(now)  # the first token reaches the user from here, with the rest of the stream
    seq.kv, seq.num_cached_tokens, seq.status = handle, item.kv.shape[3], SequenceStatus.RUNNING
    engine._live[seq.request_id] = seq  # the engine's own bookkeeping, as add_request + a prefill step leave it
    engine.scheduler.running.append(seq)
    n = item.kv.shape[3]
    outq.put(("token", seq.request_id, item.first_token, now, 0, False, None))
    nbytes = item.kv.numel() * item.kv.element_size()
    outq.put(("transfer", KVTransfer(seq.request_id, n, nbytes, item.extract_s, received - item.sent, now - t0)))


def _decode_worker(model, config, threads, kvq, outq, done, fault) -> None:
    """Install arriving KV caches and decode every running sequence, one step at a time."""
    try:
        engine = _worker_setup(model, config, threads)
        outq.put(("ready", "decode", None))
        pending: deque = deque()
        stopping = False
        while True:
            idle = not engine.has_unfinished() and not pending
            for msg in _drain(kvq, block=idle):
                if msg is None:
                    stopping = True
                else:
                    pending.append((msg, time.perf_counter()))
            while pending:
                item, received = pending[0]
                if fault == "decode":
                    raise RuntimeError("injected fault in the decode worker")
                full = len(engine.scheduler.running) >= engine.config.max_num_seqs
                if full or not engine.backend.can_allocate(item.kv.shape[3] + item.params.max_new_tokens):
                    break  # no room yet: admitted at a later step boundary
                pending.popleft()
                _admit_prefilled(engine, item, received, outq)
            if stopping and not pending and not engine.has_unfinished():
                break
            for ev in engine.step():
                outq.put(_token_msg(ev))
        outq.put(("stopped", "decode", None))
    except BaseException:  # noqa: BLE001
        outq.put(("error", "decode", traceback.format_exc()))
        code = 1
    else:
        code = 0
    done.set()
    _exit(code, outq)


@dataclass
class ServingRun:
    """Traces of one served workload (in request order), the generated ids, and (disaggregated) the transfers."""

    traces: list[RequestTrace]
    outputs: list[list[int]]
    transfers: list[KVTransfer] = field(default_factory=list)

    def transfer_bytes(self) -> int:
        return sum(t.bytes for t in self.transfers)


def _check_requests(requests, arrivals) -> tuple[list[Request], list[float]]:
    requests = list(requests)
    if not requests or not all(isinstance(r, Request) for r in requests):
        raise ValueError("requests must be a non-empty sequence of serving.workload.Request")
    arrivals = [0.0] * len(requests) if arrivals is None else [float(a) for a in arrivals]
    if len(arrivals) != len(requests):
        raise ValueError(f"arrivals must hold one time per request ({len(requests)}), got {len(arrivals)}")
    if any(not math.isfinite(a) or a < 0 for a in arrivals) or any(b < a for a, b in zip(arrivals, arrivals[1:])):
        raise ValueError("arrivals must be finite, non-negative, non-decreasing seconds after the start")
    return requests, arrivals


def _params(r: Request) -> SamplingParams:
    return SamplingParams(max_new_tokens=r.max_new_tokens, ignore_eos=True)


def serve_colocated(engine, requests: SequenceABC[Request], arrivals: SequenceABC[float] | None = None) -> ServingRun:
    """The baseline: one engine in this process, requests added at their arrival times (s after the start),
    greedy with ``ignore_eos``; prefills and decodes share its steps (continuous batching)."""
    requests, arrivals = _check_requests(requests, arrivals)
    if engine.has_unfinished():
        raise RuntimeError("serve_colocated needs an idle engine")
    start = time.perf_counter()
    times: list[list[float]] = [[] for _ in requests]
    outputs: list[list[int]] = [[] for _ in requests]
    nxt = 0
    while nxt < len(requests) or engine.has_unfinished():
        now = time.perf_counter() - start
        while nxt < len(requests) and arrivals[nxt] <= now:
            r = requests[nxt]
            engine.add_request(list(r.prompt_ids), _params(r), request_id=nxt, arrival=start + arrivals[nxt])
            nxt += 1
        if not engine.has_unfinished():
            time.sleep(max(0.0, min(arrivals[nxt] - now, _POLL_S)))
            continue
        for ev in engine.step():
            outputs[ev.request].append(ev.token_id)
            times[ev.request].append(ev.time)
    traces = [
        RequestTrace(i, start + a, len(r.prompt_ids), t, finish=t[-1])
        for i, (r, a, t) in enumerate(zip(requests, arrivals, times))
    ]
    return ServingRun(traces, outputs)


class DisaggregatedServer:
    """A prefill worker and a decode worker, each its own process with its own ``Engine``; this process
    only routes requests in and tokens out.

        with DisaggregatedServer("tiny-target") as server:
            run = server.serve(requests, arrivals)      # traces, outputs, one KVTransfer per request

    Token times are ``time.perf_counter()`` in the workers: CLOCK_MONOTONIC, one clock for every process
    of the machine, so TTFT and TPOT mix them safely. The first token is emitted when the decode worker
    has installed the KV (it streams the whole answer), so TTFT includes the transfer. On a 2-core CPU
    the workers share the cores with each other and with this process (one torch thread each by
    default): expect no speed-up here, only the mechanism and the byte accounting.
    Shutdown is clean even on error: ``close()`` asks, then terminates, then kills; the workers are daemonic
    and leave by themselves when this process dies.
    """

    def __init__(
        self,
        model: str = "tiny-target",
        config=None,
        *,
        threads_per_worker: int = 1,
        start_timeout: float = 180.0,
        _fault: str | None = None,  # tests: "prefill" or "decode" raises in that worker at its first request
    ) -> None:
        if not isinstance(threads_per_worker, int) or isinstance(threads_per_worker, bool) or threads_per_worker <= 0:
            raise ValueError(f"threads_per_worker must be a positive int, got {threads_per_worker!r}")
        if not isinstance(start_timeout, (int, float)) or start_timeout <= 0:
            raise ValueError(f"start_timeout must be a positive number of seconds, got {start_timeout!r}")
        if _fault not in (None, "prefill", "decode"):
            raise ValueError(f"_fault must be None, 'prefill' or 'decode', got {_fault!r}")
        self.model, self.config, self.threads = model, config, threads_per_worker
        self.start_timeout = float(start_timeout)
        self._fault = _fault
        self.processes: list = []
        self._next_id = 0

    # ------------------------------------------------------------ lifecycle
    def start(self) -> DisaggregatedServer:
        if self.processes:
            raise RuntimeError("the server is already started")
        ctx = mp.get_context("spawn")
        self._inq, self._kvq, self._outq = ctx.Queue(), ctx.Queue(), ctx.Queue()
        self._done = ctx.Event()
        common = (self.model, self.config, self.threads)
        self.processes = [
            ctx.Process(
                target=_prefill_worker,
                args=(*common, self._inq, self._kvq, self._outq, self._done, self._fault),
                name="prefill-worker",
                daemon=True,
            ),
            ctx.Process(
                target=_decode_worker,
                args=(*common, self._kvq, self._outq, self._done, self._fault),
                name="decode-worker",
                daemon=True,
            ),
        ]
        try:
            for p in self.processes:
                p.start()
            ready: set[str] = set()
            deadline = time.monotonic() + self.start_timeout
            while len(ready) < 2:
                if time.monotonic() > deadline:
                    raise WorkerError(f"workers not ready after {self.start_timeout:g} s (ready: {sorted(ready)})")
                msg = self._get(timeout=_POLL_S)
                if msg is not None and msg[0] == "ready":
                    ready.add(msg[1])
        except BaseException:
            self.close(force=True)
            raise
        return self

    def __enter__(self) -> DisaggregatedServer:
        return self.start()

    def __exit__(self, exc_type, *exc) -> None:
        self.close(force=exc_type is not None)

    def alive(self) -> list[str]:
        """Names of worker processes still running."""
        return [p.name for p in self.processes if p.is_alive()]

    def close(self, timeout: float = 10.0, force: bool = False) -> None:
        """Stop the workers: a polite stop message, then terminate, then kill. Safe to call twice.
        ``force`` (after a failure): do not wait for in-flight work, give the workers 2 s at most."""
        if not self.processes:
            return
        try:
            self._inq.put(None)
            if force:
                self._done.set()  # the prefill worker need not wait for a decode worker that may be gone
        except (ValueError, OSError):
            pass
        timeout = min(timeout, 2.0) if force else timeout
        deadline = time.monotonic() + timeout
        for p in self.processes:
            if p.pid is not None:
                p.join(max(0.0, deadline - time.monotonic()))
        for p in self.processes:
            if p.is_alive():
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)
        for q in (self._inq, self._kvq, self._outq):
            q.cancel_join_thread()  # never block this process on unread messages
            q.close()
        self.closed_processes, self.processes = self.processes, []

    # ------------------------------------------------------------ messages
    def _get(self, timeout: float):
        """One message from the workers, or None after ``timeout``; raises WorkerError on a worker's failure."""
        try:
            msg = self._outq.get(timeout=timeout)
        except queue.Empty:
            dead = [f"{p.name} (exit code {p.exitcode})" for p in self.processes if not p.is_alive()]
            if dead:
                self.close(force=True)
                raise WorkerError(f"worker process died: {', '.join(dead)}") from None
            return None
        if msg[0] == "error":
            self.close(force=True)
            raise WorkerError(f"the {msg[1]} worker failed:\n{msg[2]}")
        return msg

    def submit(self, prompt_ids: SequenceABC[int], params: SamplingParams, arrival: float | None = None) -> int:
        """Send one request (token ids) to the prefill worker; returns its id."""
        if not self.processes:
            raise RuntimeError("start the server first (use it as a context manager)")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("prompt_ids must hold at least one token id")
        rid, self._next_id = self._next_id, self._next_id + 1
        self._inq.put((rid, ids, params, time.perf_counter() if arrival is None else arrival))
        return rid

    def serve(
        self, requests: SequenceABC[Request], arrivals: SequenceABC[float] | None = None, timeout: float = 300.0
    ) -> ServingRun:
        """Send ``requests`` at their arrival times (s after the start), greedy with ``ignore_eos``; wait for
        every token. Raises WorkerError (after shutting the workers down) if a worker fails."""
        requests, arrivals = _check_requests(requests, arrivals)
        start = time.perf_counter()
        deadline = time.monotonic() + timeout
        ids: dict[int, int] = {}
        times: list[list[float]] = [[] for _ in requests]
        outputs: list[list[int]] = [[] for _ in requests]
        transfers: list[KVTransfer] = []
        finished, nxt = 0, 0
        while finished < len(requests):
            if time.monotonic() > deadline:
                self.close(force=True)
                raise WorkerError(f"serve timed out after {timeout:g} s with {len(requests) - finished} unfinished")
            now = time.perf_counter() - start
            while nxt < len(requests) and arrivals[nxt] <= now:
                r = requests[nxt]
                ids[self.submit(r.prompt_ids, _params(r), start + arrivals[nxt])] = nxt
                nxt += 1
            wait = _POLL_S if nxt == len(requests) else max(0.0, min(arrivals[nxt] - now, _POLL_S))
            msg = self._get(timeout=max(wait, 1e-3))
            while msg is not None:
                if msg[0] == "token":
                    _, rid, tok, t, _index, done, _reason = msg
                    i = ids[rid]
                    outputs[i].append(tok)
                    times[i].append(t)
                    finished += bool(done)
                elif msg[0] == "transfer":
                    transfers.append(msg[1])
                try:
                    msg = self._outq.get_nowait()
                except queue.Empty:
                    msg = None
                if msg is not None and msg[0] == "error":
                    self.close(force=True)
                    raise WorkerError(f"the {msg[1]} worker failed:\n{msg[2]}")
        traces = [
            RequestTrace(i, start + a, len(r.prompt_ids), sorted(t), finish=max(t))
            for i, (r, a, t) in enumerate(zip(requests, arrivals, times))
        ]
        return ServingRun(traces, outputs, transfers)

    def generate(self, prompts: SequenceABC[SequenceABC[int]], max_new_tokens: int = 16) -> list[list[int]]:
        """Greedy ids for each prompt (token ids), all sent at once: what a colocated engine must match."""
        reqs = [Request(tuple(int(t) for t in p), max_new_tokens) for p in prompts]
        return self.serve(reqs).outputs


# ----------------------------------------------------------------------------- the model at scale
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
        from course_lib.measure.hardware import gpu_spec
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
        from course_lib.measure.hardware import gpu_spec
        from course_lib.models.accounting import ModelShape, kv_bytes_per_token

        self.cfg = cfg
        self.shape = ModelShape.from_name(cfg.model)
        spec = gpu_spec(cfg.gpu)
        self.flops = spec.peak_flops(spec.best_dtype(cfg.dtype)) * cfg.compute_efficiency
        self.bw = spec.bandwidth * cfg.bandwidth_efficiency
        self.kv_per_token = kv_bytes_per_token(self.shape, cfg.dtype)
        self.link = link_gbps(cfg.link) * 1e9

    def prefill(self, n_prompts: int) -> float:
        from course_lib.measure.roofline import prefill_time

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
        t += costs.decode([r[1] for r in running])
        for r in running:
            itl[r[0]] = max(itl[r[0]], t - r[3])
            r[1], r[2], r[3] = r[1] + 1, r[2] + 1, t
            if r[2] == cfg.output_len:
                last[r[0]] = t
        running = [r for r in running if r[2] < cfg.output_len]


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
            t += costs.decode([r[1] for r in running])
            for r in running:
                itl[r[0]] = max(itl[r[0]], t - r[3])
                r[1], r[2], r[3] = r[1] + 1, r[2] + 1, t
                if r[2] == cfg.output_len:
                    last[r[0]] = t
            running = [r for r in running if r[2] < cfg.output_len]
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


def sweep_rates(
    cfg: SimConfig,
    rates: SequenceABC[float],
    setups: SequenceABC[tuple[int, int] | int] = (2, (1, 1)),
    slo: SLO | None = None,
) -> list[dict]:
    """One row per (setup, rate): TTFT/TPOT percentiles, attainment and goodput per GPU under ``slo``. A setup
    is an int (colocated GPUs) or (prefill GPUs, decode GPUs); compare setups with the same GPU count."""
    rates = list(rates)
    if not rates or any(not isinstance(r, (int, float)) or isinstance(r, bool) or not r > 0 for r in rates):
        raise ValueError(f"rates must be a non-empty list of positive requests/s, got {rates!r}")
    rows = []
    for s in setups:
        for r in rates:
            if isinstance(s, int) and not isinstance(s, bool):
                res = simulate_colocated(cfg, r, s)
            elif isinstance(s, tuple) and len(s) == 2:
                res = simulate_disaggregated(cfg, r, *s)
            else:
                raise ValueError(f"each setup must be an int (colocated GPUs) or (prefill, decode), got {s!r}")
            rows.append(res.row(slo))
    return rows


def max_goodput_per_gpu(rows: list[dict], setup: str, target: float = 0.9) -> float:
    """DistServe's goodput: the highest swept rate at which ≥ ``target`` of requests meet the SLO, per GPU
    (0 if none does). ``rows`` from ``sweep_rates`` with an ``slo``."""
    if not 0 < target <= 1:
        raise ValueError(f"target must be a fraction in (0, 1], got {target!r}")
    mine = [r for r in rows if r["setup"] == setup]
    if not mine or "attainment" not in mine[0]:
        raise ValueError(f"rows must come from sweep_rates(..., slo=...) and include setup {setup!r}")
    ok = [r["rate"] / r["gpus"] for r in mine if r["attainment"] >= target]
    return max(ok, default=0.0)


def plot_disagg_sweep(rows: list[dict], slo: SLO | None = None, p: int = 90):
    """Panels on a Figure of its own, one line per setup vs request rate: p-th percentile TTFT and TPOT (SLO
    lines dashed), p99 of each request's longest stall between two tokens (the prefill interference), and,
    with rows swept under an SLO, goodput per GPU."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not rows:
        raise ValueError("rows must be the non-empty output of sweep_rates")
    if f"ttft_p{p}" not in rows[0]:
        raise ValueError(f"p must be one of the swept percentiles (50, 90, 99), got {p!r}")
    panels = [
        (f"ttft_p{p}", 1e3, f"TTFT p{p} (ms)", None if slo is None else slo.ttft_s * 1e3),
        (f"tpot_p{p}", 1e3, f"TPOT p{p} (ms)", None if slo is None else slo.tpot_s * 1e3),
        ("max_itl_p99", 1e3, "longest stall p99 (ms)", None),
    ]
    if "goodput_per_gpu" in rows[0]:
        panels.append(("goodput_per_gpu", 1.0, "goodput (req/s per GPU in SLO)", None))
    fig = Figure(figsize=(3.4 * len(panels), 3.2), dpi=90)
    FigureCanvasAgg(fig)  # renders without pyplot state
    axes = fig.subplots(1, len(panels))
    for s in dict.fromkeys(r["setup"] for r in rows):
        mine = [r for r in rows if r["setup"] == s]
        for ax, (key, scale, _, _) in zip(axes, panels):
            ax.plot([r["rate"] for r in mine], [r[key] * scale for r in mine], marker="o", label=s)
    for ax, (_, _, label, line) in zip(axes, panels):
        if line is not None:
            ax.axhline(line, ls="--", c="grey", lw=1)
        ax.set(xlabel="request rate (req/s)", ylabel=label)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


__all__ = [
    "DisaggregatedServer",
    "INFINIBAND_NDR_GBPS",
    "KVTransfer",
    "ServingRun",
    "SimConfig",
    "SimResult",
    "WorkerError",
    "extract_kv",
    "install_kv",
    "kv_transfer_bytes",
    "link_gbps",
    "max_goodput_per_gpu",
    "plot_disagg_sweep",
    "serve_colocated",
    "simulate_colocated",
    "simulate_disaggregated",
    "sweep_rates",
]
