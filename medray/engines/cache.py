"""On-disk response cache for paid/remote engines: a rerun or resumed run makes no new calls.

Keyed by sha256 of the canonical JSON of (provider, endpoint, model, request payload): the
payload holds the messages (images included, base64) and every decoding parameter sent, so
a changed prompt, image or max-tokens is a different key. API keys are never part of it.

SQLite in WAL mode: each `put` is one atomic transaction, and several processes (Ray
actors, parallel runs) may read and write the same file safely; a writer waits up to
`timeout` seconds for the lock instead of failing.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    response TEXT NOT NULL,
    created REAL NOT NULL
)
"""


def cache_key(provider: str, endpoint: str | None, model: str, payload: Any) -> str:
    blob = json.dumps(
        {"provider": provider, "endpoint": endpoint or "", "model": model, "payload": payload},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ResponseCache:
    """`get(key) -> dict | None`, `put(key, provider, model, response)`; thread- and
    process-safe (one connection per thread, SQLite locking between processes)."""

    def __init__(self, path: str | Path, timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.timeout = timeout
        self._local = threading.local()
        with self._conn() as conn:
            conn.execute(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    def get(self, key: str) -> dict | None:
        row = self._conn().execute(
            "SELECT response FROM responses WHERE key = ?", (key,)
        ).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, provider: str, model: str, response: dict) -> None:
        # INSERT OR IGNORE: when two processes race on one key, the first answer wins and
        # both runs then read the same response.
        self._conn().execute(
            "INSERT OR IGNORE INTO responses (key, provider, model, response, created) "
            "VALUES (?, ?, ?, ?, ?)",
            (key, provider, model, json.dumps(response, ensure_ascii=False), time.time()),
        )

    def __len__(self) -> int:
        return int(self._conn().execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
