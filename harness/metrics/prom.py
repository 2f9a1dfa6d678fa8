"""Prometheus text exposition -> flat samples, as a /metrics endpoint exposes them."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.errors import HarnessError


class PromParseError(HarnessError):
    """The text is not Prometheus exposition format (one line, says why)."""


@dataclass(frozen=True)
class Sample:
    """One exposed sample: the name as exposed (counters keep `_total`, histograms `_sum`...)."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    value: float = math.nan


def family_kept(family_name: str, keep_prefixes: Sequence[str]) -> bool:
    """Whether a family is kept: its name (as parsed, counters without `_total`) starts with a prefix."""
    return not keep_prefixes or any(family_name.startswith(p) for p in keep_prefixes)


def parse_exposition(text: str, keep_prefixes: Sequence[str] = ()) -> list[Sample]:
    """Every sample of the families whose name starts with one of `keep_prefixes` ([] keeps all).

    The whole text is parsed even where families are dropped: a malformed line anywhere means
    the scrape as a whole cannot be trusted.
    """
    try:
        fast = _parse_plain(text, keep_prefixes)
        if fast is not None:
            return fast
        return _parse_with_prometheus_client(text, keep_prefixes)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise PromParseError(f"malformed Prometheus exposition text: {detail}") from None


def _parse_with_prometheus_client(text: str, keep_prefixes: Sequence[str]) -> list[Sample]:
    from prometheus_client.parser import text_string_to_metric_families

    samples: list[Sample] = []
    for family in text_string_to_metric_families(text):
        keep = family_kept(family.name, keep_prefixes)
        for s in family.samples:
            if keep:
                samples.append(Sample(name=s.name, labels=dict(s.labels), value=float(s.value)))
    return samples


# ---- the plain text a /metrics endpoint writes, parsed fast ------------------------------------------------
# prometheus_client's parser reads label sets a character at a time: a scrape of vLLM's /metrics (about 600
# lines, 50 kB) cost 26 ms of CPU, at every scrape of every point (4 to 10 a second in the CPU sweeps), in the
# harness process beside the server it measures. The text servers write is plainer than what that parser
# accepts: one space between fields, label values without escapes, the same label sets at every scrape. This
# path reads exactly that, with the families grouped and counters named as prometheus_client does (the tests
# hold the two paths equal), and hands any text with a line outside it to prometheus_client, whole, so that
# every other form, and every error, is what it was.

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
# a label set: quoted values without backslashes, braces only inside quotes (the pairs are read by _labels)
_LABEL_SET = r'\{([^{}\\"]*(?:"[^"\\\n]*"[^{}\\"]*)*)\}'
_SAMPLE_LINE = re.compile("(" + _NAME + ")(?:" + _LABEL_SET + r")? (\S+)(?: (\S+))?")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*)"(,|$)')
_COMMENT = re.compile(rf"# (HELP|TYPE) ({_NAME})(?: (.*))?")
_TYPE_SUFFIXES = {"counter": ("",), "gauge": ("",), "summary": ("_count", "_sum", ""),
                  "histogram": ("_count", "_sum", "_bucket")}
_label_sets: dict[str, dict[str, str] | None] = {}  # label text -> labels (None: not plain); bounded below


class _NotPlain(Exception):
    """A line the fast path does not read: the whole text goes to prometheus_client."""


def _labels(text: str) -> dict[str, str]:
    found = _label_sets.get(text, False)
    if found is False:
        found = {}
        end = 0
        for match in _LABEL.finditer(text):
            if match.start() != end or match.group(1) in found or match.group(1).startswith("__"):
                found = None
                break
            found[match.group(1)] = match.group(2)
            end = match.end()
        if found is not None and (end != len(text) or text.endswith(",")):
            found = None  # a trailing comma or anything the pairs did not cover
        if len(_label_sets) > 20_000:
            _label_sets.clear()
        _label_sets[text] = found
    if found is None:
        raise _NotPlain
    return dict(found)


def _number(text: str) -> float:
    """A value as prometheus_client reads it: no underscores, an int where it is one."""
    if "_" in text:
        raise ValueError(f"Invalid value: {text!r}")
    try:
        return float(int(text))
    except ValueError:
        return float(text)


def _add_family(samples: list[Sample], name: str, kind: str, rows: list[Sample],
                keep_prefixes: Sequence[str]) -> None:
    """A family's samples, where it is kept; a counter is named as prometheus_client names it."""
    if kind == "counter":
        if name.endswith("_total"):
            name = name[:-6]
        else:
            rows = [Sample(s.name + "_total", s.labels, s.value) for s in rows]
    if family_kept(name, keep_prefixes):
        samples.extend(rows)


def _parse_plain(text: str, keep_prefixes: Sequence[str]) -> list[Sample] | None:
    """The samples, or None where a line is not plain (then prometheus_client parses the whole text)."""
    samples: list[Sample] = []
    family, kind, allowed = "", "untyped", ()
    rows: list[Sample] = []
    try:
        for line in text.split("\n"):
            if not line or line.isspace():
                continue
            if line[0] == "#":
                match = _COMMENT.fullmatch(line)
                if match is None:
                    parts = line.split(None, 2)
                    if len(parts) >= 2 and (parts[1] in ("HELP", "TYPE") or parts[0] != "#"):
                        raise _NotPlain  # a HELP or TYPE line of another shape, or "#x y"
                    continue  # any other comment is ignored, as prometheus_client ignores it
                word, name, rest = match.groups()
                if word == "TYPE" and (rest is None or rest.split() != [rest]):
                    raise _NotPlain  # no type, or more than one word
                if name != family:
                    if family:
                        _add_family(samples, family, kind, rows, keep_prefixes)
                    family, rows = name, []
                    if word == "HELP":
                        kind, allowed = "untyped", (name,)
                if word == "TYPE":
                    kind = rest
                    allowed = tuple(name + suffix for suffix in _TYPE_SUFFIXES.get(kind, ("",)))
                continue
            match = _SAMPLE_LINE.fullmatch(line)
            if match is None:
                raise _NotPlain
            name, label_text, value, timestamp = match.groups()
            if timestamp is not None:
                _number(timestamp)  # read only to refuse a malformed one
            sample = Sample(name, _labels(label_text) if label_text else {}, _number(value))
            if name in allowed:
                rows.append(sample)
                continue
            # a sample outside the open family: that family ends, and this one stands alone, untyped
            if family:
                _add_family(samples, family, kind, rows, keep_prefixes)
            _add_family(samples, name, "untyped", [sample], keep_prefixes)
            family, kind, allowed, rows = "", "untyped", (), []
    except (_NotPlain, ValueError):
        return None  # prometheus_client reads it, and words any error its own way
    if family:
        _add_family(samples, family, kind, rows, keep_prefixes)
    return samples
