"""Conversations of exact bare lengths from trajectories and pad (docs/facts.md §5).

Turn 1 = a system message of pad + the real first user message (at most
`max_real_first_turn_frac` of the turn), together exactly `first_turn_length` bare
tokens. Turns 2..N = one user message of exactly `subsequent_turn_length` tokens: the
next real message cut at a safe boundary, topped up with pad after a blank line when it
is short (or cut short), pure pad when the trajectory has no message left.

`prompt_tokens` is recorded as the blog does: turn 1 is the chat template rendered over
turn 1's messages with the generation prompt; turn k adds the assumed output length and
the turn length to turn k-1.

Cost: every final message is encoded exactly once (that is the verification); pads are
never encoded to be measured (harness.dataset.pads), real messages only through a window.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.dataset.boundaries import (
    EncodedText,
    cut_at_most,
    encode_with_boundaries,
    is_safe_boundary,
    refit,
)
from harness.dataset.pads import PadSupply
from harness.dataset.sources import Trajectory
from harness.dataset.tokenizer import Tokenizer
from harness.errors import HarnessError

JOINER = "\n\n"  # between a short real message and the pad that tops it up
BATCH_CONVERSATIONS = 8
_CHAT_MARGIN_CHARS = 256


@dataclass(frozen=True)
class TurnLengths:
    first_turn: int
    subsequent_turn: int
    num_turns: int
    max_real_first_turn_frac: float
    assumed_output: int

    @property
    def real_first_cap(self) -> int:
        return int(self.max_real_first_turn_frac * self.first_turn)

    def check(self) -> None:
        if self.real_first_cap < 1:
            raise HarnessError(
                f"first_turn_length {self.first_turn} x max_real_first_turn_frac {self.max_real_first_turn_frac} "
                "leaves no room for real text (under one token); raise either")


@dataclass
class BuildStats:
    real_turns: int = 0  # later turns holding real text
    topped_up_turns: int = 0  # ... of which topped up with pad
    pad_only_turns: int = 0
    refits: int = 0
    prompt_tokens_method: str = "segments"


@dataclass
class _Message:
    role: str
    text: str
    target: int
    slot: str  # names the pad draws of this message (deterministic seeds)
    remake: Callable[[int], str] | None = None  # pad tokens -> text, for a refit
    pad_guess: int = 0


def _first_safe(text: str, start: int, stop: int, step: int) -> int | None:
    for i in range(start, stop, step):
        if is_safe_boundary(text, i):
            return i
    return None


def _chat_count_by_segments(tokenizer: Tokenizer, messages: Sequence[dict[str, str]],
                           bare_counts: Sequence[int]) -> int | None:
    """count_chat without encoding long contents again: their middles are known from the bare counts.

    The rendered prompt is split at safe boundaries inside each long content; counts add up
    across those (harness.dataset.boundaries). None when a content is not rendered verbatim.
    """
    rendered = tokenizer.render_chat(messages)
    outside: list[str] = []
    heads_tails: list[str] = []
    middle_bare: list[int] = []
    pos = 0
    for message, bare in zip(messages, bare_counts, strict=True):
        content = message["content"]
        at = rendered.find(content, pos)
        if at < 0:
            return None
        a = _first_safe(content, _CHAT_MARGIN_CHARS, len(content) - _CHAT_MARGIN_CHARS, 1)
        b = _first_safe(content, len(content) - _CHAT_MARGIN_CHARS, _CHAT_MARGIN_CHARS, -1)
        if a is None or b is None or b <= a:
            continue
        outside.append(rendered[pos:at + a])
        heads_tails += [content[:a], content[b:]]
        middle_bare.append(bare)
        pos = at + b
    outside.append(rendered[pos:])
    counts = tokenizer.count_bare_batch(outside + heads_tails)
    total = sum(counts[:len(outside)])
    ht = counts[len(outside):]
    for k, bare in enumerate(middle_bare):
        total += bare - ht[2 * k] - ht[2 * k + 1]
    return total


class ConversationBuilder:
    def __init__(self, tokenizer: Tokenizer, lengths: TurnLengths, pads: PadSupply):
        lengths.check()
        self.tokenizer = tokenizer
        self.lengths = lengths
        self.pads = pads
        self.stats = BuildStats()
        self._chat_by_segments: bool | None = None  # decided on the first conversation

    # ------------------------------------------------------------ turn 1

    def _first_user_text(self, encoded: EncodedText) -> str:
        cap = self.lengths.real_first_cap
        cut = cut_at_most(encoded, cap)
        if cut is not None:
            return cut[0]
        # no safe boundary under the cap (one huge "word"): cut at token boundaries, measured,
        # stepping back by the overshoot
        j = min(cap, encoded.tokens - 1)
        for _ in range(24):
            if j < 1:
                break
            prefix = encoded.text[:encoded.starts[j]]
            got = self.tokenizer.count_bare(prefix)
            if got <= cap:
                return prefix
            j -= max(1, got - cap)
        raise HarnessError(f"cannot cut a first user message to at most {cap} tokens with this tokenizer")

    # ------------------------------------------------------------ turns 2..N

    def _later_turn(self, encoded: EncodedText | None, slot: str) -> _Message:
        target = self.lengths.subsequent_turn

        def pad_only(k: int) -> str:
            return self.pads.take(k, f"{slot}/{k}")

        if encoded is None or target < 4:
            self.stats.pad_only_turns += 1
            return _Message("user", pad_only(target), target, slot, remake=pad_only, pad_guess=target)
        self.stats.real_turns += 1
        cut = cut_at_most(encoded, target)
        if cut is not None and cut[1] == target:
            return _Message("user", cut[0], target, slot, remake=None)
        cut = cut_at_most(encoded, target - 3)
        if cut is None:
            self.stats.real_turns -= 1
            self.stats.pad_only_turns += 1
            return _Message("user", pad_only(target), target, slot, remake=pad_only, pad_guess=target)
        self.stats.topped_up_turns += 1
        head = cut[0] + JOINER
        return _Message("user", head, target, slot, remake=lambda k: head + pad_only(k), pad_guess=-1)

    # ------------------------------------------------------------ a batch of conversations

    def build_batch(self, trajectories: Sequence[Trajectory], first_index: int) -> list[list[dict[str, Any]]]:
        L = self.lengths
        later = L.num_turns - 1
        texts: list[str] = []
        wants: list[int] = []
        for t in trajectories:
            texts.append(t.user_messages[0])
            wants.append(L.real_first_cap + 8)
            for i in range(1, 1 + later):
                if i < len(t.user_messages):
                    texts.append(t.user_messages[i])
                    wants.append(L.subsequent_turn + 8)
        encoded = iter(encode_with_boundaries(self.tokenizer, texts, wants))

        users: list[str] = []
        turns: list[list[_Message]] = []
        for c, t in enumerate(trajectories):
            users.append(self._first_user_text(next(encoded)))
            row = []
            for i in range(1, 1 + later):
                enc = next(encoded) if i < len(t.user_messages) else None
                row.append(self._later_turn(enc, f"{first_index + c}/t{i + 1}"))
            turns.append(row)

        # heads of topped-up turns are measured, then the pad fills the rest
        heads = [m for row in turns for m in row if m.pad_guess == -1]
        for m, n in zip(heads, self._count(m.text for m in heads), strict=True):
            m.pad_guess = m.target - n
            if m.pad_guess < 1:  # the real part left no room: pad only
                m.remake = (lambda slot: (lambda k: self.pads.take(k, f"{slot}/{k}")))(m.slot)
                m.pad_guess = m.target
            m.text = m.remake(m.pad_guess)

        user_counts = self._count(users)
        conversations = []
        firsts: list[_Message] = []
        for c, n_user in enumerate(user_counts):
            slot = f"{first_index + c}/t1"
            pad_n = L.first_turn - n_user
            make = (lambda s: (lambda k: self.pads.take(k, f"{s}/{k}")))(slot)
            firsts.append(_Message("system", make(pad_n), pad_n, slot, remake=make, pad_guess=pad_n))

        # the verification: every final message encoded once, refitted if it misses
        checked = firsts + [m for row in turns for m in row]
        for m, n in zip(checked, self._count(m.text for m in checked), strict=True):
            if n != m.target:
                self._refit(m, n)

        for c, user in enumerate(users):
            system = firsts[c]
            first_messages = ([{"role": "system", "content": system.text}] if system.target > 0 else []) + [
                {"role": "user", "content": user}]
            bare = ([system.target] if system.target > 0 else []) + [user_counts[c]]
            prompt = self._chat_count(first_messages, bare)
            conversation = [{"messages": first_messages, "prompt_tokens": prompt}]
            for m in turns[c]:
                prompt += L.assumed_output + L.subsequent_turn
                conversation.append({"messages": [{"role": "user", "content": m.text}], "prompt_tokens": prompt})
            conversations.append(conversation)
        return conversations

    def _count(self, texts) -> list[int]:
        return self.tokenizer.count_bare_batch(list(texts))

    def _refit(self, m: _Message, got: int) -> None:
        self.stats.refits += 1
        if m.remake is None:  # a real-only turn that missed: top it up instead
            cut = m.text
            while cut and self.tokenizer.count_bare(cut + JOINER) >= m.target:
                cut = cut[: max(0, len(cut) * 3 // 4)]
                i = cut.rfind(" ")
                cut = cut[:i] if i > 0 else ""
            head = cut + JOINER if cut else ""
            n_head = self.tokenizer.count_bare(head) if head else 0
            m.remake = (lambda h, s: (lambda k: h + self.pads.take(k, f"{s}/refit/{k}")))(head, m.slot)
            m.pad_guess = m.target - n_head
            got = -1
        start = m.pad_guess + (m.target - got) if got >= 0 else m.pad_guess
        m.text = refit(m.target, m.remake, self.tokenizer.count_bare, start,
                       what=f"a {m.role} message of {m.target} tokens")

    def _chat_count(self, messages: list[dict[str, str]], bare: list[int]) -> int:
        if self._chat_by_segments is None:
            full = self.tokenizer.count_chat(messages)
            by_segments = _chat_count_by_segments(self.tokenizer, messages, bare)
            self._chat_by_segments = by_segments == full
            if not self._chat_by_segments:
                self.stats.prompt_tokens_method = "full"
            return full
        if self._chat_by_segments:
            fast = _chat_count_by_segments(self.tokenizer, messages, bare)
            if fast is not None:
                return fast
        return self.tokenizer.count_chat(messages)


@dataclass
class BuildResult:
    conversations: list[list[dict[str, Any]]]
    stats: BuildStats
    total_tokens: int
    trajectory_ids: list[str] = field(default_factory=list)


def build_conversations(tokenizer: Tokenizer, lengths: TurnLengths, pads: PadSupply,
                        trajectories: Sequence[Trajectory],
                        on_progress: Callable[[int], None] | None = None) -> BuildResult:
    builder = ConversationBuilder(tokenizer, lengths, pads)
    conversations: list[list[dict[str, Any]]] = []
    for start in range(0, len(trajectories), BATCH_CONVERSATIONS):
        batch = trajectories[start:start + BATCH_CONVERSATIONS]
        conversations.extend(builder.build_batch(batch, start))
        if on_progress is not None:
            on_progress(len(batch))
    total = len(conversations) * (lengths.first_turn + (lengths.num_turns - 1) * lengths.subsequent_turn)
    return BuildResult(conversations=conversations, stats=builder.stats, total_tokens=total,
                       trajectory_ids=[t.trajectory_id for t in trajectories])
