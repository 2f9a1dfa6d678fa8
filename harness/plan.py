"""The resolve stage: Sweep -> Plan. Everything a run needs is decided here, once: each deployment's
dialect, build (interpreter, kernels), server argv and launcher reservation; each point's offset and
EvalScope argv; the dataset need. Launchers and the runner only fill in what is known at run time
(the port a node picked, the built dataset's path, an attempt's output folder); they never render.

Offsets: EvalScope rotates the conversation list by --dataset-offset (docs/facts.md §6). Point i
starts where point i-1's conversations ended, so no point re-sends a conversation an earlier point
already warmed in the prefix cache, provided the dataset holds offset + sum(numbers) conversations.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from harness.builds.envs import env_dir_for, expected_python, planned_kernel
from harness.builds.kernels import KernelIdentity
from harness.calc import sizing_for_launch, sizing_warnings
from harness.config import ConfigError, DatasetRecipe, LoadedLaunch, LoadedRecipe, LoadedSweep, SweepFile
from harness.config.hubref import HubRef
from harness.io import display_path
from harness.loadgen import (
    ClientPlan,
    blog_client_warning,
    client_argv_template,
    fill_client_argv,
    resolve_client,
    warmed_resends,
)
from harness.records import point_id
from harness.servers.base import MODEL_PLACEHOLDER, PORT_PLACEHOLDER
from harness.servers.preflight import PinnedMemory, hisparse_start_refusals, pinned_memory, stop_grace_for
from harness.servers.vllm_command import ServerCommand, server_command
from harness.support import (
    ResolvedDialect,
    dialect_from_spec,
    forced_dialect_note,
    hisparse_option_problems,
)

DATASET_PLACEHOLDER = Path("<dataset>")


@dataclass(frozen=True)
class PointPlan:
    deployment: str
    concurrency: int
    conversations: int
    dataset_offset: int
    client_argv: tuple[str, ...]  # EvalScope's argv with {base_url}, {dataset} and {outputs} to fill

    @property
    def point_id(self) -> str:
        return point_id(self.concurrency)

    @property
    def evalscope_name(self) -> str:
        return f"{self.deployment}-c{self.concurrency}"


@dataclass(frozen=True)
class BuildPlan:
    """Where a vLLM deployment's server comes from, resolved without building anything."""

    spec: str  # the profile's build.vllm
    kind: str  # system | pypi | git
    python: str | None  # the interpreter the server command runs under (None: `vllm` on PATH)
    env_dir: Path | None
    kernels: str  # vllm | bundled
    kernel: KernelIdentity | None = None  # kernels: bundled: the module as the source tree is now


@dataclass(frozen=True)
class Sizing:
    """What the concurrency calculator predicts at the workload's longest context."""

    seq_len: int
    predicted_concurrency: int
    baseline_concurrency: int
    layout: str
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class DeploymentPlan:
    name: str
    launch: LoadedLaunch
    engine: str
    dialect: ResolvedDialect | None  # None where it does not matter (sim, no HiSparse)
    build: BuildPlan | None  # None for the simulated engine
    command: ServerCommand
    reserve_gpus: int  # GPUs the launcher reserves for the server
    served_model_name: str
    ready_timeout_s: float
    points: tuple[PointPlan, ...]
    sizing: Sizing | None = None  # predicted concurrency (vLLM engines only)
    pinned: PinnedMemory | None = None  # host memory pinned per node (vLLM engines only)
    stop_grace_s: float = 15.0  # what a stop gives the server after SIGTERM (servers/preflight.py stop_grace_for)
    api_key: str | None = None  # the key the server demands; readiness, scrapes and the client send it
    # a hub model: fetched onto the server's node before it starts; the argv names MODEL_PLACEHOLDER
    weights: HubRef | None = None
    arm: str = ""  # the sweep's deployment this is (its name, or the name it has at each context)
    context_tokens: int | None = None  # the first-turn length it runs at (a sweep with contexts)
    recipe: LoadedRecipe | None = None  # the dataset its points read: the sweep's, or its context's
    @property
    def launch_path(self) -> Path:
        return self.launch.path

    @property
    def profile(self):
        return self.launch.profile


