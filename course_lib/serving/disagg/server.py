"""``DisaggregatedServer``: a prefill worker and a decode worker, each its own process with its own
``Engine``; this process only routes requests in and tokens out, and accounts every KV transfer. On a
2-core CPU the workers share the cores, so nothing here is faster than the colocated engine: the point
is the mechanism and the accounting, not the speed. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import queue
import time
from collections.abc import Sequence as SequenceABC

import torch.multiprocessing  # noqa: F401 - registers torch's reductions: tensors cross the queues by shared memory

from course_lib.core import procs
from course_lib.engine.sampling import SamplingParams
from course_lib.measure.metrics import RequestTrace
from course_lib.serving.disagg.handover import KVTransfer
from course_lib.serving.disagg.run import ServingRun, check_requests, request_params
from course_lib.serving.disagg.workers import POLL_S, decode_worker, prefill_worker
from course_lib.serving.workload import Request


class WorkerError(RuntimeError):
    """A worker process failed or died; the message holds its role and traceback."""


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
        ctx = procs.context()  # a fork server with torch imported: the workers start in a fraction of a second
        self._inq, self._kvq, self._outq = ctx.Queue(), ctx.Queue(), ctx.Queue()
        self._done = ctx.Event()
        common = (self.model, self.config, self.threads)
        self.processes = [
            procs.process(
                ctx,
                prefill_worker,
                (*common, self._inq, self._kvq, self._outq, self._done, self._fault),
                name="prefill-worker",
                daemon=True,
            ),
            procs.process(
                ctx,
                decode_worker,
                (*common, self._kvq, self._outq, self._done, self._fault),
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
                msg = self._get(timeout=POLL_S)
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
        requests, arrivals = check_requests(requests, arrivals)
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
                ids[self.submit(r.prompt_ids, request_params(r), start + arrivals[nxt])] = nxt
                nxt += 1
            wait = POLL_S if nxt == len(requests) else max(0.0, min(arrivals[nxt] - now, POLL_S))
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
