"""One way to name and fetch a repository on ModelScope or Hugging Face.

A `HubRef` names a model or data set on one hub at one revision; `resolve` turns it into a
local folder through that hub's own client (modelscope's and huggingface_hub's
`snapshot_download`), so each library's cache folder, offline switch, resume and integrity
checks apply unchanged. `read_dataset_rows` reads a data set snapshot's split the way the
`datasets` library finds split files, which both hubs use, so the same files give the same
rows from either hub. The hub libraries are imported only when a reference is resolved.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from harness.errors import HarnessError

Hub = Literal["modelscope", "huggingface"]
RepoType = Literal["model", "dataset"]
DEFAULT_HUB: Hub = "huggingface"
PREFIXES: dict[str, Hub] = {"ms://": "modelscope", "hf://": "huggingface"}
# huggingface_hub's own switch; modelscope has none (only local_files_only), so the harness reads this one
OFFLINE_ENV: dict[Hub, str] = {"huggingface": "HF_HUB_OFFLINE", "modelscope": "MODELSCOPE_OFFLINE"}
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO_ID_RE = re.compile(rf"{_NAME}/{_NAME}")
DATA_EXTENSIONS = (".jsonl", ".json", ".parquet")
Progress = Callable[[str], None]


class HubError(HarnessError):
    """A hub reference that cannot be resolved; the message names the hub, the id and the revision."""


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def is_offline(hub: Hub) -> bool:
    also = ("TRANSFORMERS_OFFLINE",) if hub == "huggingface" else ()  # huggingface_hub reads both
    return any(_truthy(os.environ.get(name)) for name in (OFFLINE_ENV[hub], *also))


def looks_like_local_path(text: str) -> bool:
    """A model or data set named by a path, which no hub resolves."""
    return text.startswith(("/", ".", "~")) or os.path.exists(text)


@dataclass(frozen=True)
class HubRef:
    hub: Hub
    repo_id: str
    revision: str | None = None
    repo_type: RepoType = "model"

    def __str__(self) -> str:
        prefix = next(p for p, h in PREFIXES.items() if h == self.hub)
        kind = "datasets/" if self.repo_type == "dataset" else ""
        return f"{prefix}{kind}{self.repo_id}" + (f"@{self.revision}" if self.revision else "")

    @property
    def label(self) -> str:
        """How errors name this reference: `hub: org/name@revision`."""
        return f"{self.hub}: {self.repo_id}@{self.revision or 'default branch'}"

    @classmethod
    def parse(cls, value: str | Mapping[str, Any] | HubRef, *, repo_type: RepoType = "model",
              where: str = "") -> HubRef:
        """From `ms://org/name@rev`, `hf://datasets/org/name`, a bare `org/name[@rev]` (DEFAULT_HUB), or a
        mapping {hub, repo_id (or id), revision, repo_type}."""
        at = f"{where}: " if where else ""
        if isinstance(value, HubRef):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"hub", "repo_id", "id", "revision", "repo_type"})
            if unknown:
                raise HubError(f"{at}unknown hub reference field(s) {unknown} "
                               "(allowed: hub, repo_id, revision, repo_type)")
            hub, rid = value.get("hub", DEFAULT_HUB), value.get("repo_id", value.get("id"))
            revision, repo_type = value.get("revision"), value.get("repo_type", repo_type)
        elif isinstance(value, str):
            text, hub = value.strip(), DEFAULT_HUB
            for prefix, name in PREFIXES.items():
                if text.startswith(prefix):
                    text, hub = text[len(prefix):], name
            if text.startswith("datasets/"):
                text, repo_type = text[len("datasets/"):], "dataset"
            rid, _, revision = text.partition("@")
            revision = revision if _ else None
            if _ and not revision:
                raise HubError(f"{at}{value!r}: empty revision after '@'")
        else:
            raise HubError(f"{at}a hub reference must be a string or a mapping, not {type(value).__name__}")
        if hub not in get_args(Hub):
            raise HubError(f"{at}unknown hub {hub!r} (use one of: {', '.join(get_args(Hub))})")
        if repo_type not in get_args(RepoType):
            raise HubError(f"{at}unknown repo_type {repo_type!r} (use model or dataset)")
        if not isinstance(rid, str) or not _REPO_ID_RE.fullmatch(rid):
            raise HubError(f"{at}{rid!r} is not a hub repository id (expected org/name, e.g. zai-org/GLM-5.3)")
        if revision is not None and (not isinstance(revision, str) or not revision.strip()
                                     or re.search(r"\s|@|\.\.", revision)):
            raise HubError(f"{at}{revision!r} is not a revision (a commit sha, tag or branch name)")
        return cls(hub=hub, repo_id=rid, revision=revision, repo_type=repo_type)


@dataclass(frozen=True)
class ResolvedRef:
    ref: HubRef
    local_path: Path
    revision_sha: str  # HF: the commit of the snapshot; ModelScope: the revision its cache recorded
    revision_is_commit: bool  # False where the hub's cache only knows a branch or tag name


def check_trust_remote_code(ref: HubRef) -> None:
    """trust_remote_code runs the repository's Python: refuse it unless the revision is pinned."""
    why = ""
    if ref.revision is None:
        why = "no revision is pinned, so the code that runs can change between runs"
    elif ref.revision in ("main", "master"):
        why = f"{ref.revision!r} is a branch, so the code that runs can change between runs"
    elif ref.hub == "huggingface" and not COMMIT_RE.fullmatch(ref.revision):
        why = "a Hugging Face pin must be a 40-hex commit sha (branches and tags can move)"
    if why:
        raise HubError(f"{ref.label}: trust_remote_code refused: {why}; pin it as {ref.repo_id}@<commit>")


