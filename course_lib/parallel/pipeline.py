"""Pipeline parallelism for inference: the model's layers cut into p stages, one process each (GPipe).

Stage 0 embeds and runs the first layers, each next stage runs the next slice, the last one applies the
head; activations (N, D) travel rank → rank + 1 with point-to-point ``send``/``recv``, and the last stage
sends the sampled token ids back to stage 0 for the next decode step. Each stage keeps the KV cache of its
own layers only (``StageBackend``). Like cooks on a line, a stage is idle until the first dish reaches it
(fill) and after the last one left it (drain): with a batch cut into m equal micro-batches, stage s runs
micro-batch j in time slot s + j, every stage is busy m of the m + p − 1 slots, and the idle share — the
*bubble* — is (p − 1)/(m + p − 1). More micro-batches shrink it, but each is smaller and less efficient.

Per stage the work is the same kind as the whole model's (prefill compute-bound, decode bandwidth-bound on
its own layers' weights), on 1/p of the layers; what pipelining adds is the bubble and one activation
transfer per micro-batch per stage boundary. A stage posts the receives of a whole step up front, so a
transfer lands while it computes; the first micro-batch's hand-off still delays each next stage once, by
t_comm, and ``bubble_with_comm`` is the formula with it. Each worker loads the whole checkpoint (a tiny one
here) but touches only its slice of layers. Introduced in 07_parallelism.ipynb.

    tl = gpipe_schedule(p=4, m=8)                     # simulated: no processes, drawn instantly
    tl.bubble() == bubble_fraction(4, 8)              # 3/11
    runs = measure_bubble("tiny-target", prompts, p=2, ms=(1, 2, 4))              # measured, 2 processes
    print(format_bubble_rows(bubble_rows(runs)))      # formula, + t_comm, wall clock, CPU-time replay
    res = pipeline_generate("tiny-target", prompts, p=2, m=4, max_new_tokens=8)   # spawns 2 processes
    plot_timeline(res.timeline)
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path

import torch

from course_lib.engine.attention import ContiguousBackend

LINEAR_CHOICES = ("auto", "reference", "skinny")


# ----------------------------------------------------------------------------- pure functions
def _check_count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def bubble_fraction(p: int, m: int) -> float:
    """GPipe's idle share (p − 1)/(m + p − 1): p stages, m equal micro-batches, fill and drain once."""
    _check_count("p (pipeline stages)", p)
    _check_count("m (micro-batches)", m)
    return (p - 1) / (m + p - 1)


def _check_time(name: str, value, minimum_exclusive: bool = False):
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (minimum_exclusive and value == 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if minimum_exclusive else '>= 0'}, got {value!r}")
    return value


def bubble_with_comm(p: int, m: int, t_stage, t_comm) -> float:
    """The bubble when each hand-off between stages takes ``t_comm`` (overlapped with the sender's next
    micro-batch, so paid once per stage boundary, in the fill): (p − 1)(t + c) / ((m + p − 1)·t + (p − 1)·c),
    t = ``t_stage`` the time of one micro-batch on one stage. c = 0 gives ``bubble_fraction``."""
    _check_count("p (pipeline stages)", p)
    _check_count("m (micro-batches)", m)
    t, c = _check_time("t_stage", t_stage, True), _check_time("t_comm", t_comm)
    return (p - 1) * (t + c) / ((m + p - 1) * t + (p - 1) * c)


def stage_bounds(num_layers: int, p: int) -> list[tuple[int, int]]:
    """(start, stop) layer range of each of p stages: equal slices, so no stage holds up the others."""
    _check_count("num_layers", num_layers)
    _check_count("p (pipeline stages)", p)
    if num_layers % p:
        raise ValueError(
            f"world_size (pipeline stages) p={p} does not divide the model's {num_layers} layers: every stage "
            f"must hold the same number of layers, or the slowest sets the pace; use p in "
            f"{[d for d in range(1, num_layers + 1) if num_layers % d == 0]}"
        )
    k = num_layers // p
    return [(s * k, (s + 1) * k) for s in range(p)]


