"""The correctness probe's prompt set: short prompts, each with the answer where one is known
(harness/data/correctness/prompts.yaml ships one; a sweep's `correctness.prompts` may name another)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import Field, ValidationError, field_validator

from harness.errors import HarnessError
from harness.io import data_path
from harness.schema import StrictModel

DEFAULT_PROMPTS = data_path("correctness", "prompts.yaml")


class Prompt(StrictModel):
    id: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    answer: str | None = Field(default=None, description="the right answer, as a whole word of the reply")

    def is_right(self, reply: str) -> bool | None:
        """Whether `reply` holds the answer as a whole word (case ignored); None without an answer."""
        if self.answer is None:
            return None
        return re.search(rf"(?<![\w]){re.escape(self.answer)}(?![\w])", reply, flags=re.IGNORECASE) is not None


class PromptSet(StrictModel):
    prompts: list[Prompt] = Field(min_length=1)

    @field_validator("prompts")
    @classmethod
    def _unique(cls, prompts: list[Prompt]) -> list[Prompt]:
        ids = [p.id for p in prompts]
        if len(set(ids)) != len(ids):
            raise ValueError("prompt ids must be unique")
        return prompts

    def by_text(self) -> dict[str, Prompt]:
        return {p.prompt: p for p in self.prompts}


def load_prompt_set(path: Path | None = None) -> PromptSet:
    path = Path(path) if path is not None else DEFAULT_PROMPTS
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise HarnessError(f"{path}: cannot read the prompt set: {exc}") from None
    try:
        return PromptSet.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise HarnessError(f"{path}: {where}: {first.get('msg')}") from None
