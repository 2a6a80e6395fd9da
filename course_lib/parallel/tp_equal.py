"""Tensor parallelism checked against one process: the same logits (to fp32 rounding) and the same greedy tokens.

``logits_run`` drives an engine's model by hand through a prefill (logits at every position) and a few
greedy decode steps, so two engines can be compared logit for logit, not only by the tokens they pick.
``tp_equality`` runs it twice, each in its own processes under ``course_lib.parallel.launcher.launch``:
one process with the whole model (``Engine``), then a TP group of ``world_size`` ranks (``tp_engine``),
which get the reference logits and return how far theirs are (``TPEquality``), their greedy tokens and
what each process held in memory (peak and final RSS, and PSS, which shares the pages of the libraries the
ranks map in common). The two runs never overlap, so the caller's process never holds the model and the
machine never holds the whole model beside its shards. The sums of a row-parallel layer are added in
another order than one matmul adds them, so logits agree to fp32 rounding, not bit for bit.
Introduced in 07_parallelism.ipynb.
"""

from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass, field

import torch


def _forward_all(engine, handles, chunks, starts, last_only: bool = False) -> torch.Tensor:
    """Logits (N, V) at every new token of one flat step (``Engine.forward`` keeps only the last ones),
    or (B, V) at each sequence's last token with ``last_only``."""
    flat, pos = [], []
    for chunk, s in zip(chunks, starts):
        flat += chunk
        pos += range(s, s + len(chunk))
    ids, pos = torch.tensor(flat), torch.tensor(pos)  # (N,), (N,)
    meta = engine.backend.prepare(handles, [len(c) for c in chunks], pos)
    last = torch.tensor([len(c) for c in chunks]).cumsum(0) - 1 if last_only else None  # (B,)
    return engine.model(ids, pos, meta, engine.backend, logits_indices=last)


@torch.inference_mode()
def logits_run(engine, prompts, decode_steps: int = 2, last_only: bool = False) -> list[torch.Tensor]:
    """A prefill of ``prompts`` (logits at all positions, or the last with ``last_only``), then
    ``decode_steps`` greedy steps of one token per sequence: [(N, V) or (B, V), (B, V), ...]."""
    ids = engine.encode(prompts)
    kv = engine.backend
    handles = [kv.allocate() for _ in ids]
    try:
        for h, p in zip(handles, ids):
            kv.append(h, len(p))
        logits = _forward_all(engine, handles, ids, [0] * len(ids), last_only)  # (N, V) or (B, V)
        out = [logits]
        ends = torch.tensor([len(p) for p in ids]).cumsum(0) - 1 if not last_only else torch.arange(len(ids))
        toks, starts = logits[ends].argmax(-1).tolist(), [len(p) for p in ids]
        for _ in range(decode_steps):
            for h in handles:
                kv.append(h, 1)
            logits = _forward_all(engine, handles, [[t] for t in toks], starts)  # (B, V)
            out.append(logits)
            toks, starts = logits.argmax(-1).tolist(), [s + 1 for s in starts]
        return out
    finally:
        for h in handles:
            kv.free(h)


def process_memory() -> dict[str, int]:
    """This process's memory in bytes: peak RSS (VmHWM), RSS, PSS (shared pages divided among the processes
    that map them) and USS (pages only this process maps)."""
    import psutil

    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM", "VmRSS")):
                key, value = line.split(":")
                status[key] = int(value.split()[0]) * 1024
    full = psutil.Process().memory_full_info()
    return {"peak_rss": status["VmHWM"], "rss": status["VmRSS"], "pss": full.pss, "uss": full.uss}


