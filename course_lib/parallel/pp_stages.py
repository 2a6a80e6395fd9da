"""One pipeline stage at work: its slice of the layers, its own KV cache, and send/recv between ranks.

``stage_bounds`` cuts the model's layers into p equal slices and ``split_micro_batches`` the batch into m
micro-batches. Each stage is one process (under ``course_lib.parallel.launcher.launch``): stage 0 embeds
and runs the first layers, each next stage runs the next slice, the last one applies the head;
activations (N, D) travel rank → rank + 1 with point-to-point ``isend``/``irecv``, and the last stage
sends the sampled token ids back to stage 0 for the next decode step. Each stage keeps the KV cache of its
own layers only (``StageBackend``). Per stage the work is the same kind as the whole model's (prefill
compute-bound, decode bandwidth-bound on its own layers' weights), on 1/p of the layers. gloo moves a
message only once its receive is posted (the receiver notifies the sender), so a stage posts the prefill's
receives up front and each micro-batch's next-step receive as soon as it takes this step's: a transfer
lands while the stage computes. ``Slot.wait`` records when the stage began waiting for a slot's input. Each worker loads the whole
checkpoint (a tiny one here) but touches only its slice of layers, and records a ``Slot`` per micro-batch
(wall clock and CPU time). Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch

from course_lib.engine.attention import ContiguousBackend
from course_lib.parallel.pp_schedule import Slot, check_count

LINEAR_CHOICES = ("auto", "reference", "skinny")


def stage_bounds(num_layers: int, p: int) -> list[tuple[int, int]]:
    """(start, stop) layer range of each of p stages: equal slices, so no stage holds up the others."""
    check_count("num_layers", num_layers)
    check_count("p (pipeline stages)", p)
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
    check_count("num_seqs", num_seqs)
    check_count("m (micro-batches)", m)
    if m > num_seqs:
        raise ValueError(f"m={m} micro-batches need at least {m} sequences, got {num_seqs}")
    q, r = divmod(num_seqs, m)
    out, start = [], 0
    for j in range(m):
        size = q + (j < r)
        out.append(list(range(start, start + size)))
        start += size
    return out


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
    inbox = {}  # (step, micro) -> (work, buffer): receives posted ahead of need

    def post(step: int, j: int) -> None:
        """Post the receive of micro-batch j's input for ``step`` (tag: step and micro-batch)."""
        idx = micro[j]
        if not is_first:
            n = sum(len(prompts[i]) for i in idx) if step == 0 else len(idx)
            buf = torch.empty(n, D, dtype=model.dtype, device=dev)  # (N, D) from the previous stage
            inbox[(step, j)] = (dist.irecv(buf, src=rank - 1, tag=step * m + j), buf)
        elif step > 0 and p > 1:
            buf = torch.empty(len(idx), dtype=torch.long, device=dev)  # (b,) last step's tokens
            inbox[(step, j)] = (dist.irecv(buf, src=p - 1, tag=step * m + j), buf)

    # gloo moves a message only once its receive is posted (the receiver tells the sender it is ready), so a
    # receive posted when it is needed costs a round trip between the processes on top of the transfer. Post
    # the prefill's receives up front, and micro-batch j's next-step receive as soon as this step's is taken:
    # every message then lands while the stage computes. (Posting each step's receives only when the step
    # begins made every round wait for the first micro-batch's rendezvous, on both stages.)
    for j in range(m):
        post(0, j)
    with torch.inference_mode():
        for step in range(max_new_tokens):
            for j, idx in enumerate(micro):
                if step == 0:
                    lens, starts = [len(prompts[i]) for i in idx], [0] * len(idx)
                else:
                    lens, starts = [1] * len(idx), [len(prompts[i]) + step - 1 for i in idx]
                t_wait = time.perf_counter()
                if is_first:
                    if step == 0:
                        ids = torch.tensor([t for i in idx for t in prompts[i]], device=dev)  # (N,)
                    elif p == 1:
                        ids = local_ids[j]
                    else:
                        work, ids = inbox.pop((step, j))
                        work.wait()
                    t_start, c_start = time.perf_counter(), time.thread_time()
                    x = model.embed(ids)  # (N, D)
                else:
                    work, x = inbox.pop((step, j))
                    work.wait()  # (N, D) activations of the previous stage
                    t_start, c_start = time.perf_counter(), time.thread_time()
                if step + 1 < max_new_tokens:
                    post(step + 1, j)
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
                slots.append(Slot(rank, j, t_start - t0, t_end - t0, step, c_end - c_start, t_wait - t0))
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
    rank: int,
    world_size: int,
    model,
    prompts,
    ms: Sequence[int],
    repeats: int,
    linear: str = "auto",
    decode_tokens: int = 0,
) -> dict:
    """Per rank: one warm-up prefill, then ``repeats`` pipelined prefills for each m in ``ms``; the slots of each
    ({m: [slots] × repeats}). With ``decode_tokens`` > 0 also, for each m, one run of prefill + that many
    greedy steps with the micro-batches in flight across steps: {("decode", m): slots}."""
    engine_model = load_engine_model(model, linear)
    _run_stage(engine_model, rank, world_size, prompts, split_micro_batches(len(prompts), max(ms)), 1, False)
    out = {}
    for m in ms:
        micro = split_micro_batches(len(prompts), m)
        out[m] = [_run_stage(engine_model, rank, world_size, prompts, micro, 1, False)[0] for _ in range(repeats)]
    for m in ms if decode_tokens else ():
        micro = split_micro_batches(len(prompts), m)
        out[("decode", m)] = _run_stage(engine_model, rank, world_size, prompts, micro, decode_tokens, False)[0]
    return out


__all__ = [
    "LINEAR_CHOICES",
    "StageBackend",
    "bubble_worker",
    "load_engine_model",
    "pipeline_worker",
    "split_micro_batches",
    "stage_bounds",
]
