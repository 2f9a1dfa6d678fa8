"""Check a built swe_smith file independently of the builder.

Per conversation: the number of turns; turn 1's bare tokens summed over its messages;
each later turn exactly one user message of the stated length; `prompt_tokens` as the
metadata's rule says (turn 1 with the chat template). Across conversations: no two share
a first-turn prefix of `max_shared_prefix_tokens` or more (prefix caching would reuse it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.dataset.tokenizer import Tokenizer
from harness.errors import HarnessError

# A shared prefix shorter than this cannot hit vLLM's prefix cache (its blocks hold 16-64 tokens).
DEFAULT_MAX_SHARED_PREFIX_TOKENS = 16


@dataclass(frozen=True)
class Violation:
    conversation: int  # 0-based index in the file
    turn: int | None  # 1-based turn, None for file-level problems
    message: str

    def __str__(self) -> str:
        where = "file" if self.conversation < 0 else f"conversation {self.conversation}"
        if self.turn is not None:
            where += f" turn {self.turn}"
        return f"{where}: {self.message}"


@dataclass
class VerifyReport:
    path: Path
    conversations: int = 0
    turns: int = 0
    tokens_checked: int = 0
    max_shared_prefix_tokens: int = 0
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise HarnessError(f"{path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise HarnessError(f"{path}: not JSON ({str(exc).splitlines()[0][:120]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("conversations"), list):
        raise HarnessError(f"{path}: not a swe_smith dataset (no conversations list)")
    return data


def _common_prefix_len(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # binary search: slice comparisons run in C
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def verify_dataset(path: Path | str, tokenizer: Tokenizer,
                   max_shared_prefix_tokens: int = DEFAULT_MAX_SHARED_PREFIX_TOKENS,
                   check_prompt_tokens: bool = True) -> VerifyReport:
    path = Path(path)
    data = _load(path)
    meta = data.get("metadata") or {}
    report = VerifyReport(path=path)
    bad = report.violations.append
    first_len = meta.get("first_turn_length")
    later_len = meta.get("subsequent_turn_length")
    num_turns = meta.get("num_turns")
    assumed_output = meta.get("assumed_output_length")
    conversations = data["conversations"]
    report.conversations = len(conversations)
    if meta.get("conversations") not in (None, len(conversations)):
        bad(Violation(-1, None, f"metadata says {meta.get('conversations')} conversations, file has "
                                f"{len(conversations)}"))
    first_texts: list[str] = []
    for ci, conversation in enumerate(conversations):
        if not isinstance(conversation, list) or not conversation:
            bad(Violation(ci, None, "not a non-empty list of turns"))
            first_texts.append("")
            continue
        report.turns += len(conversation)
        if num_turns is not None and len(conversation) != num_turns:
            bad(Violation(ci, None, f"{len(conversation)} turns, expected {num_turns}"))
        previous_prompt = None
        for ti, turn in enumerate(conversation, 1):
            messages = turn.get("messages") if isinstance(turn, dict) else None
            if not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
                bad(Violation(ci, ti, "messages must be a non-empty list of {role, content}"))
                continue
            counts = tokenizer.count_bare_batch([m["content"] for m in messages])
            report.tokens_checked += sum(counts)
            prompt = turn.get("prompt_tokens")
            if ti == 1:
                first_texts.append("".join(m["content"] for m in messages))
                if first_len is not None and sum(counts) != first_len:
                    bad(Violation(ci, ti, f"{sum(counts)} bare tokens, expected {first_len}"))
                if check_prompt_tokens and prompt is not None:
                    chat = tokenizer.count_chat(messages)
                    if prompt != chat:
                        bad(Violation(ci, ti, f"prompt_tokens {prompt}, the chat template gives {chat}"))
            else:
                if len(messages) != 1 or messages[0].get("role") != "user":
                    bad(Violation(ci, ti, f"expected one user message, got {len(messages)} "
                                          f"({', '.join(str(m.get('role')) for m in messages)})"))
                if later_len is not None and sum(counts) != later_len:
                    bad(Violation(ci, ti, f"{sum(counts)} bare tokens, expected {later_len}"))
                if (check_prompt_tokens and prompt is not None and previous_prompt is not None
                        and assumed_output is not None and later_len is not None
                        and prompt != previous_prompt + assumed_output + later_len):
                    bad(Violation(ci, ti, f"prompt_tokens {prompt}, expected {previous_prompt} + "
                                          f"{assumed_output} + {later_len}"))
            previous_prompt = prompt
    # the longest shared prefix is between neighbours in sorted order
    order = sorted(range(len(first_texts)), key=first_texts.__getitem__)
    for a, b in zip(order, order[1:], strict=False):
        chars = _common_prefix_len(first_texts[a], first_texts[b])
        if chars == 0:
            continue
        shared = tokenizer.count_bare(first_texts[a][:chars])
        report.max_shared_prefix_tokens = max(report.max_shared_prefix_tokens, shared)
        if shared >= max_shared_prefix_tokens:
            bad(Violation(max(a, b), 1, f"shares a {shared}-token first-turn prefix with conversation {min(a, b)}"))
    return report
