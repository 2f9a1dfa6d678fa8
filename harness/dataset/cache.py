"""Build a recipe into a swe_smith JSON file, cached by a hash of everything it depends on.

The file is `<recipe dir>/built/<recipe-name>-<key>.json` (datasets/built/ for the shipped
recipes; git-ignored). The key hashes the recipe, the number of conversations, the source
file's sha256 (or, for a hub data set, its hub, id, split and the revision read: a commit sha on
Hugging Face), the tokenizer fingerprint (its files' bytes), the pad inputs (the hub pad's revision
likewise) and the builder version; the file is rebuilt only when one of those changes. A hub input
pinned to a commit names its revision without a fetch, so a cached file is reused offline even where
the raw data set is not in the hub cache; an unpinned one is resolved first (its branch may have moved). The same inputs give
a byte-identical file: the metadata holds no times and no absolute paths. Files are written
atomically: an interrupted build leaves nothing under the final name.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config import LoadedRecipe
from harness.dataset.builder import TurnLengths, build_conversations
from harness.dataset.pads import make_pad_supply, pad_inputs_digest
from harness.dataset.sources import read_hub_rows, read_jsonl_rows, select_trajectories
from harness.dataset.tokenizer import Tokenizer, load_tokenizer_cached
from harness.errors import HarnessError
from harness.hub import COMMIT_RE, HubError, HubRef, ResolvedRef, resolve
from harness.io import atomic_write_bytes, json_digest, sha256_file
from harness.records import HubInputRecord

BUILDER_VERSION = 1
PROMPT_TOKENS_RULE = ("turn 1: the chat template over turn 1's messages with the generation prompt; "
                      "turn k: turn k-1 + assumed_output_length + subsequent_turn_length")


@dataclass(frozen=True)
class HubInput:
    """One hub input of a recipe (source, pad or tokenizer): what was asked and the revision read."""

    role: str
    ref: HubRef
    revision_sha: str  # Hugging Face: a commit; ModelScope: the revision its cache records
    revision_is_commit: bool
    resolved: ResolvedRef | None = None  # None: a pinned commit named the revision, nothing fetched yet

    def key(self) -> dict[str, str]:
        return {"hub": self.ref.hub, "id": self.ref.repo_id, "revision_sha": self.revision_sha}

    def record(self) -> HubInputRecord:
        return HubInputRecord(hub=self.ref.hub, id=self.ref.repo_id, repo_type=self.ref.repo_type,
                              revision=self.ref.revision, revision_sha=self.revision_sha,
                              revision_is_commit=self.revision_is_commit)

    def local(self) -> ResolvedRef:
        """The input's files (fetched now if only its pin was known)."""
        if self.resolved is not None:
            return self.resolved
        try:
            found = resolve(self.ref)
        except HubError as exc:
            raise HarnessError(f"{self.role} {exc}") from None
        if found.revision_sha != self.revision_sha:
            raise HarnessError(f"{self.role} {self.ref.label}: the hub gave revision {found.revision_sha}, "
                               f"not the pinned {self.revision_sha}")
        return found


@dataclass(frozen=True)
class BuiltDataset:
    path: Path
    conversations: int
    sha256: str  # of the file's bytes
    cached: bool
    build_s: float
    total_tokens: int  # bare tokens of every message
    inputs: tuple[HubInput, ...] = ()  # the hub inputs it was built from


def _label(path: Path | str, base: Path) -> str:
    """A path as it appears in metadata and keys: relative to the recipe's folder, POSIX style."""
    return Path(os.path.relpath(Path(path).resolve(), base.resolve())).as_posix()


def _recipe_summary(loaded: LoadedRecipe) -> dict[str, Any]:
    base = loaded.path.parent
    data = loaded.recipe.model_dump(mode="json")
    if loaded.recipe.source.path is not None:
        data["source"]["path"] = _label(loaded.recipe.source.path, base)
    data["pad"]["paths"] = [_label(p, base) for p in loaded.recipe.pad.paths]
    if Path(loaded.recipe.tokenizer.name).exists():
        data["tokenizer"]["name"] = _label(loaded.recipe.tokenizer.name, base)
    data.pop("description", None)
    return data