def split_micro_batches(num_seqs: int, m: int) -> list[list[int]]:
    """Sequence indices of each of m micro-batches, in order; sizes differ by at most one (first ones larger)."""
    _check_count("num_seqs", num_seqs)
    _check_count("m (micro-batches)", m)
    if m > num_seqs:
        raise ValueError(f"m={m} micro-batches need at least {m} sequences, got {num_seqs}")
    q, r = divmod(num_seqs, m)
    out, start = [], 0
    for j in range(m):
        size = q + (j < r)
        out.append(list(range(start, start + size)))
        start += size
    return out


# ----------------------------------------------------------------------------- timelines
@dataclass(frozen=True)
class Slot:
    """Stage ``stage`` worked on micro-batch ``micro`` from ``start`` to ``end`` (seconds from the common start);
    ``step`` 0 is the prefill, k ≥ 1 the k-th decode step."""

    stage: int
    micro: int
    start: float
    end: float
    step: int = 0
    cpu: float | None = None  # CPU seconds of the stage's main thread in the slot (measured runs, one torch
    # thread per stage, the default): less than end − start means the OS gave the core to someone else


@dataclass
class Timeline:
    """Every slot of a pipelined run; ``bubble()`` = idle time / (stages × makespan)."""

    stages: int
    micro_batches: int
    slots: list[Slot] = field(default_factory=list)
    unit: str = "s"  # measured: seconds; simulated: whatever t_stage was given in

    @property
    def makespan(self):
        """From the first slot's start to the last slot's end."""
        if not self.slots:
            raise ValueError("an empty timeline has no makespan")
        return max(s.end for s in self.slots) - min(s.start for s in self.slots)

    def busy(self, stage: int):
        """Time stage ``stage`` spent working."""
        return sum((s.end - s.start for s in self.slots if s.stage == stage), 0)

    def bubble(self):
        """Idle share over all stages: 1 − busy / (stages × makespan). Exact for exact (int, Fraction) times."""
        total = self.stages * self.makespan
        idle = total - sum((self.busy(s) for s in range(self.stages)), 0)
        return idle / total

    def cpu_share(self) -> float:
        """CPU time / wall time inside the slots: ~1 when each stage had its core, lower when the OS gave it
        to another process (an oversubscribed machine stretches the bars and the measured bubble with them)."""
        if any(s.cpu is None for s in self.slots):
            raise ValueError("cpu_share needs measured slots (a simulated timeline has no CPU times)")
        return sum(s.cpu for s in self.slots) / sum(s.end - s.start for s in self.slots)

    def replayed(self, t_comm: float = 0.0) -> Timeline:
        """The same schedule re-timed with each slot's CPU time (``gpipe_schedule`` with measured durations):
        the run as it would go with a dedicated core per stage, and hand-offs that take ``t_comm`` (default:
        free). One-step timelines only."""
        if any(s.cpu is None for s in self.slots) or any(s.step for s in self.slots):
            raise ValueError("replayed needs the measured slots of one prefill (step 0 only)")
        cpu = {(s.stage, s.micro): s.cpu for s in self.slots}
        t = [[max(cpu[(st, j)], 1e-9) for j in range(self.micro_batches)] for st in range(self.stages)]
        replay = gpipe_schedule(self.stages, self.micro_batches, t, t_comm)
        replay.unit = "s"
        return replay

    def _slot_map(self) -> dict[tuple[int, int], Slot]:
        if any(s.step for s in self.slots):
            raise ValueError("needs the slots of one prefill (step 0 only): use only_step(0) first")
        return {(s.stage, s.micro): s for s in self.slots}

    def imbalance(self) -> float:
        """The busiest stage's busy time ÷ the mean stage's: 1 for equal stages, as the formula assumes (the
        last stage also runs the LM head, the first the embedding)."""
        busy = [self.busy(s) for s in range(self.stages)]
        return max(busy) * self.stages / sum(busy)

    def mean_slot(self) -> float:
        """Mean busy time of one micro-batch on one stage: the t of the formulas."""
        if not self.slots:
            raise ValueError("an empty timeline has no slots")
        return sum((s.end - s.start for s in self.slots), 0) / len(self.slots)

    def hops(self) -> dict[tuple[int, int], float]:
        """{(s, j): time from stage s finishing micro-batch j to stage s + 1 starting it}: the hand-off, plus
        queueing when stage s + 1 was still busy with j − 1."""
        slot = self._slot_map()
        return {
            (s, j): slot[(s + 1, j)].start - slot[(s, j)].end
            for s in range(self.stages - 1)
            for j in range(self.micro_batches)
        }

    def first_hop(self) -> float:
        """The hand-off time t_comm: the first micro-batch's hop, averaged over the stage boundaries (the next
        stage is idle, waiting for it, so there is no queueing in it); 0 for one stage."""
        if self.stages == 1:
            return 0.0
        hops = self.hops()
        return sum(hops[(s, 0)] for s in range(self.stages - 1)) / (self.stages - 1)

    def only_step(self, step: int) -> Timeline:
        """The slots of one step (0 = prefill) as a timeline of their own."""
        return Timeline(self.stages, self.micro_batches, [s for s in self.slots if s.step == step], self.unit)


