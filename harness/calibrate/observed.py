"""A measured run folder as calibration data: the sweep it ran (from the manifest's resolved config), and per
point what the engine measured (server histograms and counters in scrapes.jsonl, the derived metrics) and
what the client saw (EvalScope's summary and its per-request records in benchmark_data.db).

The engine's own quantities are the ones to fit: on the 2-core CPU rig the API server delivers streams in
bursts, so EvalScope's TPOT is unreliable there while the server's histograms are right (docs/tpot.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from harness import vllm_names as names
from harness.config import LaunchProfile, LoadedLaunch, LoadedSweep, PointSpec, SweepFile, load_recipe
from harness.errors import HarnessError
from harness.metrics.derive import group_scrapes, histogram_mean
from harness.metrics.evalscope_requests import read_request_rows
from harness.metrics.scrape import read_scrapes
from harness.records import PointRecord, RunManifest
from harness.results import RunPaths, iter_points, read_manifest

PREFILL_HISTOGRAM = names.PREFILL_TIME


@dataclass(frozen=True)
class ClientRecords:
    """EvalScope's per-request records of one point (benchmark_data.db)."""

    requests: int
    mean_prompt_tokens: float
    completion_tokens: tuple[int, ...]
    bursts: int                # replies that arrived in one piece: the client TPOT of those is meaningless
    mean_client_tpot_ms: float | None


@dataclass(frozen=True)
class ObservedPoint:
    name: str                  # "<deployment>:c<concurrency>"
    record: PointRecord
    prefill_ms: float | None   # the server's prefill-time histogram mean over the point's window
    client: ClientRecords | None
    # requests in the server's histograms over the window that were not the point's: the correctness probe
    # asks its prompts during a deployment's highest point (docs/correctness.md)
    other_requests: int = 0

    @property
    def tpot_from_client(self) -> bool:
        """The point's TPOT is the client's: the server's histogram also holds the probe's requests (short,
        queued, on a pressured arm preempted: they raised the server's mean by 4-40% at c8), and the client
        saw every reply stream (no reply in one burst), where its per-request TPOT is the engine's own
        within 1.5% (docs/tpot.md, "With a quiet engine")."""
        return bool(self.other_requests) and self.client is not None and self.client.bursts == 0 \
            and self.client.mean_client_tpot_ms is not None

    @property
    def tpot_ms(self) -> float | None:
        if self.tpot_from_client:
            assert self.client is not None
            return self.client.mean_client_tpot_ms
        return self.record.metrics.server_tpot_ms if self.record.metrics else None

    @property
    def total_tok_s(self) -> float | None:
        return self.record.summary.total_throughput_tok_s if self.record.summary else None

    def value(self, quantity: str) -> float | None:
        if quantity in ("tpot_ms", "prefill_ms", "total_tok_s"):
            return getattr(self, quantity)
        metrics = self.record.metrics
        return getattr(metrics, quantity) if metrics is not None else None


@dataclass(frozen=True)
class ObservedRun:
    run_dir: Path
    manifest: RunManifest
    loaded: LoadedSweep  # the sweep as the run resolved it
    points: dict[str, ObservedPoint] = field(default_factory=dict)

    def point_spec(self, name: str) -> tuple[str, PointSpec, int]:
        """(deployment, spec, dataset offset) of a point, as the sweep ran it."""
        record = self.points[name].record
        return record.deployment, PointSpec(concurrency=record.concurrency, conversations=record.conversations), record.dataset_offset


def point_name(deployment: str, concurrency: int) -> str:
    return f"{deployment}:c{concurrency}"


def parse_point_names(text: str, run: ObservedRun) -> list[str]:
    """`dep:c1,dep:4` -> point names of the run; one clear error for a point it does not hold."""
    names = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        dep, _, conc = part.rpartition(":")
        name = point_name(dep, int(conc.lstrip("cp"))) if conc.lstrip("cp").isdigit() and dep else part
        if name not in run.points:
            raise HarnessError(f"--points {part}: the run has no ok point {name} "
                               f"(it has: {', '.join(run.points)})")
        names.append(name)
    return names