def _hub_input(role: str, ref: HubRef) -> HubInput:
    """The input's revision: its pin where that names it (a Hugging Face commit; ModelScope records the
    revision asked for), else what the hub resolves it to now."""
    if ref.revision is not None and (ref.hub == "modelscope" or COMMIT_RE.fullmatch(ref.revision)):
        return HubInput(role, ref, ref.revision, bool(COMMIT_RE.fullmatch(ref.revision)))
    try:
        found = resolve(ref)
    except HubError as exc:
        raise HarnessError(f"{role} {exc}") from None
    return HubInput(role, ref, found.revision_sha, found.revision_is_commit, found)


def hub_inputs(loaded: LoadedRecipe, tokenizer: Tokenizer) -> tuple[HubInput, ...]:
    """The recipe's hub inputs, each with the revision a build reads."""
    r = loaded.recipe
    out = [_hub_input(role, ref) for role, ref in (("source", r.source_ref()), ("pad", r.pad_ref()))
           if ref is not None]
    if tokenizer.origin is not None:
        origin = tokenizer.origin
        out.append(HubInput("tokenizer", origin.ref, origin.revision_sha, origin.revision_is_commit, origin))
    return tuple(out)


def _input(inputs: tuple[HubInput, ...], role: str) -> HubInput | None:
    return next((i for i in inputs if i.role == role), None)


def cache_key_material(loaded: LoadedRecipe, number: int, tokenizer: Tokenizer,
                       inputs: tuple[HubInput, ...]) -> dict[str, Any]:
    """Everything the built file depends on (hashed into the key)."""
    r = loaded.recipe
    source = _input(inputs, "source")
    source_part = ({"kind": "hub", **source.key(), "split": r.source.split} if source is not None
                   else {"kind": r.source.kind, "sha256": sha256_file(r.source.path)})
    pad = _input(inputs, "pad")
    return {"builder_version": BUILDER_VERSION, "recipe": _recipe_summary(loaded), "number": number,
            "source": source_part, "tokenizer": tokenizer.fingerprint,
            "pad": pad_inputs_digest(r.pad.kind, list(r.pad.paths), r.pad.split, r.pad.field),
            **({"pad_source": pad.key()} if pad is not None else {})}


def cache_key(loaded: LoadedRecipe, number: int, tokenizer: Tokenizer, inputs: tuple[HubInput, ...] = ()) -> str:
    material = cache_key_material(loaded, number, tokenizer, inputs)
    return json_digest(material)


def _cache_path(loaded: LoadedRecipe, key: str) -> Path:
    return loaded.path.parent / "built" / f"{loaded.recipe.name}-{key}.json"