def gpipe_schedule(p: int, m: int, t_stage: Real | Sequence = 1.0, t_comm: Real = 0) -> Timeline:
    """The GPipe forward schedule, simulated: stage s starts micro-batch j when stage s − 1 has finished it
    and its activations have arrived (``t_comm`` later), and stage s has finished j − 1. ``t_stage``: the time
    of one micro-batch on one stage — one number for all, one per stage (p numbers), or one per stage and
    micro-batch (p lists of m). With equal times and t_comm = 0 stage s runs j in slot s + j, and ``bubble()``
    equals ``bubble_fraction(p, m)`` (exactly, for exact numbers); with t_comm, ``bubble_with_comm``."""
    _check_count("p (pipeline stages)", p)
    _check_count("m (micro-batches)", m)
    _check_time("t_comm", t_comm)
    if isinstance(t_stage, Sequence):
        if len(t_stage) != p:
            raise ValueError(
                f"t_stage must be one time, one per stage ({p}) or p lists of m, got {len(t_stage)} entries"
            )
        rows = [list(r) if isinstance(r, Sequence) else [r] * m for r in t_stage]
    else:
        rows = [[t_stage] * m for _ in range(p)]
    if any(len(r) != m for r in rows):
        raise ValueError(f"each stage's list of times in t_stage must hold m={m} times")
    if not all(isinstance(t, Real) and not isinstance(t, bool) and t > 0 for r in rows for t in r):
        raise ValueError(f"t_stage times must be positive numbers, got {t_stage!r}")
    end = [[0] * m for _ in range(p)]
    slots = []
    for s in range(p):
        for j in range(m):
            start = max(end[s - 1][j] + t_comm if s else 0, end[s][j - 1] if j else 0)
            end[s][j] = start + rows[s][j]
            slots.append(Slot(s, j, start, end[s][j]))
    return Timeline(p, m, slots, unit="time units")


