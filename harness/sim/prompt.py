"""Chat messages -> what the engine needs of a prompt: its token count (the tokenizer's chat template,
as vLLM counts) and one hash per full 64-token block covering the whole prefix, for prefix caching.

Block hashes come from per-message segments (a message's bare token count, keyed by its role and text)
so that a conversation's next turn, which repeats the earlier messages, hits the same blocks.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from harness.dataset.tokenizer import Tokenizer


@dataclass(frozen=True)
class PromptShape:
    tokens: int
    block_hashes: tuple[int, ...]


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True)


def _digest(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(p)
        h.update(b"\0")
    return h.digest()


class PromptMeasurer:
    def __init__(self, tokenizer: Tokenizer, block_size: int, cache_entries: int = 4096):
        self.tokenizer = tokenizer
        self.block_size = block_size
        self._counts: OrderedDict[bytes, int] = OrderedDict()
        self._cache_entries = cache_entries

    def _segment(self, message: dict[str, Any]) -> tuple[bytes, int]:
        text = _text(message.get("content") or "")
        key = _digest(str(message.get("role", "")).encode(), text.encode())
        n = self._counts.get(key)
        if n is None:
            n = self.tokenizer.count_bare(text) + 2  # the role marker and its newline
            self._counts[key] = n
            if len(self._counts) > self._cache_entries:
                self._counts.popitem(last=False)
        else:
            self._counts.move_to_end(key)
        return key, n

    def measure(self, messages: list[dict[str, Any]]) -> PromptShape:
        total = self.tokenizer.count_chat(messages)
        segments = [self._segment(m) for m in messages]
        rest = total - sum(n for _, n in segments)
        if rest > 0:
            segments.append((b"generation-prompt", rest))
        return PromptShape(tokens=total, block_hashes=tuple(self._block_hashes(segments, total)))

    def _block_hashes(self, segments: list[tuple[bytes, int]], total: int) -> list[int]:
        bs = self.block_size
        hashes: list[int] = []
        chain = b"root"
        pieces: list[bytes] = []
        filled = 0
        for key, n in segments:
            offset = 0
            while offset < n:
                take = min(n - offset, bs - filled)
                pieces.append(key + offset.to_bytes(4, "little") + take.to_bytes(4, "little"))
                offset += take
                filled += take
                if filled == bs:
                    chain = _digest(chain, *pieces)
                    hashes.append(int.from_bytes(chain[:8], "little"))
                    pieces, filled = [], 0
        return hashes[: total // bs]
