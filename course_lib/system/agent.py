"""A tool-calling agent loop, driven by the chat model or by a scripted policy, with its cost per step.

The loop (ReAct's shape, Yao et al. 2023; Huyen, *AI Engineering*, ch. 6): the policy reads the task and
the history, emits one tool call, the tool's result is appended to the history, and again, until the policy
answers or the step budget runs out. Every step sends the whole history again, so the prompt grows by one
call and one result per step: the tokens a step *sends* grow linearly with the step, their sum over a run
quadratically, unless a prefix cache keeps the history's KV blocks (then a step prefills only what is new).
``ModelPolicy`` asks the engine for each call (optionally grammar-constrained to the call's schema), in
lockstep over all unfinished tasks (one batch per step); ``ScriptedPolicy`` follows each task's known plan
and costs no model time, the stand-in where the model is too small to choose its calls. ``first_calls``
and ``call_rates`` measure which one a model is. Introduced in 08_system_2_agents_observability_feedback.ipynb.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from course_lib.engine import SamplingParams
from course_lib.system.tools import ANSWER, ToolCall, calculator, call_schema, parse_tool_call, run_tool

SYSTEM = (
    "You are an agent with two tools: calculator (arithmetic, e.g. 12*7) and docs (searches the Python "
    "standard library documentation). Reply with one JSON object and nothing else: "
    '{"tool": "calculator", "input": "12*7"} or {"tool": "docs", "input": "difflib get_close_matches cutoff"}. '
    'The result comes back in the next message. When you know the answer, reply {"tool": "answer", "input": "..."}.'
)
#: Tasks with a known answer and a known plan (the calls a scripted policy makes, in order).
TASKS = (
    {"id": 1, "question": "What is 37 * 41?", "answer": "1517", "plan": [["calculator", "37*41"]]},
    {"id": 2, "question": "What is (17 + 5) * 3?", "answer": "66", "plan": [["calculator", "(17+5)*3"]]},
    {"id": 3, "question": "What is the default cutoff of difflib.get_close_matches?", "answer": "0.6",
     "plan": [["docs", "difflib get_close_matches cutoff"]]},
    {"id": 4, "question": "What is 2 ** 10 minus 24?", "answer": "1000",
     "plan": [["calculator", "2**10"], ["calculator", "1024-24"]]},
    {"id": 5, "question": "What is 100 times the default cutoff of difflib.get_close_matches?", "answer": "60",
     "plan": [["docs", "difflib get_close_matches cutoff"], ["calculator", "0.6*100"]]},
    {"id": 6, "question": "How many seconds are in 3 days and 5 hours?", "answer": "277200",
     "plan": [["calculator", "3*24*3600"], ["calculator", "5*3600"], ["calculator", "259200+18000"]]},
)  # fmt: skip


@dataclass(frozen=True)
class Step:
    index: int  # 0 for the first call
    text: str  # what the policy emitted
    call: ToolCall | None  # None: not a parsable call
    observation: str  # the tool's result (or the error the agent is shown)
    prompt_tokens: int  # tokens this step sent (0 for the scripted policy)
    generated_tokens: int
    model_s: float  # the model's time for this call (0 for the scripted policy)


@dataclass
class AgentRun:
    task: dict
    steps: list[Step] = field(default_factory=list)
    answer: str | None = None  # None: the step budget ran out first

    @property
    def correct(self) -> bool:
        return self.answer is not None and self.task["answer"] in self.answer


def messages(task: dict, steps: list[Step]) -> list[dict]:
    """The chat history a policy reads: system, the task, then each call and its result."""
    out = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}]
    for s in steps:
        out += [{"role": "assistant", "content": s.text}, {"role": "user", "content": f"Result: {s.observation}"}]
    return out


class ScriptedPolicy:
    """Each task's plan, call by call; then the last result as the answer. No model time."""

    def decide(self, runs: list[AgentRun]) -> list[tuple[str, int, int, float]]:
        out = []
        for run in runs:
            plan, i = run.task["plan"], len(run.steps)
            if i < len(plan):
                text = ToolCall(*plan[i]).to_json()
            else:
                text = ToolCall(ANSWER, run.steps[-1].observation if run.steps else "").to_json()
            out.append((text, 0, 0, 0.0))
        return out


