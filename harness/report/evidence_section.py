"""The report's evidence: which client ran, which conversation-reuse mode, whether HiSparse was really on
(start lines and metric families beside the calculator), and the HiSparse counters per point.

Functions return plain (kind, text) warnings and markdown lines; report/markdown.py places them.
"""

from __future__ import annotations

from harness import vllm_names as names
from harness.evidence import SAMPLING_NOTE, concurrency_mismatch
from harness.loadgen import BLOG_EVALSCOPE, CLIENT_DIFFERENCE, warmed_resends
from harness.records import PointRecord, RunManifest


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _launches(manifest: RunManifest) -> dict:
    launches = manifest.resolved_config.get("launches") if isinstance(manifest.resolved_config, dict) else None
    return launches if isinstance(launches, dict) else {}


def _reproduces_blog(manifest: RunManifest) -> tuple[bool, str | None]:
    """(a GLM-5 arm on vLLM ran, the first reasoning parser an arm set), from the resolved config."""
    blog, parser = False, None
    for launch in _launches(manifest).values():
        serve = launch.get("serve") or {}
        blog = blog or (launch.get("engine", "vllm") == "vllm" and "glm-5" in str(serve.get("model", "")).lower())
        parser = parser or serve.get("reasoning_parser")
    return blog, parser


def client_line(manifest: RunManifest) -> str:
    prov = manifest.provenance
    source = prov.client_source or "harness"
    where = "the harness's own environment" if source == "harness" else f"{source}, from its cached environment"
    return f"Client: EvalScope {prov.evalscope_version or '?'} ({where})."


def reuse_line(manifest: RunManifest) -> str:
    w = manifest.workload
    if w.conversation_reuse == "shared":
        return (f"Conversations: shared by every point, {w.conversations_built} conversations with offsets rotating as "
                "EvalScope does (later points re-send conversations earlier points warmed).")
    return f"Conversations: fresh at every point ({w.conversations_built or '?'} built)."


def reused_points(manifest: RunManifest, points: list[PointRecord]) -> dict[int, int]:
    """Per concurrency, how many conversations it re-sent that an earlier point of its deployment had
    already sent (EvalScope's rotation, docs/facts.md §6); the largest over deployments."""
    built = manifest.workload.conversations_built
    if not built or built <= 0:
        return {}
    by_dep: dict[str, list[PointRecord]] = {}
    for p in points:
        by_dep.setdefault(p.deployment, []).append(p)
    out: dict[int, int] = {}
    for dep_points in by_dep.values():
        order = sorted(dep_points, key=lambda p: p.dataset_offset)
        for concurrency, again in warmed_resends([(p.concurrency, p.dataset_offset, p.conversations) for p in order],
                                              built).items():
            out[concurrency] = max(out.get(concurrency, 0), again)
    return dict(sorted(out.items()))


def client_warnings(manifest: RunManifest) -> list[tuple[str, str]]:
    blog, parser = _reproduces_blog(manifest)
    version = manifest.provenance.evalscope_version
    if not blog or version is None or version == BLOG_EVALSCOPE:
        return []
    return [("client", f"EvalScope {version} ran, not the blog's {BLOG_EVALSCOPE}: {CLIENT_DIFFERENCE}"
             + (f"; the arms ran --reasoning-parser {parser}" if parser else ""))]


def evidence_warnings(manifest: RunManifest) -> list[tuple[str, str]]:
    out = []
    for dep, entry in manifest.deployments.items():
        ev = entry.evidence
        if ev is None:
            continue
        if ev.problem:
            out.append(("HiSparse not active", f"`{dep}`: {ev.problem}"))
        elif (note := concurrency_mismatch(ev)) is not None:
            out.append(("HiSparse concurrency", f"`{dep}`: {note}"))
    return out


def evidence_section(manifest: RunManifest, points: list[PointRecord]) -> list[str]:
    """Per HiSparse arm: what the server showed, the calculator beside it, and the counters per point."""
    deps = {dep: entry.evidence for dep, entry in manifest.deployments.items() if entry.evidence is not None}
    if not deps:
        return ["No arm asked for HiSparse."]
    lines = ["| deployment | active | host pool (start line) | logged max concurrency | calculator at that "
             f"length | `{names.HISPARSE_PREFIX}` families at the first scrape |", "|---|---|---|--:|--:|---|"]
    for dep, ev in deps.items():
        active = {True: "yes", False: "**no**", None: "not checked"}[ev.hisparse_active]
        pool = (f"{ev.host_source_gib:g} GiB, {ev.host_source_blocks:,} blocks" if ev.host_source_gib is not None
                else (f"{ev.host_pool_gib:g} GiB" if ev.host_pool_gib is not None else "-"))
        logged = (f"{ev.logged_max_concurrency:g} at {ev.logged_concurrency_tokens:,} tokens"
                  if ev.logged_max_concurrency is not None else "-")
        predicted = "-" if ev.predicted_concurrency is None else str(ev.predicted_concurrency)
        families = ", ".join(f"`{f.removeprefix(names.HISPARSE_PREFIX)}`" for f in ev.metric_families) or "none"
        lines.append(f"| {dep} | {active} | {pool} | {logged} | {predicted} | {families} |")
    rows = [p for p in points if p.deployment in deps and p.metrics is not None]
    if rows:
        lines += ["", f"Per point ({SAMPLING_NOTE}):", "",
                  "| deployment | c | hit rate | misses | host-to-device bytes | H2D (B/s) | host pool max |",
                  "|---|--:|--:|--:|--:|--:|--:|"]
        for p in rows:
            m = p.metrics
            usage = "-" if m.hisparse_host_usage_max is None else f"{m.hisparse_host_usage_max:.0%}"
            lines.append(f"| {p.deployment} | {p.concurrency} | {_num(m.hisparse_hit_rate, 3)} "
                         f"| {_num(m.hisparse_misses, 0)} | {_num(m.hisparse_h2d_bytes, 0)} "
                         f"| {_num(m.hisparse_h2d_bytes_per_s, 0)} | {usage} |")
    return lines
