"""The sweep file: the dataset, the client points and the deployments to run them against."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from harness import vllm_names as names
from harness.config.nightly import NightlySettings
from harness.schema import RelPath, Slug, StrictModel, must_exist, renamed

# A pinned EvalScope: a release ("1.7.0") or a git ref ("acd09b44", "modelscope/evalscope@acd09b44").
EVALSCOPE_REPO = "modelscope/evalscope"
_EVALSCOPE_VERSION_RE = re.compile(r"^(?:==)?(\d+(?:\.\d+){1,3}(?:(?:a|b|rc|\.post|\.dev)\d+)?)$")
_EVALSCOPE_GIT_RE = re.compile(r"^(?:(?P<repo>[\w.-]+/[\w.-]+)@)?(?P<ref>[\w./-]+)$")


def evalscope_spec_parts(spec: str) -> tuple[str, str | None, str | None]:
    """("pypi", version, None) or ("git", repo, ref) for a client.evalscope value (validated)."""
    m = _EVALSCOPE_VERSION_RE.match(spec)
    if m:
        return "pypi", m.group(1), None
    g = _EVALSCOPE_GIT_RE.match(spec)
    if g is None:
        raise ValueError(f"cannot read evalscope {spec!r}; write a release like '1.7.0' or a git ref like "
                         f"'acd09b44' or '{EVALSCOPE_REPO}@acd09b44'")
    return "git", g.group("repo") or EVALSCOPE_REPO, g.group("ref")


class PointSpec(StrictModel):
    concurrency: int = Field(ge=1, description="concurrent conversations (EvalScope's --parallel)")
    conversations: int = Field(ge=1, description="conversations sent (EvalScope's --number)")

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        return renamed(data, {"parallel": "concurrency", "number": "conversations"}, "client.points: ")


class ClientSettings(StrictModel):
    model: str | None = Field(default=None, description="served model name; default: the launch profile's")
    api: str = "openai"
    dataset: str = "swe_smith"
    max_tokens: int = Field(gt=0)
    extra_args: dict[str, Any] = Field(default_factory=dict)
    dataset_offset: int = Field(default=0, ge=0)
    multi_turn: bool = True
    points: list[PointSpec] | None = None
    concurrency: list[int] | None = None
    conversations: list[int] | None = None
    timeout_s: float = Field(default=6 * 3600, gt=0, description="wall limit for one point's EvalScope run")
    evalscope_args: list[str] = Field(default_factory=list, description="appended verbatim")
    evalscope: str | None = Field(default=None, description="the EvalScope the points run: a release "
                                  "('1.7.0', the blog's) or a git ref, built once into a cached environment; "
                                  "default: the harness's own")
    nice: int = Field(default=0, ge=0, le=19, description="run EvalScope at this lower CPU priority (a "
                      "client sharing cores with the server steals its time; docs/tpot.md)")

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        return renamed(data, {"parallel": "concurrency", "number": "conversations"}, "client: ")

    @field_validator("evalscope")
    @classmethod
    def _readable_evalscope(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = str(value).strip()
        evalscope_spec_parts(value)
        return value

    @model_validator(mode="after")
    def _one_point_list(self) -> ClientSettings:
        if self.points is not None:
            if self.concurrency is not None or self.conversations is not None:
                raise ValueError("give either points or concurrency+conversations, not both")
            if not self.points:
                raise ValueError("points: at least one point is needed")
            return self
        if self.concurrency is None or self.conversations is None:
            raise ValueError("give points, or both concurrency and conversations lists")
        if len(self.concurrency) != len(self.conversations):
            raise ValueError(f"concurrency has {len(self.concurrency)} values but conversations has {len(self.conversations)}; "
                             "they pair up one to one")
        if not self.concurrency:
            raise ValueError("concurrency: at least one point is needed")
        if any(v < 1 for v in self.concurrency + self.conversations):
            raise ValueError("concurrency and conversations values must be >= 1")
        return self

    @model_validator(mode="after")
    def _unique_concurrency(self) -> ClientSettings:
        # a point's folder is named by its concurrency (c8): two points at one concurrency would collide
        seen = [p.concurrency for p in self.point_list]
        dupes = sorted({c for c in seen if seen.count(c) > 1})
        if dupes:
            raise ValueError(f"concurrency {dupes[0]} appears in two points; each point needs its own concurrency value")
        return self

    @property
    def point_list(self) -> list[PointSpec]:
        if self.points is not None:
            return list(self.points)
        return [PointSpec(concurrency=p, conversations=n) for p, n in zip(self.concurrency or [], self.conversations or [],
                                                                  strict=True)]


class ScrapeSettings(StrictModel):
    interval_s: float = Field(default=30.0, gt=0)
    keep_prefixes: list[str] = Field(default_factory=lambda: [names.PREFIX],
                                     description="metric family prefixes kept; [] keeps all")
    timeout_s: float = Field(default=10.0, gt=0)


class SloSettings(StrictModel):
    """A latency target: a point meets it when every limit given holds (its p90s, its interactivity), and
    goodput counts the requests that meet the same limits one by one (their own TTFT, TPOT, latency)."""

    interactivity_min_tok_s_user: float | None = Field(default=None, gt=0, description="1000 / TPOT (ms) at "
                                                       "least this: per point its mean, per request its own")
    ttft_p90_max_s: float | None = Field(default=None, gt=0, description="p90 TTFT at most this (per request: "
                                         "its TTFT)")
    tpot_p90_max_ms: float | None = Field(default=None, gt=0, description="p90 TPOT at most this (per request: "
                                          "its TPOT)")
    e2e_p90_max_s: float | None = Field(default=None, gt=0, description="p90 end-to-end latency at most this "
                                        "(per request: its latency)")

    @model_validator(mode="after")
    def _something(self) -> SloSettings:
        if all(v is None for v in (self.interactivity_min_tok_s_user, self.ttft_p90_max_s, self.tpot_p90_max_ms,
                                   self.e2e_p90_max_s)):
            raise ValueError("give at least one limit (interactivity_min_tok_s_user, ttft_p90_max_s, "
                             "tpot_p90_max_ms, e2e_p90_max_s)")
        return self


def context_tokens(value: Any) -> int:
    """A context length: tokens as a number, or `16k` (16,000) / `1M` (1,000,000) as the blog writes them."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a context length")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmM]?)\s*", value)
        if m:
            scale = {"": 1, "k": 1_000, "m": 1_000_000}[m.group(2).lower()]
            tokens = float(m.group(1)) * scale
            if tokens.is_integer():
                return int(tokens)
    raise ValueError(f"{value!r} is not a context length; write tokens (74160) or 16k / 1M")


