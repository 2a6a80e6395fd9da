"""Cost in money: dollars per million tokens from a measured throughput and an instance's hourly price, and
the break-even between paying an API per token and renting a machine by the hour.

A machine rented at ``$h`` per hour that sustains ``r`` tokens per second costs ``h / (3600 r)`` dollars per
token when it is kept busy (``usd_per_mtok``); idle hours cost the same and produce nothing, so utilisation
divides the throughput. Prefill and decode run at very different rates (chapter 01: one is compute-bound,
the other bandwidth-bound), so ``measure_throughput`` measures both from one batched run's traces, and a
request's cost is its prompt tokens at the prefill rate plus its output tokens at the decode rate, the way
APIs price input and output tokens differently. The break-even (Huyen, *AI Engineering*, ch. 9, "T ≤ p × N")
compares a fixed monthly cost ``T`` of self-hosting with ``N`` requests a month at an API price ``p`` per
request: self-hosting pays when ``T ≤ p·N``, i.e. from ``N* = T / p`` on, provided the machines can serve
``N`` (``break_even_table`` adds instances as ``N`` outgrows one). Prices live in ``data/system/prices.json``
with their sources and dates. Introduced in 08_system_1_context_guardrails_gateway.ipynb.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from course_lib.core.paths import data_dir
from course_lib.engine import SamplingParams

HOURS_PER_MONTH = 730  # 365 × 24 / 12


def _pos(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def load_prices(path=None) -> dict:
    """``{"instances": [...], "apis": [...]}`` from ``data/system/prices.json``, each entry with its sources."""
    path = path or data_dir() / "system" / "prices.json"
    doc = json.loads(open(path, encoding="utf-8").read())
    for inst in doc["instances"]:
        lo, hi = inst["usd_per_hour"]
        if not (0 < lo <= hi) or not inst.get("sources"):
            raise ValueError(f"{path}: instance {inst['name']!r} needs usd_per_hour [low, high] and sources")
    for api in doc["apis"]:
        if not api.get("sources") or api["input_usd_per_mtok"] <= 0 or api["output_usd_per_mtok"] <= 0:
            raise ValueError(f"{path}: api {api['name']!r} needs positive prices and sources")
    return doc


def usd_per_mtok(usd_per_hour: float, tok_per_s: float, utilisation: float = 1.0) -> float:
    """Dollars per million tokens of a machine at ``usd_per_hour`` producing ``tok_per_s`` while busy, busy a
    share ``utilisation`` of the hours paid for."""
    _pos("usd_per_hour", usd_per_hour)
    _pos("tok_per_s", tok_per_s)
    if not _pos("utilisation", utilisation) <= 1:
        raise ValueError(f"utilisation must be in (0, 1], got {utilisation!r}")
    return usd_per_hour / (3600 * tok_per_s * utilisation) * 1e6


@dataclass(frozen=True)
class Throughput:
    prefill_tok_s: float  # prompt tokens / seconds to the last first token (all prompts prefilled)
    decode_tok_s: float  # tokens after the first / seconds from then to the last token, the batch decoding
    batch: int
    prompt_tokens: int
    output_tokens: int

    def request_seconds(self, prompt_tokens: float, output_tokens: float) -> float:
        """Machine-seconds one request of this shape takes at these rates (its share of a batch)."""
        return prompt_tokens / self.prefill_tok_s + output_tokens / self.decode_tok_s


def measure_throughput(engine, prompts, max_new_tokens: int) -> Throughput:
    """Prefill and decode rates of one batched greedy run of ``prompts`` (EOS ignored, so every sequence
    decodes ``max_new_tokens``): from the requests' traces."""
    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 2:
        raise ValueError(
            f"max_new_tokens must be an int >= 2 (decode needs tokens after the first), got {max_new_tokens!r}"
        )
    results = engine.generate(list(prompts), SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True))
    start = min(r.trace.arrival for r in results)
    first = max(r.trace.token_times[0] for r in results)
    end = max(r.trace.token_times[-1] for r in results)
    n_prompt = sum(len(r.prompt_ids) for r in results)
    n_decode = sum(len(r.output_ids) - 1 for r in results)
    if end <= first or first <= start:
        raise ValueError("the run was too short to time prefill and decode apart: raise max_new_tokens")
    n_out = sum(len(r.output_ids) for r in results)
    return Throughput(n_prompt / (first - start), n_decode / (end - first), len(results), n_prompt, n_out)


def break_even_requests(monthly_usd: float, api_usd_per_request: float) -> float:
    """``N* = T / p``: requests a month from which a fixed monthly cost ``T`` is no more than the API bill."""
    return _pos("monthly_usd", monthly_usd) / _pos("api_usd_per_request", api_usd_per_request)


def api_usd_per_request(api: dict, prompt_tokens: float, output_tokens: float) -> float:
    """An API's price of one request: its input and output tokens at the API's two prices."""
    _pos("prompt_tokens", prompt_tokens)
    _pos("output_tokens", output_tokens)
    return (prompt_tokens * api["input_usd_per_mtok"] + output_tokens * api["output_usd_per_mtok"]) / 1e6


def break_even_table(
    usd_per_hour: float, seconds_per_request: float, api_usd: float, monthly_requests, utilisation: float = 1.0
) -> list[dict]:
    """One row per monthly volume ``N``: instances needed (each serves ``utilisation`` × 730 h of requests at
    ``seconds_per_request`` machine-seconds each), their monthly cost ``T``, the API bill ``p·N``, and whether
    ``T ≤ p·N``."""
    _pos("usd_per_hour", usd_per_hour)
    _pos("seconds_per_request", seconds_per_request)
    _pos("api_usd", api_usd)
    if not _pos("utilisation", utilisation) <= 1:
        raise ValueError(f"utilisation must be in (0, 1], got {utilisation!r}")
    capacity = HOURS_PER_MONTH * 3600 * utilisation / seconds_per_request  # requests per instance-month
    rows = []
    for n in monthly_requests:
        _pos("monthly_requests", n)
        instances = max(1, math.ceil(n / capacity))
        t = instances * usd_per_hour * HOURS_PER_MONTH
        rows.append({"requests": n, "instances": instances, "self_host_usd": t, "api_usd": api_usd * n,
                     "self_host_wins": t <= api_usd * n})  # fmt: skip
    return rows


__all__ = [
    "HOURS_PER_MONTH", "Throughput", "api_usd_per_request", "break_even_requests", "break_even_table",
    "load_prices", "measure_throughput", "usd_per_mtok",
]  # fmt: skip
