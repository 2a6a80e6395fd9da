"""Cache-aware scheduling (chapter 06): FCFS and longest-prefix-match first over a bounded radix tree."""

from __future__ import annotations

import numpy as np
import pytest

from course_lib.kv import radix
from course_lib.serving import cache_aware as ca


def _reference(prompts, capacity, policy, batch, arrivals_per_step):
    """Brute force: one request at a time, picked by scanning the whole queue; cache hits either by a
    brute-force longest common prefix over every prompt run so far (unbounded) or by a RadixCache."""
    n = len(prompts)
    tree = radix.RadixCache(capacity) if capacity is not None else None
    done, waits, order, hits, step = [], [0] * n, [], 0, 0
    while len(order) < n:
        waiting = [i for i in range(min(n, (step + 1) * arrivals_per_step)) if i not in order]

        def cached(i):
            m = radix.brute_force_match(done, prompts[i]) if tree is None else tree.peek(prompts[i])
            return min(m, len(prompts[i]) - 1)

        ranks = {i: cached(i) for i in waiting}  # ranked once, as the step begins
        chosen = []
        for _ in range(min(batch, len(waiting))):
            rest = [i for i in waiting if i not in chosen]
            if policy == "fcfs":
                chosen.append(min(rest))
            else:
                chosen.append(max(rest, key=lambda i: (ranks[i], -i)))
        for i in chosen:
            if tree is None:
                hits += cached(i)
                done.append(prompts[i])
            else:
                hits += min(tree.match(prompts[i]), len(prompts[i]) - 1)
                tree.insert(prompts[i])
            waits[i] = step - i // arrivals_per_step
            order.append(i)
        step += 1
    return hits, tuple(order), tuple(waits)


def _small_stream(rng):
    prefixes = [tuple(rng.integers(0, 4, int(rng.integers(1, 6))).tolist()) for _ in range(3)]
    out = []
    for _ in range(int(rng.integers(2, 12))):
        own = tuple(rng.integers(0, 4, int(rng.integers(1, 5))).tolist())
        out.append(prefixes[int(rng.integers(0, 3))] + own if rng.random() < 0.7 else own)
    return out


