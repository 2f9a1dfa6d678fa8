"""A data set snapshot's rows, read from its own files the way the `datasets` library finds them.

Both hubs lay data set splits out the same way (ModelScope's MsDataset resolves git-hosted data
sets with the `datasets` machinery), so the same files give the same rows from either hub. The
split's files come from the data set card's `configs:` block, else the library's default patterns.
JSON lines, JSON (a list of rows, or columns) and Parquet are read. Parquet stays columnar in
memory and a row becomes a dict only when it is read: the OpenHands trajectories are one 2 GB
file, and the builder looks at a few hundred of its rows.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import yaml

from harness.hub import HubError, ResolvedRef

DATA_EXTENSIONS = (".jsonl", ".json", ".parquet")


def _card_data_files(root: Path, config: str | None) -> dict[str, list[str]] | None:
    """Split -> path patterns from the README's YAML `configs` (the data set card), if it has any."""
    readme = root / "README.md"
    if not readme.is_file():
        return None
    text = readme.read_text(encoding="utf-8", errors="replace")
    found = re.match(r"---\s*\n(.*?)\n---\s*\n", text, re.S)
    try:
        card = yaml.safe_load(found.group(1)) if found else None
    except yaml.YAMLError:
        return None
    configs = card.get("configs") if isinstance(card, dict) else None
    if not isinstance(configs, list) or not configs:
        return None
    chosen = next((c for c in configs if c.get("config_name") == config), None) if config else (
        next((c for c in configs if c.get("default")), None)
        or next((c for c in configs if c.get("config_name") == "default"), configs[0]))
    if chosen is None:
        return None
    files = chosen.get("data_files")
    if isinstance(files, str) or isinstance(files, list) and all(isinstance(f, str) for f in files):
        return {"train": [files] if isinstance(files, str) else list(files)}
    if isinstance(files, dict):
        return {k: [v] if isinstance(v, str) else list(v) for k, v in files.items()}
    out: dict[str, list[str]] = {}
    for item in files or []:
        if isinstance(item, dict) and "split" in item:
            path = item.get("path")
            out.setdefault(item["split"], []).extend([path] if isinstance(path, str) else list(path or []))
    return out or None


def _dataset_split_files(resolved: ResolvedRef, split: str, config: str | None = None) -> list[Path]:
    """The files of one split, found as the `datasets` library finds them (the card's configs first,
    then its default split patterns); ModelScope's MsDataset uses the same machinery."""
    from datasets.data_files import EmptyDatasetError, get_data_patterns, resolve_pattern

    root, label = resolved.local_path, resolved.ref.label
    patterns = _card_data_files(root, config)
    if patterns is None:
        try:
            patterns = get_data_patterns(str(root))
        except EmptyDatasetError:
            raise HubError(f"{label}: no data files in {root}") from None
    if split not in patterns:
        raise HubError(f"{label}: no split {split!r} (splits: {', '.join(sorted(patterns)) or 'none'})")
    files: list[str] = []
    for pattern in patterns[split]:
        try:
            files += resolve_pattern(pattern, base_path=str(root), allowed_extensions=list(DATA_EXTENSIONS))
        except FileNotFoundError:
            continue
    if not files:
        raise HubError(f"{label}: split {split!r} has no {'/'.join(DATA_EXTENSIONS)} files "
                       f"(patterns {patterns[split]})")
    return [Path(f.removeprefix("file://")) for f in dict.fromkeys(sorted(files))]


def _text_rows(path: Path, label: str) -> list[dict[str, Any]]:
    name = path.name
    text = path.read_text(encoding="utf-8")
    if name.endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # a .json file that holds JSON lines, which `datasets` also accepts
        if isinstance(data, list):
            return data
        if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()):
            return [dict(zip(data, values, strict=True)) for values in zip(*data.values(), strict=True)]
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise HubError(f"{label}: {name} line {number}: not JSON ({exc.msg})") from None
    return rows


class SplitRows(Sequence[dict[str, Any]]):
    """The rows of one split, file after file in name order; random access."""

    def __init__(self, resolved: ResolvedRef, split: str, config: str | None = None):
        import pyarrow.parquet as pq

        self.files = _dataset_split_files(resolved, split, config)
        label = resolved.ref.label
        # each part is a list of dicts (JSON) or a pyarrow Table (Parquet, columnar)
        self._parts: list[Any] = [pq.read_table(path) if path.name.endswith(".parquet") else _text_rows(path, label)
                                  for path in self.files]
        self._starts: list[int] = []
        total = 0
        for part in self._parts:
            self._starts.append(total)
            total += part.num_rows if hasattr(part, "num_rows") else len(part)
        self._len = total

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(index)
        part = bisect.bisect_right(self._starts, index) - 1
        rows, offset = self._parts[part], index - self._starts[part]
        return rows.slice(offset, 1).to_pylist()[0] if hasattr(rows, "num_rows") else rows[offset]


def iter_dataset_rows(resolved: ResolvedRef, split: str, config: str | None = None,
                      batch_rows: int = 256) -> Iterator[dict[str, Any]]:
    """The rows of one split in order, Parquet read a batch at a time (pads read only what they use)."""
    import pyarrow.parquet as pq

    for path in _dataset_split_files(resolved, split, config):
        if path.name.endswith(".parquet"):
            for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows):
                yield from batch.to_pylist()
        else:
            yield from _text_rows(path, resolved.ref.label)

