"""The gate's result as markdown: a short summary for $GITHUB_STEP_SUMMARY, and a regression report
shaped to paste as a GitHub issue (title line, what ran, what regressed, the likely cause)."""

from __future__ import annotations

from collections.abc import Sequence

from harness.nightly.changepoint import ChangePoint, grouped
from harness.nightly.gate import Finding, GateResult
from harness.nightly.night_record import NightRecord

_HEADLINE = {"pass": "PASS", "regression": "REGRESSION", "not_comparable": "NOT COMPARABLE"}
_REASONS = {"threshold": "beyond threshold", "metric_missing": "metric missing",
            "deployment_missing": "deployment missing", "point_missing": "point missing",
            "point_failed": "point failed", "point_degraded": "requests failed",
            "hisparse_inactive": "HiSparse not active", "answers_changed": "answers changed under pressure"}


def number(value: float | None) -> str:
    """Four significant digits, thousands separated, never an exponent."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _findings_table(findings: Sequence[Finding]) -> list[str]:
    lines = ["| deployment | c | metric | baseline | tonight | ratio | threshold | reason |",
             "|---|--:|---|--:|--:|--:|---|---|"]
    for f in findings:
        lines.append("| " + " | ".join(_cell(x) for x in (
            f.deployment, "-" if f.concurrency is None else str(f.concurrency), f.metric or "-", number(f.baseline),
            number(f.value), "-" if f.ratio is None else f"{f.ratio:.3f}x", f.threshold or "-",
            _REASONS[f.reason])) + " |")
    return lines


def _causes(result: GateResult) -> list[str]:
    if not result.likely_causes:
        if result.outcome == "regression" and result.last_good_night:
            return [f"No version changed since the last good night {result.last_good_night} "
                    "(vLLM commit, kernels, EvalScope, harness): look at the machine and the data."]
        return []
    return [f"Likely cause (changed since the last good night {result.last_good_night}):"] + \
        [f"- {c.text}" for c in result.likely_causes]


def _change_lines(change_points: Sequence[ChangePoint], *, each: bool = True) -> list[str]:
    """The change points, a line per group of the same change; `each`: every series under its group."""
    if not change_points:
        return []
    lines = ["Change points in the history (step or slow drift; the night named is the first of it):"]
    for group in grouped(change_points):
        lines.append(f"- {group.text}")
        if each and len(group.members) > 1:
            lines += [f"  - {cp.short}" for cp in group.members]
    return lines


def step_summary(result: GateResult, night: NightRecord, change_points: Sequence[ChangePoint] = ()) -> str:
    """A short markdown block for the CI job's summary page."""
    lines = [f"## Nightly gate: {_HEADLINE[result.outcome]} ({night.night_id})", ""]
    base = ", ".join(result.baseline_nights) if result.baseline_nights else "none"
    lines += [f"Baseline: median of {len(result.baseline_nights)} comparable night(s): {base}.", ""]
    if result.findings:
        lines += [f"**{len(result.findings)} finding(s)**", ""] + _findings_table(result.findings) + [""]
    else:
        lines += ["No regression found.", ""]
    for block in (_causes(result), _change_lines(change_points, each=False),
                  (["Notes:"] + [f"- {n}" for n in result.notes]) if result.notes else []):
        if block:
            lines += block + [""]
    return "\n".join(lines).rstrip() + "\n"


def _environment(night: NightRecord) -> list[str]:
    gpu = night.gpu
    hardware = "simulated engine (not GPU measurements)" if night.simulated else \
        f"{gpu.count or '?'}x {gpu.model or 'unknown GPU'}, driver {gpu.driver or '?'}"
    lines = [f"- night: `{night.night_id}` started {night.started_at or '?'}",
             f"- sweep: `{night.sweep_name}` (sha256 `{(night.sweep_sha256 or '?')[:16]}`)",
             f"- hardware: {hardware}",
             f"- harness commit `{night.provenance.harness_commit or '?'}`, EvalScope "
             f"`{night.provenance.evalscope_version or '?'}`"]
    for dep, facts in sorted(night.deployments.items()):
        hisparse = {True: "on", False: "OFF", None: "unknown"}[facts.hisparse_active] \
            if facts.hisparse_requested else "not requested"
        lines.append(f"- `{dep}`: vLLM `{facts.vllm_version or '?'}` commit `{facts.vllm_commit or '?'}`, "
                     f"kernels `{(facts.kernel_hash or '-')[:16]}`, launch profile `{facts.launch_sha256 or '?'}`, "
                     f"HiSparse {hisparse}")
    return lines


def regression_report(result: GateResult, night: NightRecord, change_points: Sequence[ChangePoint] = (),
                      links: Sequence[tuple[str, str]] = ()) -> str:
    """A GitHub issue: the first line is the title, the rest its body. `links`: (text, url) pairs."""
    what = sorted({f.metric or f.reason for f in result.findings})
    title = (f"Nightly {_HEADLINE[result.outcome].lower()}: {night.sweep_name} {night.night_id}"
             + (f": {', '.join(what[:3])}{' ...' if len(what) > 3 else ''}" if what else ""))
    lines = [f"# {title}", "", "## What ran", ""] + _environment(night) + ["", "## What changed", ""]
    if result.findings:
        lines += [f"Against the median of {len(result.baseline_nights)} comparable night(s) "
                  f"({', '.join(result.baseline_nights) or 'none'}):", ""]
        lines += _findings_table(result.findings) + [""]
    else:
        lines += ["No finding against the baseline.", ""]
    for block in (_causes(result), _change_lines(change_points),
                  (["Notes:"] + [f"- {n}" for n in result.notes]) if result.notes else []):
        if block:
            lines += block + [""]
    if links:
        lines += ["## Files", ""] + [f"- [{text}]({url})" for text, url in links] + [""]
    lines += ["## Reproduce", "", "```", f"python -m harness sweep <the sweep file of {night.sweep_name}>",
              f"python -m harness history show {night.night_id} --store <history folder>", "```"]
    return "\n".join(lines).rstrip() + "\n"