def plot_timeline(timeline: Timeline, *, ax=None, title: str | None = None):
    """One row per stage (stage 0 on top), one bar per micro-batch and step, coloured by micro-batch: the
    cooks on a line. Draws on a Figure of its own (no pyplot state) unless ``ax`` is given; returns (fig, ax)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from course_lib.measure.plots import DPI, FIGSIZE

    if not timeline.slots:
        raise ValueError("the timeline has no slots to draw")
    if ax is None:
        fig = Figure(figsize=FIGSIZE, dpi=DPI)
        FigureCanvasAgg(fig)  # renders without pyplot
        ax = fig.add_subplot()
    fig = ax.figure
    origin = min(s.start for s in timeline.slots)
    span = float(timeline.makespan)
    scale, unit = (1e3, "ms") if timeline.unit == "s" else (1.0, timeline.unit)
    colors = [f"C{j % 10}" for j in range(timeline.micro_batches)]
    for s in timeline.slots:
        x0, w = float(s.start - origin) * scale, float(s.end - s.start) * scale
        ax.barh(s.stage, w, left=x0, height=0.7, color=colors[s.micro], edgecolor="black", lw=0.5)
        if w > 0.03 * span * scale:
            label = f"{s.micro}" if s.step == 0 else f"{s.micro}·{s.step}"
            ax.text(x0 + w / 2, s.stage, label, ha="center", va="center", fontsize=7)
    p, m = timeline.stages, timeline.micro_batches
    ax.set_yticks(range(p), [f"stage {s}" for s in range(p)])
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(
        title
        or f"p={p} stages, m={m} micro-batches: bubble {float(timeline.bubble()):.3f} "
        f"(formula (p−1)/(m+p−1) = {bubble_fraction(p, m):.3f})",
        fontsize=9,
    )
    ax.grid(True, axis="x", alpha=0.25)
    fig.tight_layout()
    return fig, ax


# ----------------------------------------------------------------------------- one stage's KV
class StageBackend(ContiguousBackend):
    """The contiguous KV cache of one stage's layers only: model layer i lives at index i − ``first_layer``."""

    name = "contiguous-stage"

    def __init__(self, first_layer: int, num_layers: int, *args, **kwargs) -> None:
        super().__init__(num_layers, *args, **kwargs)
        self.first_layer = first_layer

    def forward(self, layer, q, k, v, meta):
        local = layer - self.first_layer
        if not 0 <= local < self.num_layers:
            raise ValueError(
                f"layer {layer} is not on this stage (layers {self.first_layer}..{self.first_layer + self.num_layers - 1})"
            )
        return super().forward(local, q, k, v, meta)


# ----------------------------------------------------------------------------- the worker side
def load_engine_model(model, linear: str = "auto"):
    """A ``LlamaEngineModel`` from an embedded name / folder or a loaded HF model, with the ``Engine``'s
    linear-layer rule (``"auto"``: SkinnyLinear for fp32 on a CPU), so stages match ``Engine`` outputs."""
    from course_lib.engine.layers import SkinnyLinear
    from course_lib.engine.model import LlamaEngineModel
    from course_lib.models.load import load_model

    if linear not in LINEAR_CHOICES:
        raise ValueError(f"linear must be one of {LINEAR_CHOICES}, got {linear!r}")
    hf = load_model(model)[0] if isinstance(model, (str, Path)) else model
    m = LlamaEngineModel(hf)
    if linear == "skinny" or (linear == "auto" and m.device.type == "cpu" and m.dtype == torch.float32):
        for name, lin in list(m.linears()):
            m.set_linear(name, SkinnyLinear.from_linear(lin))
    return m


