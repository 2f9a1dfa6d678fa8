"""EvalScope's benchmark_summary.json -> EvalScopeSummary, whichever key set wrote it (docs/facts.md §6).

Key sets, checked in EvalScope's sources (evalscope/perf/utils/perf_constants.py):
- from 1.10 (1.14.1 installed here): "Avg TTFT (ms)", "Avg TPOT (ms)", "Avg ITL (ms)";
- 1.7 .. 1.9: "TTFT (ms)", "TPOT (ms)", "ITL (ms)"; the other keys as from 1.10;
- older releases spelled everything out with latencies in seconds ("Average time per output
  token (s)", "Total requests", ...): read as the "<=1.9" key set, seconds turned into ms.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.records import EvalScopeSummary

# field -> (key, factor to the field's unit); the first key present wins
_STABLE_KEYS: dict[str, list[tuple[str, float]]] = {
    "total_requests": [("Total Requests", 1), ("Total requests", 1)],
    "success_requests": [("Success Requests", 1), ("Succeed requests", 1)],
    "failed_requests": [("Failed Requests", 1), ("Failed requests", 1)],
    "total_throughput_tok_s": [("Total Throughput (tok/s)", 1), ("Total token throughput (tok/s)", 1)],
    "output_throughput_tok_s": [("Output Throughput (tok/s)", 1), ("Output token throughput (tok/s)", 1)],
    "request_throughput_req_s": [("Req Throughput (req/s)", 1), ("Request throughput (req/s)", 1)],
    "mean_latency_s": [("Avg Latency (s)", 1), ("Average latency (s)", 1)],
    "mean_input_tokens": [("Avg Input Tokens", 1), ("Average input tokens per request", 1)],
    "mean_output_tokens": [("Avg Output Tokens", 1), ("Average output tokens per request", 1)],
    "time_taken_s": [("Test Duration (s)", 1), ("Time taken for tests (s)", 1)],
}

_LATENCY_KEYS_NEW: dict[str, tuple[str, float]] = {
    "mean_ttft_ms": ("Avg TTFT (ms)", 1), "mean_tpot_ms": ("Avg TPOT (ms)", 1),
    "mean_itl_ms": ("Avg ITL (ms)", 1),
}
_LATENCY_KEYS_OLD: dict[str, tuple[str, float]] = {
    "mean_ttft_ms": ("TTFT (ms)", 1), "mean_tpot_ms": ("TPOT (ms)", 1), "mean_itl_ms": ("ITL (ms)", 1),
}
_LATENCY_KEYS_LEGACY: dict[str, tuple[str, float]] = {
    "mean_ttft_ms": ("Average time to first token (s)", 1000),
    "mean_tpot_ms": ("Average time per output token (s)", 1000),
    "mean_itl_ms": ("Average inter-token latency (s)", 1000),
}
_INT_FIELDS = {"total_requests", "success_requests", "failed_requests"}


def _number(raw: Any, key: str, path: Path) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise HarnessError(f"{path}: {key!r} is not a number: {raw!r}"[:300])
    try:
        value = float(raw)
    except ValueError:
        raise HarnessError(f"{path}: {key!r} is not a number: {raw!r}"[:300]) from None
    # EvalScope writes -1 (or -1 s scaled to -1000 ms) for "not measured"; nothing here is negative
    return None if math.isnan(value) or value < 0 else value


def _fill(data: dict[str, Any], keys: dict[str, tuple[str, float]], path: Path) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for fieldname, (key, factor) in keys.items():
        value = _number(data.get(key), key, path)
        out[fieldname] = None if value is None else value * factor
    return out


def _summary_from_dict(data: dict[str, Any], path: Path) -> EvalScopeSummary:
    fields: dict[str, Any] = {}
    for fieldname, candidates in _STABLE_KEYS.items():
        present = next(((k, f) for k, f in candidates if k in data), None)
        if present is not None:
            fields[fieldname] = _fill(data, {fieldname: present}, path)[fieldname]
    if any(k in data for k, _ in _LATENCY_KEYS_NEW.values()):
        fields.update(_fill(data, _LATENCY_KEYS_NEW, path), key_set=">=1.10")
    elif any(k in data for k, _ in _LATENCY_KEYS_OLD.values()):
        fields.update(_fill(data, _LATENCY_KEYS_OLD, path), key_set="<=1.9")
    elif any(k in data for k, _ in _LATENCY_KEYS_LEGACY.values()):
        fields.update(_fill(data, _LATENCY_KEYS_LEGACY, path), key_set="<=1.9")
    for name in _INT_FIELDS & fields.keys():
        if fields[name] is not None:
            fields[name] = round(fields[name])
    return EvalScopeSummary(**fields)


def parse_summary(path: Path) -> EvalScopeSummary:
    """Read one benchmark_summary.json; a missing or unreadable file is a one-line HarnessError."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HarnessError(f"{path}: EvalScope summary not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HarnessError(f"{path}: cannot read EvalScope summary: {' '.join(str(exc).split())}") from None
    except json.JSONDecodeError as exc:
        raise HarnessError(f"{path}: EvalScope summary is not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(data, dict):
        raise HarnessError(f"{path}: EvalScope summary is not a JSON object")
    return _summary_from_dict(data, path)
