"""`harness capacity SWEEP`: for every (arm, context), the largest concurrency at which every request stays
running, measured, beside what the engine logs and what the calculator predicts.

A search is a ramp (start, 2x, 4x, ... up to `search.max_concurrency`) and then a bisection between the
last concurrency that passed and the first that failed, each step a short probe: `c` conversations at
concurrency `c`, fresh ones each probe. A probe passes when the point ran, nothing was preempted and the
running gauge reached `running_fraction x c` (every request admitted at once: none waiting for KV), or, where
no scrape caught them together, the engine's requests per step (from its counters) rounds to it. Probes
already in the run folder are reused, not run again (a resumed search goes on where it stopped). A server
that refuses the context's max_model_len records the arm as `does not fit`, with vLLM's reason and its
estimate of the longest length that would fit; the search moves on. With an `slo:`, the probe that met it
with the most total tok/s per GPU is kept too.

Results go to capacity.json in the run folder (`CapacityReport`), and the report and figures read it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from harness import provenance
from harness.calc import sizing_for_launch
from harness.config import LoadedSweep, PointSpec
from harness.config.sweep import SearchSettings
from harness.errors import HarnessError
from harness.evidence import parse_does_not_fit, parse_kv_capacity, parse_start_lines
from harness.io import atomic_write_json, iso_from_unix
from harness.loadgen import client_argv_template
from harness.plan import DeploymentPlan, Plan, PointPlan, conversation_tokens, make_plan
from harness.point import does_not_fit_record
from harness.records import PointRecord, Record
from harness.results import RunPaths, RunRecorder, new_run_id, read_point, run_dir_for
from harness.runner import SweepOptions, SweepOutcome, open_recorder, run_sweep
from harness.servers.base import read_log_head, read_log_tail
from harness.sim.capacity import hisparse_start_lines, kv_capacity, refusal
from harness.sim.engine import Engine
from harness.sim.engine_config import engine_config, stable_seed
from harness.sim.virtual import shapes_from_recipe
from harness.simulate import SIMULATED_NOTE, SimulateOptions, SimulateOutcome, simulate_point

Progress = Callable[[str], None]
CAPACITY_JSON = "capacity.json"
CAPACITY_SCHEMA = 1
# the dataset a search draws its probes' fresh conversations from: this many times the largest concurrency
PROBE_CONVERSATIONS_FACTOR = 3


class ProbeRecord(Record):
    concurrency: int
    passed: bool
    why: str  # what decided it, in words
    preemptions: float | None = None
    max_running: float | None = None
    decode_batch_mean: float | None = None
    total_tok_s_per_gpu: float | None = None
    slo_met: bool | None = None


CapacityStatus = Literal["measured", "not_bracketed", "does_not_fit", "failed"]


class CapacityRecord(Record):
    """One (arm, context): what the search measured, what the engine logged, what the calculator says."""

    deployment: str
    arm: str
    context_tokens: int | None = None
    max_model_len: int | None = None
    status: CapacityStatus
    capacity: int | None = None  # the largest concurrency that passed (0: none did)
    first_failing: int | None = None  # the smallest that failed (None: not bracketed)
    probes: list[ProbeRecord] = []
    logged_max_concurrency: float | None = None  # vLLM: Maximum concurrency for N tokens per request
    logged_tokens_per_request: int | None = None
    logged_hisparse_concurrency: float | None = None  # HiSparse's steady-state maximum concurrency line
    calculator_estimate: int | None = None  # the blog's calculator, same deployment and length
    calculator_baseline: int | None = None  # the calculator's plain GPU-resident figure
    does_not_fit_reason: str | None = None  # vLLM's own message
    estimated_max_len: int | None = None  # vLLM's estimate of the longest max_model_len that fits
    best_slo_concurrency: int | None = None  # the probe that met the SLO with the most total tok/s per GPU
    best_slo_tok_s_per_gpu: float | None = None
    reason: str | None = None  # why a search failed or did not bracket

    @property
    def logged_bound(self) -> float | None:
        """The engine's own bound: HiSparse's steady-state line where it logs one, else the KV line."""
        return self.logged_hisparse_concurrency if self.logged_hisparse_concurrency is not None \
            else self.logged_max_concurrency


class CapacityReport(Record):
    schema_version: int = CAPACITY_SCHEMA
    sweep_name: str
    simulated: bool = False
    virtual_time: bool = False
    results: list[CapacityRecord] = []


def _write_capacity(run_dir: Path, report: CapacityReport) -> Path:
    path = Path(run_dir) / CAPACITY_JSON
    atomic_write_json(path, report)
    return path


def read_capacity(run_dir: Path) -> CapacityReport | None:
    path = Path(run_dir) / CAPACITY_JSON
    if not path.is_file():
        return None
    try:
        return CapacityReport.model_validate_json(path.read_bytes())
    except ValueError as exc:
        raise HarnessError(f"{path}: unreadable capacity results: {str(exc).splitlines()[0]}") from None


# ---- the search ---------------------------------------------------------------------------------------

def probe_verdict(record: PointRecord, concurrency: int, running_fraction: float) -> ProbeRecord:
    """Did every request stay running? No preemption, and the running gauge reached the concurrency."""
    m = record.metrics
    base = ProbeRecord(concurrency=concurrency, passed=False, why="",
                       preemptions=m.preemptions if m else None, max_running=m.max_running if m else None,
                       decode_batch_mean=m.decode_batch_mean if m else None,
                       total_tok_s_per_gpu=m.total_tok_s_per_gpu if m else None,
                       slo_met=getattr(m, "slo_met", None) if m else None)
    if record.status == "does_not_fit":
        return base.model_copy(update={"why": "does not fit"})
    if record.status != "ok":
        return base.model_copy(update={"why": f"{record.status}: {record.reason}"})
    if m is not None and m.preemptions:
        return base.model_copy(update={"why": f"{m.preemptions:.0f} preemption(s)"})
    need = math.ceil(running_fraction * concurrency)
    if m is None or (m.max_running is None and m.decode_batch_mean is None):
        return base.model_copy(update={"why": "neither the running gauge nor the engine's step counters were read"})
    if m.max_running is not None and m.max_running >= need:
        return base.model_copy(update={"passed": True, "why": f"{m.max_running:.0f} running, no preemption"})
    # The gauge is sampled; on a busy frontend every scrape can land between bursts and miss requests that ran
    # together. The engine's requests per step come from counters (docs/metrics.md, "Occupancy two ways"):
    # requests decoding side by side for the whole probe give c per step, one after another give 1.
    if m.decode_batch_mean is not None and round(m.decode_batch_mean) >= need:
        return base.model_copy(update={"passed": True, "why": f"{m.decode_batch_mean:.2f} requests per engine step "
                                       f"(the gauge saw {_count(m.max_running)}), no preemption"})
    return base.model_copy(update={"why": f"at most {_count(m.max_running)} of {concurrency} running together "
                                   f"({_count(m.decode_batch_mean, 2)} requests per engine step)"})


def _count(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


@dataclass
class Bracket:
    """The search's state: the ramp until a probe fails, then bisection; pure, so it is tested alone."""

    start: int
    maximum: int
    passed: int | None = None  # largest concurrency that passed
    failed: int | None = None  # smallest that failed
    tried: dict[int, bool] = field(default_factory=dict)

    def record(self, concurrency: int, passed: bool) -> None:
        self.tried[concurrency] = passed
        if passed and (self.passed is None or concurrency > self.passed):
            self.passed = concurrency
        if not passed and (self.failed is None or concurrency < self.failed):
            self.failed = concurrency

    def next(self) -> int | None:
        """The next concurrency to probe; None when the capacity is found (or cannot be bracketed)."""
        if self.failed is None:  # ramp
            if self.passed is None:
                return self.start
            if self.passed >= self.maximum:
                return None
            return min(self.passed * 2, self.maximum)
        low = self.passed or 0
        if self.failed - low <= 1:
            return None
        return (low + self.failed) // 2

    @property
    def bracketed(self) -> bool:
        return self.failed is not None


