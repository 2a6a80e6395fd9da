"""What the engine's own thread does between steps, shared by the server's ``EngineLoop`` thread and the
``EngineProcess`` child: add and abort requests, step, count (``EngineCore``); and how the items of a step
reach the requests' ``asyncio`` queues, one ``call_soon_threadsafe`` per event loop (``route``, ``send``).
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from course_lib.engine.sampling import SamplingParams

log = logging.getLogger(__name__)


class EngineCore:
    """What the engine's own thread does between steps, shared by ``EngineLoop`` (a thread of the server) and
    ``EngineProcess``'s child: add and abort requests, step, count. Each call returns per-request items
    ``("added", rid, prompt_tokens)``, ``("error", rid, status, message)`` or ``("token", rid, TokenEvent)``."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.live: set[str] = set()  # added and not yet finished or aborted
        self.steps = 0
        self.errors = 0
        self.step_seconds = 0.0  # time spent inside engine.step(), summed

    def add(self, rid: str, prompt, params: SamplingParams) -> tuple:
        try:
            seq = self.engine.add_request(prompt, params, request_id=rid)
        except ValueError as exc:  # bad input: nothing was queued
            return ("error", rid, 400, str(exc))
        except Exception as exc:  # noqa: BLE001 - one request's failure must not end the loop
            log.exception("add_request failed for %s", rid)
            return ("error", rid, 500, f"engine error: {exc!r}")
        self.live.add(rid)
        return ("added", rid, seq.num_prompt_tokens)

    def abort(self, rid: str) -> None:
        self.live.discard(rid)
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
        for ev in events:
            if ev.finished:
                self.live.discard(ev.request)
        return [("token", ev.request, ev) for ev in events]

    def gauges(self) -> tuple:
        """(waiting, running, KV bytes used, KV bytes reserved, steps, step errors, step seconds)."""
        e = self.engine
        s = e.scheduler
        kv = (e.backend.bytes_used(), e.backend.bytes_reserved())
        return (len(s.waiting), len(s.running), *kv, self.steps, self.errors, self.step_seconds)


def route(sinks: dict, items: list[tuple], abort: Callable[[str], None]) -> None:
    """Hand ``EngineCore`` items to their requests' queues (one hop per event loop); a request that errored
    or finished leaves ``sinks``, and one whose event loop is gone is aborted."""
    out: dict[str, tuple] = {}
    for kind, rid, *rest in items:
        sink = sinks.get(rid)
        if sink is None:
            continue
        out.setdefault(rid, (sink, []))[1].append((kind, *rest))
        if kind == "error" or (kind == "token" and rest[0].finished):
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
