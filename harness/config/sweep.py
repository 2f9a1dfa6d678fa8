"""The sweep file: the dataset, the client points and the deployments to run them against."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

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


class DeploymentSpec(StrictModel):
    name: Slug
    launch: RelPath

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


