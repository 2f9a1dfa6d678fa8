"""Pad text: disjoint spans of a token pool, so that no two conversations share a prefix.

Kinds (docs/facts.md §5): `openscience` (nvidia/OpenScienceReasoning-2, field `output`, from
ModelScope or Hugging Face through harness/hub.py, rows read in order as they are needed), `local` (text files), `synthetic` (generated from the seed). The first two feed a
`TextPool`: documents are cleaned (``<think>`` markup, chat-control spellings and the
tokenizer's special tokens removed), joined, encoded once as one stream, and each pad slot
takes the next span of it, cut at safe boundaries (harness.dataset.boundaries) so the span's
token count is known without encoding it again. When the pool runs out, the remaining
slots are synthetic and the metadata says from which slot on.

Synthetic pad is a sequence of phrases drawn from a fixed lexicon whose token counts are
measured once; each phrase starts at a safe boundary, so a slot's count is the sum.
"""

from __future__ import annotations

import bisect
import hashlib
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.dataset.boundaries import is_safe_boundary
from harness.dataset.sources import hub_provenance
from harness.dataset.tokenizer import Tokenizer
from harness.errors import HarnessError
from harness.hub import HubError, ResolvedRef
from harness.hub_rows import iter_dataset_rows

_THINK = re.compile(r"</?think>", re.IGNORECASE)
# Chat-control spellings of the common templates (ChatML, Llama 3, GLM), whatever the tokenizer.
_CONTROL = re.compile(r"<\|[A-Za-z0-9_:./-]{1,64}\|>|\[gMASK\]|\[sMASK\]|\[MASK\]|<sop>|<eop>|</?s>|<unk>|<pad>")
_BLANK_RUNS = re.compile(r"\n{3,}")
_ENCODE_CHUNK_CHARS = 64_000


def special_token_strings(tokenizer: Tokenizer) -> list[str]:
    decoder = tokenizer.backend.get_added_tokens_decoder()
    return sorted({tok.content for tok in decoder.values() if tok.special and tok.content}, key=len, reverse=True)


def clean_pad_text(text: str, special_tokens: Iterable[str] = ()) -> str:
    text = _THINK.sub("", text)
    text = _CONTROL.sub("", text)
    for token in special_tokens:
        text = text.replace(token, "")
    return _BLANK_RUNS.sub("\n\n", text).strip()


# ---------------------------------------------------------------- synthetic

_SYLLABLES = ("ka ro mi ten vel dor sa lin qua ter no phi zen mar tor el cy ad um bri gal fen ox ply sto rix "
              "ven ul ja wen tho pra dun mel sik ore an is ta ne lo ri be cu").split()
_WORDS = ("the of and in to a is that for on with as by at from this which are be it an was or its "
          "energy reaction sample field model system value rate phase state wave mass heat charge force "
          "cell gene protein orbit light signal density pressure volume surface layer matrix vector "
          "because therefore however then thus so if when while since given where").split()
_LEXICON_SEED = "harness-synthetic-pad-lexicon-v1"
_LEXICON_SIZE = 4096


def _lexicon_phrases() -> list[str]:
    rng = random.Random(_LEXICON_SEED)
    phrases = []
    for _ in range(_LEXICON_SIZE):
        words = []
        for _w in range(rng.randint(1, 6)):
            if rng.random() < 0.55:
                words.append(rng.choice(_WORDS))
            else:
                words.append("".join(rng.choice(_SYLLABLES) for _s in range(rng.randint(1, 3))))
            if rng.random() < 0.08:
                words.append(str(rng.randint(0, 9999)))
        if rng.random() < 0.2:
            words[0] = words[0].capitalize()
        phrase = " " + " ".join(words) + rng.choice(["", "", "", ",", ".", ";", ":"])
        phrases.append(phrase)
    return phrases


