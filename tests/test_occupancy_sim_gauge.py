"""The simulated engine's `vllm:num_requests_running` against the engine's own step record.

vLLM's scheduler reports its stats with each step's outputs (`make_stats()` after `update_from_output`:
finished requests gone, requests admitted in the step counted, prefill included) and the frontend sets
the gauge from them, so a scrape shows the running count of the last step that ended, never that of
the step in flight. The simulated server is run in this process with its real aiohttp app on
127.0.0.1 under a multi-turn streaming load like EvalScope's; /metrics is scraped over HTTP every few
milliseconds, and every value must be one the step record allows at that instant (docs/metrics.md,
"Occupancy two ways"). The same check must fail on a server that shows the live running queue.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from sim_support import REPO

from harness.config import load_launch
from harness.dataset.tokenizer import default_tokenizer_path, load_tokenizer
from harness.sim.counters import EngineGauges
from harness.sim.engine import Engine, SimRequest, StepRecord
from harness.sim.engine_config import engine_config
from harness.sim.exposition import MetricsText
from harness.sim.server import SimServer

# How late the server may publish a step's stats after the step's end (its event loop is shared with
# the load and the scraper here). Only ever lets an older value through, never the step in flight's.
PUBLISH_SLACK_S = 0.05
FIRST_TURN = "Fix the failing test in parser.py; the traceback says KeyError: 'name'. " * 120  # ~2,000 tokens
LATER_TURN = "Now run the whole suite and tell me what else fails. " * 20


@dataclass(frozen=True)
class Scrape:
    before_s: float  # engine clock when the GET was sent
    after_s: float   # and when its answer was read
    running: float


def allowed_values(records: list[StepRecord], before_s: float, after_s: float) -> set[int]:
    """The running counts a scrape between `before_s` and `after_s` may show: those of the steps whose
    stats could be the latest published at some instant in between. Step k's are published at its end,
    at most PUBLISH_SLACK_S later; before the first step the gauge is 0."""
    allowed = {0} if not records or records[0].end_s + PUBLISH_SLACK_S > before_s else set()
    for i, record in enumerate(records):
        next_end = records[i + 1].end_s if i + 1 < len(records) else math.inf
        if record.end_s <= after_s and next_end + PUBLISH_SLACK_S > before_s:
            allowed.add(record.num_running)
    return allowed


def running_of(text: str) -> float:
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:num_requests_running":
            return sum(s.value for s in family.samples)
    raise AssertionError("no vllm:num_requests_running in /metrics")


async def _chat(session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]]) -> str:
    body = {"model": "glm-agentx", "messages": messages, "max_tokens": 24, "ignore_eos": True, "stream": True}
    text = []
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
        async for raw in response.content:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    text.append(choice["delta"].get("content") or choice["delta"].get("reasoning") or "")
    return "".join(text)


async def _conversation(session: aiohttp.ClientSession, url: str, key: int, turns: int) -> None:
    """EvalScope's multi-turn mode: each turn re-sends the history and the reply, as soon as the reply ends."""
    messages = [{"role": "user", "content": f"[conversation {key}] " + FIRST_TURN}]
    for _ in range(turns):
        reply = await _chat(session, url, messages)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": LATER_TURN}]


async def _point(server: SimServer, *, concurrency: int, conversations: int, turns: int) -> list[Scrape]:
    """One point against the server over HTTP on 127.0.0.1, scraped every 3-10 ms meanwhile."""
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    scrapes: list[Scrape] = []
    done = asyncio.Event()
    rng = random.Random(7)
    try:
        async with aiohttp.ClientSession() as session:
            async def scraper() -> None:
                while not done.is_set():
                    before = server.now_s()
                    async with session.get(url + "/metrics") as response:
                        text = await response.text()
                    scrapes.append(Scrape(before, server.now_s(), running_of(text)))
                    await asyncio.sleep(rng.uniform(0.003, 0.010))

            queue = list(range(conversations))

            async def worker() -> None:
                while queue:
                    await _conversation(session, url, queue.pop(0), turns)

            scraping = asyncio.create_task(scraper())
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            await asyncio.sleep(0.05)  # a few idle scrapes after the last step
            done.set()
            await scraping
    finally:
        await runner.cleanup()
    return scrapes


def _run_point(server: SimServer, **load: int) -> tuple[list[Scrape], list[StepRecord]]:
    scrapes = asyncio.run(_point(server, **load))
    records = list(server.engine.step_record)
    assert records and records[0].index == 0, "the step record must cover the whole point"
    return scrapes, records


