"""The history store: a folder with one JSON file per night, appended atomically.

<store>/nights/<night-id>.json        the night record
<store>/artifacts/<night-id>/...      the night's report and figures, when given

In CI the folder is a checkout of a dedicated branch (or a restored artifact), so a file in it may
be anything: a file that is not a night record, or one cut short, is reported as a warning line
and skipped; it never stops the history from loading.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import HarnessError
from harness.io import atomic_write_bytes, atomic_write_json
from harness.nightly.night_record import NIGHT_FORMAT, NIGHT_SCHEMA_VERSION, NightRecord, validation_message


@dataclass(frozen=True)
class LoadedHistory:
    """Every readable night, oldest first, and one warning line per file skipped."""

    nights: list[NightRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def before(self, night: NightRecord) -> list[NightRecord]:
        """The nights that ran before `night` (the history it is gated against)."""
        return [n for n in self.nights if n.order < night.order and n.night_id != night.night_id]


class NightStore:
    def __init__(self, root: Path | str):
        self.root = Path(root)

    @property
    def nights_dir(self) -> Path:
        return self.root / "nights"

    def path_for(self, night_id: str) -> Path:
        return self.nights_dir / f"{night_id}.json"

    def artifacts_dir(self, night_id: str) -> Path:
        return self.root / "artifacts" / night_id

    def add(self, record: NightRecord, *, report: Path | None = None, figures: Sequence[Path] = (),
            replace: bool = False) -> NightRecord:
        """Store a night (and copies of its report and figures); returns the record as stored."""
        path = self.path_for(record.night_id)
        if path.exists() and not replace:
            raise HarnessError(f"{path}: night {record.night_id} is already in the history "
                               "(add --replace to overwrite it)")
        update: dict[str, object] = {}
        if report is not None:
            update["report_path"] = self._attach(record.night_id, Path(report), Path(report).name)
        if figures:
            update["figure_paths"] = [self._attach(record.night_id, Path(f), f"figures/{Path(f).name}")
                                      for f in figures]
        stored = record.model_copy(update=update) if update else record
        atomic_write_json(path, stored)  # last: a crash before here leaves no half night behind
        return stored

    def _attach(self, night_id: str, source: Path, name: str) -> str:
        try:
            data = source.read_bytes()
        except OSError as exc:
            raise HarnessError(f"{source}: cannot attach to night {night_id}: {exc.strerror or exc}") from None
        target = self.artifacts_dir(night_id) / name
        atomic_write_bytes(target, data)
        return target.relative_to(self.root).as_posix()

    def load(self) -> LoadedHistory:
        if not self.nights_dir.is_dir():
            return LoadedHistory()
        nights: list[NightRecord] = []
        warnings: list[str] = []
        for path in sorted(self.nights_dir.iterdir()):
            if path.name.startswith(".") or path.is_dir():
                continue  # temporary files of an atomic write, and folders, are not nights
            record, problem = _read(path)
            if problem is not None:
                warnings.append(f"warning: {path}: {problem}; skipped")
            elif record is not None:
                nights.append(record)
        return LoadedHistory(sorted(nights, key=lambda n: n.order), warnings)

    def get(self, night_id: str) -> NightRecord:
        path = self.path_for(night_id)
        if not path.is_file():
            raise HarnessError(f"{self.root}: no night {night_id!r} in the history (see `harness history list`)")
        record, problem = _read(path)
        if record is None:
            raise HarnessError(f"{path}: {problem}")
        return record


def _read(path: Path) -> tuple[NightRecord | None, str | None]:
    """(record, None), or (None, why the file is not a usable night)."""
    if path.suffix != ".json":
        return None, "not a night record (not a .json file)"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return None, f"unreadable: {exc.strerror or exc}"
    except ValueError as exc:
        return None, f"corrupt JSON: {str(exc).splitlines()[0]}"
    if not isinstance(data, dict) or data.get("format") != NIGHT_FORMAT:
        return None, f"not a night record (no \"format\": \"{NIGHT_FORMAT}\")"
    version = data.get("schema_version")
    if not isinstance(version, int) or version > NIGHT_SCHEMA_VERSION:
        return None, (f"night record schema {version!r} is newer than this harness reads "
                      f"({NIGHT_SCHEMA_VERSION})")
    try:
        record = NightRecord.model_validate(data)
    except ValueError as exc:
        return None, f"malformed night record: {validation_message(exc)}"
    if record.night_id != path.stem:
        return None, f"holds night {record.night_id!r}, not {path.stem!r}"
    return record, None
