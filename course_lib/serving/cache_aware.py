"""Cache-aware scheduling over a radix tree: longest prefix match first against first come, first served.

A prefix cache only pays when a request finds its prefix still cached. Under a bounded cache that depends on
the *order* requests run in: SGLang (Zheng et al., 2024) orders its waiting queue by the length of each
request's longest prefix match with the radix tree ("longest-prefix-match first", LPM) instead of by
arrival, so requests sharing a prefix run while it is cached. :func:`grouped_stream` draws requests in a few
groups that share distinct long prefixes (system prompts, few-shot examples), interleaved with unique ones;
:func:`schedule` replays them through a bounded :class:`~course_lib.kv.radix.RadixCache`, a batch of ``batch``
requests per scheduler step, under ``"fcfs"`` or ``"lpm"`` (ties by arrival), and counts the prompt tokens
that hit the cache, the tokens prefilled, and each request's wait in steps. :func:`trie_tokens` is the bound
with room for everything: the distinct tokens of the prompts' trie, which every order computes (when no
prompt is a prefix of another); :func:`lru_prediction` predicts FCFS's hits from reuse distances alone.
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from course_lib.kv.checks import check_int
from course_lib.kv.radix import RadixCache

POLICIES = ("fcfs", "lpm")


@dataclass(frozen=True)
class GroupedRequest:
    """One prompt: its token ids, its prefix group (None: unique) and the length of that shared prefix."""

    prompt: tuple
    group: int | None = None
    prefix_len: int = 0


def _check_range(name: str, value) -> tuple[int, int]:
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) for v in value)
        or not 1 <= value[0] <= value[1]
    ):
        raise ValueError(f"{name} must be a (low, high) tuple of ints with 1 <= low <= high, got {value!r}")
    return value


def grouped_stream(
    num_groups: int = 4,
    per_group: int = 16,
    prefix_len: int = 256,
    suffix=(8, 48),
    num_unique: int = 16,
    unique=(32, 192),
    seed: int = 0,
    vocab: int = 49152,
) -> list[GroupedRequest]:
    """``num_groups`` groups of ``per_group`` prompts, each group's opening with its own ``prefix_len``
    random tokens and going on with a unique ``suffix`` (lengths drawn in [low, high]), and ``num_unique``
    prompts of their own (``unique`` lengths); all in a random interleaved order, the arrival order."""
    check_int("num_groups", num_groups, 0)
    check_int("per_group", per_group, 1)
    check_int("prefix_len", prefix_len, 1)
    check_int("num_unique", num_unique, 0)
    suffix, unique = _check_range("suffix", suffix), _check_range("unique", unique)
    if num_groups * per_group + num_unique == 0:
        raise ValueError("num_groups * per_group + num_unique must be >= 1: the stream would be empty")
    rng = np.random.default_rng(seed)

    def draw(lo_hi):
        return tuple(rng.integers(0, vocab, int(rng.integers(lo_hi[0], lo_hi[1] + 1))).tolist())

    reqs = []
    for g in range(num_groups):
        prefix = tuple(rng.integers(0, vocab, prefix_len).tolist())
        reqs += [GroupedRequest(prefix + draw(suffix), g, prefix_len) for _ in range(per_group)]
    reqs += [GroupedRequest(draw(unique)) for _ in range(num_unique)]
    order = rng.permutation(len(reqs))
    return [reqs[i] for i in order]


@dataclass(frozen=True)
class Schedule:
    """One replay: which request ran at which step, and what the cache saved."""

    policy: str
    capacity: int | None
    batch: int
    prompt_tokens: int
    hit_tokens: int
    order: tuple  # request indices in the order they were prefilled
    waits: tuple  # per request (by index): steps from arrival to its prefill
    steps: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens

    @property
    def computed(self) -> int:
        """Prompt tokens prefilled (the last one of each prompt always is: its logits are needed)."""
        return self.prompt_tokens - self.hit_tokens

    @property
    def wait_p50(self) -> float:
        return float(np.percentile(self.waits, 50))

    @property
    def wait_p99(self) -> float:
        return float(np.percentile(self.waits, 99))

    def median_wait(self, ids) -> float:
        """Median wait (steps) of the requests ``ids`` (indices into the stream)."""
        ids = list(ids)
        if not ids or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.waits) for i in ids):
            raise ValueError(
                f"ids must be a non-empty list of request indices in [0, {len(self.waits)}), got {ids!r:.80}"
            )
        return float(np.median([self.waits[i] for i in ids]))


def _check_stream(stream) -> list[tuple]:
    if not isinstance(stream, (list, tuple)) or not stream:
        raise ValueError(f"stream must be a non-empty list of GroupedRequest (or token lists), got {stream!r:.80}")
    prompts = [tuple(r.prompt) if isinstance(r, GroupedRequest) else tuple(r) for r in stream]
    if any(not p for p in prompts):
        raise ValueError("stream must not hold an empty prompt: every prompt needs at least one token")
    return prompts


def schedule(stream, capacity, policy: str = "fcfs", batch: int = 4, arrivals_per_step: int = 8) -> Schedule:
    """Replay ``stream`` (arrival order; ``arrivals_per_step`` requests arrive at each step) through a
    :class:`RadixCache` of ``capacity`` tokens (None: unbounded; else at least the longest prompt). Each step
    the scheduler takes ``batch`` waiting requests, by arrival (``"fcfs"``) or by the length of their cached
    prefix as the step begins, longest first, ties by arrival (``"lpm"``). A chosen request's prefill reuses
    what the tree holds when it runs (an earlier request of the same step included), then caches its prompt."""
    prompts = _check_stream(stream)
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    check_int("batch", batch, 1)
    check_int("arrivals_per_step", arrivals_per_step, 1)
    longest = max(map(len, prompts))
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < longest):
        raise ValueError(f"capacity must be None or an int >= the longest prompt ({longest} tokens), got {capacity!r}")
    tree = RadixCache(capacity)
    n = len(prompts)
    waiting, arrived, step = [], 0, 0
    waits, order, hits = [0] * n, [], 0
    while len(order) < n:
        top = min(n, (step + 1) * arrivals_per_step)
        waiting += range(arrived, top)
        arrived = top
        if policy == "lpm":  # stable sort: ties keep arrival order
            waiting.sort(key=lambda i: -min(tree.peek(prompts[i]), len(prompts[i]) - 1))
        chosen, waiting = waiting[:batch], waiting[batch:]
        if policy == "lpm":
            waiting.sort()  # the rest back in arrival order
        for i in chosen:
            hits += min(tree.match(prompts[i]), len(prompts[i]) - 1)
            tree.insert(prompts[i])
            waits[i] = step - i // arrivals_per_step
            order.append(i)
        step += 1
    total = sum(map(len, prompts))
    return Schedule(policy, capacity, batch, total, hits, tuple(order), tuple(waits), step)


def trie_tokens(stream) -> int:
    """Distinct nodes of the prompts' trie: what any order prefills with room for everything, when no prompt
    is a prefix of another (such a prompt recomputes its last token, which makes the order matter)."""
    tree = RadixCache()
    for p in _check_stream(stream):
        tree.insert(p)
    return tree.tokens


def lru_prediction(stream, capacity: int) -> int:
    """Predicted FCFS hit tokens from the arrival order alone: a request hits its group's prefix when the
    tokens cached since that prefix's last use (that prefix, the other prefixes used in between and every
    prompt's own tokens since) fit in ``capacity``: LRU keeps exactly what was touched within its capacity.
    A prediction, not a bound: the tree evicts whole leaves, by their last use, not single tokens."""
    if not stream or not all(isinstance(r, GroupedRequest) for r in stream):
        raise ValueError("stream must be a non-empty list of GroupedRequest (it needs their groups)")
    check_int("capacity", capacity, 1)
    last, hits = {}, 0
    for i, r in enumerate(stream):
        if r.group is not None and r.group in last:
            between = stream[last[r.group] : i]
            own = sum(len(q.prompt) - q.prefix_len for q in between)
            others = sum({q.group: q.prefix_len for q in between if q.group not in (None, r.group)}.values())
            if r.prefix_len + others + own <= capacity:
                hits += r.prefix_len
        if r.group is not None:
            last[r.group] = i
    return hits


def unique_ids(stream) -> list[int]:
    """Indices of the requests that share no prefix group."""
    return [i for i, r in enumerate(stream) if isinstance(r, GroupedRequest) and r.group is None]


def block_fcfs(stream, capacity: int, block_size: int = 16):
    """The engine's hash-block prefix cache (``BlockManager``, ``capacity`` tokens) on the same FCFS order:
    :func:`course_lib.kv.radix.hit_rates` on the prompts (its radix hits equal ``schedule(..., "fcfs")``'s)."""
    from course_lib.kv.radix import hit_rates

    prompts = _check_stream(stream)
    return hit_rates([(p, p) for p in prompts], capacity, block_size)


def gain_verdict(fcfs: Schedule, lpm: Schedule, at_least: float = 0.10):
    """LPM's hit rate over FCFS's, in points, on one stream and capacity."""
    from course_lib.measure.claims import claim

    _same_run(fcfs, lpm)
    return claim(
        f"at {fcfs.capacity or 0:,} tokens of cache, longest-prefix-match first hits ≥ {at_least:.0%} more of the "
        "prompt tokens than FCFS",
        lpm.hit_rate - fcfs.hit_rate,
        at_least=at_least,
        why_not="the cache holds the live prefixes already (or the queue is too short to reorder): FCFS's order "
        "finds them cached as often",
    )


def same_hits_verdict(fcfs: Schedule, lpm: Schedule):
    """With room for everything both orders prefill the prompts' trie: the hit tokens differ by 0."""
    from course_lib.measure.claims import claim

    _same_run(fcfs, lpm)
    return claim(
        "with room for everything, FCFS and LPM hit the same prompt tokens (difference)",
        abs(lpm.hit_tokens - fcfs.hit_tokens),
        at_most=0,
        unit=" tokens",
        why_not="a bounded cache evicts, so the order decides what is still cached; or a prompt is a prefix of "
        "another, and whichever runs second recomputes its last token",
    )


def fairness_verdict(fcfs: Schedule, lpm: Schedule, ids, at_least: float = 1.0):
    """The price: how many steps longer the requests ``ids`` (e.g. :func:`unique_ids`) wait, at the median."""
    from course_lib.measure.claims import claim

    _same_run(fcfs, lpm)
    return claim(
        f"LPM makes the {len(list(ids))} requests that share no prefix wait ≥ {at_least:g} step longer (median)",
        lpm.median_wait(ids) - fcfs.median_wait(ids),
        at_least=at_least,
        unit=" steps",
        why_not="the queue never holds more than a batch, so every waiting request runs at once under either policy",
    )


def _same_run(fcfs: Schedule, lpm: Schedule) -> None:
    if not (isinstance(fcfs, Schedule) and isinstance(lpm, Schedule)) or (fcfs.policy, lpm.policy) != POLICIES:
        raise ValueError("fcfs and lpm must be Schedules of the 'fcfs' and 'lpm' policies, in that order")
    if (fcfs.capacity, fcfs.batch, fcfs.prompt_tokens) != (lpm.capacity, lpm.batch, lpm.prompt_tokens):
        raise ValueError("fcfs and lpm must replay the same stream at the same capacity and batch")