def _mismatches(scrapes: list[Scrape], records: list[StepRecord]) -> list[str]:
    out = []
    for s in scrapes:
        allowed = allowed_values(records, s.before_s, s.after_s)
        if int(s.running) not in allowed:
            inside = [r for r in records if r.start_s <= s.before_s and s.after_s <= r.end_s]
            out.append(f"scrape at {s.before_s:.4f}-{s.after_s:.4f} s saw {s.running:g}, the step record allows "
                       f"{sorted(allowed)}" + (f" (inside step {inside[0].index}, whose own count is "
                                               f"{inside[0].num_running})" if inside else ""))
    return out


def _server() -> SimServer:
    profile = load_launch(REPO / "launch" / "sim-hisparse.yaml").profile
    return SimServer(profile, load_tokenizer(default_tokenizer_path()), log=lambda _line: None)


def test_running_gauge_equals_the_step_record_at_every_scrape() -> None:
    server = _server()
    scrapes, records = _run_point(server, concurrency=3, conversations=6, turns=3)
    # Enough scrapes while requests ran to mean something. The scrape count itself follows how fast
    # this machine answers them (98 in all, 85 busy, in a full suite on 2 loaded cores), so it is the
    # busy ones, and below the telling ones, that are counted.
    busy = [s for s in scrapes if s.running > 0]
    assert len(busy) > 50, (len(scrapes), len(busy))
    assert _mismatches(scrapes, records) == []
    # the point ran as loaded: the gauge saw the three workers at once, and nothing beyond them
    assert max(s.running for s in scrapes) == 3 == max(r.num_running for r in records)
    # and the scrapes landed inside steps whose own count differs from the one before: the check had
    # cases where showing the step in flight instead would have been caught
    telling = [s for s in scrapes for i, r in enumerate(records[1:], 1)
               if r.start_s < s.before_s and s.after_s < r.end_s and r.num_running != records[i - 1].num_running]
    assert len(telling) >= 5, len(telling)
    assert scrapes[-1].running == 0 == records[-1].num_running


def test_the_check_catches_a_gauge_that_shows_the_step_in_flight() -> None:
    """The server as it was before: /metrics read the running queue as the step in flight left it."""
    server = _server()
    server.metrics = MetricsText(server.engine, server.model_name)  # live: engine.gauges()
    scrapes, records = _run_point(server, concurrency=3, conversations=3, turns=2)
    assert len(_mismatches(scrapes, records)) >= 3


def test_step_record_counts_a_request_from_its_prefill_step_to_the_step_that_finishes_it() -> None:
    engine = Engine(engine_config(load_launch(REPO / "launch" / "sim-offload.yaml").profile))
    engine.add_request(SimRequest("a", 3000, (), 8, 8), 0.0)
    now, results = 0.0, []
    while engine.has_work():
        results.append(engine.step(now))
        now = results[-1].end_s
    records = list(engine.step_record)
    assert [r.record for r in results] == records
    assert [r.index for r in records] == list(range(len(records)))
    assert all(r.start_s == res.start_s and r.end_s == res.end_s for r, res in zip(records, results, strict=True))
    # the prefill step admitted it: running from that step's stats on; the step that finished it reports 0
    assert records[0].scheduled == 1 and records[0].num_running == 1
    assert all(r.num_running == 1 for r in records[:-1]) and records[-1].num_running == 0
    assert results[-1].finished and records[-1].stats.num_requests_waiting == 0


@pytest.mark.parametrize("before_s,after_s,expected", [
    (0.00, 0.01, {0}),        # before the first step ended
    (0.30, 0.31, {1}),        # inside step 1: step 0's stats, never step 1's own
    (0.45, 0.55, {1, 2}),     # across step 1's end
    (0.82, 0.83, {2, 0}),     # just after the last step: step 1's may still be shown (slack)
    (1.00, 1.01, {0}),
])
def test_allowed_values_follow_the_publication_rule(before_s, after_s, expected) -> None:
    def rec(i: int, start: float, end: float, running: int) -> StepRecord:
        return StepRecord(i, start, end, running, EngineGauges(running, 0, 0.0, None, None, None))

    records = [rec(0, 0.0, 0.2, 1), rec(1, 0.2, 0.5, 2), rec(2, 0.5, 0.8, 0)]
    assert allowed_values(records, before_s, after_s) == expected