def library_cache_dir(hub: Hub) -> Path:
    """The folder each library uses when none is given (its own environment variables decide)."""
    if hub == "huggingface":
        from huggingface_hub import constants

        return Path(constants.HF_HUB_CACHE).expanduser()
    return Path(os.environ.get("MODELSCOPE_CACHE") or Path.home() / ".cache" / "modelscope").expanduser()


def repo_cache_folder(ref: HubRef, cache_dir: Path | None = None) -> Path:
    """Where the library keeps this repository inside a cache folder (all revisions)."""
    base = Path(cache_dir) if cache_dir is not None else library_cache_dir(ref.hub)
    if ref.hub == "huggingface":
        return base / f"{ref.repo_type}s--{ref.repo_id.replace('/', '--')}"
    return base / f"{ref.repo_type}s" / ref.repo_id.replace("/", "--")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:240]}" if text else type(exc).__name__


def size_text(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.1f} MiB"


class LineProgress:
    """Byte progress summed over a download's files, printed as a line at most every interval_s
    (a terminal bar never reaches a log file or a Ray driver; a line does)."""

    def __init__(self, label: str, emit: Progress, interval_s: float = 10.0):
        self.label, self.emit, self.interval_s = label, emit, interval_s
        self.done_bytes, self.total_bytes = 0, 0
        self._lock, self._start, self._last = threading.Lock(), time.monotonic(), float("-inf")

    def add_total(self, n_bytes: int) -> None:
        with self._lock:
            self.total_bytes += max(0, int(n_bytes or 0))

    def advance(self, n_bytes: int) -> None:
        with self._lock:
            self.done_bytes += int(n_bytes or 0)
            if time.monotonic() - self._last >= self.interval_s:
                self._last = time.monotonic()
                self.emit(self._line())

    def finish(self) -> None:
        if self.done_bytes:
            self.emit(self._line() + " done")

    def _line(self) -> str:
        rate = self.done_bytes / 2**20 / max(time.monotonic() - self._start, 1e-6)
        of = f" of {size_text(self.total_bytes)}" if self.total_bytes else ""
        return f"{self.label}: {size_text(self.done_bytes)}{of} ({rate:.1f} MiB/s)"


def _emitter(progress: Progress | None) -> Progress | None:
    """None on a terminal: the libraries' own bars; elsewhere lines on stderr."""
    if progress is not None or sys.stderr.isatty():
        return progress
    return lambda line: print(line, file=sys.stderr, flush=True)


def _hf_bar_class(lines: LineProgress) -> type:
    from tqdm.auto import tqdm

    class LineBar(tqdm):
        # counts bytes of the per-file bars; the xet "Downloading bytes" bar repeats them
        def __init__(self, *args: Any, **kwargs: Any):
            kwargs.pop("name", None)
            kwargs["disable"] = True
            self._counts = kwargs.get("unit") == "B" and not str(kwargs.get("desc", "")).startswith("Downloading b")
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if self._counts:
                lines.total_bytes = max(lines.total_bytes, int(self.total or 0))
                lines.advance(int(n or 0))
            return super().update(n)

    return LineBar


