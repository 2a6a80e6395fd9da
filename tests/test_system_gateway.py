"""Chapter 08, gateway: the token bucket admits its burst and refills at its rate (a fake clock, no sleeping);
the app checks keys (401), limits (429 with Retry-After), routes ("auto" asks the router, a name picks a
backend, an unknown one is 404), rejects bad bodies by field (400), falls back on an error and on a timeout,
answers 502 when no backend does, and bills each request at its backend's prices in the ledger."""

import time

import pytest
from fastapi.testclient import TestClient

from course_lib.system import gateway as G


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_token_bucket():
    clock = Clock()
    b = G.TokenBucket(rate=2.0, burst=3, clock=clock)
    assert [b.try_take() for _ in range(4)] == [True, True, True, False]
    assert b.retry_after() == pytest.approx(0.5)
    clock.t = 0.5
    assert b.try_take() and not b.try_take()
    clock.t = 100.0  # refills to the burst, not beyond
    assert sum(b.try_take() for _ in range(10)) == 3
    with pytest.raises(ValueError, match="rate"):
        G.TokenBucket(0, 1)
    with pytest.raises(ValueError, match="burst"):
        G.TokenBucket(1, -1)


def test_prices():
    assert G.Prices(1.0, 3.0).usd(1_000_000, 1_000_000) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="output_usd_per_mtok"):
        G.Prices(1.0, -1.0)


class Priced(G.EchoBackend):
    def __init__(self, prices):
        self.prices = prices


def make(backends, fallbacks=None, timeout_s=5.0, burst=100):
    keys = {"alice": G.TokenBucket(1e-3, burst), "bob": G.TokenBucket(1e3, 1e3)}
    router = lambda text: "code" if text.startswith("def") else "chat"
    return G.create_gateway(backends, router, keys=keys, fallbacks=fallbacks, timeout_s=timeout_s)


def post(client, content, key="bob", model="auto", **extra):
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    return client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})


def test_routes_bills_and_limits():
    backends = {"code": Priced(G.Prices(1.0, 2.0)), "chat": Priced(G.Prices(10.0, 20.0))}
    app = make(backends, burst=2)
    with TestClient(app) as c:
        r = post(c, "def f(x): return x")
        assert r.status_code == 200 and r.json()["model"] == "code" and r.headers["x-gateway-backend"] == "code"
        assert r.json()["choices"][0]["message"]["content"] == "def f(x): return x"
        assert r.json()["usage"]["total_tokens"] == 8
        assert post(c, "hello there", max_tokens=1).json()["model"] == "chat"
        assert post(c, "def f", model="chat").json()["model"] == "chat"  # a name bypasses the router
        assert post(c, "x", model="gpt-9").status_code == 404
        assert post(c, "x", key="mallory").status_code == 401
        assert c.post("/v1/chat/completions", json={"messages": []}, headers={"Authorization": "Bearer bob"}).json()[
            "error"]["param"] == "messages"  # fmt: skip
        assert post(c, "x", max_tokens=0).json()["error"]["param"] == "max_tokens"
        codes = [post(c, "hi", key="alice").status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        assert int(post(c, "hi", key="alice").headers["Retry-After"]) > 0
    led = app.state.ledger
    e = led.entries[0]
    assert (e.backend, e.prompt_tokens, e.completion_tokens) == ("code", 4, 4)
    assert e.usd == pytest.approx((4 * 1.0 + 4 * 2.0) / 1e6) and e.gateway_s > 0
    assert led.entries[1].usd == pytest.approx((2 * 10.0 + 1 * 20.0) / 1e6)
    assert led.by_backend()["chat"]["requests"] == 4 and led.total_usd("alice") > 0


def test_fallback_on_error_and_timeout_and_502():
    chat = Priced(G.Prices(10.0, 20.0))
    code = G.FaultyBackend(Priced(G.Prices(1.0, 2.0)), fail_calls={0}, slow_calls={1}, delay_s=0.5)
    app = make({"code": code, "chat": chat}, fallbacks={"code": "chat"}, timeout_s=0.1)
    with TestClient(app) as c:
        assert post(c, "def a").json()["model"] == "chat"  # call 0 raises
        assert post(c, "def b").json()["model"] == "chat"  # call 1 exceeds the timeout
        time.sleep(0.5)  # the timed-out call still holds the backend's worker until it ends
        assert post(c, "def c").json()["model"] == "code"  # call 2 answers
    fell = [e.fell_back for e in app.state.ledger.entries]
    assert fell == [True, True, False] and app.state.ledger.entries[0].route == "code"
    lonely = make({"code": G.FaultyBackend(Priced(G.Prices(1, 1)), fail_calls={0}), "chat": chat})
    with TestClient(lonely) as c:
        r = post(c, "def a")
        assert r.status_code == 502 and r.json()["error"]["type"] == "backend_error"


def test_bad_configuration():
    ok = {"code": Priced(G.Prices(1, 1)), "chat": Priced(G.Prices(1, 1))}
    with pytest.raises(ValueError, match="fallbacks"):
        make(ok, fallbacks={"code": "gpu"})
    with pytest.raises(ValueError, match="backends"):
        make({})
    with pytest.raises(ValueError, match="keys"):
        G.create_gateway(ok, lambda t: "chat", keys={})
    with pytest.raises(ValueError, match="router"):
        G.create_gateway(ok, "chat", keys={"k": G.TokenBucket(1, 1)})


def test_latency_interleaves_and_checks():
    order = []
    stats = G.latency({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 3)
    assert order == ["a", "b"] * 3 and len(stats["a"]["all"]) == 3
    one = G.latency(lambda: None, 5)
    assert 0 <= one["p50_s"] <= one["p99_s"]
    with pytest.raises(ValueError, match="fns"):
        G.latency({}, 3)
    with pytest.raises(ValueError, match="n must"):
        G.latency(lambda: None, 1)


def test_a_slow_gateway_fails_the_latency_verdict():
    from course_lib.measure.claims import claim

    slow = G.FaultyBackend(G.EchoBackend(), slow_calls=set(range(10)), delay_s=0.02)
    app = make({"code": slow, "chat": G.EchoBackend()})
    with TestClient(app) as c:
        own = G.latency(lambda: post(c, "def x", model="code"), 4)
    assert own["p50_s"] >= 0.02
    assert not claim("the gateway's own p50 is under 5 % of a 0.1 s TTFT", own["p50_s"] / 0.1, at_most=0.05)
