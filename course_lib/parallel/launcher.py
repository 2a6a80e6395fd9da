"""Run one function on N processes joined by ``torch.distributed``, and always clean up.

``launch(fn, world_size, *args)`` starts ``world_size`` workers (``core.procs``: forks of a server process
that imported torch once and never ran an op, so no CUDA or OpenMP state leaks from the parent, and a group
starts in ~0.1 s instead of the seconds a spawned interpreter takes to import torch), joins them into a process group
(gloo on a CPU, NCCL when there is one CUDA GPU per rank) through a FileStore in a temporary folder,
gives each its share of the cores (``torch.set_num_threads``), calls ``fn(rank, world_size, *args,
**kwargs)`` on every rank and returns the ranks' return values as a list. A collective is as slow as
its slowest rank, so oversubscribed cores make every rank wait: more workers than physical cores warns.

Failure is the normal case to design for. A rank that raises sends its traceback home; the others are
probably blocked in a collective waiting for it and never return, so after a short grace period they
are terminated (then killed), the process group's temporary folder is removed, and the caller gets a
:class:`WorkerError` naming the rank. Nothing outlives the call: a wall-clock ``timeout_s`` bounds it.

From a notebook: the workers *import* ``fn`` by its module and name (it is pickled by reference), and a
notebook's cells are not a module they can import. So the workers' functions live in ``course_lib``
(this module's ``rank_info`` and ``all_reduce_sum``, ``course_lib.parallel.collectives``' measurement worker),
and the notebook passes them to ``launch``. A script that calls ``launch`` must do so under
``if __name__ == "__main__":`` (each worker re-imports the script's main module). Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import os
import pickle
import queue as queue_mod
import shutil
import tempfile
import time
import traceback
import warnings
from datetime import timedelta
from typing import Any, Callable

GRACE_S = 2.0  # how long the other ranks get to finish on their own once one rank has failed
_POLL_S = 0.05


class WorkerError(RuntimeError):
    """A worker failed: ``rank`` is the failing rank, ``remote_traceback`` its traceback as text."""

    def __init__(self, rank: int, remote_traceback: str, message: str = ""):
        self.rank = rank
        self.remote_traceback = remote_traceback
        head = message or f"rank {rank} failed"
        super().__init__(f"{head}\n--- traceback of rank {rank} ---\n{remote_traceback.rstrip()}")


# ----------------------------------------------------------------------------- example workers
# Worker functions must be importable top-level functions (see the module docstring).
def rank_info(rank: int, world_size: int) -> dict[str, Any]:
    """What a worker sees: its rank, the group's size and backend, and its torch thread count."""
    import torch
    import torch.distributed as dist

    return {
        "rank": rank,
        "world_size": world_size,
        "dist_rank": dist.get_rank(),
        "backend": str(dist.get_backend()),
        "threads": torch.get_num_threads(),
        "pid": os.getpid(),
    }


def all_reduce_sum(rank: int, world_size: int, n: int = 4) -> list[float]:
    """Each rank contributes ``rank + 1`` in ``n`` elements; every rank gets the sum 1 + … + world_size."""
    import torch
    import torch.distributed as dist

    x = torch.full((n,), float(rank + 1), device=worker_device())  # (n,)
    dist.all_reduce(x)  # sum over ranks, in place
    return x.cpu().tolist()


def fail_on_rank(rank: int, world_size: int, bad_rank: int = 1) -> int:
    """A worker that crashes on ``bad_rank`` while the others wait in a collective: what ``launch`` does
    with a failure (the error reaches the caller, the waiting ranks are stopped, nothing hangs)."""
    import torch
    import torch.distributed as dist

    if rank == bad_rank:
        raise RuntimeError(f"rank {rank} failed on purpose")
    dist.all_reduce(torch.ones(1))  # never completes: the bad rank does not join
    return rank


def worker_device():
    """The device a worker computes on: ``cuda:<local rank>`` under NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ----------------------------------------------------------------------------- checks
def default_backend(world_size: int) -> str:
    """ "nccl" when CUDA has at least ``world_size`` GPUs (one per rank), else "gloo"."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def _check_fn(fn: Callable) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be a function, got {fn!r}")
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    why = ""
    if module in (None, "__main__", "__mp_main__"):
        why = (
            f"it is defined in {module or 'no module'!r} (a notebook or a script run directly), which the "
            "workers cannot import"
        )
    elif "<lambda>" in qualname or "<locals>" in qualname:
        why = "lambdas and functions defined inside another function cannot be pickled by name"
    else:
        try:
            pickle.dumps(fn)
        except Exception as err:  # noqa: BLE001 - report any pickling failure the same way
            why = f"pickling it failed ({err})"
    if why:
        raise TypeError(
            f"fn={qualname!r} cannot be sent to the workers: {why}. launch() starts processes (core.procs) "
            "that import fn by module and name, so fn must be a top-level function of an importable module "
            "(e.g. one in course_lib.parallel), not a lambda, a nested function or a notebook cell."
        )


def _check_args(args: tuple, kwargs: dict) -> None:
    try:
        pickle.dumps((args, kwargs))
    except Exception as err:  # noqa: BLE001
        raise TypeError(f"the arguments for the workers cannot be pickled ({err}); pass plain data") from None