def _run_stage(model, rank: int, p: int, prompts, micro, max_new_tokens: int, want_logits: bool):
    """One stage's whole run: for each step, for each micro-batch, recv → its layers → send. Returns
    (slots, tokens per sequence, logits (steps, B, V) or None); tokens and logits only on the last stage."""
    import torch.distributed as dist

    first, stop = stage_bounds(model.num_layers, p)[rank]
    is_first, is_last = rank == 0, rank == p - 1
    B = len(prompts)
    max_len = max(len(x) for x in prompts) + max_new_tokens
    backend = StageBackend(
        first, stop - first, model.num_kv_heads, model.head_dim, max_len, B, model.dtype, model.device
    )
    handles = [backend.allocate() for _ in range(B)]  # rows 0..B-1: a micro-batch's rows are consecutive
    D = model.config.hidden_size
    dev = model.device
    tokens: list[list[int]] = [[] for _ in range(B)]
    logits_rows: list[list[torch.Tensor | None]] = [[None] * B for _ in range(max_new_tokens)]
    local_ids: dict[int, torch.Tensor] = {}  # p == 1: the "sent back" ids stay here
    pending = []  # (work, tensor): isend buffers must live until the send completes
    slots = []
    # the common start: perf_counter is one system-wide monotonic clock (CLOCK_MONOTONIC on Linux), so every
    # rank measures from rank 0's instant; a barrier alone would leave each rank's own exit time (ms apart
    # when a core is busy elsewhere)
    dist.barrier()
    t0_tensor = torch.tensor([time.perf_counter()], dtype=torch.float64)
    dist.broadcast(t0_tensor, src=0)
    t0 = t0_tensor.item()
    m = len(micro)
    with torch.inference_mode():
        for step in range(max_new_tokens):
            # post every receive of the step up front (tag: step and micro-batch): a message then lands while
            # this stage computes, instead of waiting for a rendezvous with the sender when recv is called
            inbox = {}
            for j, idx in enumerate(micro):
                if not is_first:
                    n = sum(len(prompts[i]) for i in idx) if step == 0 else len(idx)
                    buf = torch.empty(n, D, dtype=model.dtype, device=dev)  # (N, D) from the previous stage
                    inbox[j] = (dist.irecv(buf, src=rank - 1, tag=step * m + j), buf)
                elif step > 0 and p > 1:
                    buf = torch.empty(len(idx), dtype=torch.long, device=dev)  # (b,) last step's tokens
                    inbox[j] = (dist.irecv(buf, src=p - 1, tag=step * m + j), buf)
            for j, idx in enumerate(micro):
                if step == 0:
                    lens, starts = [len(prompts[i]) for i in idx], [0] * len(idx)
                else:
                    lens, starts = [1] * len(idx), [len(prompts[i]) + step - 1 for i in idx]
                if is_first:
                    if step == 0:
                        ids = torch.tensor([t for i in idx for t in prompts[i]], device=dev)  # (N,)
                    elif p == 1:
                        ids = local_ids[j]
                    else:
                        work, ids = inbox.pop(j)
                        work.wait()
                    t_start, c_start = time.perf_counter(), time.thread_time()
                    x = model.embed(ids)  # (N, D)
                else:
                    work, x = inbox.pop(j)
                    work.wait()  # (N, D) activations of the previous stage
                    t_start, c_start = time.perf_counter(), time.thread_time()
                positions = torch.tensor([s + k for s, n in zip(starts, lens) for k in range(n)], device=dev)  # (N,)
                hs = [handles[i] for i in idx]
                for h, n in zip(hs, lens):
                    backend.append(h, n)
                meta = backend.prepare(hs, lens, positions)
                x = model.run_layers(x, positions, meta, backend, first, stop)  # (N, D)
                if is_last:
                    last = torch.tensor(lens, device=dev).cumsum(0) - 1  # (b,) each sequence's last token
                    logits = model.head(x[last])  # (b, V)
                    new = logits.argmax(-1)  # (b,) greedy
                    t_end, c_end = time.perf_counter(), time.thread_time()
                    for r, (i, t) in enumerate(zip(idx, new.tolist())):
                        tokens[i].append(t)
                        if want_logits:
                            logits_rows[step][i] = logits[r]
                    if step + 1 < max_new_tokens:
                        if p == 1:
                            local_ids[j] = new
                        else:
                            pending.append((dist.isend(new, dst=0, tag=(step + 1) * m + j), new))
                else:
                    t_end, c_end = time.perf_counter(), time.thread_time()
                    x = x.contiguous()
                    pending.append((dist.isend(x, dst=rank + 1, tag=step * m + j), x))
                slots.append(Slot(rank, j, t_start - t0, t_end - t0, step, c_end - c_start))
                pending = [(w, t) for w, t in pending if not w.is_completed()]  # drop the buffers already sent
    for work, _ in pending:
        work.wait()
    if not is_last:
        return slots, None, None
    logits_out = torch.stack([torch.stack(row) for row in logits_rows]) if want_logits else None  # (steps, B, V)
    return slots, tokens, logits_out


def pipeline_worker(
    rank: int, world_size: int, model, prompts, m: int, max_new_tokens: int, linear: str = "auto"
) -> dict:
    """Per rank (under ``launch``): stage ``rank`` of ``world_size`` runs prefill + greedy decode over
    ``m`` micro-batches. Returns {"slots"} and, on the last stage, {"tokens", "logits"}."""
    engine_model = load_engine_model(model, linear)
    micro = split_micro_batches(len(prompts), m)
    slots, tokens, logits = _run_stage(engine_model, rank, world_size, prompts, micro, max_new_tokens, True)
    return {"slots": slots, "tokens": tokens, "logits": logits}


