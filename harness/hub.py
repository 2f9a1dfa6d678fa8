"""One way to fetch a repository from ModelScope or Hugging Face.

A `HubRef` (harness/config/hubref.py) names a model or data set on one hub at one revision;
`resolve` turns it into a local folder through that hub's own client (modelscope's and
huggingface_hub's `snapshot_download`), so each library's cache folder, offline switch, proxy
settings, resume and integrity checks apply unchanged. harness/hub_rows.py reads a data set
snapshot's rows. The hub libraries are imported only when a reference is resolved.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config.hubref import (
    COMMIT_RE,
    DEFAULT_HUB,
    PREFIXES,
    Hub,
    HubError,
    HubRef,
    RepoType,
    check_trust_remote_code,
    is_hub_reference,
    looks_like_local_path,
)

__all__ = ["COMMIT_RE", "DEFAULT_HUB", "OFFLINE_ENV", "PREFIXES", "Hub", "HubError", "HubRef", "LineProgress",
           "Progress", "RepoType", "ResolvedRef", "check_trust_remote_code", "is_hub_reference", "is_offline",
           "library_cache_dir", "looks_like_local_path", "repo_cache_folder", "resolve", "size_text"]

# huggingface_hub's own switch; modelscope has none (only local_files_only), so the harness reads this one
OFFLINE_ENV: dict[Hub, str] = {"huggingface": "HF_HUB_OFFLINE", "modelscope": "MODELSCOPE_OFFLINE"}
Progress = Callable[[str], None]


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def is_offline(hub: Hub) -> bool:
    also = ("TRANSFORMERS_OFFLINE",) if hub == "huggingface" else ()  # huggingface_hub reads both
    return any(_truthy(os.environ.get(name)) for name in (OFFLINE_ENV[hub], *also))


@dataclass(frozen=True)
class ResolvedRef:
    ref: HubRef
    local_path: Path
    revision_sha: str  # HF: the commit of the snapshot; ModelScope: the revision its cache recorded
    revision_is_commit: bool  # False where the hub's cache only knows a branch or tag name


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
