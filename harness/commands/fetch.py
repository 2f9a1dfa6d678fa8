"""`harness fetch LAUNCH|SWEEP`: put the model weights on every node that will run a server, now.

`sweep` does the same before it starts any server; run this ahead of time (hours for 700 GiB) so the
sweep finds them there. Where the weights go and where they come from is read on each node, as the
sweep reads it: $HISPARSE_WEIGHTS_CACHE (default ~/.cache/hisparse-harness/weights), HF_HUB_OFFLINE /
MODELSCOPE_OFFLINE, and $HISPARSE_WEIGHTS_SEED (a weights cache root to copy from, e.g. on a shared
filesystem, for nodes without hub access).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from harness.commands import common
from harness.commands.common import CommandArgs, positional, progress
from harness.config import load_launch, load_sweep, read_yaml_mapping
from harness.errors import HarnessError
from harness.hub import HubRef, size_text
from harness.io import display_path
from harness.plan import make_plan
from harness.runner import SweepOptions, make_launcher
from harness.weights import WeightsOutcome, fetch_needs, group_needs


@dataclass(frozen=True)
class FetchArgs(CommandArgs):
    file: Path = positional("a launch profile (launch/*.yaml) or a sweep (sweeps/*.yaml)", type=Path)
    launcher: str = common.launcher()
    ray_gpus: int | None = common.ray_gpus()


def register(parser: argparse.ArgumentParser) -> None:
    FetchArgs.register(parser, run)


def _servers_of(path: Path) -> list[tuple[str, HubRef | None, int]]:
    """(server name, its hub model or None, the GPUs it reserves) for a sweep's deployments or one profile."""
    if "deployments" in read_yaml_mapping(path):
        plan = make_plan(load_sweep(path))
        return [(d.name, d.weights, d.reserve_gpus) for d in plan.deployments]
    profile = load_launch(path).profile
    return [(path.stem, profile.model_ref, profile.reserved_gpus())]


def _node_lines(outcome: WeightsOutcome) -> list[str]:
    return [f"  {n.hostname} ({n.node_id[:8]}): {n.local_path} "
            f"({'already there' if n.already_present else size_text(n.bytes_transferred) + ' moved'}"
            f", {n.seconds:.1f} s)" for n in outcome.nodes]


def run(args: FetchArgs) -> int:
    servers = _servers_of(args.file)
    needs = group_needs(servers)
    if not needs:
        print(f"{display_path(args.file)}: nothing to fetch (every model is a local path, the generated tiny "
              "model, or the simulated engine's)")
        return 0
    launcher = make_launcher(SweepOptions(launcher=args.launcher, ray_gpus=args.ray_gpus)) \
        if args.launcher == "ray" else None  # starts or joins Ray; the fetch runs one task per node
    try:
        outcomes = fetch_needs(needs, use_ray=launcher is not None, progress=progress)
    finally:
        if launcher is not None:
            launcher.close()
    for outcome in outcomes:
        print(outcome.summary())
        for line in _node_lines(outcome):
            print(line)
    failed = [o.problem for o in outcomes if o.problem]
    if failed:
        raise HarnessError("; ".join(failed))
    return 0