def bubble_worker(
    rank: int, world_size: int, model, prompts, ms: Sequence[int], repeats: int, linear: str = "auto"
) -> dict:
    """Per rank: one warm-up prefill, then ``repeats`` pipelined prefills for each m in ``ms``; the slots of each."""
    engine_model = load_engine_model(model, linear)
    _run_stage(engine_model, rank, world_size, prompts, split_micro_batches(len(prompts), max(ms)), 1, False)
    out = {}
    for m in ms:
        micro = split_micro_batches(len(prompts), m)
        out[m] = [_run_stage(engine_model, rank, world_size, prompts, micro, 1, False)[0] for _ in range(repeats)]
    return out


# ----------------------------------------------------------------------------- the caller side
@dataclass
class PipelineResult:
    """Greedy tokens per sequence, logits (steps, B, V) of every sampled position, and the measured timeline."""

    tokens: list[list[int]]
    logits: torch.Tensor
    timeline: Timeline


def _check_prompts(prompts) -> list[list[int]]:
    if not isinstance(prompts, Sequence) or isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str) or not isinstance(p, Sequence) or not p:
            raise ValueError(f"prompts[{i}] must be a non-empty list of token ids, got {p!r:.60}")
        out.append([int(t) for t in p])
    return out


def _num_layers(model) -> int:
    if isinstance(model, (str, Path)):
        from transformers import AutoConfig

        from course_lib.models.load import resolve

        kind, path = resolve(model)
        return AutoConfig.from_pretrained(path if path is not None else str(model)).num_hidden_layers
    return model.config.num_hidden_layers


def _check_run(model, prompts, p: int, ms: Sequence[int]) -> list[list[int]]:
    """Every check that can fail, before any process starts."""
    prompts = _check_prompts(prompts)
    _check_count("p (pipeline stages)", p)
    if not ms:
        raise ValueError("ms must hold at least one number of micro-batches")
    for m in ms:
        _check_count("m (micro-batches)", m)
        split_micro_batches(len(prompts), m)
    stage_bounds(_num_layers(model), p)
    return prompts


def pipeline_generate(
    model,
    prompts,
    p: int = 2,
    m: int = 2,
    max_new_tokens: int = 8,
    *,
    linear: str = "auto",
    threads_per_worker: int = 1,
    timeout_s: float = 120.0,
) -> PipelineResult:
    """Greedy generation (EOS ignored: exactly ``max_new_tokens`` each) on a p-stage pipeline, ``prompts``
    (token-id lists) cut into m micro-batches: the prefill goes through the stages micro-batch by micro-batch,
    then every decode step does too, the last stage sending each micro-batch's new tokens back to stage 0.
    Spawns p processes through ``launch`` (gloo on a CPU); the result holds every slot's timing."""
    from course_lib.parallel.launcher import launch

    prompts = _check_run(model, prompts, p, [m])
    _check_count("max_new_tokens", max_new_tokens)
    results = launch(
        pipeline_worker,
        p,
        model,
        prompts,
        m,
        max_new_tokens,
        linear,
        threads_per_worker=threads_per_worker,
        timeout_s=timeout_s,
    )
    timeline = Timeline(p, m, sorted((s for r in results for s in r["slots"]), key=lambda s: (s.start, s.stage)))
    return PipelineResult(results[-1]["tokens"], results[-1]["logits"], timeline)


