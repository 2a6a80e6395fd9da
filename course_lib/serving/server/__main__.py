"""The command line: ``python -m course_lib.serving.server --model tiny-target --port 8000`` serves until
Ctrl-C. The engine steps in a process of its own by default (``--engine process``, vLLM's API-server +
engine-core layout: chapter 06 measures it adding the least to TPOT); ``--engine thread`` runs it on a thread
of the server's process instead (one interpreter lock for the HTTP side and the engine).
Introduced in 06_batching_serving.ipynb."""

from __future__ import annotations

import time

from course_lib.serving.server.engine_process import EngineProcess
from course_lib.serving.server.launch import serve


def main(argv=None) -> None:
    """``python -m course_lib.serving.server --model tiny-target --port 8000``: serve until Ctrl-C."""
    import argparse

    from course_lib.engine import Engine

    ap = argparse.ArgumentParser(prog="python -m course_lib.serving.server", description=main.__doc__)
    ap.add_argument("--model", default="tiny-target")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-queue", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument(
        "--engine",
        choices=("process", "thread"),
        default="process",
        help="where the engine steps: a process of its own (default) or a thread of the server's process",
    )
    ap.add_argument("--engine-process", action="store_true", help="the same as --engine process (the default)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads of the engine")
    ap.add_argument("--max-num-seqs", type=int, default=None, help="sequences per step (the KV cache's slots)")
    ap.add_argument("--max-model-len", type=int, default=None, help="tokens per sequence the KV cache holds")
    args = ap.parse_args(argv)
    for name in ("threads", "max_num_seqs", "max_model_len"):
        v = getattr(args, name)
        if v is not None and v < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    sizes = {k: getattr(args, k) for k in ("max_num_seqs", "max_model_len") if getattr(args, k) is not None}
    from course_lib.engine.scheduler import SchedulerConfig

    if args.engine_process and args.engine == "thread":
        ap.error("--engine-process and --engine thread contradict each other")
    if args.engine == "process":
        extra = {"config": SchedulerConfig(**sizes)} if sizes else {}
        engine = EngineProcess(args.model, threads=args.threads, **extra)
    else:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        engine = Engine(args.model, config=SchedulerConfig(**sizes) if sizes else None)
    with serve(
        engine,
        args.host,
        args.port,
        max_queue=args.max_queue,
        request_timeout_s=args.timeout,
        model_name=args.model,
    ) as server:
        print(f"serving {args.model} at {server.openai_base_url} (Ctrl-C stops)", flush=True)
        try:
            while server.running:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":  # spawned engine processes re-import this module: they must not serve
    main()