@dataclass(frozen=True)
class DatasetNeed:
    recipe_path: Path
    recipe_name: str
    conversations_needed: int
    conversations_built: int  # what the recipe builds (the builder makes at least the need)
    mode: str = "fresh"  # the recipe's reuse: fresh, or shared (exactly conversations_built, rotating)
    resends: tuple[tuple[int, int], ...] = ()  # shared mode: (concurrency, warmed conversations it re-sends)
    retry_reserve: int = 0  # spare conversations after the need, for retries that shift to fresh ones

    @property
    def reuse(self) -> bool:
        return self.conversations_built < self.conversations_needed

    @property
    def build_conversations(self) -> int:
        """How many conversations the run builds: the need (fresh), or exactly the recipe's (shared)."""
        if self.mode == "shared":
            return self.conversations_built
        return max(self.conversations_built, self.conversations_needed + self.retry_reserve)

    def describe(self) -> str:
        if self.mode != "shared":
            spare = f" + {self.retry_reserve} spare for retries" if self.retry_reserve else ""
            return (f"{self.conversations_needed} conversations needed{spare}, {self.build_conversations} built: "
                    "fresh conversations at every point")
        again = ", ".join(f"c{c} re-sends {n}" for c, n in self.resends) or "no point re-sends one"
        return (f"the blog's reuse: exactly {self.conversations_built} conversations, offsets rotating as "
                f"EvalScope does ({again})")


@dataclass(frozen=True)
class Plan:
    loaded: LoadedSweep
    deployments: tuple[DeploymentPlan, ...]
    dataset: DatasetNeed
    client: ClientPlan
    warnings: tuple[str, ...]

    @property
    def config(self) -> SweepFile:
        """The sweep file's settings, as loaded."""
        return self.loaded.sweep

    @property
    def simulated(self) -> bool:
        return all(d.engine == "sim" for d in self.deployments)

    def deployment(self, name: str) -> DeploymentPlan:
        return next(d for d in self.deployments if d.name == name)


def _longest_context_tokens(loaded: LoadedSweep) -> int:
    """First turn + every later turn + every reply: the context of a conversation's last turn."""
    return conversation_tokens(loaded.dataset_recipe, loaded.sweep.client.max_tokens)


def conversation_tokens(recipe: DatasetRecipe, max_tokens: int) -> int:
    return recipe.first_turn_length + (recipe.num_turns - 1) * recipe.subsequent_turn_length + recipe.num_turns * max_tokens


# What a chat template adds to each turn beyond its bare tokens (role markers, the generation prompt): the
# margin a context's max_model_len keeps so that the conversation's last request is admitted.
TEMPLATE_TOKENS_PER_TURN = 32


def _context_max_model_len(recipe: DatasetRecipe, max_tokens: int) -> int:
    """The admission limit a context's servers start with: its whole conversation (first turn, later turns,
    replies) plus the template's tokens, so the last turn fits and nothing longer is reserved."""
    return conversation_tokens(recipe, max_tokens) + recipe.num_turns * TEMPLATE_TOKENS_PER_TURN


def _context_label(tokens: int) -> str:
    """16000 -> 16k, 1000000 -> 1m, 74160 -> 74160: a context's name in deployment names and tables."""
    if tokens % 1_000_000 == 0:
        return f"{tokens // 1_000_000}m"
    if tokens % 1_000 == 0:
        return f"{tokens // 1_000}k"
    return str(tokens)


@dataclass(frozen=True)
class _Arm:
    """One server start the sweep asks for: a deployment, or a deployment at one of the sweep's contexts."""

    name: str
    arm: str
    context_tokens: int | None
    launch: LoadedLaunch
    recipe: LoadedRecipe


def _arms(loaded: LoadedSweep) -> list[_Arm]:
    """The sweep's deployments, each once, or once per context (its own dataset and max_model_len)."""
    sweep = loaded.sweep
    if not sweep.contexts:
        return [_Arm(d.name, d.name, None, loaded.launches[d.name], loaded.recipe) for d in sweep.deployments]
    base = loaded.dataset_recipe
    if sweep.search is not None and sweep.search.probe_turns is not None:  # a capacity search's probes
        base = base.model_copy(update={"num_turns": sweep.search.probe_turns})
    arms = []
    for dep in sweep.deployments:
        launch = loaded.launches[dep.name]
        for tokens in sweep.contexts:
            recipe = base.model_copy(update={"first_turn_length": tokens})
            limit = _context_max_model_len(recipe, sweep.client.max_tokens)
            profile = launch.profile.model_copy(update={"serve": launch.profile.serve.model_copy(
                update={"max_model_len": limit})})
            arms.append(_Arm(f"{dep.name}-ctx{_context_label(tokens)}", dep.name, tokens,
                             replace(launch, profile=profile), LoadedRecipe(loaded.recipe.path, recipe)))
    return arms


def point_offsets(base_offset: int, numbers: list[int]) -> list[int]:
    offsets, offset = [], base_offset
    for n in numbers:
        offsets.append(offset)
        offset += n
    return offsets


