"""User feedback logged to SQLite: a schema, migrations by ``PRAGMA user_version``, metrics in SQL.

Explicit feedback is what a user says (a thumbs up or down: ``rating`` 1 or 0); implicit feedback is what a
user does (``regenerate`` the answer, ``edit`` it, ``abandon`` the conversation), and it comes with every
response, not with the few a user bothers to rate (Huyen, *AI Engineering*, ch. 10, "User feedback"). Each
response and each event is a row; the metrics are SQL over them, per variant of the system (a model, a
prompt). The schema changes as the product does: ``MIGRATIONS[i]`` takes the database from version ``i`` to
``i + 1`` in one transaction, and the database's own ``user_version`` says where it stands, so opening an old
log upgrades it in place and opening a new one twice does nothing. Version 2 adds each response's latency and
a table of side-by-side comparisons (which of two answers the user picked, and in which position each was
shown). Introduced in 08_system_2_agents_observability_feedback.ipynb.
"""

from __future__ import annotations

import sqlite3

KINDS = ("rating", "regenerate", "edit", "abandon")
MIGRATIONS = (
    # 0 → 1: responses and the events on them
    """
    CREATE TABLE responses (id INTEGER PRIMARY KEY, conversation INTEGER NOT NULL, variant TEXT NOT NULL);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY, response_id INTEGER NOT NULL REFERENCES responses(id),
        kind TEXT NOT NULL CHECK (kind IN ('rating', 'regenerate', 'edit', 'abandon')), value INTEGER
    );
    """,
    # 1 → 2: latency per response; side-by-side comparisons; an index for the per-response lookups
    """
    ALTER TABLE responses ADD COLUMN latency_ms REAL;
    CREATE TABLE comparisons (
        id INTEGER PRIMARY KEY, first TEXT NOT NULL, second TEXT NOT NULL,
        picked INTEGER NOT NULL CHECK (picked IN (0, 1))
    );
    CREATE INDEX events_by_response ON events (response_id, kind);
    """,
)
LATEST = len(MIGRATIONS)


def open_log(path: str = ":memory:", version: int = LATEST) -> sqlite3.Connection:
    """A connection to the log at ``path``, migrated up to ``version`` (never down)."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"path must be a file name or ':memory:', got {path!r}")
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= LATEST:
        raise ValueError(f"version must be an int in [0, {LATEST}], got {version!r}")
    conn = sqlite3.connect(path, isolation_level=None)  # autocommit; migrate() opens its own transactions
    conn.execute("PRAGMA foreign_keys = ON")
    migrate(conn, version)
    return conn


def schema_version(conn: sqlite3.Connection) -> int:
    _conn(conn)
    return conn.execute("PRAGMA user_version").fetchone()[0]


def migrate(conn: sqlite3.Connection, version: int = LATEST) -> list[int]:
    """Apply the migrations from the database's version up to ``version``; the versions reached, in order."""
    current = schema_version(conn)
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= LATEST:
        raise ValueError(f"version must be an int in [0, {LATEST}], got {version!r}")
    if current > LATEST:
        raise ValueError(f"the log is at version {current}, newer than this code knows ({LATEST})")
    reached = []
    for v in range(current, version):
        conn.execute("BEGIN")
        try:
            for statement in MIGRATIONS[v].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {v + 1}")
            conn.execute("COMMIT")
        except sqlite3.Error:
            conn.execute("ROLLBACK")
            raise
        reached.append(v + 1)
    return reached


def log_response(conn, conversation: int, variant: str, latency_ms: float | None = None) -> int:
    """A response shown to a user; its row id."""
    _conn(conn)
    if isinstance(conversation, bool) or not isinstance(conversation, int) or conversation < 0:
        raise ValueError(f"conversation must be an int >= 0, got {conversation!r}")
    if not isinstance(variant, str) or not variant:
        raise ValueError(f"variant must be a non-empty str (a model or prompt name), got {variant!r}")
    if latency_ms is None:
        cur = conn.execute("INSERT INTO responses (conversation, variant) VALUES (?, ?)", (conversation, variant))
    else:
        if schema_version(conn) < 2:
            raise ValueError("latency_ms needs schema version 2: migrate(conn) first")
        cur = conn.execute(
            "INSERT INTO responses (conversation, variant, latency_ms) VALUES (?, ?, ?)",
            (conversation, variant, float(latency_ms)),
        )
    return cur.lastrowid


