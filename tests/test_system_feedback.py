"""Chapter 08 part 2, feedback: migrations run once each and in order (user_version records them, a failed
one rolls back), events are checked against the schema, the SQL metrics match counts made by hand, the
simulated users' limits appear only where the simulation puts them (no position bias → a fixed order is
right; no rating noise and many ratings → the thumbs-up rate ranks correctly), and Wilson's interval."""

import math
import sqlite3

import pytest

from course_lib.system import feedback, feedback_sim


def test_migrations_in_order_once(tmp_path):
    path = str(tmp_path / "log.db")
    conn = feedback.open_log(path, version=1)
    assert feedback.schema_version(conn) == 1
    rid = feedback.log_response(conn, 0, "A")
    with pytest.raises(ValueError, match="version 2"):
        feedback.log_response(conn, 1, "A", latency_ms=12.0)
    conn.close()
    conn = feedback.open_log(path)  # an old log opened by new code upgrades in place, keeping its rows
    assert feedback.schema_version(conn) == feedback.LATEST == 2
    assert feedback.migrate(conn) == []
    assert conn.execute("SELECT id FROM responses").fetchall() == [(rid,)]
    feedback.log_response(conn, 1, "A", latency_ms=12.0)
    with pytest.raises(ValueError, match="version"):
        feedback.open_log(path, version=3)


def test_failed_migration_rolls_back(monkeypatch):
    conn = feedback.open_log(version=1)
    monkeypatch.setattr(feedback, "MIGRATIONS", (feedback.MIGRATIONS[0], "CREATE TABLE t (a); SELECT * FROM nowhere"))
    with pytest.raises(sqlite3.Error):
        feedback.migrate(conn, 2)
    assert feedback.schema_version(conn) == 1
    assert "t" not in [r[0] for r in conn.execute("SELECT name FROM sqlite_master")]


def test_events_and_metrics_by_hand():
    conn = feedback.open_log()
    a1, a2, b1 = (feedback.log_response(conn, i, v) for i, v in enumerate("AAB"))
    feedback.log_event(conn, a1, "rating", 1)
    feedback.log_event(conn, a1, "regenerate")
    feedback.log_event(conn, a1, "regenerate")  # twice on one response counts once
    feedback.log_event(conn, b1, "rating", 0)
    feedback.log_event(conn, b1, "abandon")
    m = feedback.metrics(conn)
    assert m["A"] == {
        "responses": 2,
        "rated": 1,
        "up": 1,
        "regenerate_rate": 0.5,
        "edit_rate": 0.0,
        "abandon_rate": 0.0,
    }
    assert m["B"]["rated"] == 1 and m["B"]["up"] == 0 and m["B"]["abandon_rate"] == 1.0
    for kind, value in (("rating", None), ("rating", 2), ("edit", 1), ("click", None)):
        with pytest.raises(ValueError):
            feedback.log_event(conn, a2, kind, value)
    with pytest.raises(sqlite3.IntegrityError):
        feedback.log_event(conn, 999, "edit")  # foreign key: no such response
    feedback.log_comparison(conn, "A", "B", 1)
    feedback.log_comparison(conn, "B", "A", 1)
    assert feedback.wins(conn, "B") == (1, 2) and feedback.wins(conn, "A") == (1, 2)
    with pytest.raises(ValueError, match="conn"):
        feedback.metrics("log.db")


def test_sim_limits_only_where_put():
    q = {"A": 0.6, "B": 0.7}
    truth = feedback_sim.true_win_rate(q, "B", "A")
    assert truth == pytest.approx(0.7 * 0.4 + 0.5 * (0.42 + 0.12))
    for bias, inside in ((0.0, True), (0.3, False)):  # a fixed order is biased only if users are
        conn = feedback.open_log()
        feedback_sim.simulate_comparisons(conn, 4000, q, position_bias=bias, first="A", seed=3)
        lo, hi = feedback_sim.wilson(*feedback.wins(conn, "B"))
        assert (lo <= truth <= hi) == inside
    conn = feedback.open_log()
    feedback_sim.simulate_sessions(conn, 3000, q, rate_share=1.0, seed=0)
    m = feedback.metrics(conn)
    assert m["B"]["up"] / m["B"]["rated"] > m["A"]["up"] / m["A"]["rated"]  # dense ratings rank right
    assert m["B"]["regenerate_rate"] < m["A"]["regenerate_rate"]
    with pytest.raises(ValueError, match="quality"):
        feedback_sim.simulate_sessions(conn, 10, {"A": 1.5, "B": 0.1})
    with pytest.raises(ValueError, match="position_bias"):
        feedback_sim.simulate_comparisons(conn, 10, q, position_bias=2)


def test_wilson():
    lo, hi = feedback_sim.wilson(50, 100)
    assert lo == pytest.approx(0.404, abs=1e-3) and hi == pytest.approx(0.596, abs=1e-3)
    assert feedback_sim.wilson(0, 10)[0] == pytest.approx(0.0, abs=1e-12)
    assert all(math.isnan(x) for x in feedback_sim.wilson(0, 0))
    with pytest.raises(ValueError):
        feedback_sim.wilson(5, 3)
