"""The correctness probe: a fixed set of short prompts asked greedily through a deployment's own server,
once alone (right after it is up, before any point) and once while the sweep's highest point keeps it
full. A kernel that corrupts KV only when pages move (HiSparse swapping under pressure, offload evicting)
changes the pressured answers; throughput would not show it.

Each prompt is its own non-streamed chat request, temperature 0, thinking off, asking for the generated
token ids where the server returns them (vLLM's `return_token_ids`), so two answers compare exactly.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from harness.config.prompts import PromptSet
from harness.errors import HarnessError
from harness.metrics.scrape import scrape_once
from harness.records import Answer
from harness.vllm_names import RUNNING

# How long one probe request may take, and how long the pressured probe waits for the server to fill.
REQUEST_TIMEOUT_S = 300.0
FILL_TIMEOUT_S = 300.0
POLL_S = 0.5


@dataclass(frozen=True)
class ProbeTarget:
    """The server the prompts go to."""

    base_url: str
    model: str
    api_key: str | None = None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def _one_line(text: object, limit: int = 200) -> str:
    return " ".join(str(text).split())[:limit]


def _ask_one(target: ProbeTarget, session, prompt_id: str, prompt: str, max_tokens: int,
            timeout_s: float = REQUEST_TIMEOUT_S) -> Answer:
    """One greedy answer; a failed request is an Answer with its error, never an exception."""
    import requests

    body = {"model": target.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": False, "chat_template_kwargs": {"enable_thinking": False},
            "return_token_ids": True}
    try:
        response = session.post(f"{target.base_url}/v1/chat/completions", json=body, headers=target.headers(),
                                timeout=timeout_s)
    except requests.RequestException as exc:
        return Answer(id=prompt_id, text="", error=f"{type(exc).__name__}: {_one_line(exc)}")
    if response.status_code != 200:
        return Answer(id=prompt_id, text="", error=f"HTTP {response.status_code}: {_one_line(response.text)}")
    try:
        choice = response.json()["choices"][0]
        text = choice["message"].get("content") or ""
        token_ids = choice.get("token_ids")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return Answer(id=prompt_id, text="", error=f"not a chat completion: {_one_line(response.text)}")
    if not (isinstance(token_ids, list) and all(isinstance(t, int) for t in token_ids)):
        token_ids = None
    return Answer(id=prompt_id, text=text, generated_ids=token_ids)


def ask(target: ProbeTarget, prompts: PromptSet, max_tokens: int) -> list[Answer]:
    """Every prompt's greedy answer, one request after another, judged where the prompt has an answer."""
    import requests

    answers = []
    with requests.Session() as session:
        session.trust_env = False  # the server is one the harness started: no proxy from the environment
        for prompt in prompts.prompts:
            answer = _ask_one(target, session, prompt.id, prompt.prompt, max_tokens)
            if answer.error is None:
                answer = answer.model_copy(update={"correct": prompt.is_right(answer.text)})
            answers.append(answer)
    return answers


def _running_now(target: ProbeTarget) -> float | None:
    """The server's running-requests gauge, summed over engines; None when /metrics cannot say."""
    try:
        samples = scrape_once(f"{target.base_url}/metrics", (RUNNING,), timeout_s=5.0, api_key=target.api_key)
    except HarnessError:
        return None
    values = [s.value for s in samples if s.name == RUNNING]
    return sum(values) if values else None


class PressuredProbe:
    """Asks the prompts once the server runs at least `fill` requests (or after FILL_TIMEOUT_S, or when the
    point ends first), in a thread beside the point's load."""

    def __init__(self, target: ProbeTarget, prompts: PromptSet, max_tokens: int, fill: int,
                 fill_timeout_s: float = FILL_TIMEOUT_S):
        self.target, self.prompts, self.max_tokens, self.fill = target, prompts, max_tokens, fill
        self.fill_timeout_s = fill_timeout_s
        self.answers: list[Answer] = []
        self.running: float | None = None  # the gauge when the prompts were sent
        self.asked_s: float | None = None  # how long the asking took
        self.note: str | None = None
        self._point_over = threading.Event()
        self._thread = threading.Thread(target=self._run, name="correctness-probe", daemon=True)

    def start(self) -> PressuredProbe:
        self._thread.start()
        return self

    def _run(self) -> None:
        deadline = time.monotonic() + self.fill_timeout_s
        while not self._point_over.is_set():
            self.running = _running_now(self.target)
            if self.running is not None and self.running >= self.fill:
                break
            if time.monotonic() >= deadline:
                self.note = (f"the server never ran {self.fill} requests in {self.fill_timeout_s:.0f} s; "
                             f"asked at {self.running if self.running is not None else 'unknown'} running")
                break
            self._point_over.wait(POLL_S)
        else:
            self.note = "the point ended before the server was full; not asked under pressure"
            return
        started = time.monotonic()
        self.answers = ask(self.target, self.prompts, self.max_tokens)
        self.asked_s = round(time.monotonic() - started, 3)

    def finish(self, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        """Called when the point's load has ended: stop waiting to fill, let the asking finish."""
        self._point_over.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self.note = f"the probe did not finish within {timeout_s:.0f} s of the point's end"
