"""What each lever against per-op overhead buys a decode step: ops dispatched and µs per step.

The levers are the engine's decode modes (``engine/fast_decode.py``): "eager" (the reference forward),
"fused" (the same maths in fewer ops and allocations), "compiled" (``torch.compile`` of the fused step)
and "cudagraph" (on a CUDA device: one graph replay per step). For each we time one decode step of one
sequence at a fixed context, forward + greedy argmax + the token's trip to the host (``.tolist()``, the
moment the engine emits it), median of ``repeats`` runs of ``steps`` steps, and count the aten ops the
step dispatches (``count_dispatched``, from the profiler; a compiled step's fused C++ loops are not ops,
so it counts only what the compiled code still dispatches). The engine's whole decode loop against HF
``generate`` (``engine_vs_hf.step_time``) turns a lever into the issue's goal: tiny-target ≥ 3× HF at
batch 1. Compiling SmolLM2 takes minutes on 2 cores, so quick mode loads the compiled rows from the run
recorded by ``python -m course_lib.bottlenecks.step_levers --record``. Shown in 02_metrics_1_latency.ipynb.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from course_lib.bottlenecks.engine_vs_hf import PROMPT, step_time
from course_lib.engine.engine import Engine
from course_lib.engine.fast_decode import DECODE_MODES, FastDecoder
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.scheduler import SchedulerConfig
from course_lib.kernels import cpu_gemv
from course_lib.measure.bench import benchmark
from course_lib.measure.claims import claim, relative_spread

RECORDED = Path(__file__).resolve().parents[2] / "data" / "measurements" / "step-levers-cpu.json"


@dataclass
class LeverRow:
    model: str
    lever: str
    ops: int  # aten ops one step dispatches from Python
    step_us: float  # median µs of one decode step (forward + argmax + token to host)
    samples_us: list[float] = field(default_factory=list)
    compile_s: float = 0.0  # the first call (compilation, capture); 0 for eager paths
    vs_hf: float | None = None  # HF generate's step time / the engine's whole decode step with this lever
    spread: float = 0.0  # relative run-to-run spread of step_us


def count_dispatched(fn) -> int:
    """Ops ``fn()`` dispatches from Python or from compiled code: the profiler's op events (``ns::name``)
    that no other op called (an ``aten::linear`` counts once, not with the ``addmm`` inside it). Unlike a
    ``TorchDispatchMode`` counter, this leaves a ``torch.compile``d function on its compiled path, where
    inductor's generated C++ loops are not ops at all."""
    from torch.profiler import ProfilerActivity, profile

    sys.stderr.flush()
    saved = os.dup(2)  # the profiler's C++ side prints start/stop lines to fd 2: keep them out of the notebook
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fn()
    finally:
        os.dup2(saved, 2)
        os.close(saved)

    def outer(ev) -> bool:
        p = ev.cpu_parent
        while p is not None:
            if "::" in p.name:
                return False
            p = p.cpu_parent
        return True

    return sum(1 for ev in prof.events() if "::" in ev.name and outer(ev))


def set_lever(engine: Engine, lever: str) -> None:
    """Route the engine's decode steps through ``lever`` (one of ``DECODE_MODES``)."""
    if lever not in DECODE_MODES:
        raise ValueError(f"lever must be one of {DECODE_MODES}, got {lever!r}")
    engine.fast = None if lever == "eager" else FastDecoder(engine.model, lever)


def step_fn(engine: Engine, context: int):
    """One decode step of one sequence at ``context`` tokens (its slot rewritten each call)."""
    be = engine.backend
    row = be.allocate()
    be.append(row, context)
    tok = [engine.tokenizer(PROMPT)["input_ids"][-1]]

    def step() -> list[int]:
        return engine.forward([row], [tok], [context - 1]).argmax(-1).tolist()

    return step, lambda: be.free(row)


@torch.inference_mode()
def measure_lever(
    engine: Engine, lever: str, name: str, context: int = 64, steps: int = 20, repeats: int = 5, hf_step_s=None
) -> LeverRow:
    """Ops and µs per decode step of ``engine`` with ``lever``; ``hf_step_s`` adds the ratio to HF."""
    for arg, v in (("context", context), ("steps", steps), ("repeats", repeats)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{arg} must be a positive int, got {v!r}")
    if repeats < 2:
        raise ValueError(f"repeats must be ≥ 2 to give a spread, got {repeats}")
    set_lever(engine, lever)
    step, free = step_fn(engine, context)
    try:
        t0 = time.perf_counter()
        step()  # compiles / captures on the first call
        compile_s = time.perf_counter() - t0 if lever in ("compiled", "cudagraph") else 0.0
        ops = count_dispatched(step)
        r = benchmark(lambda: [step() for _ in range(steps)], warmup=1, repeats=repeats, device=engine.device.type)
    finally:
        free()
    samples = [s / steps * 1e6 for s in r.samples_s]
    vs_hf = None
    if hf_step_s is not None:
        prompts = [PROMPT]

        def ours(n: int) -> None:
            engine.generate(prompts, SamplingParams(max_new_tokens=n, ignore_eos=True))

        vs_hf = hf_step_s / step_time(ours, steps + 1, repeats, engine.device.type)
    set_lever(engine, "eager")
    return LeverRow(name, lever, ops, r.median_s / steps * 1e6, samples, compile_s, vs_hf, relative_spread(samples))


@torch.inference_mode()
def hf_step_s(engine: Engine, new_tokens: int = 21, repeats: int = 3) -> float:
    """Seconds per decode step of HF ``generate`` on the engine's model, batch 1, greedy."""
    hf, tok = engine.hf_model, engine.tokenizer
    ids = tok(PROMPT, return_tensors="pt")["input_ids"].to(engine.device)

    def theirs(n: int) -> None:
        hf.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )

    return step_time(theirs, new_tokens, repeats, engine.device.type)