class ModelPolicy:
    """The chat model chooses each call: one greedy request per unfinished task, batched per step."""

    def __init__(self, engine, tools, constrained: bool = True, max_new_tokens: int = 32) -> None:
        if not getattr(getattr(engine, "tokenizer", None), "chat_template", None):
            raise ValueError("engine must be an Engine of a chat model (smollm2-135m-instruct)")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        self.engine = engine
        self.batches: list[dict] = []  # per call of decide: requests, tokens sent, tokens found cached, seconds
        structured = json.dumps(call_schema(tools)) if constrained else None
        self.params = SamplingParams(max_new_tokens=max_new_tokens, structured=structured)

    def decide(self, runs: list[AgentRun]) -> list[tuple[str, int, int, float]]:
        tok = self.engine.tokenizer
        prompts = [tok.apply_chat_template(messages(r.task, r.steps), tokenize=False, add_generation_prompt=True)
                   for r in runs]  # fmt: skip
        backend = self.engine.backend
        hits0, t0 = getattr(backend, "prefix_hits", 0), time.perf_counter()
        results = self.engine.generate(prompts, self.params)
        self.batches.append({
            "requests": len(runs), "sent": sum(len(r.prompt_ids) for r in results),
            "cached": getattr(backend, "prefix_hits", 0) - hits0, "seconds": time.perf_counter() - t0,
        })  # fmt: skip
        return [
            (r.text.strip(), len(r.prompt_ids), len(r.output_ids), r.trace.token_times[-1] - r.trace.arrival)
            for r in results
        ]


def run_agents(tasks, policy, tools: dict, max_calls: int = 4) -> list[AgentRun]:
    """Every task through the loop, in lockstep, until it answers or the policy has been called ``max_calls``
    times (the step budget; the answer is a call too). Greedy decoding makes a run with a smaller budget the
    first calls of this one."""
    tasks = _tasks(tasks)
    if not hasattr(policy, "decide"):
        raise ValueError(f"policy must be a ScriptedPolicy or ModelPolicy, got {type(policy).__name__}")
    if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1:
        raise ValueError(f"max_calls must be an int >= 1, got {max_calls!r}")
    runs = [AgentRun(t) for t in tasks]
    live = list(runs)
    while live:
        for run, (text, n_prompt, n_gen, seconds) in zip(live, policy.decide(live)):
            call = parse_tool_call(text, tools)
            if call is not None and call.tool == ANSWER:
                run.answer = call.input
                continue
            if call is None:
                obs = 'error: reply with one JSON object {"tool": ..., "input": ...}'
            else:
                obs = run_tool(call, tools)
            run.steps.append(Step(len(run.steps), text, call, obs, n_prompt, n_gen, seconds))
        live = [r for r in live if r.answer is None and len(r.steps) < max_calls]
    return runs


def first_calls(engine, tasks, tools: dict, constrained: bool, max_new_tokens: int = 32) -> dict:
    """The model's first call on each task, asked once (no loop), scored by ``call_rates``."""
    tasks = _tasks(tasks)
    policy = ModelPolicy(engine, tools, constrained, max_new_tokens)
    t0 = time.perf_counter()
    texts = [text for text, *_ in policy.decide([AgentRun(t) for t in tasks])]
    return {**call_rates(texts, tasks, tools), "seconds": time.perf_counter() - t0}


def call_rates(texts, tasks, tools: dict) -> dict:
    """For each task's first reply in ``texts``: is it parsable, the plan's tool, and the plan's call in
    effect (a calculator input of the same value, a docs query whose best document is the plan's)?"""
    tasks = _tasks(tasks)
    if not isinstance(texts, (list, tuple)) or len(texts) != len(tasks) or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"texts must be a list of {len(tasks)} strings, one reply per task")
    calls = [parse_tool_call(text, tools) for text in texts]
    right_tool = [c is not None and c.tool == t["plan"][0][0] for c, t in zip(calls, tasks)]
    right = [ok and _same_effect(c, ToolCall(*t["plan"][0]), tools) for ok, c, t in zip(right_tool, calls, tasks)]
    n = len(tasks)
    return {
        "texts": list(texts),
        "parsable": sum(c is not None for c in calls) / n,
        "right_tool": sum(right_tool) / n,
        "right_call": sum(right) / n,
    }


def _same_effect(call: ToolCall, planned: ToolCall, tools: dict) -> bool:
    if call.tool == "calculator":
        try:
            return calculator(call.input) == calculator(planned.input)
        except ValueError:
            return False
    return run_tool(call, tools) == run_tool(planned, tools)


def _tasks(tasks) -> list[dict]:
    tasks = list(tasks) if isinstance(tasks, (list, tuple)) else None
    if not tasks or not all(isinstance(t, dict) and {"question", "answer", "plan"} <= set(t) for t in tasks):
        raise ValueError("tasks must be a non-empty list of dicts with 'question', 'answer' and 'plan' (agent.TASKS)")
    return tasks


__all__ = [
    "SYSTEM",
    "TASKS",
    "AgentRun",
    "ModelPolicy",
    "ScriptedPolicy",
    "Step",
    "first_calls",
    "messages",
    "run_agents",
]
