"""Compare a run against a reference (another run folder or a reference JSON) point by point: the one judge
(harness/judge.py) with one reference, so `compare` and the nightly gate find the same regressions.

The rules are the run's own sweep's `nightly: thresholds:` (the catalogue's defaults where it has none), or
one `--tolerance` for every ratio rule. A regression is a gated metric beyond its rule, a point that failed
or is degraded, HiSparse asked for and not on, or a point or deployment of the reference missing from the
run. Runs that are not the same experiment (hardware, engine, workload) are refused, not compared.

Runs whose deployments ran different builds (another bundled kernel source hash, kernels: vllm
against bundled, another vLLM) are compared, since measuring that difference is what a kernel A/B
is for, but never as "the same build": the differences are named, one per line, at the top of
the table, and `Comparison.build_differences` lists them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.catalogue import Metric, table_metrics
from harness.config.nightly import GATEABLE_METRICS, AnswerThresholds, GateThresholds, MetricRule
from harness.errors import HarnessError
from harness.io import atomic_write_json
from harness.judge import Experiment, Finding, Measurement, PointResult, judge
from harness.records import AnswerScores, RunManifest, WorkloadRecord, answer_scores
from harness.results import read_manifest
from harness.summary import load_runs

REFERENCE_FORMAT = "harness-reference/1"


class ComparisonRefused(HarnessError):
    """The two sides are not the same experiment: different hardware or workload."""


# The columns of the comparison table: the catalogue's table metrics (harness/catalogue.py).
METRICS: tuple[Metric, ...] = table_metrics()


@dataclass(frozen=True)
class RefPoint:
    status: str
    conversations: int | None
    values: dict[str, float | None]
    reason: str | None = None
    failed_requests: int | None = None
    total_requests: int | None = None


@dataclass(frozen=True)
class Reference:
    """One side of a comparison: hardware and workload identity, and metrics by (deployment, concurrency)."""

    source: str
    run_id: str
    gpu_model: str | None
    gpus_per_server: int
    simulated: bool
    workload: dict[str, Any]
    points: dict[tuple[str, int], RefPoint]
    builds: dict[str, dict[str, str | None]] = field(default_factory=dict)  # deployment -> build identity
    hisparse: dict[str, tuple[bool | None, bool | None]] = field(default_factory=dict)  # dep -> (asked, on)
    thresholds: GateThresholds | None = None  # type: ignore[valid-type]  # the run's own sweep's; None: defaults
    answers: dict[str, AnswerScores] = field(default_factory=dict)  # dep -> its correctness probe's scores
    answer_limits: AnswerThresholds | None = None  # the run's own sweep's; None: defaults

    @property
    def experiment(self) -> Experiment:
        return Experiment(gpu_model=self.gpu_model, gpus_per_server=self.gpus_per_server, simulated=self.simulated,
                          workload=self.workload)

    def measurement(self) -> Measurement:
        points = {key: PointResult(status=p.status, reason=p.reason, failed_requests=p.failed_requests,
                                   total_requests=p.total_requests, conversations=p.conversations, values=p.values)
                  for key, p in self.points.items()}
        return Measurement(self.run_id, self.experiment, points, self.hisparse, self.answers)

    def to_json(self) -> dict[str, Any]:
        deployments: dict[str, dict[str, Any]] = {}
        for (dep, concurrency), point in sorted(self.points.items()):
            values = {k: v for k, v in point.values.items() if v is not None}
            deployments.setdefault(dep, {})[str(concurrency)] = {
                "status": point.status, "conversations": point.conversations, **values,
                **({"reason": point.reason} if point.reason else {})}
        return {"format": REFERENCE_FORMAT, "run_id": self.run_id,
                "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "hardware": {"gpu_model": self.gpu_model, "gpus_per_server": self.gpus_per_server,
                             "simulated": self.simulated},
                "workload": self.workload, "deployments": deployments, "builds": self.builds}


def _int(value: object) -> int | None:
    number = _float(value)
    return None if number is None else int(number)


def _float(value: object) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


# What makes two deployments' servers the same build, as the manifest's build records say.
BUILD_FIELDS = ("kernels", "kernel_sha256", "kernel_version", "kernel_built_for", "kernel_cuda_arch",
                "vllm_version", "vllm_commit", "torch_version")


def build_identity(manifest: RunManifest) -> dict[str, dict[str, str | None]]:
    out = {}
    for name, dep in manifest.deployments.items():
        build = dep.build
        if build is None:  # the simulated engine, or a server that never started
            continue
        kernel = build.kernel
        out[name] = {"kernels": build.kernels, "kernel_sha256": kernel.source_sha256 if kernel else None,
                     "kernel_version": kernel.version if kernel else None,
                     "kernel_built_for": kernel.built_for if kernel else None,
                     "kernel_cuda_arch": kernel.cuda_arch if kernel else None,
                     "vllm_version": build.vllm_version, "vllm_commit": build.vllm_commit,
                     "torch_version": build.torch_version}
    return out


def build_differences(run: Reference, ref: Reference) -> list[str]:
    """One line per field in which a deployment's build differs between the two sides."""
    lines = []
    for dep in sorted(set(run.builds) & set(ref.builds)):
        ours, theirs = run.builds[dep], ref.builds[dep]
        for key in BUILD_FIELDS:
            old, new = theirs.get(key), ours.get(key)
            if old != new:
                lines.append(f"{dep}: {key} {_short(old)} (reference) vs {_short(new)} (this run)")
    return lines


