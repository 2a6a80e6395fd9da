"""The engine's convenience wrappers around ``add_request`` / ``step``: ``events`` (run prompts to the end,
yield each token), ``generate`` (results in prompt order, each with its trace), ``stream`` (text pieces of
one prompt) and the no-cache baseline's backend swap. ``Engine`` binds them as its methods; they need an
engine with no other unfinished requests. Introduced in 02_metrics_1_latency.ipynb.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from course_lib.engine.attention import NoCacheBackend
from course_lib.engine.sampling import SamplingParams
from course_lib.engine.sequence import TokenEvent
from course_lib.engine.text_stream import TextStream
from course_lib.measure.metrics import RequestTrace


@dataclass
class GenerationResult:
    request_id: str | int
    prompt_ids: list[int]
    output_ids: list[int]  # generated ids; ends with EOS when finish_reason == "eos"
    text: str
    finish_reason: str  # "eos", "length" or "stop"
    trace: RequestTrace


@contextmanager
def swap_backend(engine, use_kv_cache: bool):
    """Temporarily swap in the no-cache backend (chapter 05's baseline); the engine must be idle."""
    if use_kv_cache:
        yield
        return
    if engine.has_unfinished():
        raise RuntimeError("use_kv_cache=False needs an idle engine: finish or abort the running requests first")
    saved = engine.backend
    engine.backend = engine.scheduler.backend = NoCacheBackend(engine.config.max_model_len)
    try:
        yield
    finally:
        engine.backend = engine.scheduler.backend = saved


def params_list(engine, params, n: int) -> list[SamplingParams]:
    if params is None or isinstance(params, SamplingParams):
        plist = [engine._check_params(params or SamplingParams())] * n
    elif isinstance(params, (list, tuple)):
        if len(params) != n:
            raise ValueError(f"params is a list of {len(params)} SamplingParams but there are {n} prompts")
        plist = [engine._check_params(p, f"params[{i}]") for i, p in enumerate(params)]
    else:
        raise ValueError(f"params must be a SamplingParams or a list of one per prompt, got {type(params).__name__}")
    if any(p.n > 1 for p in plist):  # results are one per prompt here
        raise ValueError("params.n > 1: drive add_request/step (see parallel_sampling.sample_ids) for n samples")
    return plist


def events(
    engine,
    ids: list[list[int]],
    params: SamplingParams | list[SamplingParams] | None = None,
    use_kv_cache: bool = True,
    arrival: float | None = None,
) -> Iterator[TokenEvent]:
    """Run these prompts (token ids) to completion, yielding each token as soon as it is on the host.
    ``event.request`` is the prompt's index. Needs an engine with no other unfinished requests."""
    plist = params_list(engine, params, len(ids))
    for p in plist:
        engine.check_fits(ids, p.max_new_tokens)
    if engine.has_unfinished():
        raise RuntimeError(
            "generate/events need an idle engine; drive add_request/step yourself to mix them with other requests"
        )
    arrival = time.perf_counter() if arrival is None else arrival
    with swap_backend(engine, use_kv_cache):
        for i, (p_ids, p) in enumerate(zip(ids, plist)):
            engine.add_request(p_ids, p, request_id=i, arrival=arrival)
        try:
            while engine.has_unfinished():
                yield from engine.step()
        finally:
            for rid in list(engine._live):  # the caller stopped early: free what is left
                engine.abort(rid)


def generate(
    engine,
    prompts,
    params: SamplingParams | list[SamplingParams] | None = None,
    *,
    use_kv_cache: bool = True,
    on_token: Callable[[TokenEvent], None] | None = None,
) -> list[GenerationResult]:
    """Generate for every prompt (one ``SamplingParams`` for all, or a list with one per prompt);
    results in prompt order, each with its trace."""
    arrival = time.perf_counter()
    ids = engine.encode(prompts)
    plist = params_list(engine, params, len(ids))
    outputs: list[list[int]] = [[] for _ in ids]
    times: list[list[float]] = [[] for _ in ids]
    reasons: list[str] = ["length"] * len(ids)
    for ev in engine.events(ids, plist, use_kv_cache, arrival):
        outputs[ev.request].append(ev.token_id)
        times[ev.request].append(ev.time)
        if ev.finish_reason:
            reasons[ev.request] = ev.finish_reason
        if on_token is not None:
            on_token(ev)
    results = []
    for i, (p, out) in enumerate(zip(ids, outputs)):
        trace = RequestTrace(
            request_id=i,
            arrival=arrival,
            prompt_tokens=len(p),
            token_times=times[i],
            finish=times[i][-1] if times[i] else None,
        )
        text = engine.tokenizer.decode(out, skip_special_tokens=True)
        if reasons[i] == "stop":  # cut the text before the stop string, as the OpenAI API does
            cut = min((text.find(s) for s in plist[i].stop if s in text), default=len(text))
            text = text[:cut]
        results.append(GenerationResult(i, p, out, text, reasons[i], trace))
    return results


def stream(engine, prompt: str, params: SamplingParams | None = None) -> Iterator[tuple[str, TokenEvent]]:
    """Yield (text piece, event) per token of one prompt, detokenizing incrementally (O(1) amortised per
    token, :class:`~course_lib.engine.text_stream.TextStream`): a piece is "" while a split UTF-8 character
    or a possible stop string's start is held back, and the text is cut before a stop string."""
    params = params or SamplingParams()
    ids = engine.encode([prompt])
    text = TextStream(engine.tokenizer, tuple(params.stop))
    for ev in engine.events(ids, params):
        piece = text.push(ev.token_id, (ev.finish_reason or "length") if ev.finished else None)
        yield piece, ev