@pytest.mark.parametrize("policy", ca.POLICIES)
def test_schedule_equals_brute_force_reference(policy):
    rng = np.random.default_rng(1)
    for _ in range(150):
        prompts = _small_stream(rng)
        longest = max(map(len, prompts))
        capacity = None if rng.random() < 0.4 else int(rng.integers(longest, 3 * longest + 1))
        batch, per_step = int(rng.integers(1, 4)), int(rng.integers(1, 5))
        got = ca.schedule(prompts, capacity, policy, batch, per_step)
        assert (got.hit_tokens, got.order, got.waits) == _reference(prompts, capacity, policy, batch, per_step)
        assert got.prompt_tokens == sum(map(len, prompts))
        assert got.steps == max(w + i // per_step for i, w in enumerate(got.waits)) + 1


def test_fcfs_hits_equal_radix_hit_rates_replay():
    """FCFS's order is the arrival order: the tree's hits are those of chapter 05's replay (radix.hit_rates)."""
    stream = ca.grouped_stream(num_groups=3, per_group=6, prefix_len=96, num_unique=6, unique=(16, 96), seed=3)
    for cap in (160, 300, 600, 10_000):
        fcfs = ca.schedule(stream, cap, "fcfs", batch=3, arrivals_per_step=5)
        assert fcfs.hit_tokens == ca.block_fcfs(stream, cap).radix_hits


def test_with_room_for_everything_every_order_prefills_the_trie():
    for seed in range(4):
        stream = ca.grouped_stream(num_groups=3, per_group=5, prefix_len=64, suffix=(4, 16), num_unique=4, seed=seed)
        trie = ca.trie_tokens(stream)
        for policy in ca.POLICIES:
            for batch, per_step in ((1, 1), (2, 6), (5, 3)):
                assert ca.schedule(stream, None, policy, batch, per_step).computed == trie


def test_lpm_ties_fall_back_to_arrival_and_peek_does_not_touch_lru():
    # nothing cached: LPM is FCFS
    prompts = [(1, 2), (3, 4), (5, 6)]
    assert ca.schedule(prompts, None, "lpm", batch=1, arrivals_per_step=3).order == (0, 1, 2)
    tree = radix.RadixCache(6)
    tree.insert((1, 2, 3))
    tree.insert((4, 5, 6))
    assert tree.peek((1, 2, 3)) == 3  # a look, not a use: (1, 2, 3) stays the least recently used
    tree.insert((7, 8))
    assert tree.peek((1, 2, 3)) == 0 and tree.peek((4, 5, 6)) == 3


def _chapter_runs(capacity=512, **kw):
    stream = ca.grouped_stream(num_groups=4, per_group=16, prefix_len=256, num_unique=16, seed=0)
    kw = {"batch": 4, "arrivals_per_step": 8, **kw}
    return stream, ca.schedule(stream, capacity, "fcfs", **kw), ca.schedule(stream, capacity, "lpm", **kw)


def test_gain_verdict_holds_under_a_small_cache_and_fails_where_order_cannot_matter():
    _, fcfs, lpm = _chapter_runs(512)
    assert ca.gain_verdict(fcfs, lpm)
    _, fcfs, lpm = _chapter_runs(None)  # room for everything: the same hits
    assert not ca.gain_verdict(fcfs, lpm)
    _, fcfs, lpm = _chapter_runs(512, batch=1, arrivals_per_step=1)  # no queue: nothing to reorder
    assert fcfs.order == lpm.order and not ca.gain_verdict(fcfs, lpm)


def test_same_hits_verdict_holds_with_room_and_fails_under_eviction():
    _, fcfs, lpm = _chapter_runs(None)
    assert ca.same_hits_verdict(fcfs, lpm)
    _, fcfs, lpm = _chapter_runs(512)
    assert not ca.same_hits_verdict(fcfs, lpm)


def test_fairness_verdict_holds_with_a_queue_and_fails_without_one():
    stream, fcfs, lpm = _chapter_runs(512)
    assert ca.fairness_verdict(fcfs, lpm, ca.unique_ids(stream))
    stream, fcfs, lpm = _chapter_runs(512, batch=4, arrivals_per_step=4)  # each step runs all that arrived
    assert set(fcfs.waits) == set(lpm.waits) == {0}
    assert not ca.fairness_verdict(fcfs, lpm, ca.unique_ids(stream))


def test_lru_prediction_is_exact_where_eviction_is_whole_prefixes():
    """Round robin over two groups, room for one prefix: FCFS evicts each prefix before its next use (the
    prediction: 0 hits); room for both: every request after its group's first hits the prefix."""
    a, b = tuple(range(100, 140)), tuple(range(200, 240))
    stream = [ca.GroupedRequest((a, b)[k % 2] + (k,), k % 2, 40) for k in range(8)]
    for cap, expect in ((50, 0), (90, 6 * 40)):
        assert ca.lru_prediction(stream, cap) == expect
        assert ca.schedule(stream, cap, "fcfs", batch=1, arrivals_per_step=1).hit_tokens == expect


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: ca.schedule([], None), "stream"),
        (lambda: ca.schedule([(1,), ()], None), "stream"),
        (lambda: ca.schedule([(1, 2)], None, policy="sjf"), "policy"),
        (lambda: ca.schedule([(1, 2)], None, batch=0), "batch"),
        (lambda: ca.schedule([(1, 2)], None, arrivals_per_step=True), "arrivals_per_step"),
        (lambda: ca.schedule([(1, 2, 3)], 2), "capacity"),
        (lambda: ca.schedule([(1, 2, 3)], 4.0), "capacity"),
        (lambda: ca.grouped_stream(num_groups=-1), "num_groups"),
        (lambda: ca.grouped_stream(suffix=(9, 3)), "suffix"),
        (lambda: ca.grouped_stream(unique=[1, 2]), "unique"),
        (lambda: ca.grouped_stream(num_groups=0, num_unique=0), "num_unique"),
        (lambda: ca.lru_prediction([(1, 2)], 4), "stream"),
        (lambda: ca.lru_prediction(ca.grouped_stream(), 0), "capacity"),
        (lambda: ca.schedule([(1, 2)], None).median_wait([]), "ids"),
        (lambda: ca.schedule([(1, 2)], None).median_wait([3]), "ids"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_verdicts_refuse_mismatched_runs():
    _, fcfs, lpm = _chapter_runs(512)
    _, other, _ = _chapter_runs(768)
    with pytest.raises(ValueError, match="fcfs and lpm"):
        ca.gain_verdict(lpm, fcfs)
    with pytest.raises(ValueError, match="same stream"):
        ca.same_hits_verdict(other, lpm)
