"""Synthetic nightly histories for the tests and for trying the dashboard without GPUs.

Nights follow the blog's shape (Hybrid HiSparse keeps admitting where the offload baseline
saturates) with seeded multiplicative noise on every metric; `Change`s put a step or a drift into
chosen metrics from a chosen night on. Nothing here is a measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from harness.nightly.night_record import DeploymentFacts, GpuFacts, NightProvenance, NightRecord, NightRow

HISPARSE = "tp8-hisparse384-native128"
OFFLOAD = "tp8-offload512"
PARALLELS = (1, 16, 32)
SWEEP_SHA256 = "5" * 64
_START = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)
# Noise relative to `noise` per metric: acceptance length and occupancy move far less from night to
# night than throughput and latency do (a server admits what its pool holds; MTP accepts what the
# model predicts).
_NOISE_SCALE = {"mtp_acceptance_length": 0.2, "occupancy_mean_running": 0.3}


@dataclass(frozen=True)
class Change:
    """From night `from_night` (1-based) on, `metric` is multiplied by `factor` and, for a drift,
    moves by `per_night` more every night: night i gets factor * (1 + per_night * (i - from_night + 1))."""

    metric: str
    from_night: int
    factor: float = 1.0
    per_night: float = 0.0
    deployment: str | None = None  # None: every deployment
    concurrency: int | None = None  # None: every point

    def multiplier(self, night: int, deployment: str, concurrency: int) -> float:
        if night < self.from_night or self.deployment not in (None, deployment) \
                or self.concurrency not in (None, concurrency):
            return 1.0
        return self.factor * (1.0 + self.per_night * (night - self.from_night + 1))


def _base(deployment: str, concurrency: int) -> dict[str, float]:
    """Noise-free metrics of one point, the blog's shape."""
    hisparse = deployment == HISPARSE
    running = min(float(concurrency), 22.0 if hisparse else 3.8)
    interactivity = (86.0 if hisparse else 88.0) * (0.4 + 0.6 / (1.0 + 0.04 * running))
    return {"interactivity_tok_s_user": interactivity,
            "total_tok_s_per_gpu": 1000.0 * running * interactivity / 86.0,
            "output_tok_s_per_gpu": 3.0 * running * interactivity / 8.0,
            "mean_ttft_ms": 900.0 + 250.0 * max(0.0, concurrency - running),
            "occupancy_mean_running": running,
            "mtp_acceptance_length": 2.62 if hisparse else 2.58}


def synthetic_night(index: int, *, rng: np.random.Generator, noise: float = 0.03,
                    changes: Sequence[Change] = (), deployments: Sequence[str] = (HISPARSE, OFFLOAD),
                    parallels: Sequence[int] = PARALLELS, gpu_model: str = "H200", gpu_count: int | None = 8,
                    simulated: bool = False, sweep_sha256: str = SWEEP_SHA256, vllm_commit: str = "e8ef1e07bd",
                    failed: Sequence[tuple[str, int]] = (), hisparse_active: bool | None = True) -> NightRecord:
    """Night number `index` (1-based) of a synthetic history."""
    night_id = f"nightly-{(_START + timedelta(days=index - 1)).strftime('%Y%m%dT%H%M%SZ')}"
    started = (_START + timedelta(days=index - 1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows = []
    for dep in deployments:
        for concurrency in parallels:
            values = {}
            for metric, value in _base(dep, concurrency).items():
                for change in changes:
                    if change.metric == metric:
                        value *= change.multiplier(index, dep, concurrency)
                values[metric] = float(value * (1.0 + noise * _NOISE_SCALE.get(metric, 1.0) * rng.standard_normal()))
            is_failed = (dep, concurrency) in failed
            rows.append(NightRow(
                run_id=night_id, deployment=dep, concurrency=concurrency, conversations=max(2, concurrency),
                status="failed" if is_failed else "ok", reason="server died" if is_failed else None,
                simulated=simulated, gpu_model=gpu_model, gpus_per_server=8, total_requests=13 * concurrency,
                success_requests=0 if is_failed else 13 * concurrency, failed_requests=0,
                **({} if is_failed else values)))
    deps = {d: DeploymentFacts(vllm_version="0.33.0", vllm_commit=vllm_commit,
                               hisparse_requested=d == HISPARSE,
                               hisparse_active=hisparse_active if d == HISPARSE else None) for d in deployments}
    return NightRecord(night_id=night_id, started_at=started, sweep_name="glm53-tp8-nightly",
                       sweep_sha256=sweep_sha256, simulated=simulated,
                       gpu=GpuFacts(model=gpu_model, count=gpu_count, driver="580.65"), gpus_per_server=8,
                       provenance=NightProvenance(harness_commit="abc1234", evalscope_version="1.14.1"),
                       deployments=deps, rows=rows)


def synthetic_history(nights: int = 12, *, seed: int = 0, noise: float = 0.03, changes: Sequence[Change] = (),
                      vllm_commits: Sequence[str] | None = None) -> list[NightRecord]:
    """`nights` comparable nights, oldest first; vllm_commits: each night's build (default: one build)."""
    rng = np.random.default_rng(seed)
    if vllm_commits is not None and len(vllm_commits) != nights:
        raise ValueError(f"{len(vllm_commits)} vLLM commits for {nights} nights")
    return [synthetic_night(i, rng=rng, noise=noise, changes=changes,
                            **({} if vllm_commits is None else {"vllm_commit": vllm_commits[i - 1]}))
            for i in range(1, nights + 1)]