# ---- resolving one deployment ----------------------------------------------------------------------

def resolve_dialect(loaded: LoadedLaunch, override: str | None = None) -> tuple[ResolvedDialect | None, list[str]]:
    """The dialect to render (None for the simulated engine), and notes where a forced dialect
    contradicts the build. HiSparse options are checked against the dialect, whatever chose it."""
    profile, notes = loaded.profile, []
    if profile.engine != "vllm":
        return None, notes
    build = profile.build
    wanted = override if override not in (None, "auto") else profile.dialect
    if wanted != "auto":
        dialect: ResolvedDialect = wanted  # type: ignore[assignment]
        note = forced_dialect_note(dialect, blog_branch=build.blog_branch, pinned_version=build.version)
        if note and profile.kv.hisparse is not None:
            notes.append(f"{note} ({build.vllm})")
    else:
        found, field, why = dialect_from_spec(uses_hisparse=profile.kv.hisparse is not None,
                                              blog_branch=build.blog_branch, pinned_version=build.version)
        if found is None:
            raise ConfigError(loaded.path, f"build {build.vllm} {why}" if field == "build" else why, field)
        dialect = found
    hisparse = profile.kv.hisparse
    if hisparse is not None:
        for problem in hisparse_option_problems(dialect=dialect, device_buffer_size=hisparse.device_buffer_size,
                                                eager_host_mirror=hisparse.eager_host_mirror):
            raise ConfigError(loaded.path, f"{problem} (dialect {dialect})", "kv.hisparse")
    return dialect, notes


def _resolve_build(loaded: LoadedLaunch, envs_dir: Path | None = None) -> BuildPlan | None:
    profile = loaded.profile
    if profile.engine != "vllm":
        return None
    spec = profile.build
    return BuildPlan(spec=spec.vllm, kind=spec.kind, python=expected_python(spec, envs_dir),
                     env_dir=None if spec.kind == "system" else env_dir_for(spec, envs_dir), kernels=spec.kernels,
                     kernel=planned_kernel(spec))


def _sizing(loaded: LoadedSweep, arm: _Arm) -> Sizing | None:
    profile = arm.launch.profile
    # the calculator models GLM-5.3's sparse-MLA KV on GPUs; other models and CPU builds have no prediction
    if profile.engine != "vllm" or "glm-5" not in profile.serve.model.lower() or profile.build.package != "vllm":
        return None
    seq_len = (profile.serve.max_model_len if arm.context_tokens is not None and profile.serve.max_model_len
               else conversation_tokens(arm.recipe.recipe, loaded.sweep.client.max_tokens))
    result = sizing_for_launch(profile, seq_len)
    concurrencies = loaded.sweep.concurrencies_of(arm.arm)
    return Sizing(seq_len=seq_len, predicted_concurrency=result.predicted_total,
                  baseline_concurrency=result.baseline_total, layout=result.layout,
                  warnings=tuple(sizing_warnings(profile, seq_len, concurrencies)))


def _refuse(launch: LoadedLaunch) -> PinnedMemory | None:
    """HiSparse's start-time refusals and the pinned memory per node, before anything starts: one
    line each (harness/servers/preflight.py); RAM from the profile's host_ram_gib where declared."""
    profile = launch.profile
    if profile.engine != "vllm":
        return None
    problems = hisparse_start_refusals(profile, profile.host_ram_gib)
    if problems:
        raise ConfigError(launch.path, problems[0], "kv.hisparse" if profile.kv.hisparse else "kv")
    return pinned_memory(profile)


def _reproduces_blog(loaded: LoadedSweep) -> tuple[bool, str | None]:
    """(a GLM-5 arm on vLLM runs, the first reasoning parser an arm sets)."""
    profiles = [ld.profile for ld in loaded.launches.values()]
    blog = any(p.engine == "vllm" and "glm-5" in p.serve.model.lower() for p in profiles)
    return blog, next((p.serve.reasoning_parser for p in profiles if p.serve.reasoning_parser), None)


