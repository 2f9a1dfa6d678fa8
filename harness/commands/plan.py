"""`harness plan SWEEP.yaml`: what a sweep will run, before anything runs."""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from harness.commands import common
from harness.commands.common import CommandArgs, option, positional
from harness.config import load_sweep
from harness.io import display_path
from harness.plan import Plan, make_plan, planned_client_argv
from harness.redact import redact_argv, redact_env


@dataclass(frozen=True)
class PlanArgs(CommandArgs):
    sweep: Path = positional("sweep file, e.g. sweeps/tp8.yaml", type=Path)
    dialect: str | None = common.dialect("render HiSparse flags for")
    json: bool = option("--json", "print the plan as JSON for tools", action="store_true", default=False)


def register(parser: argparse.ArgumentParser) -> None:
    PlanArgs.register(parser, run)


def run(args: PlanArgs) -> int:
    plan = make_plan(load_sweep(args.sweep), dialect=args.dialect)
    print(json.dumps(_plan_as_dict(plan), indent=2) if args.json else _plan_as_text(plan))
    return 0


def _plan_as_dict(plan: Plan) -> dict:
    sweep = plan.config
    return {
        "sweep": sweep.name,
        "file": display_path(plan.loaded.path),
        "gpus_per_server": sweep.gpus_per_server,
        "client": {"evalscope_version": plan.client.version, "source": plan.client.source,
                   "program": list(plan.client.program), "nice": plan.client.nice},
        "dataset": {"recipe": display_path(plan.dataset.recipe_path), "name": plan.dataset.recipe_name,
                    "conversations_needed": plan.dataset.conversations_needed,
                    "conversations_built": plan.dataset.build_conversations,
                    "reuse": plan.dataset.mode, "resends": dict(plan.dataset.resends)},
        "deployments": [{
            "name": dep.name,
            "launch": display_path(dep.launch_path),
            "engine": dep.engine,
            "dialect": dep.dialect,
            "build": None if dep.build is None else {"spec": dep.build.spec, "kind": dep.build.kind,
                                                     "python": dep.build.python, "kernels": dep.build.kernels,
                                                     "kernel": None if dep.build.kernel is None
                                                     else dep.build.kernel.__dict__},
            "weights": None if dep.weights is None else str(dep.weights),  # fetched first; "{model}" in the argv
            "server_argv": redact_argv(dep.command.argv),
            "server_env": redact_env(dep.command.env),
            "server_command": dep.command.shell_line(),
            "client": plan.client.describe(),
            "pinned_host": None if dep.pinned is None else {
                "executor": dep.pinned.executor, "nodes": dep.pinned.nodes,
                "hisparse_pools_per_node": dep.pinned.hisparse_pools, "per_node_gib": dep.pinned.per_node_gib},
            "sizing": None if dep.sizing is None else {
                "seq_len": dep.sizing.seq_len, "predicted_concurrency": dep.sizing.predicted_concurrency,
                "baseline_concurrency": dep.sizing.baseline_concurrency, "layout": dep.sizing.layout},
            "points": [{"concurrency": p.concurrency, "conversations": p.conversations, "dataset_offset": p.dataset_offset,
                        "evalscope_argv": redact_argv(planned_client_argv(dep, p))}
                       for p in dep.points],
        } for dep in plan.deployments],
        "warnings": list(plan.warnings),
    }


def _plan_as_text(plan: Plan) -> str:
    sweep = plan.config
    n_points = sum(len(dep.points) for dep in plan.deployments)
    client = plan.client
    lines = [f"Sweep {sweep.name} ({display_path(plan.loaded.path)}): {len(plan.deployments)} deployment(s), "
             f"{n_points} point(s), {sweep.gpus_per_server} GPU(s) per server",
             f"Dataset: {display_path(plan.dataset.recipe_path)} ({plan.dataset.recipe_name}): "
             f"{plan.dataset.describe()}",
             f"Client: {client.describe()}", ""]
    for dep in plan.deployments:
        dialect = f", dialect {dep.dialect}" if dep.dialect else ""
        lines.append(f"Deployment {dep.name} ({display_path(dep.launch_path)}, engine {dep.engine}{dialect})")
        if dep.build is not None:
            lines.append(f"  build: {dep.build.spec} ({dep.build.kind}; kernels {dep.build.kernels}; "
                         f"python {dep.build.python or 'the vllm on PATH'})")
            if dep.build.kernel is not None:
                lines.append(f"  kernel: bundled {dep.build.kernel.describe()}, sha256 "
                             f"{dep.build.kernel.source_sha256} (from the source tree; built at `build`)")
        if dep.weights is not None:
            lines.append(f"  weights: {dep.weights} (fetched onto each server node first; {{model}} is its path there)")
        lines.append(f"  server: {dep.command.shell_line()}")
        lines.append(f"  client: {client.describe()}")
        if dep.pinned is not None:
            lines.append(f"  pinned host memory: {dep.pinned.describe()}")
        if dep.sizing is not None:
            lines.append(f"  sizing: about {dep.sizing.predicted_concurrency} concurrent requests fit at "
                         f"{dep.sizing.seq_len:,} tokens (plain GPU-resident KV: "
                         f"{dep.sizing.baseline_concurrency}; calculator, {dep.sizing.layout} layout)")
        for p in dep.points:
            argv = redact_argv(planned_client_argv(dep, p))
            lines.append(f"  c{p.concurrency} ({p.conversations} conversations, offset {p.dataset_offset}): {shlex.join(argv)}")
        lines.append("")
    if plan.warnings:
        lines.append("Warnings:")
        lines += [f"  - {w}" for w in plan.warnings]
    return "\n".join(lines).rstrip()
