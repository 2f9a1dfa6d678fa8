"""The simulated engine behind an OpenAI-compatible HTTP server, as vLLM serves it: streamed and plain
/v1/chat/completions, /v1/models, /health, /version and /metrics. One asyncio task advances the engine
in real time (`time_scale` simulated seconds per wall second); each request waits on its own queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from harness.config import LaunchProfile
from harness.config.prompts import load_prompt_set
from harness.config.sim import SimSettings
from harness.errors import HarnessError
from harness.sim.capacity import hisparse_start_lines, kv_capacity, refusal
from harness.sim.counters import EngineGauges
from harness.sim.engine import Engine, FinishedRequest, SimRequest
from harness.sim.engine_config import engine_config
from harness.sim.exposition import MALFORMED_METRICS_TEXT, MetricsText
from harness.sim.prompt import PromptMeasurer

FILLER_TEXT = (" The patch updates the parser, adds a regression test and keeps the public API unchanged;"
               " next I will run the test suite and check the logs for errors.")


@dataclass
class _Stream:
    queue: asyncio.Queue
    sent_tokens: int = 0
    output_tokens: int = 0  # the reply's length, decided when the request arrives
    reasoning_tokens: int = 0  # how many of them are reasoning (with a reasoning parser and thinking on)
    text: str | None = None  # a fixed reply (greedy answers), sent whole with the first content token
    return_token_ids: bool = False  # vLLM's `return_token_ids`: the reply carries its generated token ids


def _error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status},
            "object": "error", "message": message, "type": kind, "code": status}
    return web.json_response(body, status=status)


class SimServer:
    def __init__(self, profile: LaunchProfile, tokenizer: Any, *, log=print):
        self.profile = profile
        self.sim = profile.sim or SimSettings()
        self.config = engine_config(profile)
        self.engine = Engine(self.config)
        self.model_name = profile.served_model_name
        # What /metrics shows of the scheduler (running, waiting, KV usage): the stats of the last step that
        # ended, as vLLM's frontend sets its gauges from each step's outputs (docs/metrics.md, "Occupancy
        # two ways"); never the state of the step still in flight.
        self.published: EngineGauges = self.engine.gauges()
        self.metrics = MetricsText(self.engine, self.model_name, gauges=lambda: self.published)
        self.measurer = PromptMeasurer(tokenizer, self.config.block_size)
        self.tokenizer = tokenizer
        ids = tokenizer.encode_bare(FILLER_TEXT)
        self.filler = [tokenizer.decode([i]) for i in ids] or [" ok"]
        self.faults = self.sim.faults
        self.rng = random.Random(self.sim.seed)
        # greedy replies to the shipped correctness prompts: their right answers, as a model that knows them
        self.answers = {p.prompt: p.answer for p in load_prompt_set().prompts if p.answer is not None}
        self.streams: dict[str, _Stream] = {}
        self.completed_requests = 0
        self.started_monotonic = time.monotonic()
        self.log = log
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sim-tokenize")
        self._loop_task: asyncio.Task | None = None

    # ---------------------------------------------------------------- clock and step loop

    def now_s(self) -> float:
        return (time.monotonic() - self.started_monotonic) * self.sim.time_scale

    async def step_loop(self) -> None:
        scale = self.sim.time_scale
        while True:
            if not self.engine.has_work():
                self.published = self.engine.gauges()  # idle: what the last step left, less any abort since
                self._wake.clear()
                await self._wake.wait()
                continue
            result = self.engine.step(self.now_s())
            if result.duration_s > 0:
                await asyncio.sleep(result.duration_s / scale)
            elif not result.tokens and not result.aborted:
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=0.05)
            if result.record is not None:  # the step has ended: its stats go out with its tokens
                self.published = result.record.stats
            finished = {done.request_id: done for done in result.finished}
            for rid, n in result.tokens.items():
                self._deliver(rid, ("tokens", n, finished.pop(rid, None)))
            for rid, done in finished.items():
                self._deliver(rid, ("tokens", 0, done))
            for rid in result.aborted:
                self._deliver(rid, ("error", "request does not fit the KV cache pool", None))

    def _deliver(self, rid: str, event: tuple[str, Any, FinishedRequest | None]) -> None:
        stream = self.streams.get(rid)
        if stream is not None:
            stream.queue.put_nowait(event)

    # ---------------------------------------------------------------- readiness

    def ready(self) -> bool:
        if self.faults.never_ready:
            return False
        return time.monotonic() - self.started_monotonic >= self.faults.ready_delay_s

    async def health(self, request: web.Request) -> web.Response:
        if not self.ready():
            return web.Response(status=503, text="starting")
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        if not self.ready():
            return _error(503, "server is starting", "ServiceUnavailableError")
        card = {"id": self.model_name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": self.profile.serve.model, "parent": None, "max_model_len": self.config.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "sim", "engine": "harness-sim", "simulated": True})

    async def metrics_handler(self, request: web.Request) -> web.Response:
        if self.faults.malformed_metrics:
            return web.Response(body=MALFORMED_METRICS_TEXT.encode(), content_type="text/plain")
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    # ---------------------------------------------------------------- chat completions

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if not self.ready():
            return _error(503, "server is starting", "ServiceUnavailableError")
        if self.faults.error_fraction and self.rng.random() < self.faults.error_fraction:
            return _error(500, "injected fault (sim.faults.error_fraction)", "InternalServerError")
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "request body is not JSON", "BadRequestError")
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            return _error(400, "messages must be a non-empty list of objects", "BadRequestError")
        model = body.get("model")
        if model is not None and model != self.model_name:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        try:
            shape = await asyncio.get_running_loop().run_in_executor(self._executor, self.measurer.measure,
                                                                     messages)
        except (KeyError, TypeError, ValueError, HarnessError) as exc:
            return _error(400, f"cannot render the chat: {exc}", "BadRequestError")
        room = self.config.max_model_len - shape.tokens
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or room
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, "max_tokens must be a positive integer", "BadRequestError")
        if max_tokens > room:
            return _error(400, f"This model's maximum context length is {self.config.max_model_len} tokens. "
                          f"However, you requested {max_tokens} output tokens and your prompt contains "
                          f"{shape.tokens} input tokens.", "BadRequestError")
        stream = self._reply(body, messages, max_tokens)
        stream.return_token_ids = body.get("return_token_ids") is True
        output = stream.output_tokens
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        self.streams[rid] = stream
        try:
            self.engine.add_request(SimRequest(rid, shape.tokens, shape.block_hashes, max_tokens, output),
                                    self.now_s())
        except HarnessError as exc:
            del self.streams[rid]
            return _error(400, str(exc), "BadRequestError")
        self._wake.set()
        try:
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return await self._stream(request, rid, stream, include_usage)
            return await self._whole(rid, stream)
        finally:
            self.streams.pop(rid, None)
            self.engine.abort(rid)  # no-op when finished; frees the KV of a client that went away

    def _reply(self, body: dict[str, Any], messages: list[dict[str, Any]], max_tokens: int) -> _Stream:
        """What the reply will be: its length, its reasoning share and, for a shipped correctness prompt, its
        text.

        Replies end anywhere in the second half of max_tokens (all of it with ignore_eos). A shipped correctness
        prompt gets its right answer, the same every time, as a model that knows it would greedily; with
        `faults.corrupt_under_pressure`, one asked while that many requests run gets a wrong one, as a kernel
        that corrupts KV under pressure would give."""
        last = messages[-1].get("content")
        answer = self.answers.get(last) if isinstance(last, str) else None
        if answer is not None:  # no draw from the seeded sequence: probing leaves the sweep's replies as they were
            corrupt = self.faults.corrupt_under_pressure
            if corrupt is not None and len(self.engine.running) >= corrupt:
                self.log(f"sim: a wrong answer at {len(self.engine.running)} running "
                         "(sim.faults.corrupt_under_pressure)")
                answer = answer * 2  # token noise: the answer twice, which is no longer the answer
            return _Stream(asyncio.Queue(), output_tokens=min(max_tokens, 2), text=answer)
        ignore_eos = bool(body.get("ignore_eos", False))
        output = max_tokens if ignore_eos else self.rng.randint(max(1, max_tokens // 2), max_tokens)
        thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True) is not False
        # With a reasoning parser (serve.reasoning_parser, as the blog's glm45) the first half of a reply is
        # reasoning, streamed as `delta.reasoning` the way vLLM's parser separates it; none without one.
        reasoning = output // 2 if self.profile.serve.reasoning_parser and thinking else 0
        return _Stream(asyncio.Queue(), output_tokens=output, reasoning_tokens=reasoning)

    def _text(self, start: int, n: int) -> str:
        return "".join(self.filler[(start + i) % len(self.filler)] for i in range(n))

    def _delta(self, stream: _Stream, start: int, n: int) -> dict[str, str]:
        """The delta for tokens [start, start + n): reasoning first, then content."""
        split = stream.reasoning_tokens
        delta: dict[str, str] = {}
        if start < split:
            delta["reasoning"] = self._text(start, min(n, split - start))
        if start + n > split:
            first = max(start, split)
            if stream.text is None:
                delta["content"] = self._text(first, start + n - first)
            else:
                delta["content"] = stream.text if first == split else ""
        return delta

    def _usage(self, done: FinishedRequest) -> dict[str, Any]:
        return {"prompt_tokens": done.prompt_tokens, "total_tokens": done.prompt_tokens + done.output_tokens,
                "completion_tokens": done.output_tokens, "prompt_tokens_details": None}

    async def _whole(self, rid: str, stream: _Stream) -> web.Response:
        while True:
            kind, value, done = await stream.queue.get()
            if kind == "error":
                return _error(500, value, "InternalServerError")
            if done is not None:
                break
        self._count_completion()
        delta = self._delta(stream, 0, done.output_tokens)
        message: dict[str, Any] = {"role": "assistant", **delta, "tool_calls": []}
        message.setdefault("content", "")
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                                  "finish_reason": done.finish_reason, "stop_reason": None}
        if stream.return_token_ids:
            choice["token_ids"] = self.tokenizer.encode_bare(delta.get("reasoning", "") + message["content"])
        return web.json_response({
            "id": rid, "object": "chat.completion", "created": int(time.time()), "model": self.model_name,
            "choices": [choice],
            "usage": self._usage(done)})

    async def _stream(self, request: web.Request, rid: str, stream: _Stream,
                      include_usage: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        created = int(time.time())

        def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
            obj: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created,
                                   "model": self.model_name, "choices": choices}
            if usage is not None:
                obj["usage"] = usage
            return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

        first, stalled = True, False
        while True:
            kind, value, done = await stream.queue.get()
            if kind == "error":
                err = {"error": {"message": value, "type": "InternalServerError", "code": 500}}
                await response.write(b"data: " + json.dumps(err).encode() + b"\n\n")
                break
            if first:  # vLLM opens with a role-only delta
                await response.write(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}]))
                first = False
            stall_at = self.faults.stall_after_tokens
            if stall_at is not None and not stalled and stream.sent_tokens + value > stall_at:
                stalled = True
                self.log(f"sim: stalling {rid} for {self.faults.stall_s} s (sim.faults.stall_after_tokens)")
                await asyncio.sleep(self.faults.stall_s)
            delta = self._delta(stream, stream.sent_tokens, value) if value else {}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                      "finish_reason": done.finish_reason if done else None}
            if done is not None:
                choice["stop_reason"] = None
            await response.write(chunk([choice]))
            stream.sent_tokens += value
            if done is not None:
                if include_usage:
                    await response.write(chunk([], self._usage(done)))
                break
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        self._count_completion()
        return response

    def _count_completion(self) -> None:
        self.completed_requests += 1
        limit = self.faults.exit_after_requests
        if limit is not None and self.completed_requests >= limit:
            self.log(f"sim: exiting after {self.completed_requests} requests (sim.faults.exit_after_requests)")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(3)

    # ---------------------------------------------------------------- app

    @web.middleware
    async def require_api_key(self, request: web.Request, handler) -> web.StreamResponse:
        """As vLLM's --api-key / VLLM_API_KEY: every /v1 route needs `Authorization: Bearer <key>`."""
        key = self.profile.api_key
        if key and request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {key}":
            return _error(401, "Unauthorized", "authentication_error")
        return await handler(request)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 2**20, middlewares=[self.require_api_key])
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_post("/v1/chat/completions", self.chat)

        async def start_loop(app: web.Application) -> None:
            self._loop_task = asyncio.create_task(self.step_loop())

        async def stop_loop(app: web.Application) -> None:
            if self._loop_task is not None:
                self._loop_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._loop_task
            self._executor.shutdown(wait=False)

        app.on_startup.append(start_loop)
        app.on_cleanup.append(stop_loop)
        return app

    def describe(self) -> str:
        c = self.config
        pool = f"{self.engine.gpu.capacity_pages} {'HMA pages' if c.policy == 'hisparse' else 'blocks'}"
        parts = [f"policy {c.policy}", f"GPU pool {pool} ({c.sizing.kv_bytes_per_gpu / 2**30:.2f} GiB/GPU)",
                 f"TP{c.tensor_parallel_size}", f"max_num_seqs {c.max_num_seqs}",
                 f"max_model_len {c.max_model_len}", f"top-K {c.index_topk}"]
        if c.num_speculative_tokens:
            parts.append(f"MTP{c.num_speculative_tokens} (p_accept {c.draft_acceptance:.2f})")
        if c.policy == "hisparse":
            parts.append(f"hot rows {c.hot_rows} ({c.hot_pages_per_request} pages/request)")
        return ", ".join(parts)


async def serve(server: SimServer, host: str, port: int) -> None:
    """Serve until cancelled (SIGINT/SIGTERM); refuse, as vLLM does, a max_model_len whose one request cannot
    fit the KV cache (HarnessError, after logging vLLM's ValueError)."""
    refused = refusal(server.config)
    if refused is not None:
        server.log(f"ERROR sim: ValueError: {refused}")
        raise HarnessError(refused)
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    bound = port
    sockets = getattr(site._server, "sockets", None) or []  # type: ignore[attr-defined]
    if sockets:
        bound = sockets[0].getsockname()[1]
    server.log(f"sim: SIMULATED engine (no GPU): {server.describe()}")
    server.log(f"INFO sim: {kv_capacity(server.config).line(server.config.max_model_len)}")
    for line in hisparse_start_lines(server.config):
        server.log(f"INFO sim: {line}")
    if server.profile.api_key:  # as older vLLM releases do: the key appears among the printed arguments
        server.log(f"sim: non-default args: {{'api_key': {server.profile.api_key!r}, "
                   f"'served_model_name': [{server.model_name!r}]}}")
    server.log(f"sim: serving {server.model_name} on http://{host}:{bound}")
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
