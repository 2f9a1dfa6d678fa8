"""The report's Correctness section: per deployment, the greedy probe's answers alone and under pressure,
their agreement with each other and with the baseline arm's, the share right, and the gate's verdict."""

from __future__ import annotations

from harness.config.nightly import AnswerThresholds
from harness.judge import answer_findings
from harness.records import Answer, AnswerScores, RunManifest, answer_scores

# Changed answers listed per deployment, at most.
SHOWN_CHANGES = 5


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _quoted(text: str, limit: int = 40) -> str:
    one = " ".join(text.split())
    return repr(one if len(one) <= limit else one[:limit - 1] + "…")


def _changes(alone: list[Answer], pressured: list[Answer]) -> list[str]:
    before = {a.id: a for a in alone if a.error is None}
    out = []
    for answer in pressured:
        first = before.get(answer.id)
        if first is None or answer.error is not None:
            continue
        same = (first.generated_ids == answer.generated_ids if first.generated_ids is not None
                and answer.generated_ids is not None else first.text == answer.text)
        if not same:
            out.append(f"`{answer.id}`: {_quoted(first.text)} alone, {_quoted(answer.text)} under pressure")
    return out


def correctness_section(manifest: RunManifest) -> list[str]:
    probed = {name: d for name, d in manifest.deployments.items() if d.correctness is not None}
    if not probed:
        return ["No correctness probe in this run (`correctness: {enabled: false}`, a capacity search, "
                "or a run in virtual time)."]
    scores: dict[str, AnswerScores] = answer_scores(manifest.deployments)
    nightly = manifest.resolved.nightly()
    limits = nightly.answers if nightly is not None else AnswerThresholds()
    findings = answer_findings(scores, limits)
    failing = {f.deployment for f in findings}
    first = next(iter(probed.values())).correctness
    lines = [f"The prompts of `{first.prompts}`, greedy, thinking off: once alone before the first point, "
             "once while the deployment's highest point keeps its server full. Limits: same as alone "
             f">= {_share(limits.agreement_min)}, same as the baseline arm >= "
             f"{_share(limits.baseline_agreement_min)}, right >= {_share(limits.score_min)} "
             "(`nightly: answers:`; '-' is no limit).", "",
             "| deployment | answered | right | under pressure | same as alone | same as baseline | gate |",
             "|---|---:|---:|---|---:|---:|---|"]
    notes: list[str] = []
    for name, dep in probed.items():
        c, s = dep.correctness, scores[name]
        answered = sum(1 for a in c.unpressured + c.pressured if a.error is None)
        asked = len(c.unpressured) + len(c.pressured)
        running = "" if c.pressured_running is None else f", {c.pressured_running:.0f} running"
        pressure = f"c{c.pressured_concurrency}{running}" if c.pressured else "not asked"
        baseline = "baseline" if s.baseline is None and dep.evidence is None else (
            f"{_share(s.agreement_with_baseline)} ({s.baseline})" if s.baseline else "-")
        gate = "**fails**" if name in failing else "passes"
        lines.append(f"| {name} | {answered} of {asked} | {_share(s.score)} | {pressure} | "
                     f"{_share(s.agreement_under_pressure)} | {baseline} | {gate} |")
        if c.note:
            notes.append(f"- {name}: {c.note}")
        changes = _changes(c.unpressured, c.pressured)
        notes += [f"- {name}: {change}" for change in changes[:SHOWN_CHANGES]]
        if len(changes) > SHOWN_CHANGES:
            notes.append(f"- {name}: {len(changes) - SHOWN_CHANGES} more changed answers (manifest.json)")
    lines += [""] + [f"- {f.detail}" for f in findings] + notes
    return lines