def _short(value: str | None) -> str:
    return "-" if value is None else value


def _reference_from_run(run_dir: Path) -> Reference:

    manifest = read_manifest(run_dir)
    df = load_runs([run_dir])
    points: dict[tuple[str, int], RefPoint] = {}
    for row in df.to_dict("records"):
        number = row["conversations"]
        points[(str(row["deployment"]), int(row["concurrency"]))] = RefPoint(
            status=str(row["status"]), conversations=None if _float(number) is None else int(number),
            values={name: _float(row[name]) for name in GATEABLE_METRICS},
            reason=None if row["reason"] is None or str(row["reason"]) in ("", "<NA>") else str(row["reason"]),
            failed_requests=_int(row["failed_requests"]), total_requests=_int(row["total_requests"]))
    resolved = manifest.resolved
    hisparse = {}
    for name, dep in manifest.deployments.items():
        asked = dep.evidence.hisparse_requested if dep.evidence is not None else resolved.hisparse_requested(name)
        hisparse[name] = (asked, dep.evidence.hisparse_active if dep.evidence is not None else None)
    nightly = resolved.nightly()
    return Reference(source=str(run_dir), run_id=manifest.run_id, gpu_model=manifest.gpu_model,
                     gpus_per_server=manifest.gpus_per_server, simulated=manifest.simulated,
                     workload=manifest.workload.identity(), points=points, builds=build_identity(manifest),
                     hisparse=hisparse, thresholds=nightly.thresholds if nightly else None,
                     answers=answer_scores(manifest.deployments), answer_limits=nightly.answers if nightly else None)


def _reference_from_json(path: Path) -> Reference:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise HarnessError(f"{path}: cannot read reference: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise HarnessError(f"{path}: not a reference JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or data.get("format") != REFERENCE_FORMAT:
        raise HarnessError(f"{path}: not a reference JSON (expected \"format\": \"{REFERENCE_FORMAT}\"; "
                           "write one with `harness compare RUN --write-reference OUT`)")
    try:
        hardware = data["hardware"]
        points = {}
        for dep, by_parallel in data["deployments"].items():
            for concurrency, entry in by_parallel.items():
                points[(str(dep), int(concurrency))] = RefPoint(
                    status=str(entry.get("status", "ok")),
                    conversations=entry.get("conversations", entry.get("number")),  # "number" before schema 3
                    values={name: _float(entry.get(name)) for name in GATEABLE_METRICS},
                    reason=entry.get("reason"), failed_requests=_int(entry.get("failed_requests")),
                    total_requests=_int(entry.get("total_requests")))
        return Reference(source=str(path), run_id=str(data.get("run_id", Path(path).stem)),
                         gpu_model=hardware.get("gpu_model"), gpus_per_server=int(hardware["gpus_per_server"]),
                         simulated=bool(hardware.get("simulated", False)),
                         workload=WorkloadRecord.model_validate(data.get("workload") or {}).identity(), points=points,
                         builds={str(k): dict(v) for k, v in (data.get("builds") or {}).items()})
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise HarnessError(f"{path}: malformed reference JSON: {type(exc).__name__}: {exc}") from None


def load_reference(ref: Path) -> Reference:
    """A reference JSON file, or a run folder read as one."""
    ref = Path(ref)
    return _reference_from_json(ref) if ref.is_file() else _reference_from_run(ref)


def write_reference(run_dir: Path, out: Path) -> Path:
    """Write the run's metrics, hardware and workload identity as a reference JSON."""
    atomic_write_json(Path(out), _reference_from_run(Path(run_dir)).to_json())
    return Path(out)


@dataclass(frozen=True)
class PointChange:
    deployment: str
    concurrency: int
    status: str
    reference_status: str
    values: dict[str, tuple[float | None, float | None]]  # metric -> (reference, run)
    regressions: list[str]  # metric names, or "status"

    @property
    def name(self) -> str:
        return f"{self.deployment} c{self.concurrency}"


@dataclass
class Comparison:
    run_id: str
    reference_id: str
    rules: str  # how the limits were chosen, for the table's heading
    points: list[PointChange] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    build_differences: list[str] = field(default_factory=list)  # empty: the same build where both record one

    @property
    def regressions(self) -> list[str]:
        """One line per regression, naming the point and the metric: the judge's findings."""
        return [f.detail for f in self.findings]

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0

    def markdown(self) -> str:
        head = ["deployment", "c"] + [m.label or m.name for m in METRICS] + ["verdict"]
        lines = [f"## {self.run_id} against {self.reference_id} ({self.rules})", ""]
        if self.build_differences:
            lines += ["**Not the same build**: these numbers compare different server code:"]
            lines += [f"- {d}" for d in self.build_differences] + [""]
        lines += ["| " + " | ".join(head) + " |", "|---|--:|" + "--:|" * len(METRICS) + "---|"]
        for p in self.points:
            cells = [p.deployment, str(p.concurrency)]
            for m in METRICS:
                cells.append(_cell(m, *p.values[m.name], regressed=m.name in p.regressions))
            if "status" in p.regressions:
                verdict = f"**REGRESSION: {p.status}**"
            elif p.regressions:
                verdict = "**REGRESSION**"
            else:
                verdict = "ok" if p.status == "ok" else p.status
            lines.append("| " + " | ".join(cells) + f" | {verdict} |")
        lines.append("")
        regressions = self.regressions
        lines.append(f"**{len(regressions)} regression(s)**" if regressions else "No regressions.")
        lines += [f"- {r}" for r in regressions]
        if self.notes:
            lines += ["", "Notes:"] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def _cell(metric: Metric, ref: float | None, run: float | None, regressed: bool) -> str:
    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:,.{metric.digits}f}"

    if ref is None and run is None:
        return "-"
    text = f"{fmt(ref)} → {fmt(run)}"
    if ref is not None and run is not None and ref != 0:
        text += f" ({(run - ref) / abs(ref):+.1%})"
    return f"**{text}**" if regressed else text