def equality_worker(
    rank: int,
    world_size: int,
    model: str,
    prompts: list[list[int]],
    decode_steps: int,
    max_new_tokens: int,
    reference: list[torch.Tensor] | None = None,
    tensor_parallel: bool = True,
    vocab_parallel: bool = False,
    standalone: bool = True,
) -> dict:
    """One process of ``tp_equality``: the whole model (``tensor_parallel=False``, world_size 1) or one TP
    rank. Returns its logits (the reference run) or their distance to ``reference``, its greedy tokens,
    its argmax per position, the seconds it took to load and to run, and its memory."""
    from course_lib.engine import Engine, SamplingParams
    from course_lib.engine.scheduler import SchedulerConfig
    from course_lib.parallel.tp_model import tp_engine

    before = process_memory()  # the interpreter, torch and the launcher: before any model code or weight
    t0 = time.perf_counter()
    longest = max(len(p) for p in prompts) + max(decode_steps, max_new_tokens) + 1
    cfg = SchedulerConfig(
        max_model_len=longest, max_num_seqs=len(prompts), max_num_batched_tokens=len(prompts) * longest
    )
    if tensor_parallel:
        engine = tp_engine(
            rank,
            world_size,
            model,
            config=cfg,
            linear="reference",
            vocab_parallel=vocab_parallel,
            standalone=standalone,
        )
    else:
        engine = Engine(
            model, config=cfg, linear="reference", decode="eager"
        )  # the reference forward, as each rank runs
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    logits = logits_run(engine, prompts, decode_steps)
    greedy = [
        r.output_ids for r in engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True))
    ]
    out = {
        "greedy": greedy,
        "argmax": [step.argmax(-1).tolist() for step in logits],
        "load_s": load_s,
        "run_s": time.perf_counter() - t0,
        "memory": process_memory(),
        "rss_before_load": before["rss"],
        "weight_bytes": _weight_bytes(engine.model),
        "kv_heads": engine.backend.num_kv_heads,
        "heads": engine.model.num_heads,
        "vocab_rows": engine.model.embed_weight.shape[0],  # the embedding rows this process holds
        "transformers_imported": "transformers" in sys.modules,
    }
    if reference is None:
        out["logits"] = logits
    else:
        diffs = [(a - e).abs() for a, e in zip(logits, reference)]
        out["max_abs_diff"] = max(d.max().item() for d in diffs)
    return out


def _weight_bytes(model) -> int:
    """Bytes of the distinct weight tensors the engine's model holds (a tied head counted once)."""
    seen, total = set(), 0
    tensors = [model.embed_weight, model.final_norm] + [lin.weight for _, lin in model.linears()]
    tensors += [t for layer in model.layers for t in (layer.attn_norm, layer.mlp_norm)]
    for t in tensors:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


@dataclass
class TPEquality:
    """One process against a TP group of ``world_size`` ranks on the same prompts."""

    model: str
    world_size: int
    prompt_tokens: list[int]  # tokens of each prompt
    single: dict  # what the one-process run returned (logits dropped)
    ranks: list[dict]  # what each TP rank returned
    launch_s: dict[str, float] = field(default_factory=dict)  # wall seconds of each launch, start-up included
    max_abs_logit: float = 0.0  # the scale of the reference logits
    answers: list[str] = field(default_factory=list)  # the one-process greedy tokens, decoded

    @property
    def max_abs_diff(self) -> float:
        return max(r["max_abs_diff"] for r in self.ranks)

    @property
    def greedy_equal(self) -> bool:
        return all(r["greedy"] == self.single["greedy"] for r in self.ranks)

    @property
    def argmax_equal(self) -> bool:
        """Every position's top token (prefill and decode steps) equal to one process's, on every rank."""
        return all(r["argmax"] == self.single["argmax"] for r in self.ranks)

    def logits_close(self, atol: float, rtol: float = 0.0) -> bool:
        """max |TP − one| ≤ atol + rtol · (largest |logit|), over every position and rank."""
        return self.max_abs_diff <= atol + rtol * self.max_abs_logit

    def startup_s(self, which: str = "tp") -> float:
        """Seconds of a launch ("single" or "tp") before and after the work: starting the processes (``core.procs``),
        the imports they still make, joining the process group, sending the results home (launch wall time − the slowest
        process's load + run)."""
        procs = [self.single] if which == "single" else self.ranks
        return self.launch_s.get(which, float("nan")) - max(p["load_s"] + p["run_s"] for p in procs)

    def memory_total(self, key: str = "peak_rss") -> int:
        """Bytes summed over the TP ranks: ``peak_rss`` (an upper bound: the peaks need not coincide),
        ``rss`` (counts a shared library once per rank), ``pss`` (counts it once in all), ``uss``."""
        return sum(r["memory"][key] for r in self.ranks)

    def __str__(self) -> str:
        mib = 2**20
        s, p = self.single, self.world_size
        weights = ", ".join(f"{r['weight_bytes'] / mib:.0f}" for r in self.ranks)
        peaks = ", ".join(f"{r['memory']['peak_rss'] / mib:.0f}" for r in self.ranks)
        lines = [
            f"{self.model}: {len(self.prompt_tokens)} prompts of {self.prompt_tokens} tokens, TP={p} against one process",
            f"  logits: max |Δ| = {self.max_abs_diff:.2e} (largest |logit| {self.max_abs_logit:.1f}); "
            f"top token at every position equal: {self.argmax_equal}",
            f"  greedy tokens equal on every rank: {self.greedy_equal} ({len(s['greedy'][0])} tokens per prompt)",
            f"  heads per rank: {self.ranks[0]['heads']} query, {self.ranks[0]['kv_heads']} KV "
            f"(one process: {s['heads']}, {s['kv_heads']})",
            f"  weights held: one process {s['weight_bytes'] / mib:.0f} MiB, each rank {weights} MiB",
            f"  memory, one process: peak RSS {s['memory']['peak_rss'] / mib:.0f} MiB",
            f"  memory, TP ranks: peak RSS {peaks} MiB "
            f"(sum {self.memory_total() / mib:.0f}); at the end PSS sum {self.memory_total('pss') / mib:.0f} MiB",
            f"  seconds: one process {self.launch_s.get('single', float('nan')):.1f} "
            f"(start-up {self.startup_s('single'):.1f}, load {s['load_s']:.1f}, run {s['run_s']:.1f}); "
            f"TP group {self.launch_s.get('tp', float('nan')):.1f} (start-up {self.startup_s('tp'):.1f}, "
            f"load {max(r['load_s'] for r in self.ranks):.1f}, run {max(r['run_s'] for r in self.ranks):.1f})",
        ]
        return "\n".join(lines)


