"""How a model or data set on ModelScope or Hugging Face is named: `HubRef`, and the default hub.

This is the pure part of the hub layer (no hub client is imported): the config schemas validate
references and `trust_remote_code` pins with it when a file is loaded, and harness/hub.py resolves
the same `HubRef` to local files. DEFAULT_HUB is set here and nowhere else.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from harness.errors import HarnessError

Hub = Literal["modelscope", "huggingface"]
RepoType = Literal["model", "dataset"]
DEFAULT_HUB: Hub = "huggingface"
PREFIXES: dict[str, Hub] = {"ms://": "modelscope", "hf://": "huggingface"}
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO_ID_RE = re.compile(rf"{_NAME}/{_NAME}")


class HubError(HarnessError):
    """A hub reference that cannot be resolved; the message names the hub, the id and the revision."""


def looks_like_local_path(text: str) -> bool:
    """A model or data set named by a path, which no hub resolves."""
    return text.startswith(("/", ".", "~")) or os.path.exists(text)


def is_hub_reference(text: str) -> bool:
    """`ms://...`, `hf://...` or a bare `org/name[@rev]`: what the hub layer resolves."""
    return text.startswith(tuple(PREFIXES)) or (not looks_like_local_path(text)
                                                and bool(_REPO_ID_RE.fullmatch(text.partition("@")[0])))


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
              where: str = "", default_hub: Hub | None = None, revision: str | None = None) -> HubRef:
        """From `ms://org/name@rev`, `hf://datasets/org/name`, a bare `org/name[@rev]` (default_hub,
        else DEFAULT_HUB), or a mapping {hub, repo_id (or id), revision, repo_type}. `revision` is a
        separate pin (a config's `revision:` field); it must agree with one written after `@`."""
        at = f"{where}: " if where else ""
        hub_default: Hub = default_hub or DEFAULT_HUB
        if isinstance(value, HubRef):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"hub", "repo_id", "id", "revision", "repo_type"})
            if unknown:
                raise HubError(f"{at}unknown hub reference field(s) {unknown} "
                               "(allowed: hub, repo_id, revision, repo_type)")
            hub, rid = value.get("hub", hub_default), value.get("repo_id", value.get("id"))
            written, repo_type = value.get("revision"), value.get("repo_type", repo_type)
        elif isinstance(value, str):
            text, hub = value.strip(), hub_default
            for prefix, name in PREFIXES.items():
                if text.startswith(prefix):
                    text, hub = text[len(prefix):], name
            if text.startswith("datasets/"):
                text, repo_type = text[len("datasets/"):], "dataset"
            rid, has_at, written = text.partition("@")
            if has_at and not written:
                raise HubError(f"{at}{value!r}: empty revision after '@'")
            written = written if has_at else None
        else:
            raise HubError(f"{at}a hub reference must be a string or a mapping, not {type(value).__name__}")
        if revision is not None and written is not None and revision != written:
            raise HubError(f"{at}{value!r} pins revision {written!r} but revision is {revision!r}; write one")
        revision = written if written is not None else revision
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
