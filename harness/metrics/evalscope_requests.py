"""EvalScope's per-request output (benchmark_data.db) -> ClientRequests, whichever release wrote it.

Both the blog's 1.7.0 and 1.14.x write one SQLite row per request in a table `result` with the columns
read here (latency, first_chunk_latency, prompt_tokens, completion_tokens, success,
inter_token_latencies as a JSON list of seconds); 1.14 adds request_id and is_stream, which are not
needed (docs/facts.md §6). From the rows the harness recomputes the client's TPOT the way EvalScope
defines it and counts the replies that arrived in one burst, the measurement that shows why a client
TPOT can be far below the server's (docs/tpot.md).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from pathlib import Path

from harness.errors import HarnessError
from harness.records import ClientRequests

DB_NAME = "benchmark_data.db"
BURST_S = 0.005  # a reply whose decode span (latency - first chunk) is under 5 ms arrived in one read
_COLUMNS = ("latency", "first_chunk_latency", "prompt_tokens", "completion_tokens", "success",
            "inter_token_latencies")


def read_requests(db_path: Path) -> ClientRequests | None:
    """The per-request summary of one run; None where EvalScope wrote no database, HarnessError where
    it cannot be read."""
    db_path = Path(db_path)
    if not db_path.is_file():
        return None
    try:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as conn:
            present = {row[1] for row in conn.execute("PRAGMA table_info(result)")}
            missing = [c for c in _COLUMNS if c not in present]
            if missing:
                raise HarnessError(f"{db_path}: EvalScope's result table lacks {', '.join(missing)}")
            rows = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM result").fetchall()
            schema = "1.14" if "request_id" in present else "1.7"
    except sqlite3.Error as exc:
        raise HarnessError(f"{db_path}: cannot read EvalScope's per-request database: {exc}") from None
    ok = [r for r in rows if r[4] and r[0] is not None and r[1] is not None and r[3]]
    streamed = [r for r in ok if r[3] > 1]
    spans = [r[0] - r[1] for r in streamed]
    gaps = [g for r in streamed for g in _gaps(r[5])]
    return ClientRequests(
        requests=len(rows), succeeded=len(ok), db_schema=schema,
        mean_prompt_tokens=_mean([r[2] for r in ok if r[2] is not None]),
        mean_completion_tokens=_mean([r[3] for r in ok]),
        mean_decode_span_ms=None if not spans else 1000 * statistics.fmean(spans),
        tpot_ms=None if not streamed else 1000 * statistics.fmean((r[0] - r[1]) / (r[3] - 1) for r in streamed),
        burst_replies=sum(1 for span in spans if span < BURST_S),
        max_chunk_gap_ms=None if not gaps else 1000 * max(gaps))


def _gaps(raw: str | None) -> list[float]:
    try:
        values = json.loads(raw or "[]")
    except ValueError:
        return []
    return [float(v) for v in values if isinstance(v, int | float)]


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None