ContextTokens = Annotated[int, BeforeValidator(context_tokens), Field(gt=0)]


class SearchSettings(StrictModel):
    """The capacity search (`harness capacity`): per (arm, context), the largest concurrency at which every
    request stays running, found by a ramp then bisection with short probes."""

    start_concurrency: int = Field(default=1, ge=1)
    max_concurrency: int = Field(default=256, ge=1, description="the ramp stops here; a capacity at or above "
                                 "it is reported as not bracketed")
    probe_turns: int | None = Field(default=None, ge=1, description="turns a probe conversation sends (default: "
                                    "the recipe's, capped at 3): a probe needs the steady state, not a whole "
                                    "conversation")
    probe_timeout_s: float = Field(default=900, gt=0, description="wall limit of one probe")
    running_fraction: float = Field(default=1.0, gt=0, le=1, description="steady state counts as all running "
                                    "when the running gauge reaches this fraction of the concurrency")


class CorrectnessSettings(StrictModel):
    """The correctness probe: fixed prompts answered greedily at low concurrency and again under the sweep's
    highest point, through the same server (docs/correctness.md)."""

    enabled: bool = True
    prompts: RelPath | None = Field(default=None, description="a prompt set (YAML); default: the shipped one")
    max_tokens: int = Field(default=24, gt=0)


