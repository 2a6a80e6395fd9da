"""The scheduler: which sequences run in the next step, and how many of their tokens.

Every step gets a token budget (``max_num_batched_tokens``) and a sequence budget (``max_num_seqs``).
Running sequences come first: one token each if decoding, the rest of their prompt if a chunked
prefill is under way. Then waiting requests are admitted while the budgets and the KV storage allow:
- ``static`` (request-level batching): a batch starts only when nothing runs and takes up to
  ``max_num_seqs`` of the requests waiting then (its prefill spread over as many steps as the token budget
  needs, chunked if a prompt straddles the budget); it runs until its last request ends and newcomers wait
  for all of it;
- ``dynamic`` (dynamic batching, as in Triton Inference Server / TF Serving): like static, but an empty
  engine starts a batch only once ``max_num_seqs`` requests wait or the oldest has waited ``max_wait_s``
  (a fuller batch for a bounded extra delay);
- ``continuous`` (iteration-level batching, Orca/vLLM): admit at every step, into the slots freed by
  finished requests.
A prompt larger than the budget left is cut into chunks (``chunked_prefill``), so one step can hold a
prefill chunk and many decode tokens together. If a running sequence cannot get KV room, the newest
running sequence is preempted (``preemption``): "recompute" frees its KV and recomputes its tokens when
it is re-admitted; "swap" copies its KV to host memory (``backend.swap_out``) and back when re-admitted
(``backend.swap_in``), trading PCIe bytes for recomputed FLOPs. With a backend that has
``prefix_caching`` (``PagedBackend(prefix_caching=True)``), a request starts on the cached blocks of its
longest matching prefix (``backend.allocate_prefix``) and processes only the rest. ``admission="priority"``
admits waiting requests by ``Sequence.priority`` (lower first, FCFS within a class) instead of arrival order.

Driving it without a model (``course_lib.serving.simulator``): ``add(seq)``, then per step
``batch = schedule(now)`` with the simulated clock (``now=None`` reads ``time.perf_counter()``, the
engine's clock; ``seq.arrival`` must be on the same clock), then do the engine's postprocess:
``seq.num_cached_tokens += n`` for each (seq, n), append a token id to every sequence whose prompt is
complete, and ``finish(seq, reason, now)`` the ones that are done. When ``schedule`` returns an empty
batch while requests wait, ``wait_time(now)`` says how long dynamic batching holds them (advance the
clock to ``min(next arrival, now + wait_time(now))``).
Introduced in 02_metrics_1_latency.ipynb; chapter 06 (batching and serving) adds dynamic batching,
swapping and prefix caching.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from course_lib.engine.sequence import Sequence, SequenceStatus

POLICIES = ("static", "continuous", "dynamic")
PREEMPTION_MODES = ("recompute", "swap")
ADMISSIONS = ("fcfs", "priority")


@dataclass
class SchedulerConfig:
    """Budgets of one step and of the KV cache. ``None`` fields take the model's values in ``Engine``."""

    policy: str = "continuous"  # "static", "continuous" or "dynamic"
    max_num_seqs: int = 64  # sequences in one step (= rows of the contiguous cache)
    max_num_batched_tokens: int = 2048  # new tokens in one step, prefill and decode together
    max_model_len: int | None = None  # prompt + output tokens of one request; default: the model's context
    chunked_prefill: bool = True  # split prompts larger than the token budget left in a step
    max_kv_tokens: int | None = None  # KV budget in tokens over all sequences; default: max_num_seqs × max_model_len
    max_wait_s: float = 0.05  # dynamic: the longest the oldest waiting request is held for a fuller batch
    preemption: str = "recompute"  # "recompute" (free the KV) or "swap" (copy it to host memory and back)
    admission: str = "fcfs"  # "priority": waiting requests are admitted lowest Sequence.priority first (FCFS within)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"SchedulerConfig.policy must be one of {POLICIES}, got {self.policy!r}")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"SchedulerConfig.admission must be one of {ADMISSIONS}, got {self.admission!r}")
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(f"SchedulerConfig.preemption must be one of {PREEMPTION_MODES}, got {self.preemption!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"SchedulerConfig.{name} must be a positive int, got {v!r}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len <= 1):
            raise ValueError(f"SchedulerConfig.max_model_len must be None or an int > 1, got {self.max_model_len!r}")
        if self.max_kv_tokens is not None and (
            not isinstance(self.max_kv_tokens, int) or isinstance(self.max_kv_tokens, bool) or self.max_kv_tokens <= 0
        ):
            raise ValueError(
                f"SchedulerConfig.max_kv_tokens must be None or a positive int, got {self.max_kv_tokens!r}"
            )
        if not isinstance(self.chunked_prefill, bool):
            raise ValueError(f"SchedulerConfig.chunked_prefill must be a bool, got {self.chunked_prefill!r}")
        w = self.max_wait_s
        if not isinstance(w, (int, float)) or isinstance(w, bool) or not math.isfinite(w) or w < 0:
            raise ValueError(f"SchedulerConfig.max_wait_s must be a finite number of seconds >= 0, got {w!r}")


