"""What the engine's own thread does between steps, shared by the server's ``EngineLoop`` thread and the
``EngineProcess`` child: add and abort requests, step, count (``EngineCore``); and how the items of a step
reach the requests' ``asyncio`` queues, one ``call_soon_threadsafe`` per event loop (``route``, ``send``).
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from course_lib.engine.parallel_sampling import sample_ids
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.sequence import SequenceStatus

log = logging.getLogger(__name__)


class EngineCore:
    """What the engine's own thread does between steps, shared by ``EngineLoop`` (a thread of the server) and
    ``EngineProcess``'s child: add and abort requests, step, count. Each call returns per-request items
    ``("added", rid, prompt_tokens)``, ``("error", rid, status, message)`` or ``("token", rid, TokenEvent, last)``:
    with ``n > 1`` a request has several samples (``TokenEvent.request`` says which), and ``last`` marks the
    token after which none of them runs any more."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.live: dict[str, set] = {}  # request id → its samples' ids not yet finished (added, not aborted)
        self.owner: dict = {}  # sample id → request id
        self.steps = 0
        self.errors = 0
        self.step_seconds = 0.0  # time spent inside engine.step(), summed
        self._start = self._totals()  # the engine's counters may predate this server

    def add(self, rid: str, prompt, params: SamplingParams) -> tuple:
        try:
            seq = self.engine.add_request(prompt, params, request_id=rid)
        except ValueError as exc:  # bad input: nothing was queued
            return ("error", rid, 400, str(exc))
        except Exception as exc:  # noqa: BLE001 - one request's failure must not end the loop
            log.exception("add_request failed for %s", rid)
            return ("error", rid, 500, f"engine error: {exc!r}")
        ids = sample_ids(rid, params.n)
        self.live[rid] = set(ids)
        self.owner.update(dict.fromkeys(ids, rid))
        return ("added", rid, seq.num_prompt_tokens)

    def abort(self, rid: str) -> None:
        for sid in self.live.pop(rid, ()):
            self.owner.pop(sid, None)
        try:
            self.engine.abort(rid)  # frees its KV
        except ValueError:
            pass  # it finished (or was never added) meanwhile

    def step(self) -> list[tuple]:
        """One engine step: a token item per generated token, or, if the step raised, an error for every live
        request (aborted, its KV freed) and the loop carries on."""
        t0 = time.perf_counter()
        try:
            events = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - fail this batch's requests, keep serving
            self.errors += 1
            log.exception("engine step failed; failing its %d requests", len(self.live))
            failed = sorted(self.live)
            for rid in failed:
                self.abort(rid)
            return [("error", rid, 500, f"engine error: {exc!r}") for rid in failed]
        finally:
            self.step_seconds += time.perf_counter() - t0
        self.steps += 1
        items = []
        for ev in events:
            rid = self.owner.get(ev.request)
            if rid is None:
                continue  # aborted meanwhile
            last = False
            if ev.finished:
                del self.owner[ev.request]
                samples = self.live[rid]
                samples.discard(ev.request)
                if not samples:
                    del self.live[rid]
                    last = True
            items.append(("token", rid, ev, last))
        return items

    def _totals(self) -> dict:
        b = self.engine.backend
        return {
            "preemptions": self.engine.scheduler.num_preemptions,
            "prefix_queries": getattr(b, "prefix_queries", 0),
            "prefix_hits": getattr(b, "prefix_hits", 0),
        }

    def gauges(self) -> dict:
        """The engine's state now: queue lengths, KV usage, the counters since this core started (preemptions,
        prefix-cache tokens queried and hit) and the loop's own (steps, step errors, step seconds)."""
        e = self.engine
        s, b = e.scheduler, e.backend
        swapped = sum(1 for seq in s.waiting if seq.status is SequenceStatus.SWAPPED)
        g = {"waiting": len(s.waiting) - swapped, "running": len(s.running), "swapped": swapped}
        g |= {"kv_used": b.bytes_used(), "kv_reserved": b.bytes_reserved(), "kv_usage": kv_usage(b)}
        g |= {k: v - self._start[k] for k, v in self._totals().items()}
        return g | {"steps": self.steps, "errors": self.errors, "step_seconds": self.step_seconds}


def kv_usage(backend) -> float:
    """The fraction of the KV cache reserved by live sequences: blocks in use (paged; cached free blocks
    count as free, as vLLM counts them) or rows in use (contiguous); 0 for a backend that stores none."""
    blocks = getattr(backend, "blocks", None)
    if blocks is not None and getattr(blocks, "num_blocks", 0):
        return blocks.num_used / blocks.num_blocks
    rows, max_len = getattr(backend, "max_seqs", 0), getattr(backend, "max_len", 0)
    if rows and max_len and getattr(backend, "stores_kv", False):
        return backend.bytes_reserved() / (rows * max_len * backend.bytes_per_token)
    return 0.0


def route(sinks: dict, items: list[tuple], abort: Callable[[str], None]) -> None:
    """Hand ``EngineCore`` items to their requests' queues (one hop per event loop); a request that errored
    or finished leaves ``sinks``, and one whose event loop is gone is aborted."""
    out: dict[str, tuple] = {}
    for item in items:
        kind, rid = item[0], item[1]
        sink = sinks.get(rid)
        if sink is None:
            continue
        out.setdefault(rid, (sink, []))[1].append(item)
        if kind == "error" or (kind == "token" and item[-1]):
            sinks.pop(rid, None)
    for rid in send(out):
        abort(rid)


def send(out: dict) -> list:
    """Put each request's items on its queue: one ``call_soon_threadsafe`` per event loop. Returns the
    request ids that could not be reached (their event loop is closed)."""
    per_loop: dict = {}
    for rid, ((loop, q), items) in out.items():
        per_loop.setdefault(loop, []).append((rid, q, items))
    lost = []
    for loop, batch in per_loop.items():
        try:
            loop.call_soon_threadsafe(_put_batch, batch)
        except RuntimeError:  # the event loop is closed
            log.warning("could not deliver to %d requests; aborting them", len(batch))
            lost += [rid for rid, _, _ in batch]
    return lost


def _put_batch(batch: list) -> None:
    """On the event loop: hand each request its items."""
    for _, q, items in batch:
        for item in items:
            q.put_nowait(item)
