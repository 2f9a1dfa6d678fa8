"""The engine in virtual time, driven by closed-loop clients that behave as EvalScope's multi-turn mode
(docs/facts.md §6): `concurrency` workers; each takes the next of `conversations` conversations (the list rotated by the
dataset offset) and sends its turns in order, each request = all earlier turns + the replies + the new
turn, the next turn as soon as the reply ends. No wall clock: a point of minutes runs in milliseconds.

Conversations are shapes, not text: the tokens each turn adds (exact by the dataset recipe's
construction) plus the chat template's tokens. A conversation's blocks hash by (conversation, block
index): its next turn repeats the earlier prompt exactly, so that is the prefix identity.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.config import DatasetRecipe
from harness.sim.engine import Engine, SimRequest

# The shipped tokenizer's template (harness.dataset.tokenizer): "[gMASK]<sop>" before the first
# message, "<|role|>\n" before each message, "<|assistant|>\n" as the generation prompt.
TEMPLATE_PREFIX_TOKENS = 2
TOKENS_PER_MESSAGE = 2
GENERATION_PROMPT_TOKENS = 2
_request_serial = itertools.count(1)  # request ids stay unique across points on one engine


@dataclass(frozen=True)
class ConversationShape:
    key: int
    turn_tokens: tuple[int, ...]  # tokens each turn adds to the prompt (its messages with their markers)


def shapes_from_recipe(recipe: DatasetRecipe, count: int) -> list[ConversationShape]:
    """`count` conversations of the recipe's shape: turn 1 is a pad (system) and a user message."""
    first = recipe.first_turn_length + 2 * TOKENS_PER_MESSAGE
    later = recipe.subsequent_turn_length + TOKENS_PER_MESSAGE
    turns = (first, *([later] * (recipe.num_turns - 1)))
    return [ConversationShape(key=i, turn_tokens=turns) for i in range(count)]


@dataclass(frozen=True)
class RequestRecord:
    conversation: int
    turn: int
    prompt_tokens: int
    output_tokens: int
    start_s: float
    first_token_s: float | None
    end_s: float
    chunks: int
    preemptions: int
    cached_tokens: int
    ok: bool = True


@dataclass
class PointRun:
    concurrency: int
    conversations: int
    start_s: float
    end_s: float = 0.0
    requests: list[RequestRecord] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class _Client:
    conversation: ConversationShape
    turn: int = 0
    history_tokens: int = TEMPLATE_PREFIX_TOKENS
    request_id: str = ""
    start_s: float = 0.0
    chunks: int = 0


class _HashCache:
    """Each conversation's block hashes, grown as its prompts grow."""

    def __init__(self) -> None:
        self._by_key: dict[int, list[int]] = {}

    def prefix(self, key: int, blocks: int) -> tuple[int, ...]:
        hashes = self._by_key.setdefault(key, [])
        while len(hashes) < blocks:
            hashes.append(hash((key, len(hashes), 0x5EED)))
        return tuple(hashes[:blocks])


def run_point(engine: Engine, shapes: list[ConversationShape], *, concurrency: int, conversations: int,
              max_tokens: int, start_s: float, scrape_interval_s: float | None = None,
              on_scrape: Callable[[float], None] | None = None) -> PointRun:
    """One EvalScope-like point from `start_s`: `conversations` of `shapes` (cycling) at `concurrency`;
    `on_scrape(now_s)` at start, every interval and at end."""
    if not shapes:
        raise ValueError("no conversations to send")
    queue = deque(shapes[i % len(shapes)] for i in range(conversations))
    hashes = _HashCache()
    run = PointRun(concurrency=concurrency, conversations=conversations, start_s=start_s)
    clients: dict[str, _Client] = {}
    now = start_s

    def send(client: _Client) -> None:
        shape = client.conversation
        prompt = client.history_tokens + shape.turn_tokens[client.turn] + GENERATION_PROMPT_TOKENS
        client.request_id = f"v-{next(_request_serial)}"
        client.start_s = now
        client.chunks = 0
        bs = engine.config.block_size
        # the reply's blocks get hashes of their own: vLLM caches them (a preempted request finds them again)
        # but the next turn re-sends the reply as text, re-tokenized (and without its reasoning), so that
        # prompt is not assumed to match them; it matches this prompt's blocks
        reply = tuple(hash((client.request_id, i)) for i in range(prompt // bs, (prompt + max_tokens) // bs))
        engine.add_request(SimRequest(client.request_id, prompt, hashes.prefix(shape.key, prompt // bs) + reply,
                                      max_tokens, max_tokens), now)
        clients[client.request_id] = client

    def next_conversation() -> None:
        if queue:
            send(_Client(conversation=queue.popleft()))

    for _ in range(min(concurrency, conversations)):
        next_conversation()
    next_scrape = start_s
    while clients:
        if on_scrape is not None and scrape_interval_s and now >= next_scrape:
            on_scrape(now)
            next_scrape = now + scrape_interval_s
        result = engine.step(now)
        if result.duration_s <= 0 and not result.tokens and not result.aborted:
            raise RuntimeError("the simulated engine made no progress with requests outstanding")
        now = result.end_s
        for rid in result.tokens:
            clients[rid].chunks += 1
        for rid in result.aborted:
            client = clients.pop(rid)
            run.requests.append(RequestRecord(client.conversation.key, client.turn, 0, 0, client.start_s,
                                              None, now, 0, 0, 0, ok=False))
            next_conversation()
        for done in result.finished:
            client = clients.pop(done.request_id)
            run.requests.append(RequestRecord(
                conversation=client.conversation.key, turn=client.turn, prompt_tokens=done.prompt_tokens,
                output_tokens=done.output_tokens, start_s=client.start_s, first_token_s=done.first_token_s,
                end_s=now, chunks=client.chunks, preemptions=done.preemptions, cached_tokens=done.cached_tokens))
            # the reply joins the history as the client re-sends it: re-tokenized text, which can take more
            # (or fewer) tokens than were generated (the calibrated profile's reply_history_ratio)
            client.history_tokens = done.prompt_tokens + round(done.output_tokens * engine.config.reply_history_ratio)
            client.turn += 1
            if client.turn < len(client.conversation.turn_tokens):
                send(client)
            else:
                next_conversation()
    run.end_s = now
    if on_scrape is not None:
        on_scrape(now)
    return run