class CapacitySearch:
    """A deployment's point source for the runner (harness/runner.py PointSource): each probe decided from
    the last one's record; probes already in the run folder are reused."""

    def __init__(self, plan: Plan, dep: DeploymentPlan, settings: SearchSettings, recorder: RunRecorder,
                 progress: Progress | None = None):
        self.plan, self.dep, self.settings, self.paths = plan, dep, settings, recorder.paths
        self.progress = progress
        self.bracket = Bracket(settings.start_concurrency, settings.max_concurrency)
        self.probes: dict[int, ProbeRecord] = {}
        self.records: dict[int, PointRecord] = {}
        self.does_not_fit: PointRecord | None = None
        self.failure: str | None = None
        self._offset = plan.config.client.dataset_offset

    def _judge(self, record: PointRecord) -> None:
        probe = probe_verdict(record, record.concurrency, self.settings.running_fraction)
        self.probes[record.concurrency] = probe
        self.records[record.concurrency] = record
        if self.progress is not None and record.status != "does_not_fit":
            self.progress(f"capacity: {self.dep.name} c{record.concurrency}: {'pass' if probe.passed else 'fail'} "
                          f"({probe.why})")
        if record.status == "does_not_fit":
            self.does_not_fit = record
        elif record.status == "failed":
            self.failure = f"c{record.concurrency} failed: {record.reason}"
        self.bracket.record(record.concurrency, probe.passed)

    def next(self, last: PointRecord | None) -> PointPlan | None:
        if last is not None:
            self._judge(last)
        while self.does_not_fit is None and self.failure is None:
            concurrency = self.bracket.next()
            if concurrency is None:
                return None
            earlier = read_point(self.paths.point_json(self.dep.name, concurrency))
            if earlier is not None and earlier.status in ("ok", "degraded", "does_not_fit"):
                self._judge(earlier)  # measured by an earlier run of this search: reused
                continue
            return self._point(concurrency)
        return None

    def remaining(self) -> list[PointPlan]:
        return []

    def _point(self, concurrency: int) -> PointPlan:
        client = self.plan.config.client
        offset, self._offset = self._offset, self._offset + concurrency
        served = client.model or self.dep.served_model_name
        argv = client_argv_template(self.plan.client, client, model=served, concurrency=concurrency,
                                    conversations=concurrency, dataset_offset=offset,
                                    name=f"{self.dep.name}-c{concurrency}", api_key=self.dep.api_key)
        return PointPlan(self.dep.name, concurrency, concurrency, offset, client_argv=tuple(argv))