def _ms_callback_class(lines: LineProgress) -> type:
    class LineCallback:  # modelscope makes one per file: (filename, file_size), update(n), end()
        def __init__(self, filename: str, file_size: int):
            lines.add_total(file_size)
            self.update, self.end = lines.advance, lambda: None

    return LineCallback


def resolve(ref: HubRef | str | Mapping[str, Any], *, cache_dir: Path | str | None = None,
            offline: bool | None = None, allow_patterns: Sequence[str] | None = None,
            progress: Progress | None = None) -> ResolvedRef:
    """Local files for `ref` (downloaded unless offline); HubError in one line when that fails.

    cache_dir: the library's cache folder (default: its own, from HF_HUB_CACHE / MODELSCOPE_CACHE).
    offline: None reads HF_HUB_OFFLINE / MODELSCOPE_OFFLINE. progress: a line sink (default: the
    libraries' bars on a terminal, else lines on stderr)."""
    ref = HubRef.parse(ref)
    offline = is_offline(ref.hub) if offline is None else offline
    cache = Path(cache_dir).expanduser() if cache_dir is not None else None
    emit = _emitter(progress)
    lines = LineProgress(ref.label, emit) if emit is not None else None
    patterns = list(allow_patterns) if allow_patterns else None
    if ref.hub == "huggingface":
        resolved = _resolve_hf(ref, cache, offline, patterns, lines)
    else:
        resolved = _resolve_ms(ref, cache, offline, patterns, lines)
    if lines is not None:
        lines.finish()
    return resolved


def _offline_why(ref: HubRef, library_offline: bool = False) -> str:
    return f"{OFFLINE_ENV[ref.hub]}=1" if library_offline or is_offline(ref.hub) else "offline requested"


def _unreachable(ref: HubRef, where: Path, exc: BaseException) -> HubError:
    return HubError(f"{ref.label}: the hub cannot be reached ({_first_line(exc)}) and it is not in the "
                    f"local cache ({where})")


def _cached_or_unreachable(ref: HubRef, where: Path, exc: BaseException, from_cache: Callable[[], Any],
                           missing: tuple[type[BaseException], ...]) -> Path:
    """What the cache holds when the hub cannot be reached, with a warning; else the one-line error."""
    try:
        path = Path(from_cache())
    except missing:
        raise _unreachable(ref, where, exc) from None
    print(f"{ref.label}: the hub cannot be reached ({_first_line(exc)}); using the cached copy in {path}",
          file=sys.stderr)
    return path


def _resolve_hf(ref: HubRef, cache: Path | None, offline: bool, patterns: list[str] | None,
                lines: LineProgress | None) -> ResolvedRef:
    import httpx
    from huggingface_hub import errors, snapshot_download

    where = cache or library_cache_dir(ref.hub)
    kwargs: dict[str, Any] = {"repo_type": ref.repo_type, "revision": ref.revision, "cache_dir": cache,
                              "local_files_only": offline, "allow_patterns": patterns}
    if lines is not None:
        kwargs["tqdm_class"] = _hf_bar_class(lines)
    try:
        try:
            path = Path(snapshot_download(ref.repo_id, **kwargs))
        except httpx.TransportError as exc:  # a proxy that refuses is raised, not read as "offline"
            if offline:
                raise
            path = _cached_or_unreachable(ref, where, exc, lambda: snapshot_download(
                ref.repo_id, **{**kwargs, "local_files_only": True}), (errors.LocalEntryNotFoundError,))
    except errors.IncompleteSnapshotError as exc:
        missing = re.search(r"\d+ file\(s\) are missing \(.*?\)(?=\. )", str(exc))
        raise HubError(f"{ref.label}: the cached snapshot in {where} is incomplete and the hub cannot be used "
                       f"({missing.group(0) if missing else _first_line(exc)})") from None
    except errors.LocalEntryNotFoundError as exc:
        cause = exc.__cause__
        if offline or isinstance(cause, errors.OfflineModeIsEnabled):
            raise HubError(f"{ref.label}: not in the local cache ({where}) and offline "
                           f"({_offline_why(ref, isinstance(cause, errors.OfflineModeIsEnabled))})") from None
        raise _unreachable(ref, where, cause or exc) from None
    except errors.RevisionNotFoundError:
        raise HubError(f"{ref.label}: the hub has no such revision") from None
    except errors.RepositoryNotFoundError:
        raise HubError(f"{ref.label}: no such repository on the hub, or it is private or gated "
                       "(set HF_TOKEN for one you may read)") from None
    except (httpx.HTTPError, OSError, ValueError) as exc:
        raise HubError(f"{ref.label}: the download failed ({_first_line(exc)})") from None
    return ResolvedRef(ref, path, revision_sha=path.name, revision_is_commit=bool(COMMIT_RE.fullmatch(path.name)))


