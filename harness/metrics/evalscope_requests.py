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
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.records import ClientRequests

DB_NAME = "benchmark_data.db"
BURST_S = 0.005  # a reply whose decode span (latency - first chunk) is under 5 ms arrived in one read
_COLUMNS = ("latency", "first_chunk_latency", "prompt_tokens", "completion_tokens", "success",
            "inter_token_latencies")


@dataclass(frozen=True)
class RequestRow:
    """One request as EvalScope recorded it (seconds and tokens)."""

    latency_s: float | None
    first_chunk_s: float | None  # time to first token
    prompt_tokens: int | None
    completion_tokens: int | None
    success: bool
    chunk_gaps_s: tuple[float, ...]  # inter-token latencies, one per streamed chunk after the first

    @property
    def ok(self) -> bool:
        """Succeeded, with the timings and tokens every per-request number needs: the one success filter."""
        return bool(self.success) and self.latency_s is not None and self.first_chunk_s is not None \
            and bool(self.completion_tokens)

    @property
    def decode_span_s(self) -> float | None:
        if self.latency_s is None or self.first_chunk_s is None:
            return None
        return self.latency_s - self.first_chunk_s

    @property
    def tpot_s(self) -> float | None:
        """EvalScope's TPOT of this request: (latency - TTFT) / (output tokens - 1); None below two tokens."""
        span = self.decode_span_s
        if span is None or not self.completion_tokens or self.completion_tokens < 2:
            return None
        return span / (self.completion_tokens - 1)

    @property
    def burst(self) -> bool:
        """The reply arrived in one read (a decode span under BURST_S): the client saw no streaming."""
        span = self.decode_span_s
        return span is not None and span < BURST_S


def read_request_rows(db_path: Path) -> tuple[list[RequestRow], str] | None:
    """Every request row of one run and the database's schema ("1.7" or "1.14"); None where EvalScope wrote
    no database, HarnessError where it cannot be read. The one reader of benchmark_data.db."""
    db_path = Path(db_path)
    if not db_path.is_file():
        return None
    try:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as conn:
            present = {row[1] for row in conn.execute("PRAGMA table_info(result)")}
            missing = [c for c in _COLUMNS if c not in present]
            if missing:
                raise HarnessError(f"{db_path}: EvalScope's result table lacks {', '.join(missing)}")
            raw = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM result").fetchall()
            schema = "1.14" if "request_id" in present else "1.7"
    except sqlite3.Error as exc:
        raise HarnessError(f"{db_path}: cannot read EvalScope's per-request database: {exc}") from None
    rows = [RequestRow(latency_s=r[0], first_chunk_s=r[1], prompt_tokens=r[2], completion_tokens=r[3],
                       success=bool(r[4]), chunk_gaps_s=tuple(_gaps(r[5]))) for r in raw]
    return rows, schema


def read_requests(db_path: Path) -> ClientRequests | None:
    """The per-request summary of one run; None where EvalScope wrote no database, HarnessError where
    it cannot be read."""
    found = read_request_rows(db_path)
    return None if found is None else summarise_requests(*found)


def summarise_requests(rows: list[RequestRow], schema: str | None) -> ClientRequests:
    """The per-request summary of rows read by read_request_rows (or rows made as EvalScope would write them)."""
    ok = [r for r in rows if r.ok]
    streamed = [r for r in ok if r.tpot_s is not None]
    spans = [r.decode_span_s for r in streamed if r.decode_span_s is not None]
    gaps = [g for r in streamed for g in r.chunk_gaps_s]
    return ClientRequests(
        requests=len(rows), succeeded=len(ok), db_schema=schema,
        mean_prompt_tokens=_mean([r.prompt_tokens for r in ok if r.prompt_tokens is not None]),
        mean_completion_tokens=_mean([r.completion_tokens for r in ok if r.completion_tokens]),
        mean_decode_span_ms=None if not spans else 1000 * statistics.fmean(spans),
        tpot_ms=None if not streamed else 1000 * statistics.fmean(r.tpot_s for r in streamed),
        burst_replies=sum(1 for r in streamed if r.burst),
        max_chunk_gap_ms=None if not gaps else 1000 * max(gaps))


def _gaps(raw: str | None) -> list[float]:
    try:
        values = json.loads(raw or "[]")
    except ValueError:
        return []
    return [float(v) for v in values if isinstance(v, int | float)]


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None