# ---- what the engine logged and the calculator predicts -------------------------------------------------

def _calculator(dep: DeploymentPlan, plan: Plan) -> tuple[int | None, int | None]:
    profile = dep.profile
    if profile.engine != "vllm" or "glm-5" not in profile.serve.model.lower():
        return None, None
    recipe = dep.recipe.recipe if dep.recipe is not None else plan.loaded.dataset_recipe
    try:
        result = sizing_for_launch(profile, profile.serve.max_model_len
                                   or conversation_tokens(recipe, plan.config.client.max_tokens))
    except HarnessError:
        return None, None
    return result.predicted_total, result.baseline_total


def _capacity_record(plan: Plan, dep: DeploymentPlan, search: CapacitySearch, log_lines: list[str]) -> CapacityRecord:
    """The search's outcome beside the engine's logged bounds (from its start-up log) and the calculator."""
    logged = parse_kv_capacity(log_lines)
    hisparse = parse_start_lines(log_lines)
    estimate, baseline = _calculator(dep, plan)
    refused = parse_does_not_fit(log_lines) or (
        parse_does_not_fit([search.does_not_fit.reason or ""]) if search.does_not_fit is not None else None)
    record = CapacityRecord(
        deployment=dep.name, arm=dep.arm or dep.name, context_tokens=dep.context_tokens,
        max_model_len=dep.profile.serve.max_model_len, status="measured",
        probes=[search.probes[c] for c in sorted(search.probes)],
        logged_max_concurrency=logged.max_concurrency if logged else None,
        logged_tokens_per_request=logged.tokens_per_request if logged else None,
        logged_hisparse_concurrency=hisparse.logged_max_concurrency, calculator_estimate=estimate,
        calculator_baseline=baseline)
    # a server that refused at start-up never gave the search a record to judge: its log says so
    if search.does_not_fit is not None or (refused is not None and not search.probes):
        return record.model_copy(update={
            "status": "does_not_fit",
            "does_not_fit_reason": refused.reason if refused else search.does_not_fit.reason,  # type: ignore[union-attr]
            "estimated_max_len": refused.estimated_max_len if refused else None})
    best = max((p for p in search.probes.values() if p.slo_met and p.total_tok_s_per_gpu is not None),
               key=lambda p: p.total_tok_s_per_gpu or 0.0, default=None)
    update: dict = {"capacity": search.bracket.passed if search.bracket.passed is not None else
                    (0 if search.bracket.failed is not None else None),
                    "first_failing": search.bracket.failed,
                    "best_slo_concurrency": best.concurrency if best else None,
                    "best_slo_tok_s_per_gpu": best.total_tok_s_per_gpu if best else None}
    if search.failure is not None:
        update |= {"status": "failed", "reason": search.failure}
    elif not search.bracket.bracketed:
        update |= {"status": "not_bracketed",
                   "reason": f"every probe up to c{search.settings.max_concurrency} passed: raise "
                             "search.max_concurrency to bracket it"}
    return record.model_copy(update=update)


