"""The dataset recipe: where conversations come from and the exact lengths they are padded to."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, model_validator

from harness.schema import RelPath, Slug, StrictModel, must_exist, resolve_path


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
    reuse: Literal["fresh", "blog"] = Field(
        default="fresh", description="fresh: the sweep builds offset + every point's number conversations, so "
        "no point re-sends one an earlier point warmed; blog: exactly `conversations` (the blog: 128), the "
        "points rotating through them as EvalScope does, so later points re-send warmed ones (docs/facts.md §6)")


