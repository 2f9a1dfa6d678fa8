"""The dataset recipe: where conversations come from and the exact lengths they are padded to.

Hub inputs (a `hub` source, an `openscience` pad, a tokenizer named by hub id) are read from the
recipe's `hub:` (modelscope | huggingface; default harness/config/hubref.py DEFAULT_HUB) unless the
id carries its own `ms://` / `hf://` prefix; each can pin a `revision` (or `id@revision`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, model_validator

from harness.config.hubref import Hub, HubError, HubRef, check_trust_remote_code, is_hub_reference
from harness.schema import RelPath, Slug, StrictModel, must_exist, note_deprecated, resolve_path

_REVISION_HELP = "commit sha (Hugging Face: 40 hex), tag or branch; or write id@revision"


class SourceSpec(StrictModel):
    kind: Literal["hub", "jsonl", "sample"]
    id: str | None = Field(default=None, description="hub data set id (kind hub): org/name, ms://org/name, ...")
    revision: str | None = Field(default=None, description=_REVISION_HELP)
    split: str = "train"
    path: RelPath | None = Field(default=None, description="a JSONL file (kinds jsonl, sample)")
    only_resolved: bool = False

    @model_validator(mode="after")
    def _needs(self) -> SourceSpec:
        if self.kind == "hub":
            if not self.id:
                raise ValueError("a hub source needs id")
            _hub_ref(self.id, self.revision, None, "dataset")  # the id and revision are well formed
        elif self.revision is not None:
            raise ValueError(f"revision is for hub sources; a {self.kind} source is a local file")
        if self.kind in ("jsonl", "sample"):
            if self.path is None:
                raise ValueError(f"a {self.kind} source needs path")
            must_exist(self.path)
        return self


class PadSpec(StrictModel):
    kind: Literal["openscience", "local", "synthetic"] = "synthetic"
    id: str = "nvidia/OpenScienceReasoning-2"
    revision: str | None = Field(default=None, description=_REVISION_HELP + " (kind openscience)")
    split: str = "train"
    field: str = "output"
    paths: list[RelPath] = Field(default_factory=list, description="text files (kind local)")

    @model_validator(mode="after")
    def _needs(self) -> PadSpec:
        if self.kind == "openscience":
            _hub_ref(self.id, self.revision, None, "dataset")
        elif self.revision is not None:
            raise ValueError(f"revision is for the hub pad (kind openscience), not kind {self.kind}")
        if self.kind == "local":
            if not self.paths:
                raise ValueError("a local pad needs paths")
            for p in self.paths:
                must_exist(p)
        return self


class TokenizerSpec(StrictModel):
    """A hub id (optionally ms:// / hf:// and @revision), a local folder, or a tokenizer.json file."""

    name: str
    revision: str | None = Field(default=None, description=_REVISION_HELP + " (a hub tokenizer)")
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
    def from_hub(self) -> bool:
        return is_hub_reference(self.name)

    @model_validator(mode="after")
    def _revision_only_on_the_hub(self) -> TokenizerSpec:
        if self.from_hub:
            _hub_ref(self.name, self.revision, None, "model")
        elif self.revision is not None:
            raise ValueError(f"revision is for hub tokenizers; {self.name} is a local file or folder")
        return self


def _hub_ref(text: str, revision: str | None, hub: Hub | None, repo_type: Literal["model", "dataset"]) -> HubRef:
    try:
        return HubRef.parse(text, repo_type=repo_type, default_hub=hub, revision=revision)
    except HubError as exc:
        raise ValueError(str(exc)) from None


def _reuse_name(value: object) -> object:
    if value == "blog":
        note_deprecated("reuse: `blog` is now `shared`")
        return "shared"
    return value


class DatasetRecipe(StrictModel):
    name: Slug
    description: str | None = None
    hub: Hub | None = Field(default=None, description="where hub ids without ms:// or hf:// come from "
                            "(default: huggingface)")
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
    reuse: Annotated[Literal["fresh", "shared"], BeforeValidator(_reuse_name)] = Field(
        default="fresh", description="fresh: the sweep builds offset + every point's conversations, so no point "
        "re-sends one an earlier point warmed; shared: exactly `conversations` (the blog: 128) shared by every "
        "point, rotating through them as EvalScope does, so later points re-send warmed ones (docs/facts.md §6); "
        "`blog` is the old name of `shared`")

    @model_validator(mode="after")
    def _remote_code_pinned(self) -> DatasetRecipe:
        ref = self.tokenizer_ref()
        if self.tokenizer.trust_remote_code and ref is not None:
            try:
                check_trust_remote_code(ref)
            except HubError as exc:
                raise ValueError(f"tokenizer.trust_remote_code: {exc}") from None
        return self

    # ---- the hub references, with the recipe's hub applied -------------------------------------

    def source_ref(self) -> HubRef | None:
        source = self.source
        return _hub_ref(source.id or "", source.revision, self.hub, "dataset") if source.kind == "hub" else None

    def pad_ref(self) -> HubRef | None:
        pad = self.pad
        return _hub_ref(pad.id, pad.revision, self.hub, "dataset") if pad.kind == "openscience" else None

    def tokenizer_ref(self) -> HubRef | None:
        tok = self.tokenizer
        return _hub_ref(tok.name, tok.revision, self.hub, "model") if tok.from_hub else None