def _for_search(loaded: LoadedSweep) -> LoadedSweep:
    """The sweep as a search runs it: its dataset holds enough fresh conversations for every probe (a probe
    conversation sends `search.probe_turns` turns where the sweep says so: harness/plan.py)."""
    sweep = loaded.sweep
    if sweep.search is None:
        raise HarnessError(f"{loaded.path}: `harness capacity` needs a `search:` section (and usually "
                           "`contexts:`) in the sweep file")
    top = sweep.search.max_concurrency
    client = sweep.client.model_copy(update={"points": [PointSpec(concurrency=top,
                                                                  conversations=PROBE_CONVERSATIONS_FACTOR * top)],
                                             "concurrency": None, "conversations": None})
    return replace(loaded, sweep=sweep.model_copy(update={"client": client}))


def _server_log_lines(paths: RunPaths, deployment: str) -> list[str]:
    """The start-up of the deployment's server (its logged bounds) and the end of its log (a refusal)."""
    path = paths.server_log(deployment)
    return read_log_head(path) + read_log_tail(path, 400)


# ---- a whole capacity run -------------------------------------------------------------------------------

@dataclass
class CapacityOutcome:
    run_dir: Path
    report: CapacityReport
    sweep: SweepOutcome | SimulateOutcome  # the runner's or the simulator's: counts, status


def run_capacity(loaded: LoadedSweep, options: SweepOptions, progress: Progress = print) -> CapacityOutcome:
    """Every (arm, context)'s search, on real servers (one start each, kept up across its probes)."""
    searched = _for_search(loaded)
    settings = searched.sweep.search
    assert settings is not None
    searches: dict[str, CapacitySearch] = {}
    plans: list[Plan] = []

    def source(plan: Plan, dep: DeploymentPlan, recorder: RunRecorder) -> CapacitySearch:
        plans[:] = [plan]
        searches[dep.name] = CapacitySearch(plan, dep, settings, recorder, progress)
        return searches[dep.name]

    outcome = run_sweep(searched, options, progress, sources=source)
    paths = RunPaths(outcome.run_dir)
    results = [_capacity_record(plans[0], dep, searches[dep.name], _server_log_lines(paths, dep.name))
               for dep in plans[0].deployments if dep.name in searches] if plans else []
    report = CapacityReport(sweep_name=loaded.sweep.name, simulated=plans[0].simulated if plans else False,
                            results=results)
    _write_capacity(outcome.run_dir, report)
    for line in capacity_lines(report):
        progress(line)
    return CapacityOutcome(outcome.run_dir, report, outcome)