def measure_bubble(
    model,
    prompts,
    p: int = 2,
    ms: Sequence[int] = (1, 2, 4),
    repeats: int = 3,
    *,
    linear: str = "auto",
    threads_per_worker: int = 1,
    timeout_s: float = 120.0,
) -> dict[int, list[Timeline]]:
    """Measured GPipe prefills of ``prompts`` on p stages, for each m in ``ms``: {m: [Timeline] × repeats}
    (one process launch for all; a warm-up pass first). Compare ``Timeline.bubble()`` with ``bubble_fraction``
    and ``bubble_with_comm`` (``bubble_rows`` does it for every m). The formula holds when a micro-batch's
    compute dwarfs the fixed costs each one adds — the hand-off between processes (hundreds of µs with gloo
    on a CPU), the last stage's LM head, Python: give each sequence tens of tokens, not a few (8 prompts of
    64 tokens keep tiny-target's slots at milliseconds up to m = 8)."""
    from course_lib.parallel.launcher import launch

    ms = list(ms)
    prompts = _check_run(model, prompts, p, ms)
    _check_count("repeats", repeats)
    results = launch(
        bubble_worker,
        p,
        model,
        prompts,
        ms,
        repeats,
        linear,
        threads_per_worker=threads_per_worker,
        timeout_s=timeout_s,
    )
    return {m: [Timeline(p, m, [s for r in results for s in r[m][k]]) for k in range(repeats)] for m in ms}


@dataclass(frozen=True)
class BubbleRow:
    """One m of a ``measure_bubble`` run: the formulas beside the measurements (medians over the repeats)."""

    m: int
    formula: float  # (p − 1)/(m + p − 1): equal stages, free hand-offs
    with_comm: float  # bubble_with_comm(p, m, t_slot, t_comm): equal stages, measured hand-off time
    wall: float  # the measured timeline
    replay: float  # the schedule re-timed with each slot's CPU time, free hand-offs
    replay_comm: float  # ... and hand-offs of t_comm: the measured work and communication, no other program
    t_slot: float  # mean seconds of one micro-batch on one stage
    t_comm: float  # seconds of the first micro-batch's hand-off (Timeline.first_hop)
    cpu_share: float  # CPU / wall time inside the slots
    imbalance: float  # busiest stage ÷ mean stage (Timeline.imbalance)


def bubble_rows(runs: dict[int, list[Timeline]]) -> list[BubbleRow]:
    """``measure_bubble``'s result as one row per m."""
    if not runs or any(not tls for tls in runs.values()):
        raise ValueError("runs must map each m to a non-empty list of measured Timelines (from measure_bubble)")
    rows = []
    for m, tls in runs.items():
        p = tls[0].stages

        def med(f):
            return statistics.median(float(f(t)) for t in tls)

        t_comm = med(lambda t: max(t.first_hop(), 0.0))
        rows.append(
            BubbleRow(
                m,
                bubble_fraction(p, m),
                med(lambda t: bubble_with_comm(p, m, t.mean_slot(), max(t.first_hop(), 0.0))),
                med(lambda t: t.bubble()),
                med(lambda t: t.replayed().bubble()),
                med(lambda t: t.replayed(max(t.first_hop(), 0.0)).bubble()),
                med(lambda t: t.mean_slot()),
                t_comm,
                med(lambda t: t.cpu_share()),
                med(lambda t: t.imbalance()),
            )
        )
    return rows


def format_bubble_rows(rows: Sequence[BubbleRow]) -> str:
    """The rows of ``bubble_rows`` as a table."""
    head = (
        f"{'m':>3}{'formula':>9}{'+ t_comm':>10}{'wall clock':>12}{'CPU replay':>12}{'+ t_comm':>10}"
        f"{'slot ms':>9}{'t_comm ms':>11}{'CPU/wall':>10}{'imbalance':>11}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.m:>3}{r.formula:>9.3f}{r.with_comm:>10.3f}{r.wall:>12.3f}{r.replay:>12.3f}{r.replay_comm:>10.3f}"
            f"{r.t_slot * 1e3:>9.2f}{r.t_comm * 1e3:>11.2f}{r.cpu_share:>10.2f}{r.imbalance:>11.2f}"
        )
    return "\n".join(lines)


__all__ = [
    "BubbleRow",
    "PipelineResult",
    "Slot",
    "StageBackend",
    "Timeline",
    "bubble_fraction",
    "bubble_rows",
    "bubble_with_comm",
    "bubble_worker",
    "format_bubble_rows",
    "gpipe_schedule",
    "load_engine_model",
    "measure_bubble",
    "pipeline_generate",
    "pipeline_worker",
    "plot_timeline",
    "split_micro_batches",
    "stage_bounds",
]
