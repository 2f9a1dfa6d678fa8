"""Base types shared by every config schema: strict models, sizes, paths relative to a file."""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo

from harness.io import display_path

# ---------------------------------------------------------------- deprecated spellings

# Old spellings a config may still use: each renamed value reports itself here while a file is validated,
# and the loader says so once per file (harness/config/loading.py).
_DEPRECATED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("deprecated", default=None)


def renamed(data: Any, old_to_new: dict[str, str], where: str) -> Any:
    """`data` (a mapping being validated) with its old keys under their new names, each noted."""
    if not isinstance(data, dict) or not any(old in data for old in old_to_new):
        return data
    out = dict(data)
    for old, new in old_to_new.items():
        if old in out and new not in out:
            out[new] = out.pop(old)
            note_deprecated(f"{where}`{old}` is now `{new}`")
    return out


def note_deprecated(text: str) -> None:
    notes = _DEPRECATED.get()
    if notes is not None and text not in notes:
        notes.append(text)


@contextlib.contextmanager
def deprecations() -> Iterator[list[str]]:
    """Collect the deprecated spellings noted while the block validates a file."""
    token = _DEPRECATED.set([])
    try:
        yield _DEPRECATED.get()  # type: ignore[misc]
    finally:
        _DEPRECATED.reset(token)


# ---------------------------------------------------------------- sizes

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size_bytes(value: Any) -> int:
    """`128GiB`, `1.5 GB`, `549755813888` -> bytes. Binary units (GiB) are 2**30."""
    if isinstance(value, bool):
        raise ValueError("a size must be a number of bytes or a string like '128GiB'")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"a size in bytes must be whole, got {value}")
        return int(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and m.group(2).lower() in _SIZE_UNITS:
            number = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
            if not number.is_integer():
                raise ValueError(f"size {value!r} is not a whole number of bytes")
            return int(number)
        if value.strip().startswith("-"):
            raise ValueError(f"size {value!r} must not be negative")
        raise ValueError(f"cannot read {value!r} as a size; write bytes or e.g. '128GiB'")
    raise ValueError("a size must be a number of bytes or a string like '128GiB'")


SizeBytes = Annotated[int, BeforeValidator(parse_size_bytes), Field(gt=0)]
Slug = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=100)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def resolve_path(value: Any, info: ValidationInfo) -> Path:
    if not isinstance(value, str | Path) or str(value) == "":
        raise ValueError("must be a path")
    path = Path(os.path.expanduser(str(value)))
    base = (info.context or {}).get("base_dir")
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    return Path(os.path.normpath(path))


def must_exist(path: Path) -> Path:
    if not path.exists():
        raise ValueError(f"no such file {display_path(path)}")
    return path


RelPath = Annotated[Path, BeforeValidator(resolve_path)]