@dataclass
class ScheduledBatch:
    """One step's work: sequence ``seqs[i]`` processes its next ``num_tokens[i]`` tokens."""

    seqs: list[Sequence] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens)

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    """Queues of sequences and the policy that fills each step; KV storage through ``backend``."""

    def __init__(self, config: SchedulerConfig, backend) -> None:
        if not isinstance(config, SchedulerConfig):
            raise ValueError(f"config must be a SchedulerConfig, got {type(config).__name__}")
        if config.preemption == "swap" and not (
            callable(getattr(backend, "swap_out", None)) and callable(getattr(backend, "swap_in", None))
        ):
            raise ValueError(
                f"SchedulerConfig.preemption='swap' needs a backend with swap_out/swap_in (PagedBackend, "
                f"Engine(kv_cache='paged')), got {type(backend).__name__}; use preemption='recompute'"
            )
        self.config = config
        self.backend = backend
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0  # every preemption so far, recompute or swap
        # static/dynamic: True while the batch that started at an empty engine still takes the requests that
        # waited (it fills max_num_seqs even when the token budget spreads its prefill over several steps)
        self.batch_open = False
        self._batch_admitted = 0  # requests the current static/dynamic batch has taken (its size so far)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def _prefix_caching(self) -> bool:
        return self.backend.stores_kv and getattr(self.backend, "prefix_caching", False)

    def wait_time(self, now: float | None = None) -> float:
        """Seconds the policy still holds the waiting requests back (0: it would admit them now, KV room
        permitting; ``math.inf``: nothing waits, or a static/dynamic batch must finish first)."""
        if not self.waiting:
            return math.inf
        cfg = self.config
        if cfg.policy == "continuous":
            return 0.0
        if self.running:
            return 0.0 if self.batch_open else math.inf
        if cfg.policy == "static" or len(self.waiting) >= cfg.max_num_seqs:
            return 0.0
        now = time.perf_counter() if now is None else now
        oldest = min(s.arrival for s in self.waiting)
        left = oldest + cfg.max_wait_s - now
        return left if left > 1e-9 else 0.0  # a clock set to the deadline itself may fall short by rounding

    def schedule(self, now: float | None = None) -> ScheduledBatch:
        """The next step's batch. ``now``: the clock dynamic batching compares arrivals with (default
        ``time.perf_counter()``)."""
        cfg, kv = self.config, self.backend
        batch = ScheduledBatch()
        budget = cfg.max_num_batched_tokens
        chunking = cfg.chunked_prefill and kv.stores_kv  # without a cache there is nothing to continue from
        prefix = self._prefix_caching
        if prefix:  # name the blocks the last step filled, so requests admitted now can reuse them
            for seq in self.running:
                kv.cache_prefix(seq.kv, seq.token_ids, seq.num_cached_tokens)
        # 1. running sequences: a decode token each, or the next chunk of an unfinished prefill
        for seq in list(self.running):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted below by an older sequence
            n = seq.num_pending_tokens
            if n > budget:
                if not chunking or budget == 0:
                    continue  # no room this step; it keeps its KV and runs next step
                n = budget
            while not kv.can_append(seq.kv, n):
                victim = self._preempt_newest(exclude=batch.seqs)
                if victim is None or victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            kv.append(seq.kv, n)
            batch.seqs.append(seq)
            batch.num_tokens.append(n)
            budget -= n
        # 2. admit waiting requests (static, dynamic: a batch starts only in an empty engine, dynamic only once
        # it is worth it, and it keeps taking waiting requests until it holds max_num_seqs or the queue is empty)
        if cfg.policy != "continuous" and not self.running:
            self.batch_open, self._batch_admitted = True, 0
        if self.wait_time(now) > 0:
            return batch
        refused = False
        if cfg.admission == "priority" and len(self.waiting) > 1:  # stable: first come first served within a class
            self.waiting = deque(sorted(self.waiting, key=lambda s: s.priority))
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            if cfg.policy != "continuous" and self._batch_admitted >= cfg.max_num_seqs:
                break  # a static batch is full once it has taken max_num_seqs, even if some finished already
            seq = self.waiting[0]
            swapped = seq.status is SequenceStatus.SWAPPED
            start = seq.num_cached_tokens if swapped else (kv.match_prefix(seq.token_ids) if prefix else 0)
            n = seq.num_tokens - start
            if n > budget:
                if not chunking:
                    break
                n = budget
            if swapped:
                fits = kv.can_swap_in(seq.kv, n)
            elif prefix:
                fits = kv.can_allocate_prefix(seq.token_ids, n)
            else:
                fits = kv.can_allocate(n)
            if not fits:
                refused = True
                break
            self.waiting.popleft()
            if swapped:
                host = seq.kv
                seq.kv = kv.swap_in(host)
                seq.swapped_bytes += host.num_bytes
            elif prefix:
                seq.kv, seq.num_cached_tokens = kv.allocate_prefix(seq.token_ids)
            else:
                seq.kv = kv.allocate()
            kv.append(seq.kv, n)
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled is None:  # the end of its queue time
                seq.first_scheduled = time.perf_counter() if now is None else now
            self.running.append(seq)
            self._batch_admitted += 1
            batch.seqs.append(seq)
            batch.num_tokens.append(n)
            budget -= n
        if cfg.policy != "continuous":  # the batch closes once full, once nobody waits, or once the KV is full
            full = self._batch_admitted >= cfg.max_num_seqs or len(self.running) >= cfg.max_num_seqs
            self.batch_open = bool(self.waiting) and not full and not refused
        return batch

    def _preempt_newest(self, exclude: list[Sequence]) -> Sequence | None:
        """Evict the most recently admitted running sequence not already in this step; it goes back to the
        front of the queue. "recompute": its KV is freed and its tokens recomputed when re-admitted;
        "swap": its KV is copied to host memory and copied back when re-admitted."""
        kv = self.backend
        for seq in reversed(self.running):
            if seq.status is SequenceStatus.RUNNING and not any(seq is s for s in exclude):
                if self._prefix_caching:  # its computed blocks stay cached (evictable) after the free
                    kv.cache_prefix(seq.kv, seq.token_ids, seq.num_cached_tokens)
                if self.config.preemption == "swap":
                    host = kv.swap_out(seq.kv)  # its K/V cover exactly num_cached_tokens: all computed
                    seq.kv = host
                    seq.swapped_bytes += host.num_bytes
                    seq.status = SequenceStatus.SWAPPED
                else:
                    kv.free(seq.kv)
                    seq.kv = None
                    seq.num_cached_tokens = 0
                    seq.status = SequenceStatus.PREEMPTED
                seq.num_preemptions += 1
                self.num_preemptions += 1
                self.running.remove(seq)
                self.waiting.appendleft(seq)
                return seq
        return None

    def finish(self, seq: Sequence, reason: str, now: float) -> None:
        """Mark ``seq`` finished, free its KV (a swapped-out host copy is dropped) and drop it from the queues."""
        if seq.kv is not None:
            if seq.status is not SequenceStatus.SWAPPED:
                if self._prefix_caching:
                    self.backend.cache_prefix(seq.kv, seq.token_ids, seq.num_cached_tokens)
                self.backend.free(seq.kv)
            seq.kv = None
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finish_time = now
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