def _check_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def threads_for(world_size: int, cores: int | None = None) -> int:
    """Each worker's share of the physical cores: cores // world_size, at least 1."""
    from course_lib.measure.hardware.cpu_probe import physical_cores

    return max(1, (cores or physical_cores()) // world_size)


# ----------------------------------------------------------------------------- the worker side
def _worker(rank, world_size, backend, init_method, threads, timeout_s, fn, args, kwargs, results) -> None:
    """Body of one worker process: set threads, join the group, run fn, send (rank, ok, payload) home."""
    import torch
    import torch.distributed as dist

    status, payload = "ok", b""
    try:
        torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        result = fn(rank, world_size, *args, **kwargs)
        try:
            payload = pickle.dumps(result)  # plain pickle: tensors travel by value, not by shared memory
        except Exception as err:  # noqa: BLE001
            raise TypeError(f"rank {rank}'s return value cannot be pickled ({err})") from None
    except BaseException:  # noqa: BLE001 - everything, KeyboardInterrupt included, goes home as text
        status, payload = "error", traceback.format_exc().encode()
    results.put((rank, status, payload))
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the group may be half-broken after a failure
        pass
    if status == "error":
        results.close()
        results.join_thread()  # make sure the traceback is in the pipe before exiting
        os._exit(1)


# ----------------------------------------------------------------------------- the parent side
def _stop(procs, grace_s: float) -> None:
    """Join the workers; after ``grace_s`` terminate (SIGTERM) those left, then kill (SIGKILL)."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join(1.0)
    for p in procs:
        try:
            p.close()
        except ValueError:  # still running after SIGKILL (uninterruptible sleep): nothing more to do
            pass


def launch(
    fn: Callable,
    world_size: int,
    *args,
    backend: str | None = None,
    threads_per_worker: int | None = None,
    timeout_s: float = 120.0,
    grace_s: float = GRACE_S,
    **kwargs,
) -> list:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` processes; return results by rank.

    ``backend``: "gloo" or "nccl" (default: NCCL with one GPU per rank, else gloo). ``threads_per_worker``:
    default physical cores // world_size. ``timeout_s`` bounds the whole call (also the collectives'
    timeout inside the workers). A failing rank raises :class:`WorkerError` (rank and traceback) after the
    others were given ``grace_s`` seconds and then terminated; running out of time raises TimeoutError.
    ``fn`` must be a top-level function of an importable module (not a notebook cell, not a lambda)."""
    from course_lib.core import procs as proc_start
    from course_lib.measure.hardware.cpu_probe import physical_cores

    world_size = _check_int("world_size", world_size)
    if not (isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if not (isinstance(grace_s, (int, float)) and not isinstance(grace_s, bool) and grace_s >= 0):
        raise ValueError(f"grace_s must be a number of seconds >= 0, got {grace_s!r}")
    backend = default_backend(world_size) if backend is None else backend
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or None, got {backend!r}")
    if backend == "nccl":
        import torch

        if torch.cuda.device_count() < world_size:
            raise ValueError(f"backend='nccl' needs one CUDA GPU per rank: {torch.cuda.device_count()} < {world_size}")
    _check_fn(fn)
    _check_args(args, kwargs)
    cores = physical_cores()
    threads = threads_for(world_size, cores) if threads_per_worker is None else threads_per_worker
    threads = _check_int("threads_per_worker", threads)
    if world_size * threads > cores and backend == "gloo":
        warnings.warn(
            f"{world_size} workers × {threads} thread(s) > {cores} physical cores: each worker gets a share of a "
            "core, and a collective waits for its slowest rank, so every rank runs at the pace of the one the OS "
            "has descheduled; times measured this way overstate what separate devices would take",
            RuntimeWarning,
            stacklevel=2,
        )

    ctx = proc_start.context()  # a fork server with torch imported: a group starts in ~0.1 s instead of seconds
    results = ctx.Queue()
    tmp = tempfile.mkdtemp(prefix="course_dist_")
    init_method = "file://" + os.path.join(tmp, "store")
    procs = []
    done: dict[int, Any] = {}
    failure: tuple[int, str, str] | None = None  # (rank, traceback, message)
    deadline = time.monotonic() + timeout_s
    try:
        for rank in range(world_size):
            p = proc_start.process(
                ctx,
                _worker,
                (rank, world_size, backend, init_method, threads, timeout_s, fn, args, kwargs, results),
                daemon=True,  # never outlive the parent, even if it is killed
                name=f"course-dist-rank{rank}",
            )
            p.start()
            procs.append(p)
        dead_since: dict[int, float] = {}
        while len(done) < world_size and failure is None:
            try:
                rank, status, payload = results.get(timeout=_POLL_S)
            except queue_mod.Empty:
                rank = None
            if rank is not None:
                if status == "ok":
                    done[rank] = pickle.loads(payload)
                else:
                    failure = (rank, payload.decode(errors="replace"), "")
                continue
            now = time.monotonic()
            for r, p in enumerate(procs):  # a rank that died without reporting (segfault, OOM killer)
                if r not in done and p.exitcode is not None:
                    first = dead_since.setdefault(r, now)
                    if now - first > 1.0:  # its last message would have arrived by now
                        failure = (r, "(no traceback: the process died)", f"rank {r} exited with code {p.exitcode}")
                        break
            if failure is None and now > deadline:
                missing = [r for r in range(world_size) if r not in done]
                raise TimeoutError(
                    f"launch timed out after {timeout_s:g} s; ranks {missing} had not finished "
                    "(stuck in a collective? a rank waiting for a peer that never called it?)"
                )
    finally:
        _stop(procs, grace_s if failure is not None else (grace_s if len(done) == world_size else 0.0))
        results.close()
        results.join_thread()
        shutil.rmtree(tmp, ignore_errors=True)
    if failure is not None:
        rank, tb, message = failure
        raise WorkerError(rank, tb, message)
    return [done[r] for r in range(world_size)]


__all__ = [
    "GRACE_S",
    "WorkerError",
    "all_reduce_sum",
    "default_backend",
    "launch",
    "rank_info",
    "threads_for",
    "worker_device",
]
