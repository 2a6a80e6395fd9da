"""The two worker processes of ``DisaggregatedServer``, each with its own ``Engine`` (started by
``core.procs``). The prefill worker runs prompts to their first token, extracts each KV cache
into a shared-memory tensor and puts it on a queue; the decode worker installs it as a RUNNING sequence
with its prompt cached and decodes every running sequence, one step at a time. Tokens and ``KVTransfer``
records go back to the server on one queue. Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import os
import queue
import time
import traceback
from collections import deque
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

from course_lib.engine.sampling import SamplingParams
from course_lib.serving.disagg.handover import KVTransfer, extract_kv, install_kv


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


POLL_S = 0.05


def _parent_alive() -> bool:
    parent = mp.parent_process()
    return parent is None or parent.is_alive()


def _drain(q, block: bool) -> list:
    """Everything waiting in ``q``; when ``block``, wait for at least one message (or the parent's death)."""
    items = []
    while block and not items:
        try:
            items.append(q.get(timeout=POLL_S))
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


def prefill_worker(model, config, threads, inq, kvq, outq, done, fault) -> None:
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
        while not done.wait(POLL_S):
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


def decode_worker(model, config, threads, kvq, outq, done, fault) -> None:
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