def read_metadata(path: Path) -> dict[str, Any]:
    """The metadata object at the head of a built file, without parsing the conversations."""
    with Path(path).open("rb") as fh:
        head = fh.read(1 << 20)
    text = head.decode("utf-8", errors="ignore")
    prefix = '{"metadata":'
    if text.startswith(prefix):
        try:
            meta, _ = json.JSONDecoder().raw_decode(text, len(prefix))
            if isinstance(meta, dict):
                return meta
        except json.JSONDecodeError:
            pass
    try:
        data = json.loads(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise HarnessError(f"{path}: not a built dataset ({str(exc).splitlines()[0][:120]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("metadata"), dict):
        raise HarnessError(f"{path}: not a built dataset (no metadata object)")
    return data["metadata"]


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="conv", desc="building dataset", file=sys.stderr, leave=False)


def _build_bytes(loaded: LoadedRecipe, number: int, tokenizer: Tokenizer, key: str,
                progress: bool = False, on_progress=None, inputs: tuple[HubInput, ...] = ()) -> tuple[bytes, int]:
    """The file's bytes and its total bare tokens."""
    r = loaded.recipe
    base = loaded.path.parent
    lengths = TurnLengths(first_turn=r.first_turn_length, subsequent_turn=r.subsequent_turn_length,
                          num_turns=r.num_turns, max_real_first_turn_frac=r.max_real_first_turn_frac,
                          assumed_output=r.assumed_output_length)
    lengths.check()
    source, pad = _input(inputs, "source"), _input(inputs, "pad")
    if r.source.kind == "hub":
        if source is None:
            raise HarnessError(f"source {r.source.id}: a hub source needs its revision resolved first")
        rows = read_hub_rows(source.local(), r.source.split)
        label = source.ref.label
    else:
        label = _label(r.source.path, base)
        rows = read_jsonl_rows(r.source.path, label)
    selection = select_trajectories(rows, number, r.seed, r.source.only_resolved, label)
    pads = make_pad_supply(r.pad.kind, tokenizer, r.seed, list(r.pad.paths), pad.local() if pad else None,
                           r.pad.split, r.pad.field, path_label=lambda p: _label(p, base))
    bar = _progress_bar(number, progress)

    def step(done: int) -> None:
        if bar is not None:
            bar.update(done)
        if on_progress is not None:
            on_progress(done)

    try:
        result = build_conversations(tokenizer, lengths, pads, selection.trajectories, on_progress=step)
    finally:
        if bar is not None:
            bar.close()
    body = json.dumps(result.conversations, ensure_ascii=False, separators=(",", ":"))
    metadata = {
        "format": "swe_smith",
        "builder": f"harness.dataset v{BUILDER_VERSION}",
        "cache_key": key,
        "recipe": _recipe_summary(loaded),
        "conversations": len(result.conversations),
        "num_turns": r.num_turns,
        "first_turn_length": r.first_turn_length,
        "subsequent_turn_length": r.subsequent_turn_length,
        "assumed_output_length": r.assumed_output_length,
        "length_unit": "bare tokens of each message's content (no chat template, no special tokens)",
        "prompt_tokens": PROMPT_TOKENS_RULE,
        "prompt_tokens_method": result.stats.prompt_tokens_method,
        "total_tokens": result.total_tokens,
        "tokenizer": {"name": _recipe_summary(loaded)["tokenizer"]["name"], "fingerprint": tokenizer.fingerprint,
                      **({"hub": inp.record().model_dump(mode="json")} if (inp := _input(inputs, "tokenizer"))
                         else {})},
        "hub_inputs": {i.role: i.record().model_dump(mode="json") for i in inputs},
        "source": {"kind": r.source.kind, **rows.provenance, "only_resolved": r.source.only_resolved,
                   "distinct_trajectories": selection.distinct, "reused": selection.distinct < number},
        "pad": pads.metadata(),
        "turns": {"later_with_real_text": result.stats.real_turns,
                  "later_topped_up_with_pad": result.stats.topped_up_turns,
                  "later_pad_only": result.stats.pad_only_turns, "refits": result.stats.refits},
        "trajectory_ids": result.trajectory_ids,
        "content_sha256": hashlib.sha256(body.encode("utf-8")).hexdigest(),
    }
    text = '{"metadata":' + json.dumps(metadata, ensure_ascii=False, sort_keys=True) + ',"conversations":' + body + "}\n"
    return text.encode("utf-8"), result.total_tokens


def ensure_built(loaded: LoadedRecipe, min_conversations: int, progress: bool = True,
                 out: Path | None = None) -> BuiltDataset:
    """The recipe's dataset with max(recipe.conversations, min_conversations) conversations, built if needed."""
    started = time.perf_counter()
    if out is not None:
        out = Path(out)
        if not out.parent.is_dir():
            raise HarnessError(f"output folder {out.parent} does not exist")
        if out.is_dir():
            raise HarnessError(f"output {out} is a folder; give a file name")
    r = loaded.recipe
    number = max(r.conversations, min_conversations)
    tokenizer = load_tokenizer_cached(r.tokenizer.name, r.tokenizer.trust_remote_code, r.tokenizer.revision, r.hub)
    inputs = hub_inputs(loaded, tokenizer)
    key = cache_key(loaded, number, tokenizer, inputs)
    cached_file = _cache_path(loaded, key)
    target = out if out is not None else cached_file

    for candidate in (target, cached_file):
        if candidate.is_file():
            try:
                meta = read_metadata(candidate)
            except HarnessError:
                continue
            if meta.get("cache_key") != key:
                continue
            data = candidate.read_bytes()
            if candidate != target:
                atomic_write_bytes(target, data)
            return BuiltDataset(path=target, conversations=int(meta["conversations"]),
                                sha256=hashlib.sha256(data).hexdigest(), cached=True,
                                build_s=time.perf_counter() - started, total_tokens=int(meta["total_tokens"]),
                                inputs=inputs)

    data, total_tokens = _build_bytes(loaded, number, tokenizer, key, progress=progress, inputs=inputs)
    atomic_write_bytes(cached_file, data)
    if target != cached_file:
        atomic_write_bytes(target, data)
    return BuiltDataset(path=target, conversations=number, sha256=hashlib.sha256(data).hexdigest(), cached=False,
                        build_s=time.perf_counter() - started, total_tokens=total_tokens, inputs=inputs)
