"""The application as small composable stages: guard → retrieve → generate, each swappable, each traced.

A stage is a name and a function from the request's state (a dict) to the fields it adds; a stage that sets
``blocked`` stops the request (a guardrail's refusal). ``Pipeline.replace`` swaps one stage for another of
the same name and leaves the rest as they were, so a change (retrieve 1 document instead of 2, another
guard) is re-measured with everything else held fixed. Run with an OpenTelemetry tracer, every request is a
``request`` span with one child span per stage; a stage may report sub-phases (``phases``: name, start, end
on ``time.perf_counter``), which become grandchild spans: the generate stage reports prefill (arrival → first
token) and decode (first → last token) from the engine's own token times. Introduced in
08_system_2_agents_observability_feedback.ipynb.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from course_lib.engine import SamplingParams
from course_lib.system import guardrails, rag
from course_lib.system.retrieval import BM25Retriever

# time.perf_counter → the epoch nanoseconds OpenTelemetry's spans carry
_EPOCH_NS = time.time_ns() - time.perf_counter_ns()


def _ns(perf_s: float) -> int:
    return _EPOCH_NS + int(perf_s * 1e9)


@dataclass(frozen=True)
class Stage:
    name: str
    fn: Callable[[dict], dict]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"Stage.name must be an identifier such as 'retrieve', got {self.name!r}")
        if not callable(self.fn):
            raise ValueError(f"Stage.fn must be a callable state -> dict, got {type(self.fn).__name__}")


class Pipeline:
    """Stages in order; ``run(question)`` returns the final state with ``timings`` (s per stage)."""

    def __init__(self, stages) -> None:
        stages = list(stages) if isinstance(stages, (list, tuple)) else None
        if not stages or not all(isinstance(s, Stage) for s in stages):
            raise ValueError("stages must be a non-empty list of Stage")
        names = [s.name for s in stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique, got {names}")
        self.stages = stages

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def replace(self, stage: Stage) -> Pipeline:
        """A new pipeline with ``stage`` in place of the stage of the same name."""
        if not isinstance(stage, Stage):
            raise ValueError(f"stage must be a Stage, got {type(stage).__name__}")
        if stage.name not in self.names:
            raise ValueError(f"no stage named {stage.name!r} to replace; stages are {self.names}")
        return Pipeline([stage if s.name == stage.name else s for s in self.stages])

    def run(self, question: str, tracer=None, tag: str = "") -> dict:
        """One request through every stage (until one blocks); ``tag`` goes before the system prompt (a unique
        one: no prefix shared with another request)."""
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question must be a non-empty str, got {question!r}")
        if not isinstance(tag, str):
            raise ValueError(f"tag must be a str, got {type(tag).__name__}")
        state = {"question": question, "tag": tag, "timings": {}}
        if tracer is None:
            for stage in self.stages:
                if not self._step(stage, state):
                    break
            return state
        from opentelemetry import trace

        with tracer.start_as_current_span("request", attributes={"question": question}):
            for stage in self.stages:
                with tracer.start_as_current_span(stage.name) as span:
                    ok = self._step(stage, state)
                    ctx = trace.set_span_in_context(span)
                    for name, start, end in state.pop("phases", ()):
                        tracer.start_span(name, context=ctx, start_time=_ns(start)).end(end_time=_ns(end))
                    span.set_attribute("blocked", bool(state.get("blocked")))
                if not ok:
                    break
        return state

    @staticmethod
    def _step(stage: Stage, state: dict) -> bool:
        t0 = time.perf_counter()
        update = stage.fn(state)
        state["timings"][stage.name] = time.perf_counter() - t0
        if not isinstance(update, dict):
            raise ValueError(f"stage {stage.name!r} must return a dict of new fields, got {type(update).__name__}")
        state.update(update)
        return not state.get("blocked")


def guard_stage(checks=guardrails.CHECKS) -> Stage:
    """Scrub secrets and personal data; block a prompt injection (section 2's checks)."""
    checks = tuple(checks)
    if not checks or any(c not in guardrails.CHECKS for c in checks):
        raise ValueError(f"checks must be a non-empty subset of {guardrails.CHECKS}, got {checks!r}")

    def guard(state: dict) -> dict:
        found = guardrails.check_input(state["question"], checks)
        if any(f.check == "injection" for f in found):
            return {"blocked": "injection", "findings": found}
        return {"question": guardrails.scrub(state["question"], found), "findings": found}

    return Stage("guard", guard)


def retrieve_stage(retriever: BM25Retriever, k: int = 2) -> Stage:
    """The top ``k`` documents for the question (``k=0``: no context)."""
    if not isinstance(retriever, BM25Retriever):
        raise ValueError(f"retriever must be a BM25Retriever, got {type(retriever).__name__}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    return Stage("retrieve", lambda s: {"docs": [h.doc for h in retriever.retrieve(s["question"], k)] if k else []})


def generate_stage(engine, max_new_tokens: int = 16) -> Stage:
    """The chat model's greedy answer; reports its prefill and decode phases from the token times."""
    if not getattr(getattr(engine, "tokenizer", None), "chat_template", None):
        raise ValueError("engine must be an Engine of a chat model (smollm2-135m-instruct)")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")

    def generate(state: dict) -> dict:
        prompt = rag.build_prompt(
            engine.tokenizer, state["question"], state.get("docs", ()), nonce=state.get("tag", "")
        )
        [r] = engine.generate([prompt], SamplingParams(max_new_tokens=max_new_tokens))
        t = r.trace
        phases = [("prefill", t.arrival, t.token_times[0]), ("decode", t.token_times[0], t.token_times[-1])]
        return {"answer": r.text.strip(), "prompt_tokens": len(r.prompt_ids), "phases": phases}

    return Stage("generate", generate)


__all__ = ["Pipeline", "Stage", "generate_stage", "guard_stage", "retrieve_stage"]