def capacity_lines(report: CapacityReport) -> list[str]:
    """One line per (arm, context): measured capacity, logged bound, calculator estimate (and, with an SLO, the
    probe that met it with the most throughput, whether or not it held every request running)."""
    out = []
    for r in report.results:
        where = f"{r.arm}" + (f" at {r.context_tokens:,} tokens" if r.context_tokens else "")
        if r.status == "does_not_fit":
            out.append(f"{where}: does not fit ({r.does_not_fit_reason or 'refused at start-up'})")
            continue
        logged = "-" if r.logged_bound is None else f"{r.logged_bound:.2f}"
        calc = "-" if r.calculator_estimate is None else str(r.calculator_estimate)
        state = {"measured": "", "not_bracketed": " (not bracketed)", "failed": f" (failed: {r.reason})"}[r.status]
        slo = ("" if r.best_slo_concurrency is None else
               f"; best under the SLO c{r.best_slo_concurrency} at {r.best_slo_tok_s_per_gpu:,.0f} tok/s/GPU")
        out.append(f"{where}: capacity {r.capacity if r.capacity is not None else '-'}{state}, logged bound "
                   f"{logged}, calculator {calc}{slo}")
    return out


# ---- the same search in virtual time (the simulated engine, no servers, no EvalScope) -------------------


def simulate_capacity(loaded: LoadedSweep, options: SimulateOptions, progress: Progress = print) -> CapacityOutcome:
    """Every (arm, context)'s search on the simulated engine in virtual time: the engine refuses a context it
    cannot fit at start-up as vLLM does, logs its bounds, and each probe is a point `harness simulate` would
    run (fresh conversations each)."""
    searched = _for_search(loaded)
    settings = searched.sweep.search
    assert settings is not None
    plan = make_plan(searched)
    base_unix = options.start_unix_s if options.start_unix_s is not None else time.time()
    run_id = options.run_id or new_run_id(loaded.sweep.name, simulated=True)
    recorder = open_recorder(plan, run_dir_for(options.results_root, run_id), simulated=True,
                             engine_label="sim (virtual time)", started_at=iso_from_unix(base_unix),
                             planned_points=False)
    recorder.record_provenance(provenance.collect(searched, None, None, simulated=SIMULATED_NOTE))
    recorder.update_workload(source="recipe shape (virtual time, no text)")
    wall_start = time.monotonic()
    counts = {"ok": 0, "failed": 0, "does_not_fit": 0}
    failures: list[str] = []
    results = []
    now = 0.0
    for dep in plan.deployments:
        config = engine_config(dep.profile, run_seed=stable_seed(run_id, dep.name))
        refused = refusal(config)  # as vLLM, a refused engine logs no KV cache line
        lines = [] if refused else [kv_capacity(config).line(config.max_model_len), *hisparse_start_lines(config)]
        recorder.update_deployment(dep.name, policy=config.policy)
        search = CapacitySearch(plan, dep, settings, recorder, progress)
        point = search.next(None)
        if refused is not None and point is not None:
            lines.append(f"ValueError: {refused}")
            record = does_not_fit_record(plan, point, refused, [f"ValueError: {refused}"])
            recorder.record_point(record)
            counts["does_not_fit"] += 1
            progress(f"{dep.name}: does not fit: {refused[:160]}")
            search.next(record)
            point = None
        shapes_needed = plan.dataset.build_conversations
        while point is not None:
            shapes = shapes_from_recipe((dep.recipe or plan.loaded.recipe).recipe, shapes_needed)
            record, scrapes, run = simulate_point(plan, dep, point, Engine(config), shapes, base_unix, now)
            recorder.write_scrapes(dep.name, point.concurrency, scrapes)
            recorder.record_point(record)
            now = run.end_s + 5.0
            if record.status == "ok":
                counts["ok"] += 1
            else:
                counts["failed"] += 1
                failures.append(f"{dep.name} c{point.concurrency}: {record.reason}")
            point = search.next(record)
        results.append(_capacity_record(plan, dep, search, lines))
    status = recorder.finish(ended_at=iso_from_unix(base_unix + now))
    outcome = SimulateOutcome(run_dir=recorder.paths.root, points=sum(counts.values()),
                              wall_s=time.monotonic() - wall_start, simulated_s=now, status=status,
                              failures=failures, **counts)
    report = CapacityReport(sweep_name=loaded.sweep.name, simulated=True, virtual_time=True, results=results)
    _write_capacity(recorder.paths.root, report)
    return CapacityOutcome(recorder.paths.root, report, outcome)