def _loaded_sweep(run_dir: Path, manifest: RunManifest) -> LoadedSweep:
    """The sweep as the run resolved it (paths absolute), not as the files read today."""
    resolved = manifest.resolved_config
    try:
        sweep = SweepFile.model_validate(resolved["sweep"])
        paths = {dep.name: dep.launch for dep in sweep.deployments}
        launches = {name: LoadedLaunch(path=paths.get(name, Path(manifest.sweep_path)),
                                       profile=LaunchProfile.model_validate(data), files=())
                    for name, data in resolved["launches"].items()}
    except (KeyError, TypeError, ValidationError) as exc:
        raise HarnessError(f"{run_dir}/manifest.json: resolved_config does not hold the sweep and its launch "
                           f"profiles: {str(exc).splitlines()[0]}") from None
    recipe = load_recipe(sweep.dataset)
    return LoadedSweep(path=Path(manifest.sweep_path), sweep=sweep, recipe=recipe, launches=launches)


def read_client_records(db: Path) -> ClientRecords | None:
    """Per-request tokens and timings of the requests that succeeded (metrics/evalscope_requests.py reads
    the database); None when there is none."""
    found = read_request_rows(db)
    rows = [r for r in found[0] if r.ok] if found is not None else []
    if not rows:
        return None
    tpots = [1000.0 * r.tpot_s for r in rows if r.tpot_s is not None]
    return ClientRecords(
        requests=len(rows), mean_prompt_tokens=sum(r.prompt_tokens or 0 for r in rows) / len(rows),
        completion_tokens=tuple(int(r.completion_tokens or 0) for r in rows), bursts=sum(1 for r in rows if r.burst),
        mean_client_tpot_ms=sum(tpots) / len(tpots) if tpots else None)


def _probe_requests(manifest: RunManifest, record: PointRecord) -> int:
    """The correctness probe's requests sent during this point (its pressured half), 0 if none."""
    deployment = manifest.deployments.get(record.deployment)
    probe = getattr(deployment, "correctness", None) if deployment is not None else None
    if probe is None or probe.pressured_concurrency != record.concurrency:
        return 0
    return len(probe.pressured)


def _observe(paths: RunPaths, record: PointRecord, manifest: RunManifest) -> ObservedPoint:
    window = None
    if record.started_unix_s is not None and record.ended_unix_s is not None:
        window = (record.started_unix_s, record.ended_unix_s)
    snapshots = group_scrapes(read_scrapes(paths.scrapes_jsonl(record.deployment, record.concurrency)), window).snapshots
    prefill_s, _ = histogram_mean(snapshots, PREFILL_HISTOGRAM)
    client = None
    if record.evalscope_output_dir:
        dbs = sorted(Path(record.evalscope_output_dir).rglob("benchmark_data.db"))
        if not dbs:  # the folder as recorded may be relative to the run folder
            dbs = sorted(paths.point_dir(record.deployment, record.concurrency).rglob("benchmark_data.db"))
        client = read_client_records(dbs[-1]) if dbs else None
    return ObservedPoint(name=point_name(record.deployment, record.concurrency), record=record,
                         prefill_ms=None if prefill_s is None else 1000.0 * prefill_s, client=client,
                         other_requests=_probe_requests(manifest, record))


def read_run(run_dir: Path) -> ObservedRun:
    """A measured run's ok points; a simulated run is refused (calibrating the simulator on itself)."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    points = iter_points(run_dir)
    if manifest.simulated or any(p.simulated for p in points):
        raise HarnessError(f"{run_dir}: a simulated run (harness simulate); calibrate needs a run measured on a "
                           "real engine")
    paths = RunPaths(run_dir)
    observed = {point_name(p.deployment, p.concurrency): _observe(paths, p, manifest) for p in points
                if p.status == "ok"}
    if not observed:
        raise HarnessError(f"{run_dir}: no ok point to calibrate from")
    return ObservedRun(run_dir=run_dir, manifest=manifest, loaded=_loaded_sweep(run_dir, manifest), points=observed)
