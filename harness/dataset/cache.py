"""Build a recipe into a swe_smith JSON file, cached by a hash of everything it depends on.

The file is `<recipe dir>/built/<recipe-name>-<key>.json` (datasets/built/ for the shipped
recipes; git-ignored). The key hashes the recipe, the number of conversations, the source
file's sha256 (or hub id and split), the tokenizer fingerprint, the pad inputs and the
builder version; the file is rebuilt only when one of those changes. The same inputs give
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
from harness.io import atomic_write_bytes, sha256_file

BUILDER_VERSION = 1
PROMPT_TOKENS_RULE = ("turn 1: the chat template over turn 1's messages with the generation prompt; "
                      "turn k: turn k-1 + assumed_output_length + subsequent_turn_length")


@dataclass(frozen=True)
class BuiltDataset:
    path: Path
    conversations: int
    sha256: str  # of the file's bytes
    cached: bool
    build_s: float
    total_tokens: int  # bare tokens of every message


def _label(path: Path | str, base: Path) -> str:
    """A path as it appears in metadata and keys: relative to the recipe's folder, POSIX style."""
    return Path(os.path.relpath(Path(path).resolve(), base.resolve())).as_posix()


def recipe_summary(loaded: LoadedRecipe) -> dict[str, Any]:
    base = loaded.path.parent
    data = loaded.recipe.model_dump(mode="json")
    if loaded.recipe.source.path is not None:
        data["source"]["path"] = _label(loaded.recipe.source.path, base)
    data["pad"]["paths"] = [_label(p, base) for p in loaded.recipe.pad.paths]
    if Path(loaded.recipe.tokenizer.name).exists():
        data["tokenizer"]["name"] = _label(loaded.recipe.tokenizer.name, base)
    data.pop("description", None)
    return data


def _source_digest(loaded: LoadedRecipe) -> str:
    source = loaded.recipe.source
    if source.kind == "hub":
        return hashlib.sha256(f"hub\0{source.id}\0{source.split}".encode()).hexdigest()
    return sha256_file(source.path)


def cache_key(loaded: LoadedRecipe, number: int, tokenizer: Tokenizer) -> str:
    r = loaded.recipe
    pad_digest = pad_inputs_digest(r.pad.kind, list(r.pad.paths), r.pad.id, r.pad.split, r.pad.field)
    material = {"builder_version": BUILDER_VERSION, "recipe": recipe_summary(loaded), "number": number,
                "source": _source_digest(loaded), "tokenizer": tokenizer.fingerprint, "pad": pad_digest}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def cache_path(loaded: LoadedRecipe, key: str) -> Path:
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


def build_bytes(loaded: LoadedRecipe, number: int, tokenizer: Tokenizer, key: str,
                progress: bool = False, on_progress=None) -> tuple[bytes, int]:
    """The file's bytes and its total bare tokens."""
    r = loaded.recipe
    base = loaded.path.parent
    lengths = TurnLengths(first_turn=r.first_turn_length, subsequent_turn=r.subsequent_turn_length,
                          num_turns=r.num_turns, max_real_first_turn_frac=r.max_real_first_turn_frac,
                          assumed_output=r.assumed_output_length)
    lengths.check()
    if r.source.kind == "hub":
        rows = read_hub_rows(r.source.id or "", r.source.split)
        label = r.source.id or ""
    else:
        label = _label(r.source.path, base)
        rows = read_jsonl_rows(r.source.path, label)
    selection = select_trajectories(rows, number, r.seed, r.source.only_resolved, label)
    pads = make_pad_supply(r.pad.kind, tokenizer, r.seed, list(r.pad.paths), r.pad.id, r.pad.split, r.pad.field,
                           path_label=lambda p: _label(p, base))
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
        "recipe": recipe_summary(loaded),
        "conversations": len(result.conversations),
        "num_turns": r.num_turns,
        "first_turn_length": r.first_turn_length,
        "subsequent_turn_length": r.subsequent_turn_length,
        "assumed_output_length": r.assumed_output_length,
        "length_unit": "bare tokens of each message's content (no chat template, no special tokens)",
        "prompt_tokens": PROMPT_TOKENS_RULE,
        "prompt_tokens_method": result.stats.prompt_tokens_method,
        "total_tokens": result.total_tokens,
        "tokenizer": {"name": recipe_summary(loaded)["tokenizer"]["name"], "fingerprint": tokenizer.fingerprint},
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
    tokenizer = load_tokenizer_cached(r.tokenizer.name, r.tokenizer.trust_remote_code)
    key = cache_key(loaded, number, tokenizer)
    cached_file = cache_path(loaded, key)
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
                                build_s=time.perf_counter() - started, total_tokens=int(meta["total_tokens"]))

    data, total_tokens = build_bytes(loaded, number, tokenizer, key, progress=progress)
    atomic_write_bytes(cached_file, data)
    if target != cached_file:
        atomic_write_bytes(target, data)
    return BuiltDataset(path=target, conversations=number, sha256=hashlib.sha256(data).hexdigest(), cached=False,
                        build_s=time.perf_counter() - started, total_tokens=total_tokens)