def lever_rows(
    engine: Engine, name: str, levers=("eager", "fused"), context: int = 64, steps: int = 20, repeats: int = 5
) -> list[LeverRow]:
    """One ``LeverRow`` per lever on one engine, each with its ratio to HF generate."""
    hf = hf_step_s(engine, steps + 1, min(repeats, 3))
    return [measure_lever(engine, lv, name, context, steps, repeats, hf) for lv in levers]


def fewer_ops(ref: LeverRow, row: LeverRow, factor: float = 2.0, where: str = "on this machine"):
    """Verdict: ``row``'s step dispatches at least ``factor``× fewer ops than ``ref``'s (``where``: whose run)."""
    return claim(
        f"{row.model}: the {row.lever} step dispatches at least {factor:g}x fewer ops than {ref.lever} "
        f"({row.ops} vs {ref.ops})",
        ref.ops / max(row.ops, 1),
        at_least=factor,
        where=where,
        why_not=f"it removed {ref.ops - row.ops} of {ref.ops} ops: the rest are still dispatched one by one",
    )


def faster(ref: LeverRow, row: LeverRow):
    """Verdict: ``row``'s step is faster than ``ref``'s (inside the noise when the two are that close)."""
    return claim(
        f"{row.model}: the {row.lever} step is faster than {ref.lever} ({row.step_us:.0f} vs {ref.step_us:.0f} µs)",
        ref.step_us / row.step_us,
        at_least=1.0,
        spread=max(ref.spread, row.spread),
        why_not=(
            f"{ref.ops - row.ops} fewer ops saved less than the step's run-to-run spread (±{max(ref.spread, row.spread):.0%})"
            if ref.ops > row.ops
            else f"it dispatches as many ops as {ref.lever} ({row.ops} vs {ref.ops}): nothing was removed to save time"
        ),
    )


def hf_goal(row: LeverRow, goal: float = 3.0, where: str = "on this machine"):
    """Verdict against the issue's goal: the engine's decode at batch 1 ≥ ``goal``× HF ``generate``."""
    if row.vs_hf is None:
        raise ValueError(f"row {row.model}/{row.lever} has no vs_hf ratio: measure it with hf_step_s")
    return claim(
        f"{row.model} with the {row.lever} step decodes at least {goal:g}x faster than HF generate at batch 1",
        row.vs_hf,
        at_least=goal,
        spread=row.spread,
        where=where,
        why_not=f"its step dispatches {row.ops} torch ops and takes {row.step_us:.0f} µs",
    )


def format_rows(rows: list[LeverRow]) -> str:
    head = f"{'model':<24} {'lever':<10} {'ops/step':>8} {'µs/step':>9} {'± spread':>8} {'vs HF':>6} {'1st call s':>10}"
    lines = [head]
    for r in rows:
        hf = f"{r.vs_hf:5.2f}x" if r.vs_hf is not None else "     -"
        lines.append(
            f"{r.model:<24} {r.lever:<10} {r.ops:>8} {r.step_us:>9.0f} {r.spread:>8.0%} {hf:>6} {r.compile_s:>10.1f}"
        )
    return "\n".join(lines)


def load_recorded(path: Path = RECORDED) -> tuple[list[LeverRow], dict]:
    """The recorded rows and their provenance (machine, command, date)."""
    data = json.loads(Path(path).read_text())
    return [LeverRow(**r) for r in data["rows"]], data["provenance"]


def record(path: Path = RECORDED, models=("tiny-target", "smollm2-135m-instruct"), threads: int = 2) -> list[LeverRow]:
    torch.set_num_threads(threads)
    rows = []
    for name in models:
        engine = Engine(name, config=SchedulerConfig(max_model_len=256, max_num_seqs=2))
        rows += lever_rows(engine, name, ("eager", "fused", "compiled") + (("native",) if cpu_gemv.available() else ()))
        print(format_rows(rows), flush=True)
        del engine
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    prov = {
        "machine": f"{cpu or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "command": f"python -m course_lib.bottlenecks.step_levers --record --threads {threads}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    Path(path).write_text(json.dumps({"provenance": prov, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    return rows


def main(argv=None) -> list[LeverRow]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help=f"measure every lever on CPU and write {RECORDED.name}")
    ap.add_argument("--model", default="tiny-target")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--levers", nargs="+", default=["eager", "fused"], choices=DECODE_MODES)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of --record (2: the llama.cpp comparison's)")
    ap.add_argument("--json", help="write the rows there")
    args = ap.parse_args(argv)
    if args.record:
        return record(threads=args.threads)
    engine = Engine(args.model, device=args.device, config=SchedulerConfig(max_model_len=256, max_num_seqs=2))
    rows = lever_rows(engine, args.model, tuple(args.levers))
    print(format_rows(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "rows": [asdict(r) for r in rows]}, indent=1))
    return rows


if __name__ == "__main__":
    main()