def log_event(conn, response_id: int, kind: str, value: int | None = None) -> None:
    """One signal on a response: ``rating`` (value 1 up, 0 down), ``regenerate``, ``edit`` or ``abandon``."""
    _conn(conn)
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if (kind == "rating") != (value in (0, 1)) or (kind != "rating" and value is not None):
        raise ValueError(f"a rating takes value 0 or 1, other kinds none; got kind={kind!r}, value={value!r}")
    conn.execute("INSERT INTO events (response_id, kind, value) VALUES (?, ?, ?)", (response_id, kind, value))


def log_comparison(conn, first: str, second: str, picked: int) -> None:
    """A side-by-side comparison: the variant shown first, the one shown second, the position picked (0/1)."""
    _conn(conn)
    if schema_version(conn) < 2:
        raise ValueError("comparisons need schema version 2: migrate(conn) first")
    if picked not in (0, 1) or isinstance(picked, bool):
        raise ValueError(f"picked must be 0 (the first shown) or 1 (the second), got {picked!r}")
    conn.execute("INSERT INTO comparisons (first, second, picked) VALUES (?, ?, ?)", (first, second, picked))


METRICS_SQL = """
SELECT r.variant,
       COUNT(*)                                   AS responses,
       SUM(e.rated)                               AS rated,
       SUM(e.up)                                  AS up,
       AVG(e.regenerated)                         AS regenerate_rate,
       AVG(e.edited)                              AS edit_rate,
       AVG(e.abandoned)                           AS abandon_rate
FROM responses r JOIN (
    SELECT r2.id,
           COALESCE(MAX(ev.kind = 'rating'), 0)                       AS rated,
           COALESCE(MAX(ev.kind = 'rating' AND ev.value = 1), 0)      AS up,
           COALESCE(MAX(ev.kind = 'regenerate'), 0)                   AS regenerated,
           COALESCE(MAX(ev.kind = 'edit'), 0)                         AS edited,
           COALESCE(MAX(ev.kind = 'abandon'), 0)                      AS abandoned
    FROM responses r2 LEFT JOIN events ev ON ev.response_id = r2.id
    GROUP BY r2.id
) e ON e.id = r.id
GROUP BY r.variant ORDER BY r.variant
"""

WIN_SQL = """
SELECT SUM(CASE WHEN (picked = 0 AND first = :v) OR (picked = 1 AND second = :v) THEN 1 ELSE 0 END), COUNT(*)
FROM comparisons WHERE first = :v OR second = :v
"""


def metrics(conn) -> dict[str, dict]:
    """Per variant: responses, rated, up (thumbs up), and the share of responses regenerated / edited / abandoned."""
    _conn(conn)
    cur = conn.execute(METRICS_SQL)
    cols = [c[0] for c in cur.description]
    return {row[0]: dict(zip(cols[1:], row[1:])) for row in cur.fetchall()}


def wins(conn, variant: str) -> tuple[int, int]:
    """(times ``variant`` was picked, comparisons it was in)."""
    _conn(conn)
    if schema_version(conn) < 2:
        raise ValueError("comparisons need schema version 2: migrate(conn) first")
    won, n = conn.execute(WIN_SQL, {"v": variant}).fetchone()
    return int(won or 0), int(n)


def _conn(conn) -> None:
    if not isinstance(conn, sqlite3.Connection):
        raise ValueError(f"conn must be a sqlite3.Connection (from open_log), got {type(conn).__name__}")


__all__ = [
    "KINDS", "LATEST", "METRICS_SQL", "MIGRATIONS", "WIN_SQL", "log_comparison", "log_event", "log_response",
    "metrics", "migrate", "open_log", "schema_version", "wins",
]  # fmt: skip