class SyntheticPad:
    """Deterministic pad text from the seed: phrase sequences with counts known in advance."""

    def __init__(self, tokenizer: Tokenizer, seed: int):
        self.seed = seed
        self.tokenizer = tokenizer
        phrases = sorted(set(_lexicon_phrases()))
        counts = tokenizer.count_bare_batch(phrases)
        # sorted by count so "every phrase with at most r tokens" is a prefix of the list
        order = sorted(range(len(phrases)), key=lambda i: (counts[i], phrases[i]))
        self.phrases = [phrases[i] for i in order]
        self.counts = [counts[i] for i in order]
        self.max_count = self.counts[-1]
        if self.counts[0] != 1:
            raise HarnessError(f"tokenizer {tokenizer.name}: no one-token word for synthetic pad filling")

    def take(self, n_tokens: int, slot: str) -> str:
        """Exactly n tokens (predicted) of phrases drawn with the slot's own random stream."""
        rng = random.Random(f"{self.seed}/{slot}")
        all_indices = range(len(self.phrases))
        chosen: list[int] = []
        remaining = n_tokens
        while remaining >= 2 * self.max_count:
            batch = rng.choices(all_indices, k=remaining // self.max_count)
            chosen.extend(batch)
            remaining -= sum(self.counts[i] for i in batch)
        while remaining > 0:
            fits = bisect.bisect_right(self.counts, remaining)
            i = rng.randrange(fits)
            chosen.append(i)
            remaining -= self.counts[i]
        return "".join([self.phrases[i] for i in chosen])


def _code_word(ordinal: int) -> str:
    """A capitalised pseudo-word naming a pad slot, least significant syllable first.

    Text pools repeat themselves (two spans can both start "Okay, so the"); this word makes
    every slot's first tokens its own, which is what keeps conversations from sharing a prefix.
    """
    syllables = []
    while True:
        ordinal, digit = divmod(ordinal, len(_SYLLABLES))
        syllables.append(_SYLLABLES[digit])
        if ordinal == 0:
            return " " + "".join(syllables).capitalize()


# ---------------------------------------------------------------- text pools

class TextPool:
    """A stream of cleaned documents, encoded lazily; `take(n)` returns the next n-token span."""

    def __init__(self, tokenizer: Tokenizer, documents: Iterator[str]):
        self.tokenizer = tokenizer
        self._documents = documents
        self._text = ""  # encoded text still in the window
        self._starts: list[int] = []  # token start offsets into _text
        self._safe: list[bool] = []
        self._cursor = 0  # next unused token
        self._pending = ""  # text read but not yet encoded
        self.documents_used = 0
        self.exhausted = False

    def _fill(self) -> bool:
        """Encode more of the stream; False when the documents are used up and nothing is left."""
        docs_left = True
        while len(self._pending) < 4 * _ENCODE_CHUNK_CHARS:
            doc = next(self._documents, None)
            if doc is None:
                docs_left = False
                break
            if doc:
                self._pending += doc if not (self._pending or self._text) else "\n\n" + doc
                self.documents_used += 1
        # chunks end at safe boundaries, so encoding them separately equals encoding the stream
        chunks = []
        rest = self._pending
        while len(rest) > _ENCODE_CHUNK_CHARS:
            cut = self._safe_cut(rest)
            if cut <= 0:
                break
            chunks.append(rest[:cut])
            rest = rest[cut:]
        if not docs_left and rest:
            chunks.append(rest)
            rest = ""
        self._pending = rest
        if not chunks:
            return False
        for chunk, enc in zip(chunks, self.tokenizer.backend.encode_batch(chunks, add_special_tokens=False),
                              strict=True):
            base = len(self._text)
            self._text += chunk
            self._starts.extend(base + start for start, _ in enc.offsets)
        text = self._text
        self._safe.extend(is_safe_boundary(text, s) for s in self._starts[len(self._safe):])
        return True

    @staticmethod
    def _safe_cut(text: str) -> int:
        i = min(len(text) - 2, _ENCODE_CHUNK_CHARS)
        while i > 0 and not is_safe_boundary(text, i):
            i -= 1
        return i

    def _compact(self) -> None:
        if self._cursor < 200_000:
            return
        drop = self._starts[self._cursor]
        self._text = self._text[drop:]
        self._starts = [s - drop for s in self._starts[self._cursor:]]
        self._safe = self._safe[self._cursor:]
        self._cursor = 0

    def take(self, n_tokens: int) -> str | None:
        """The next span of exactly n tokens (predicted), starting and ending at safe boundaries."""
        if self.exhausted:
            return None
        p = self._cursor
        while True:
            end = len(self._starts) - 1  # starts[p + n] must exist: the span ends where that token starts
            while p + n_tokens <= end and not (self._safe[p] and self._safe[p + n_tokens]):
                p += 1
            if p + n_tokens <= end:
                span = self._text[self._starts[p]:self._starts[p + n_tokens]]
                self._cursor = p + n_tokens
                self._compact()
                return span
            if not self._fill():
                self.exhausted = True
                return None


def _local_documents(paths: list[Path], special: list[str]) -> Iterator[str]:
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise HarnessError(f"pad file {path}: cannot read: {exc}") from None
        for block in text.split("\n\n"):
            cleaned = clean_pad_text(block, special)
            if cleaned:
                yield cleaned


def _hub_documents(resolved: ResolvedRef, split: str, field_name: str, special: list[str]) -> Iterator[str]:
    label = resolved.ref.label
    try:
        for row in iter_dataset_rows(resolved, split):
            value = row.get(field_name) if isinstance(row, dict) else None
            if value is None:
                raise HarnessError(f"pad {label}: rows have no field {field_name!r}")
            cleaned = clean_pad_text(str(value), special)
            if cleaned:
                yield cleaned
    except HubError as exc:
        raise HarnessError(f"pad {exc}") from None


@dataclass
class PadSupply:
    """Hands out pad text per slot: from the pool while it lasts, then synthetic."""

    kind: str
    synthetic: SyntheticPad
    pool: TextPool | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    slots: int = 0
    fallback_slots: int = 0
    first_fallback_slot: int | None = None

    def take(self, n_tokens: int, slot: str) -> str:
        """n tokens (predicted) of pad, led by a code word naming the slot so no two slots share a prefix."""
        ordinal = self.slots
        self.slots += 1
        if n_tokens <= 0:
            return ""
        lead = _code_word(ordinal)
        lead_tokens = self.synthetic.tokenizer.count_bare(lead)
        if lead_tokens >= n_tokens:
            lead, lead_tokens = "", 0
        n_tokens -= lead_tokens
        if self.pool is not None and not self.pool.exhausted:
            span = self.pool.take(n_tokens)
            if span is not None:
                return lead + span
        if self.pool is not None:
            self.fallback_slots += 1
            if self.first_fallback_slot is None:
                self.first_fallback_slot = ordinal
        return lead + self.synthetic.take(n_tokens, slot)

    def metadata(self) -> dict[str, Any]:
        out = {"kind": self.kind, **self.provenance, "slots": self.slots}
        if self.pool is not None:
            out["documents_used"] = self.pool.documents_used
            out["fallback_synthetic_slots"] = self.fallback_slots
            out["first_fallback_slot"] = self.first_fallback_slot
            out["pool_exhausted"] = self.pool.exhausted
        return out


def pad_inputs_digest(kind: str, paths: list[Path], split: str, field_name: str) -> str:
    """What the pad depends on, for the cache key: file bytes for local pads; split and field for the
    hub pad (its hub, id and revision go into the key beside this: dataset/cache.py)."""
    digest = hashlib.sha256(kind.encode())
    if kind == "local":
        for path in paths:
            digest.update(hashlib.sha256(Path(path).read_bytes()).digest())
    elif kind == "openscience":
        digest.update(f"{split}\0{field_name}".encode())
    return digest.hexdigest()


def make_pad_supply(kind: str, tokenizer: Tokenizer, seed: int, paths: list[Path], hub_source: ResolvedRef | None,
                    split: str, field_name: str, path_label=str) -> PadSupply:
    synthetic = SyntheticPad(tokenizer, seed)
    if kind == "synthetic":
        return PadSupply(kind=kind, synthetic=synthetic, provenance={"generator": _LEXICON_SEED,
                                                                     "slot_lead": "code word per slot"})
    special = special_token_strings(tokenizer)
    if kind == "local":
        docs = _local_documents(list(paths), special)
        provenance = {"files": [{"path": path_label(p), "sha256": hashlib.sha256(Path(p).read_bytes()).hexdigest()}
                                for p in paths]}
    elif kind == "openscience":
        if hub_source is None:
            raise HarnessError("pad kind openscience needs its hub data set resolved")
        docs = _hub_documents(hub_source, split, field_name, special)
        provenance = {**hub_provenance(hub_source), "split": split, "field": field_name}
    else:
        raise HarnessError(f"unknown pad kind {kind!r}")
    provenance["slot_lead"] = "code word per slot"
    return PadSupply(kind=kind, synthetic=synthetic, pool=TextPool(tokenizer, docs), provenance=provenance)