def _ms_recorded_revision(path: Path) -> str | None:
    """The revision a ModelScope cache folder records: the snapshot folder's name, or for the
    layout of SDKs up to 1.37 the `.mv` file ("Revision:<rev>,CreatedAt:<time>")."""
    if path.parent.name == "snapshots":
        return path.name
    mv = path / ".mv"
    found = re.match(r"Revision:([^,]+)", mv.read_text(encoding="utf-8").strip()) if mv.is_file() else None
    return found.group(1) if found else None


def _resolve_ms(ref: HubRef, cache: Path | None, offline: bool, patterns: list[str] | None,
                lines: LineProgress | None) -> ResolvedRef:
    import requests
    from modelscope.hub.callback import TqdmCallback
    from modelscope.hub.snapshot_download import snapshot_download
    from modelscope_hub.errors import CacheNotFound, NetworkError, NotExistError
    from modelscope_hub.errors import HubError as MsHubError

    where = cache or library_cache_dir(ref.hub)

    def download(local_only: bool) -> Path:
        callbacks = [_ms_callback_class(lines)] if lines is not None else [TqdmCallback]
        return Path(snapshot_download(repo_id=ref.repo_id, repo_type=ref.repo_type, revision=ref.revision,
                                      cache_dir=cache, local_files_only=local_only, allow_patterns=patterns,
                                      progress_callbacks=None if local_only else callbacks))

    try:
        path = download(offline)
    except CacheNotFound:
        raise HubError(f"{ref.label}: not in the local cache ({where}) and offline "
                       f"({_offline_why(ref)})") from None
    except (requests.ConnectionError, requests.Timeout, NetworkError) as exc:
        path = _cached_or_unreachable(ref, where, exc, lambda: download(True), (CacheNotFound,))
    except (requests.HTTPError, NotExistError) as exc:
        raise HubError(f"{ref.label}: {_ms_not_found(ref)} ({_first_line(exc)})") from None
    except (MsHubError, OSError, ValueError) as exc:
        raise HubError(f"{ref.label}: the download failed ({_first_line(exc)})") from None
    recorded = _ms_recorded_revision(path)
    if ref.revision and recorded and recorded != ref.revision:
        # the SDK reuses an old-layout cache folder whatever revision is asked for
        raise HubError(f"{ref.label}: the cache folder {path} holds revision {recorded}, not {ref.revision}")
    revision = recorded or ref.revision or "unknown"
    return ResolvedRef(ref, path, revision_sha=revision, revision_is_commit=bool(COMMIT_RE.fullmatch(revision)))


def _ms_not_found(ref: HubRef) -> str:
    try:
        from modelscope_hub import HubApi

        exists = HubApi().repo_exists(ref.repo_id, ref.repo_type)
    except Exception:  # the probe is only for a better message
        return "the hub has no such repository or revision"
    return "the hub has no such revision" if exists else "no such repository on the hub, or it is private"


# ---- data set rows -------------------------------------------------------------------------------------

def _card_data_files(root: Path, config: str | None) -> dict[str, list[str]] | None:
    """Split -> path patterns from the README's YAML `configs` (the data set card), if it has any."""
    import yaml

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


def dataset_split_files(resolved: ResolvedRef, split: str, config: str | None = None) -> list[Path]:
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


def _rows_of(path: Path, label: str) -> list[dict[str, Any]]:
    name = path.name
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
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


def read_dataset_rows(resolved: ResolvedRef, split: str, config: str | None = None) -> list[dict[str, Any]]:
    """Every row of one split, file after file in name order."""
    rows: list[dict[str, Any]] = []
    for path in dataset_split_files(resolved, split, config):
        rows += _rows_of(path, resolved.ref.label)
    return rows
