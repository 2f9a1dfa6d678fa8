"""The /metrics scraper: a scrape at point start, one every interval, one at point end.

scrapes.jsonl holds one JSON object per line, appended and flushed after every scrape:
  a sample        {"t": unix_s, "scrape": i, "name": ..., "labels": {...}, "value": ...}
  a failed scrape {"t": unix_s, "scrape": i, "error": "<one line>"}
  an empty scrape {"t": unix_s, "scrape": i, "empty": true}   (answered, but nothing kept)
All records of one scrape share its `t` (the time its answer arrived) and index.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from harness import vllm_names as names
from harness.errors import HarnessError
from harness.metrics.prom import Sample, parse_exposition

DEFAULT_KEEP_PREFIXES: tuple[str, ...] = (names.PREFIX,)


class ScrapeError(HarnessError):
    """A scrape that got no usable answer (connection, timeout, HTTP status)."""


@dataclass(frozen=True)
class ScrapeRecord:
    """One line of scrapes.jsonl: a sample, or the marker of a failed or empty scrape."""

    t: float
    scrape: int
    name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    value: float | None = None
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def to_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"t": self.t, "scrape": self.scrape, "error": self.error}
        if self.name is None:
            return {"t": self.t, "scrape": self.scrape, "empty": True}
        return {"t": self.t, "scrape": self.scrape, "name": self.name, "labels": self.labels,
                "value": self.value}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ScrapeRecord:
        value = obj.get("value")
        return cls(t=float(obj["t"]), scrape=int(obj["scrape"]), name=obj.get("name"),
                   labels=dict(obj.get("labels") or {}),
                   value=None if value is None else float(value), error=obj.get("error"))


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(str(text).split())[:limit]


def scrape_once(url: str, keep_prefixes: Sequence[str] = DEFAULT_KEEP_PREFIXES,
                timeout_s: float = 10.0, api_key: str | None = None) -> list[Sample]:
    """GET `url` and parse it; raises ScrapeError or PromParseError (both HarnessError).

    Direct, never through a proxy from the environment: the server is one the harness started."""
    import requests

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with requests.Session() as session:
            session.trust_env = False  # no HTTP(S)_PROXY, no .netrc
            response = session.get(url, timeout=timeout_s, headers=headers)
    except requests.RequestException as exc:
        raise ScrapeError(f"{url}: {type(exc).__name__}: {_one_line(exc)}") from None
    if response.status_code != 200:
        raise ScrapeError(f"{url}: HTTP {response.status_code}: {_one_line(response.text, 120)}")
    return parse_exposition(response.text, keep_prefixes)


def _scrape_records(url: str, index: int, keep_prefixes: Sequence[str],
                   timeout_s: float, api_key: str | None = None) -> list[ScrapeRecord]:
    """One scrape as the records it appends; a failure becomes one error record, never an exception."""
    try:
        samples = scrape_once(url, keep_prefixes, timeout_s, api_key)
        error = None
    except HarnessError as exc:
        samples, error = [], _one_line(exc)
    except Exception as exc:  # the scraper must outlive anything one answer can do to it
        samples, error = [], f"{type(exc).__name__}: {_one_line(exc)}"
    t = time.time()
    if error is not None:
        return [ScrapeRecord(t=t, scrape=index, error=error)]
    if not samples:
        return [ScrapeRecord(t=t, scrape=index)]
    return [ScrapeRecord(t=t, scrape=index, name=s.name, labels=s.labels, value=s.value) for s in samples]


class Scraper:
    """Scrapes `url` into `out_path` from start() to stop(); also a context manager.

    The first scrape runs in start() and the last in stop(), in the caller's thread, so they
    bracket the load exactly; the periodic ones run in a background thread. stop() waits at
    most for one in-flight scrape (bounded by timeout_s), never for the rest of an interval.
    """

    def __init__(self, url: str, out_path: Path, interval_s: float = 30.0,
                 keep_prefixes: Sequence[str] = DEFAULT_KEEP_PREFIXES, timeout_s: float = 10.0,
                 api_key: str | None = None):
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be > 0")
        self.url = url
        self.out_path = Path(out_path)
        self.interval_s = float(interval_s)
        self.keep_prefixes = list(keep_prefixes)
        self.timeout_s = float(timeout_s)
        self.api_key = api_key
        self.scrapes_taken = 0
        self.scrapes_failed = 0
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._out: IO[str] | None = None
        self._thread_error: BaseException | None = None

    def start(self) -> Scraper:
        if self._out is not None:
            raise RuntimeError("Scraper already started")
        try:
            self.out_path.parent.mkdir(parents=True, exist_ok=True)
            self._out = self.out_path.open("a", encoding="utf-8")
        except OSError as exc:
            raise HarnessError(f"{self.out_path}: cannot write scrapes: {_one_line(exc)}") from None
        self._scrape()
        self._stop_event.clear()
        self._thread = threading.Thread(target=self._loop, name=f"scraper:{self.url}", daemon=True)
        self._thread.start()
        return self

    def stop(self, final_scrape: bool = True) -> int:
        """Take the final scrape, close the file; returns how many scrapes were taken."""
        if self._out is None:
            return self.scrapes_taken
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            if final_scrape and self._thread_error is None:
                self._scrape()
        finally:
            self._out.close()
            self._out = None
        if self._thread_error is not None:
            raise HarnessError(f"{self.out_path}: scraper stopped: {_one_line(self._thread_error)}")
        return self.scrapes_taken

    def __enter__(self) -> Scraper:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        # On Ctrl-C / SystemExit leave at once: a hung server could hold the last scrape timeout_s
        self.stop(final_scrape=exc_type is None or issubclass(exc_type, Exception))

    def _loop(self) -> None:
        # A fixed schedule from the first scrape: a slow scrape does not shift the later ones.
        origin = time.monotonic()
        slot = 1
        try:
            while not self._stop_event.wait(max(0.0, origin + slot * self.interval_s - time.monotonic())):
                self._scrape()
                slot = max(slot + 1, int((time.monotonic() - origin) // self.interval_s) + 1)
        except BaseException as exc:  # surfaced by stop(); a thread cannot raise to its owner
            self._thread_error = exc

    def _scrape(self) -> None:
        records = _scrape_records(self.url, self.scrapes_taken, self.keep_prefixes, self.timeout_s, self.api_key)
        assert self._out is not None
        self._out.write("".join(json.dumps(r.to_json()) + "\n" for r in records))
        self._out.flush()
        self.scrapes_taken += 1
        self.scrapes_failed += int(records[0].failed)


def read_scrapes(path: Path) -> list[ScrapeRecord]:
    """Every record of a scrapes.jsonl, in file order ([] when there is none).

    A line that does not parse is a write torn by a kill (usually the last line) and is
    skipped: the records around it are still good.
    """
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise HarnessError(f"{path}: cannot read scrapes: {_one_line(exc)}") from None
    records: list[ScrapeRecord] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            records.append(ScrapeRecord.from_json(json.loads(line)))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return records