def make_plan(loaded: LoadedSweep, dialect: str | None = None, envs_dir: Path | None = None,
              clients_dir: Path | None = None) -> Plan:
    sweep = loaded.sweep
    specs = sweep.client.point_list
    offsets = point_offsets(sweep.client.dataset_offset, [p.conversations for p in specs])
    needed = sweep.client.dataset_offset + sum(p.conversations for p in specs)
    client = resolve_client(sweep.client, clients_dir)
    warnings: list[str] = []
    deployments = []
    for dep in _arms(loaded):
        launch = dep.launch
        profile = launch.profile
        resolved, notes = resolve_dialect(launch, dialect)
        warnings += [f"{dep.name}: {note}" for note in notes]
        pinned = _refuse(launch)
        build = _resolve_build(launch, envs_dir)
        weights = profile.model_ref
        # a hub model is fetched onto the node first; which path it lands at is the fetch's to say
        rendered = profile.served_from(MODEL_PLACEHOLDER) if weights is not None else profile
        grace = profile.stop_grace_s if profile.stop_grace_s is not None else \
            stop_grace_for(pinned.per_node_gib if pinned is not None else 0.0)
        command = server_command(rendered, launch.path, dialect=resolved, python=build.python if build else None,
                                 stop_grace_s=grace)
        served = sweep.client.model or profile.served_model_name
        api_key = profile.api_key
        runs = sweep.concurrencies_of(dep.arm)
        points = tuple(
            PointPlan(dep.name, p.concurrency, p.conversations, off,
                      client_argv=tuple(client_argv_template(client, sweep.client, model=served, concurrency=p.concurrency,
                                                             conversations=p.conversations, dataset_offset=off,
                                                             name=f"{dep.name}-c{p.concurrency}", api_key=api_key)))
            for p, off in zip(specs, offsets, strict=True) if p.concurrency in runs)
        sizing = _sizing(loaded, dep)
        if sizing is not None:
            warnings += [f"{dep.name}: {w}" for w in sizing.warnings]
        deployments.append(DeploymentPlan(
            name=dep.name, launch=launch, engine=profile.engine, dialect=command.dialect, build=build,
            command=command, reserve_gpus=launch.profile.reserved_gpus(sweep.gpus_per_server),
            served_model_name=profile.served_model_name, ready_timeout_s=profile.effective_ready_timeout_s,
            points=points, sizing=sizing, api_key=api_key, pinned=pinned, weights=weights, stop_grace_s=grace,
            arm=dep.arm, context_tokens=dep.context_tokens, recipe=dep.recipe))
    recipe = loaded.dataset_recipe
    resends = ()
    if recipe.reuse == "shared":
        by_point = warmed_resends([(p.concurrency, off, p.conversations) for p, off in zip(specs, offsets, strict=True)],
                                  recipe.conversations)
        resends = tuple(sorted(by_point.items()))
    reserve = 0
    if sweep.retry_cache == "shift" and sweep.max_point_retries:
        if recipe.reuse == "shared":
            raise ConfigError(loaded.path, "retry_cache shift needs spare conversations, and the recipe's reuse: shared "
                              "builds exactly its conversations; use retry_cache: restart", "retry_cache")
        reserve = sweep.max_point_retries * sum(p.conversations for p in specs)
    need = DatasetNeed(recipe_path=loaded.recipe.path, recipe_name=recipe.name,
                       conversations_needed=needed, conversations_built=recipe.conversations, mode=recipe.reuse,
                       resends=resends, retry_reserve=reserve)
    blog, parser = _reproduces_blog(loaded)
    if blog and (note := blog_client_warning(client, parser)):
        warnings.append(note)
    if recipe.reuse == "shared":
        if resends:
            warnings.append(f"dataset {display_path(need.recipe_path)} reuses conversations as the blog did: "
                            + need.describe() + "; their prefixes are already in the prefix cache")
    elif need.reuse:
        warnings.append(
            f"dataset {display_path(need.recipe_path)} builds {need.conversations_built} conversations but the "
            f"points need {needed} (offset {sweep.client.dataset_offset} + {sum(p.conversations for p in specs)}): "
            "later points would re-send conversations earlier points warmed in the prefix cache; "
            "the sweep builds the dataset with enough conversations")
    return Plan(loaded=loaded, deployments=tuple(deployments), dataset=need, client=client, warnings=tuple(warnings))


def planned_client_argv(deployment: DeploymentPlan, point: PointPlan, dataset_path: Path | None = None,
                        outputs_dir: Path | None = None) -> list[str]:
    """The EvalScope command as `plan` prints it (attempt 1, the profile's host and port)."""
    profile = deployment.profile
    host = "127.0.0.1" if profile.host in ("0.0.0.0", "::") else profile.host
    port = profile.port or PORT_PLACEHOLDER
    outputs = outputs_dir or (Path("results/<run-id>/points") / deployment.name / point.point_id
                              / "evalscope/attempt-1")
    return fill_client_argv(point.client_argv, base_url=f"http://{host}:{port}",
                            dataset_path=dataset_path or DATASET_PLACEHOLDER, outputs_dir=outputs)
