"""Exact bare-token lengths without re-encoding whole turns again and again.

Decode-then-encode is not the identity for BPE: slicing token ids and decoding can cut a
multi-byte character (which comes back as U+FFFD, several tokens) or a word whose pieces
re-merge differently. So text is cut only at *safe boundaries*: a position `i` where
`text[i]` is a space, `text[i+1]` a letter and `text[i-1]` not whitespace, or where
`text[i-1]` is a newline after a letter or digit and `text[i]` is not whitespace. The
pre-tokenizer regexes of byte-level BPE tokenizers (GPT-2, cl100k, o200k, GLM) always
start a new pre-token there whatever follows, and BPE never merges across pre-tokens, so

    count(text) == count(text[:i]) + count(text[i:])      for every safe boundary i.

Lengths are predicted from that rule and then every final message is encoded once and
checked; a message that misses (a tokenizer the rule does not hold for) is refitted by
iterating on the measured difference, never shipped with the wrong length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.dataset.tokenizer import Tokenizer
from harness.errors import HarnessError

# A real message is encoded through at most this many characters per wanted token before
# the rest is ignored (tool outputs can be megabytes; a turn wants hundreds of tokens).
CHARS_PER_TOKEN_WINDOW = 12


def is_safe_boundary(text: str, i: int) -> bool:
    if not 1 < i < len(text) - 1:
        return False
    char = text[i]
    if char == " ":  # " word" after a non-space: a letter pre-token starts here whatever precedes
        return text[i + 1].isalpha() and not text[i - 1].isspace()
    # after a single newline that follows a letter or digit (file lists, JSON, logs have no spaces)
    return text[i - 1] == "\n" and text[i - 2].isalnum() and not char.isspace()


@dataclass(frozen=True)
class EncodedText:
    """A text with the start offset of each token and whether that start is a safe boundary."""

    text: str
    starts: list[int]
    safe: list[bool]
    complete: bool  # False when only a leading window of a longer text was encoded

    @property
    def tokens(self) -> int:
        return len(self.starts)


def encode_with_boundaries(tokenizer: Tokenizer, texts: Sequence[str], want_tokens: Sequence[int]
                           ) -> list[EncodedText]:
    """Encode each text (or a leading window big enough for `want_tokens`) in one parallel batch."""
    windows = []
    for text, want in zip(texts, want_tokens, strict=True):
        limit = max(64, want * CHARS_PER_TOKEN_WINDOW)
        windows.append(text if len(text) <= limit else text[:limit])
    out = []
    for text, window, enc in zip(texts, windows, tokenizer.backend.encode_batch(windows, add_special_tokens=False),
                                 strict=True):
        starts = [start for start, _ in enc.offsets]
        out.append(EncodedText(text=window, starts=starts,
                               safe=[is_safe_boundary(window, s) for s in starts],
                               complete=len(window) == len(text)))
    return out


def cut_at_most(encoded: EncodedText, max_tokens: int) -> tuple[str, int] | None:
    """The longest prefix with at most `max_tokens` tokens ending at a safe boundary (or the whole text).

    Returns (prefix, predicted tokens), or None when no such non-empty prefix exists.
    """
    if encoded.complete and encoded.tokens <= max_tokens:
        return encoded.text, encoded.tokens
    j = min(max_tokens, encoded.tokens - 1)
    while j > 0 and not encoded.safe[j]:
        j -= 1
    if j <= 0:
        return None
    return encoded.text[:encoded.starts[j]], j


def refit(target: int, make: Callable[[int], str], count: Callable[[str], int], first_guess: int,
          what: str, attempts: int = 12) -> str:
    """Find k such that count(make(k)) == target, starting at first_guess, stepping by the miss."""
    k = first_guess
    tried: set[int] = set()
    for _ in range(attempts):
        if k < 1:
            k = 1
        while k in tried:
            k += 1
        tried.add(k)
        text = make(k)
        got = count(text)
        if got == target:
            return text
        k += target - got if got != target else 0
    raise HarnessError(f"{what}: cannot reach exactly {target} tokens with this tokenizer "
                       f"(tried {len(tried)} fits); try another length")
