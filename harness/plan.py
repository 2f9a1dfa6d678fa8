"""Sweep -> Plan: deployments x points, each point's explicit dataset offset, the dataset need.

Offsets: EvalScope rotates the conversation list by --dataset-offset (FACTS.md §6).
Point i starts where point i-1's conversations ended, so no point re-sends a
conversation an earlier point already warmed in the prefix cache, provided the
dataset holds offset + sum(numbers) conversations.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.config import LoadedSweep, display_path
from harness.launch.vllm import ServerCommand, server_command
from harness.loadgen import LoadPoint, evalscope_argv
from harness.results import RunPaths

DATASET_PLACEHOLDER = Path("<dataset>")


@dataclass(frozen=True)
class PointPlan:
    deployment: str
    parallel: int
    number: int
    dataset_offset: int

    @property
    def point_id(self) -> str:
        return f"p{self.parallel}"

    @property
    def evalscope_name(self) -> str:
        return f"{self.deployment}-c{self.parallel}"


@dataclass(frozen=True)
class DeploymentPlan:
    name: str
    launch_path: Path
    engine: str
    command: ServerCommand
    gpus: int
    served_model_name: str
    ready_timeout_s: float
    points: tuple[PointPlan, ...]
    sizing: Sizing | None = None  # predicted concurrency (vLLM engines only)


@dataclass(frozen=True)
class Sizing:
    """What the concurrency calculator predicts at the workload's longest context."""

    seq_len: int
    predicted_concurrency: int
    baseline_concurrency: int
    layout: str
    warnings: tuple[str, ...]


def longest_context_tokens(loaded: LoadedSweep) -> int:
    """First turn + every later turn + every reply: the context of a conversation's last turn."""
    recipe = loaded.recipe.recipe
    return (recipe.first_turn_length + (recipe.num_turns - 1) * recipe.subsequent_turn_length
            + recipe.num_turns * loaded.sweep.client.max_tokens)


def _sizing(loaded: LoadedSweep, deployment: str) -> Sizing | None:
    from harness.calc import sizing_for_launch, sizing_warnings

    profile = loaded.launch_for(deployment)
    # the calculator models GLM-5.3's sparse-MLA KV on GPUs; other models and CPU builds have no prediction
    if profile.engine != "vllm" or "glm-5" not in profile.serve.model.lower() or profile.build.package != "vllm":
        return None
    seq_len = longest_context_tokens(loaded)
    result = sizing_for_launch(profile, seq_len)
    concurrencies = [p.parallel for p in loaded.sweep.client.point_list]
    return Sizing(seq_len=seq_len, predicted_concurrency=result.predicted_total,
                  baseline_concurrency=result.baseline_total, layout=result.layout,
                  warnings=tuple(sizing_warnings(profile, seq_len, concurrencies)))


@dataclass(frozen=True)
class DatasetNeed:
    recipe_path: Path
    recipe_name: str
    conversations_needed: int
    conversations_built: int  # what the recipe builds (the builder makes at least the need)

    @property
    def reuse(self) -> bool:
        return self.conversations_built < self.conversations_needed


@dataclass(frozen=True)
class Plan:
    sweep: LoadedSweep
    deployments: tuple[DeploymentPlan, ...]
    dataset: DatasetNeed
    warnings: tuple[str, ...]

    @property
    def simulated(self) -> bool:
        return all(d.engine == "sim" for d in self.deployments)


def point_offsets(base_offset: int, numbers: list[int]) -> list[int]:
    offsets, offset = [], base_offset
    for n in numbers:
        offsets.append(offset)
        offset += n
    return offsets


def make_plan(loaded: LoadedSweep, dialect: str | None = None) -> Plan:
    sweep = loaded.sweep
    specs = sweep.client.point_list
    offsets = point_offsets(sweep.client.dataset_offset, [p.number for p in specs])
    needed = sweep.client.dataset_offset + sum(p.number for p in specs)
    warnings: list[str] = []
    deployments = []
    for dep in sweep.deployments:
        launch = loaded.launches[dep.name]
        command = server_command(launch, dialect=dialect)
        warnings += [f"{dep.name}: {note}" for note in command.notes]
        points = tuple(PointPlan(dep.name, p.parallel, p.number, off) for p, off in zip(specs, offsets,
                                                                                         strict=True))
        deployments.append(DeploymentPlan(
            name=dep.name, launch_path=launch.path, engine=launch.profile.engine, command=command,
            gpus=sweep.gpus_per_server, served_model_name=launch.profile.served_model_name,
            ready_timeout_s=launch.profile.effective_ready_timeout_s, points=points,
            sizing=(sizing := _sizing(loaded, dep.name))))
        if sizing is not None:
            warnings += [f"{dep.name}: {w}" for w in sizing.warnings]
    recipe = loaded.recipe.recipe
    need = DatasetNeed(recipe_path=loaded.recipe.path, recipe_name=recipe.name,
                       conversations_needed=needed, conversations_built=recipe.conversations)
    if need.reuse:
        warnings.append(
            f"dataset {display_path(need.recipe_path)} builds {need.conversations_built} conversations but the "
            f"points need {needed} (offset {sweep.client.dataset_offset} + {sum(p.number for p in specs)}): "
            "later points would re-send conversations earlier points warmed in the prefix cache; "
            "the sweep builds the dataset with enough conversations")
    return Plan(sweep=loaded, deployments=tuple(deployments), dataset=need, warnings=tuple(warnings))


def load_point(plan: Plan, deployment: DeploymentPlan, point: PointPlan, *, base_url: str,
               dataset_path: Path, outputs_dir: Path) -> LoadPoint:
    client = plan.sweep.sweep.client
    return LoadPoint(model=client.model or deployment.served_model_name,
                     url=base_url.rstrip("/") + "/v1/chat/completions", dataset_path=dataset_path,
                     parallel=point.parallel, number=point.number, dataset_offset=point.dataset_offset,
                     name=point.evalscope_name, outputs_dir=outputs_dir)


def planned_evalscope_argv(plan: Plan, deployment: DeploymentPlan, point: PointPlan,
                           run_paths: RunPaths | None = None, dataset_path: Path | None = None) -> list[str]:
    """The EvalScope command as `plan` prints it (attempt 1, the profile's host and port)."""
    profile = plan.sweep.launch_for(deployment.name)
    host = "127.0.0.1" if profile.host in ("0.0.0.0", "::") else profile.host
    port = profile.port or "{port}"
    outputs = (run_paths.evalscope_dir(deployment.name, point.parallel, 1) if run_paths
               else Path("results/<run-id>/points") / deployment.name / point.point_id / "evalscope/attempt-1")
    lp = load_point(plan, deployment, point, base_url=f"http://{host}:{port}",
                    dataset_path=dataset_path or DATASET_PLACEHOLDER, outputs_dir=outputs)
    return evalscope_argv(lp, plan.sweep.sweep.client)