def _with_tolerance(thresholds: GateThresholds, tolerance: float) -> GateThresholds:  # type: ignore[valid-type]
    """The same gated metrics, every ratio rule at 1 -/+ `tolerance` (absolute rules unchanged)."""
    if not 0 <= tolerance < 1:
        raise HarnessError(f"--tolerance {tolerance}: must be a fraction in [0, 1), e.g. 0.10")
    rules: dict[str, MetricRule | None] = {}
    for name, rule in thresholds.rules():
        if rule.min_ratio is not None:
            rule = MetricRule(min_ratio=1 - tolerance)
        elif rule.max_ratio is not None:
            rule = MetricRule(max_ratio=1 + tolerance)
        rules[name] = rule
    for name in type(thresholds).model_fields:  # a default the run's sweep switched off stays off
        rules.setdefault(name, None)
    return GateThresholds.model_validate(rules)


def compare_runs(run: Path, reference: Path, tolerance: float | None = None) -> Comparison:
    """Each point of `run` against the same (deployment, concurrency) of `reference`, by the judge."""
    current = _reference_from_run(Path(run))
    ref = load_reference(Path(reference))
    problems = current.experiment.differences(ref.experiment)
    if problems:
        raise ComparisonRefused(f"{current.run_id} and {ref.run_id} are not comparable: " + "; ".join(problems))
    thresholds = current.thresholds if current.thresholds is not None else GateThresholds()
    rules = "the sweep's nightly thresholds" if current.thresholds is not None else "the default thresholds"
    if tolerance is not None:
        thresholds, rules = _with_tolerance(thresholds, tolerance), f"tolerance {tolerance:.0%}"
    judged = judge(current.measurement(), [ref.measurement()], thresholds, current.answer_limits)
    comparison = Comparison(current.run_id, ref.run_id, rules, findings=judged.findings,
                            notes=current.experiment.unknown(ref.experiment) + judged.notes,
                            build_differences=build_differences(current, ref))
    flagged: dict[tuple[str, int], list[str]] = {}
    for f in judged.findings:
        if f.concurrency is not None:
            flagged.setdefault((f.deployment, f.concurrency), []).append(
                f.metric if f.reason in ("threshold", "metric_missing") and f.metric else "status")
    for key, point in sorted(current.points.items()):
        base = ref.points.get(key)
        if base is None:
            comparison.notes.append(f"{key[0]} c{key[1]}: not in the reference")
            continue
        if base.conversations is not None and point.conversations is not None and base.conversations != point.conversations:
            comparison.notes.append(f"{key[0]} c{key[1]}: {point.conversations} conversations vs {base.conversations} "
                                    "in the reference")
        values = {m.name: (base.values.get(m.name), point.values.get(m.name)) for m in METRICS}
        comparison.points.append(PointChange(key[0], key[1], point.status, base.status, values,
                                             flagged.get(key, [])))
    return comparison
