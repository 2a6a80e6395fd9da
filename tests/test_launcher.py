"""course_lib.parallel.launcher: results by rank, failures that name the rank, no hang, no orphans.

Every launch spawns fresh interpreters (a few seconds each on a small machine), so the tests share
launches where they can and keep world_size at 2.
"""

import multiprocessing
import os
import time

import psutil
import pytest

from course_lib.parallel import launcher
from course_lib.parallel.launcher import WorkerError, launch


# Workers: top-level functions of an importable module (the spawned interpreters import them by name).
def fail_on_rank_1(rank, world_size):
    if rank == 1:
        raise ValueError("boom from rank 1")
    return rank


def fail_while_peer_waits(rank, world_size):
    """Rank 0 blocks in an all-reduce that rank 1 never joins: rank 1 fails instead."""
    import torch
    import torch.distributed as dist

    if rank == 1:
        time.sleep(0.5)
        raise RuntimeError("rank 1 gave up")
    x = torch.ones(1)
    dist.all_reduce(x)
    time.sleep(600)  # if the collective errors out instead of blocking, still never return on its own
    return rank


def sleep_forever(rank, world_size):
    time.sleep(600)


def _live_children() -> list[psutil.Process]:
    """Child processes of this test process (and theirs), ignoring multiprocessing's resource tracker and the fork
    server (both live for the session; the workers forked by the server are still counted, as its children)."""
    out = []
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
            if child.status() == psutil.STATUS_ZOMBIE or "resource_tracker" in cmd or "forkserver" in cmd:
                continue
        except psutil.NoSuchProcess:
            continue
        out.append(child)
    return out


def _assert_no_children():
    assert multiprocessing.active_children() == []
    deadline = time.monotonic() + 3
    while _live_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _live_children() == []


def info_and_sum(rank, world_size, n=4):
    """One launch, two checks: what the worker sees, and a collective across the ranks."""
    return launcher.rank_info(rank, world_size), launcher.all_reduce_sum(rank, world_size, n=n)


def test_launch_returns_results_by_rank_and_warns_when_oversubscribed(monkeypatch):
    import course_lib.measure.hardware.cpu_probe

    monkeypatch.setattr(course_lib.measure.hardware.cpu_probe, "physical_cores", lambda: 1)  # 2 workers on "1 core"
    with pytest.warns(RuntimeWarning, match="physical cores"):
        out = launch(info_and_sum, 2, backend="gloo", timeout_s=60, n=3)
    infos = [info for info, _ in out]
    assert [i["rank"] for i in infos] == [0, 1]
    assert [i["dist_rank"] for i in infos] == [0, 1]
    assert all(i["world_size"] == 2 and i["backend"] == "gloo" and i["threads"] == 1 for i in infos)
    assert infos[0]["pid"] != infos[1]["pid"] != os.getpid()
    assert [sums for _, sums in out] == [[3.0, 3.0, 3.0], [3.0, 3.0, 3.0]]  # 1 + 2 on every rank
    _assert_no_children()


def test_failing_worker_raises_with_rank_and_traceback():
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        launch(fail_on_rank_1, 2, backend="gloo", timeout_s=60, grace_s=0.5)
    assert info.value.rank == 1
    assert "boom from rank 1" in str(info.value) and "ValueError" in info.value.remote_traceback
    assert time.monotonic() - start < 60  # a WorkerError, not the timeout: the failure ended the call
    _assert_no_children()


def test_peer_blocked_in_collective_is_stopped():
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        launch(fail_while_peer_waits, 2, backend="gloo", timeout_s=60, grace_s=0.5)
    assert info.value.rank == 1 and "rank 1 gave up" in str(info.value)
    assert time.monotonic() - start < 60  # rank 0 never returns on its own: it was terminated
    _assert_no_children()


def test_timeout_stops_a_hanging_worker():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="timed out"):
        launch(sleep_forever, 2, backend="gloo", timeout_s=5)
    assert time.monotonic() - start < 15
    _assert_no_children()


def test_bad_input():
    with pytest.raises(ValueError, match="world_size"):
        launch(launcher.rank_info, 0)
    with pytest.raises(ValueError, match="world_size"):
        launch(launcher.rank_info, 1.5)
    with pytest.raises(ValueError, match="backend"):
        launch(launcher.rank_info, 1, backend="mpi")
    with pytest.raises(ValueError, match="timeout_s"):
        launch(launcher.rank_info, 1, timeout_s=0)
    with pytest.raises(ValueError, match="threads_per_worker"):
        launch(launcher.rank_info, 1, threads_per_worker=0)
    with pytest.raises(TypeError, match="top-level function"):
        launch(lambda rank, ws: rank, 1)

    def nested(rank, ws):
        return rank

    with pytest.raises(TypeError, match="top-level function"):
        launch(nested, 1)
    nested.__module__ = "__main__"  # what a function defined in a notebook cell looks like
    with pytest.raises(TypeError, match="notebook"):
        launch(nested, 1)
    with pytest.raises(TypeError, match="fn must be a function"):
        launch(42, 1)