def tp_equality(
    model: str,
    world_size: int,
    prompts: list[str] | list[list[int]],
    *,
    decode_steps: int = 2,
    max_new_tokens: int = 8,
    chat: bool = False,
    timeout_s: float = 300.0,
    vocab_parallel: bool = False,
    standalone: bool = True,
) -> TPEquality:
    """Logits and greedy tokens of ``prompts`` from one process, then from a TP group of ``world_size``.

    ``chat``: wrap each prompt (a string) in the model's chat template as a user message. The split is
    checked (``tp_plan.check_tp_degree``) before any process starts; an installed model is converted first,
    here, so that the ranks only read it. ``vocab_parallel``: the ranks cut the embedding and the head by
    vocabulary rows (``tp_vocab``); ``standalone=False`` makes them import ``transformers`` to load
    (``tp_load.load_for_rank``), to measure what that costs."""
    from course_lib.parallel.launcher import launch
    from course_lib.parallel.tp_load import check_split, model_config

    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings or of token-id lists")
    for name, value in (("decode_steps", decode_steps), ("max_new_tokens", max_new_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    _ensure_converted(model)
    check_split(model_config(model), world_size)
    ids, tok = _encode(model, prompts, chat)
    t0 = time.perf_counter()
    (single,) = launch(equality_worker, 1, model, ids, decode_steps, max_new_tokens, None, False, timeout_s=timeout_s)
    single_s = time.perf_counter() - t0
    reference = single.pop("logits")
    scale = max(step.abs().max().item() for step in reference)
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # more ranks than cores slows them, but equality is what is checked here
        warnings.filterwarnings("ignore", message=".*physical cores", category=RuntimeWarning)
        ranks = launch(
            equality_worker, world_size, model, ids, decode_steps, max_new_tokens, reference, True,
            vocab_parallel, standalone, threads_per_worker=1, timeout_s=timeout_s,
        )  # fmt: skip
    del reference
    launch_s = {"single": single_s, "tp": time.perf_counter() - t0}
    answers = [tok.decode(g) for g in single["greedy"]] if tok is not None else []
    return TPEquality(model, world_size, [len(p) for p in ids], single, ranks, launch_s, scale, answers)


def _ensure_converted(model: str) -> None:
    from course_lib.models import gguf
    from course_lib.models.load import INSTALLED

    if isinstance(model, str) and model in INSTALLED and not gguf.is_cached(model):
        gguf.convert(model)  # once (~25 s), in this process: the ranks then only read it


def _encode(model: str, prompts, chat: bool):
    """(token ids of the prompts, the tokenizer or None): the model's tokenizer and chat template, read here once."""
    from transformers import AutoTokenizer

    from course_lib.parallel.tp_load import checkpoint_folder

    if all(not isinstance(p, str) for p in prompts):
        if chat:
            raise ValueError("chat=True needs the prompts as strings (user messages), not token ids")
        return [[int(t) for t in p] for p in prompts], None
    folder = checkpoint_folder(model)
    tok = AutoTokenizer.from_pretrained(str(folder) if folder is not None else str(model))
    out = []
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p:
            raise ValueError(f"prompts[{i}] must be a non-empty string, got {p!r}")
        if chat:
            msgs = [{"role": "user", "content": p}]
            out.append(list(tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True)["input_ids"]))
        else:
            out.append(list(tok(p)["input_ids"]))
    return out, tok


__all__ = ["TPEquality", "equality_worker", "logits_run", "process_memory", "tp_equality"]
