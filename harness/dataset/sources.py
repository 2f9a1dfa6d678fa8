"""Agent trajectories in the nebius/SWE-rebench-openhands-trajectories schema, normalised.

Normalisation is the blog builder's (docs/facts.md §5): `tool` messages become `user`
messages, list-of-blocks content is flattened to its text parts, empty messages and every
other role are dropped. Only the user side is kept: the first user message is the task
(issue text), the later ones (tool outputs) feed turns 2..N. Assistant turns are not
needed: at benchmark time EvalScope puts the server's real replies in their place.

Rows come from a hub data set (ModelScope or Hugging Face, through harness/hub.py; the split's
files read by harness/hub_rows.py), a JSONL file in the same schema, or the shipped sample (a
JSONL file). A row's messages are read from `trajectory` (a list, or
a JSON string of one) or, failing that, `messages`.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.hub import HubError, ResolvedRef
from harness.hub_rows import SplitRows


@dataclass(frozen=True)
class Trajectory:
    trajectory_id: str
    user_messages: tuple[str, ...]  # after normalisation; [0] is the task


@dataclass
class SourceRows:
    """Raw rows, random access, plus what they are for provenance."""

    rows: Sequence[Any]
    provenance: dict[str, Any] = field(default_factory=dict)


def _flatten_content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type", "text") == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
        return "\n".join(p for p in parts if p)
    return str(content)


def normalise_messages(messages: Sequence[Any]) -> list[dict[str, str]]:
    """tool -> user, content flattened, empty messages and roles other than system/user/assistant dropped."""
    out = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "tool":
            role = "user"
        if role not in ("system", "user", "assistant"):
            continue
        content = _flatten_content(message.get("content"))
        if content.strip():
            out.append({"role": role, "content": content})
    return out


def _row_messages(row: Any) -> list[Any] | None:
    if not isinstance(row, dict):
        return None
    raw = row.get("trajectory")
    if raw is None:
        raw = row.get("messages")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            return None
    return raw if isinstance(raw, list) else None


def trajectory_from_row(row: Any, index: int, only_resolved: bool) -> Trajectory | None:
    """A usable trajectory (at least one user message), or None."""
    if only_resolved and not (isinstance(row, dict) and row.get("resolved")):
        return None
    raw = _row_messages(row)
    if raw is None:
        return None
    users = tuple(m["content"] for m in normalise_messages(raw) if m["role"] == "user")
    if not users:
        return None
    rid = row.get("trajectory_id") or row.get("instance_id") or f"row-{index}"
    return Trajectory(trajectory_id=str(rid), user_messages=users)


def read_jsonl_rows(path: Path, label: str) -> SourceRows:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise HarnessError(f"source {label}: cannot read: {exc.strerror or exc}") from None
    rows = []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise HarnessError(f"source {label}: line {number}: not JSON ({exc.msg})") from None
    return SourceRows(rows=rows, provenance={"path": label, "sha256": hashlib.sha256(data).hexdigest(),
                                             "rows": len(rows)})


def hub_provenance(resolved: ResolvedRef) -> dict[str, Any]:
    """What a hub input is, for a built file's metadata: hub, id, the revision asked for and the one used."""
    ref = resolved.ref
    return {"hub": ref.hub, "id": ref.repo_id, "revision": ref.revision, "revision_sha": resolved.revision_sha,
            "revision_is_commit": resolved.revision_is_commit}


def read_hub_rows(resolved: ResolvedRef, split: str) -> SourceRows:
    """The rows of a resolved hub data set's split (random access; Parquet rows are made on demand)."""
    try:
        rows = SplitRows(resolved, split)
    except HubError as exc:
        raise HarnessError(f"source {exc}") from None
    root = resolved.local_path
    return SourceRows(rows=rows, provenance={**hub_provenance(resolved), "split": split, "rows": len(rows),
                                             "files": [f.relative_to(root).as_posix() for f in rows.files]})


@dataclass(frozen=True)
class Selection:
    trajectories: list[Trajectory]  # one per conversation, in conversation order
    distinct: int  # how many different trajectories that is
    scanned: int  # rows looked at


def select_trajectories(source: SourceRows, number: int, seed: int, only_resolved: bool, label: str) -> Selection:
    """`number` trajectories in a seeded order; with fewer usable rows, they are reused in turn."""
    order = list(range(len(source.rows)))
    random.Random(seed).shuffle(order)
    usable: list[Trajectory] = []
    scanned = 0
    for index in order:
        scanned += 1
        trajectory = trajectory_from_row(source.rows[index], index, only_resolved)
        if trajectory is not None:
            usable.append(trajectory)
            if len(usable) >= number:
                break
    if not usable:
        why = " with resolved set" if only_resolved else ""
        raise HarnessError(f"source {label}: no usable trajectory{why} among {len(source.rows)} rows "
                           "(each needs at least one user or tool message with text)")
    chosen = [usable[i % len(usable)] for i in range(number)]
    return Selection(trajectories=chosen, distinct=len(usable), scanned=scanned)
