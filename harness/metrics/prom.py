"""Prometheus text exposition -> flat samples, as a /metrics endpoint exposes them."""

from __future__ import annotations

import math
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
    from prometheus_client.parser import text_string_to_metric_families

    samples: list[Sample] = []
    try:
        for family in text_string_to_metric_families(text):
            keep = family_kept(family.name, keep_prefixes)
            for s in family.samples:
                if keep:
                    samples.append(Sample(name=s.name, labels=dict(s.labels), value=float(s.value)))
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise PromParseError(f"malformed Prometheus exposition text: {detail}") from None
    return samples