def _none_or_distinct(values: list[int] | None, item: str, default: str) -> list[int] | None:
    """An optional list that, when given, is not empty and names no item twice (the error's location is the
    field's, added by the loader)."""
    if values is not None:
        if not values:
            raise ValueError(f"give at least one {item}, or leave it out {default}")
        if len(set(values)) != len(values):
            raise ValueError(f"a {item} appears twice")
    return values


class DeploymentSpec(StrictModel):
    name: Slug
    launch: RelPath
    concurrencies: list[int] | None = Field(
        default=None, description="run only the client's points at these concurrencies (default: every point); "
        "each keeps its dataset offset, so arms that share a point send the same conversations")

    @field_validator("concurrencies")
    @classmethod
    def _some_distinct(cls, values: list[int] | None) -> list[int] | None:
        return _none_or_distinct(values, "value", "for every point")

    @field_validator("launch")
    @classmethod
    def _exists(cls, path: Path) -> Path:
        return must_exist(path)


class SweepFile(StrictModel):
    name: Slug
    description: str | None = None
    dataset: RelPath
    gpus_per_server: int = Field(ge=1)
    client: ClientSettings
    scrape: ScrapeSettings = ScrapeSettings()
    on_point_failure: Literal["continue", "stop"] = "continue"
    max_failed_requests: int = Field(default=0, ge=0, description="failed requests a point may have and stay "
                                     "ok; more mark it degraded (with the count)")
    max_point_retries: int = Field(default=0, ge=0, le=5)
    retry_cache: Literal["restart", "shift"] = Field(
        default="restart", description="how a retried point avoids the prefix cache its failed attempt warmed: "
        "restart the server (cold cache), or shift to conversations no earlier attempt sent (the dataset is "
        "built with max_point_retries x every point's conversations to spare)")
    deployments: list[DeploymentSpec] = Field(min_length=1)
    nightly: NightlySettings = Field(default_factory=NightlySettings,
                                     description="the nightly gate's window and thresholds "
                                     "(docs/nightly.md); only `harness nightly` reads it")
    slo: SloSettings | None = Field(default=None, description="a latency target every point is checked "
                                    "against, and goodput counted under (docs/metrics.md)")
    contexts: list[ContextTokens] | None = Field(default=None, description="first-turn lengths to run the "
                                                 "points at, each with its own dataset and server start "
                                                 "(instead of the recipe's one first_turn_length)")
    search: SearchSettings | None = Field(default=None, description="the capacity search's settings "
                                          "(`harness capacity`)")
    correctness: CorrectnessSettings = Field(default_factory=CorrectnessSettings,
                                             description="greedy answers unpressured and under pressure")

    @field_validator("contexts")
    @classmethod
    def _distinct_contexts(cls, contexts: list[int] | None) -> list[int] | None:
        return _none_or_distinct(contexts, "length", "for the recipe's first_turn_length")

    @field_validator("dataset")
    @classmethod
    def _exists(cls, path: Path) -> Path:
        return must_exist(path)

    @field_validator("deployments")
    @classmethod
    def _unique(cls, deps: list[DeploymentSpec]) -> list[DeploymentSpec]:
        seen: set[str] = set()
        for d in deps:
            if d.name in seen:
                raise ValueError(f"deployment name {d.name!r} appears twice")
            seen.add(d.name)
        return deps

    @model_validator(mode="after")
    def _deployment_points_exist(self) -> SweepFile:
        known = [p.concurrency for p in self.client.point_list]
        for i, dep in enumerate(self.deployments):
            missing = [c for c in dep.concurrencies or [] if c not in known]
            if missing:
                raise ValueError(f"deployments[{i}].concurrencies: {missing[0]} is not one of the client's points "
                                 f"({', '.join(f'c{c}' for c in known)})")
        return self

    def concurrencies_of(self, deployment: str) -> list[int]:
        """The concurrencies a deployment runs, in the client's point order."""
        chosen = next(d.concurrencies for d in self.deployments if d.name == deployment)
        return [p.concurrency for p in self.client.point_list if chosen is None or p.concurrency in chosen]


