"""The scheduler: which sequences run in the next step, and how many of their tokens.

Every step gets a token budget (``max_num_batched_tokens``) and a sequence budget (``max_num_seqs``).
Running sequences come first: one token each if decoding, the rest of their prompt if a chunked
prefill is under way. Then waiting requests are admitted while the budgets and the KV storage allow:
- ``static`` (request-level batching): admit only when nothing runs, so a batch runs until its last
  request ends and newcomers wait for all of it;
- ``continuous`` (iteration-level batching, Orca/vLLM): admit at every step, into the slots freed by
  finished requests.
A prompt larger than the budget left is cut into chunks (``chunked_prefill``), so one step can hold a
prefill chunk and many decode tokens together. If a running sequence cannot get KV room, the newest
running sequence is preempted (its KV is freed; it will be recomputed). Chapter 06 grows the policies.
Introduced in 02_metrics_1_latency.ipynb.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from course_lib.engine.sequence import Sequence, SequenceStatus

POLICIES = ("static", "continuous")


@dataclass
class SchedulerConfig:
    """Budgets of one step and of the KV cache. ``None`` fields take the model's values in ``Engine``."""

    policy: str = "continuous"
    max_num_seqs: int = 64  # sequences in one step (= rows of the contiguous cache)
    max_num_batched_tokens: int = 2048  # new tokens in one step, prefill and decode together
    max_model_len: int | None = None  # prompt + output tokens of one request; default: the model's context
    chunked_prefill: bool = True  # split prompts larger than the token budget left in a step
    max_kv_tokens: int | None = None  # KV budget in tokens over all sequences; default: max_num_seqs × max_model_len

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"SchedulerConfig.policy must be one of {POLICIES}, got {self.policy!r}")
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
        self.config = config
        self.backend = backend
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        cfg, kv = self.config, self.backend
        batch = ScheduledBatch()
        budget = cfg.max_num_batched_tokens
        chunking = cfg.chunked_prefill and kv.stores_kv  # without a cache there is nothing to continue from
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
        # 2. admit waiting requests (static: only into an empty engine)
        if cfg.policy == "static" and self.running:
            return batch
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            n = seq.num_pending_tokens
            if n > budget:
                if not chunking:
                    break
                n = budget
            if not kv.can_allocate(n):
                break
            self.waiting.popleft()
            seq.kv = kv.allocate()
            kv.append(seq.kv, n)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_tokens.append(n)
            budget -= n
        return batch

    def _preempt_newest(self, exclude: list[Sequence]) -> Sequence | None:
        """Free the KV of the most recently admitted running sequence not already in this step; it goes
        back to the front of the queue and will recompute its tokens (preemption by recompute)."""
        for seq in reversed(self.running):
            if seq.status is SequenceStatus.RUNNING and not any(seq is s for s in exclude):
                self.backend.free(seq.kv)
                seq.kv = None
                seq.num_cached_tokens = 0
                seq.status = SequenceStatus.PREEMPTED
                seq.num_preemptions += 1
                self.running.remove(seq)
                self.waiting.appendleft(seq)
                return seq
        return None

    def finish(self, seq: Sequence, reason: str, now: float) -> None:
        """Mark ``seq`` finished, free its KV and drop it from the queues."""
        if seq.kv is not None:
            self.backend.free(seq.kv)
            seq.kv = None
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finish_time = now
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
