"""Chapter 08, cost: dollars per million tokens follow h / (3600 r), the price file carries sources and
ranges, the break-even table flips where N* = T / p says (and adds instances past one's capacity), the
throughput helper times prefill and decode apart, and exercise 4's checker passes its answer and fails a
wrong one."""

import math

import pytest

from course_lib.engine import Engine, SchedulerConfig
from course_lib.exercises import ch08
from course_lib.system import cost as C


def test_usd_per_mtok():
    assert C.usd_per_mtok(3.6, 1.0) == pytest.approx(1e3)  # $3.6/h at 1 tok/s: $0.001 per token
    assert C.usd_per_mtok(1.0, 100.0, utilisation=0.5) == pytest.approx(2 * C.usd_per_mtok(1.0, 100.0))
    with pytest.raises(ValueError, match="tok_per_s"):
        C.usd_per_mtok(1.0, 0)
    with pytest.raises(ValueError, match="utilisation"):
        C.usd_per_mtok(1.0, 1.0, utilisation=1.5)


def test_price_file_has_sources_and_ranges():
    prices = C.load_prices()
    kinds = {i["kind"] for i in prices["instances"]}
    assert {"cpu", "gpu"} <= kinds
    for entry in prices["instances"] + prices["apis"]:
        assert entry["sources"] and all(s["url"].startswith("http") and s["date"] for s in entry["sources"])
        assert entry["checked"] is False  # none was read on the provider's own page


def test_break_even():
    api = {"input_usd_per_mtok": 0.15, "output_usd_per_mtok": 0.60}
    p = C.api_usd_per_request(api, 200, 100)
    assert p == pytest.approx((200 * 0.15 + 100 * 0.6) / 1e6)
    t = 0.08 * C.HOURS_PER_MONTH
    n_star = C.break_even_requests(t, p)
    rows = C.break_even_table(0.08, 1e-3, p, [n_star * 0.5, n_star * 1.01])
    assert [r["self_host_wins"] for r in rows] == [False, True] and rows[0]["instances"] == 1
    capacity = C.HOURS_PER_MONTH * 3600 / 1.0  # one request per machine-second
    [row] = C.break_even_table(0.08, 1.0, p, [3.5 * capacity])
    assert row["instances"] == 4 and row["self_host_usd"] == pytest.approx(4 * t)
    with pytest.raises(ValueError, match="api_usd_per_request"):
        C.break_even_requests(t, 0)


def test_measure_throughput_on_tiny_target():
    e = Engine("tiny-target", config=SchedulerConfig(max_model_len=128, max_num_seqs=4))
    th = C.measure_throughput(e, ["def f(x):", "import os", "class A:", "for i in"], 8)
    assert th.batch == 4 and th.output_tokens == 32 and th.prompt_tokens > 4
    assert th.prefill_tok_s > 0 and th.decode_tok_s > 0
    assert th.request_seconds(10, 10) == pytest.approx(10 / th.prefill_tok_s + 10 / th.decode_tok_s)
    with pytest.raises(ValueError, match="max_new_tokens"):
        C.measure_throughput(e, ["x"], 1)


def test_exercise_break_even():
    assert ch08.check_break_even(0.08 * 730 / 5e-5, 0.08, 5e-5)
    with pytest.raises(AssertionError):
        ch08.check_break_even(0.08 / 5e-5, 0.08, 5e-5)  # forgot the hours in a month: T is per hour
    assert not ch08.check_break_even(None, 0.08, 5e-5)
    with pytest.raises(ValueError, match="usd_per_hour"):
        ch08.check_break_even(1.0, -1, 5e-5)
    assert math.isfinite(C.break_even_requests(1.0, 1e-6))


def test_a_slow_machine_fails_the_self_host_verdict():
    from course_lib.measure.claims import claim

    api = {"input_usd_per_mtok": 0.15, "output_usd_per_mtok": 0.60}
    p = C.api_usd_per_request(api, 250, 100)
    slow = C.Throughput(prefill_tok_s=10.0, decode_tok_s=1.0, batch=1, prompt_tokens=1, output_tokens=1)
    per_request = 0.0832 * slow.request_seconds(250, 100) / 3600
    assert not claim("self-hosting costs less per request than the API", per_request / p, at_most=1.0)
    fast = C.Throughput(prefill_tok_s=1e4, decode_tok_s=1e3, batch=1, prompt_tokens=1, output_tokens=1)
    assert claim(
        "self-hosting costs less per request than the API",
        0.0832 * fast.request_seconds(250, 100) / 3600 / p,
        at_most=1.0,
    )
