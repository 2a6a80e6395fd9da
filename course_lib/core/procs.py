"""Start worker processes in a fraction of a second: a fork server that has imported torch once.

Every process the course starts (chapter 07's gloo ranks, chapter 06's engine processes and the
disaggregated server's workers) used ``multiprocessing``'s "spawn": a fresh interpreter that imports torch
again, 2-5 s of a 2-core machine's time per group before any rank does its work (chapter 07 starts about
ten groups). ``context()`` gives multiprocessing's "forkserver" context instead: the first start launches
one server process that imports ``PRELOAD`` (torch and the course's engine, not transformers) once, and
every later child is an ``os.fork()`` of that server with the imports done (a two-rank group started in
0.08 s on the course's 2-core CPU, against 3-5 s spawned). The server never runs a torch op, so no thread
pool, CUDA context or tokenizer parallelism exists in it to break after a fork.

Its price is memory: the server stays for the life of the process that started it (a notebook's kernel),
about 240 MiB resident, of which about 70 MiB is its own and the rest pages its children share with it. On
the course's CPU, chapter 06's chat server (SmolLM2 in an engine process) measured 1,370 MiB of PSS over
all processes forked this way, against 1,302 MiB spawned.

Two differences from spawn that the course's targets take care of:
- A forked child has the *server's* environment, captured when the server started; ``run_with_env`` (the
  process target) first installs the environment the parent had when it started the child, so a variable
  set later in the parent (a test's ``COURSE_CACHE_DIR``) reaches the child as it did under spawn.
- Modules are the server's copies, imported when it started: code changed on disk afterwards (a notebook
  edited while its kernel runs) is not seen until the kernel restarts.

Linux only: elsewhere (macOS, Windows) the course spawns, as Python does there; ``COURSE_START_METHOD=spawn``
restores spawn on Linux too.
Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import os
import sys

#: what the fork server imports once (a name that fails to import is skipped by multiprocessing). Not
#: transformers: chapter 07's TP ranks measure what a rank saves by never importing it (``tp_standalone``),
#: and a child that needs it imports it itself, as under spawn.
PRELOAD = (
    "torch",
    "torch.distributed",
    "course_lib.engine",
    "course_lib.models.load",
    "course_lib.parallel.launcher",
    "course_lib.serving.server.engine_process",
    "course_lib.serving.disagg.workers",
)
METHODS = ("forkserver", "spawn")


def start_method() -> str:
    """``COURSE_START_METHOD`` ("forkserver" or "spawn"); by default "forkserver" on Linux and "spawn"
    elsewhere (macOS makes forking after system frameworks load unsafe, which is why Python spawns there)."""
    import multiprocessing as mp

    want = os.environ.get("COURSE_START_METHOD", "forkserver" if sys.platform.startswith("linux") else "spawn")
    if want not in METHODS:
        raise ValueError(f"COURSE_START_METHOD must be one of {METHODS}, got {want!r}")
    return want if want in mp.get_all_start_methods() else "spawn"


def context():
    """The ``multiprocessing`` context every course process starts from (see the module docstring)."""
    import multiprocessing as mp

    method = start_method()
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(list(PRELOAD))  # takes effect when the server starts (the first child)
    return ctx


def run_with_env(env: dict, target, *args) -> None:
    """A child's entry point: install ``env`` (the parent's ``os.environ`` when it started the child), then
    run ``target(*args)``."""
    if not isinstance(env, dict):
        raise ValueError(f"env must be a dict of environment variables, got {type(env).__name__}")
    if os.environ != env:
        os.environ.clear()
        os.environ.update(env)
    target(*args)


def process(ctx, target, args: tuple = (), **kwargs):
    """``ctx.Process`` whose child runs ``target(*args)`` under the parent's current environment."""
    if not callable(target):
        raise ValueError(f"target must be a callable, got {target!r}")
    return ctx.Process(target=run_with_env, args=(dict(os.environ), target, *args), **kwargs)


__all__ = ["METHODS", "PRELOAD", "context", "process", "run_with_env", "start_method"]
