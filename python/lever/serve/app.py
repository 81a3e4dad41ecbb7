"""`lever serve`: an OpenAI-compatible HTTP server (aiohttp) over one model.

Endpoints: POST /v1/chat/completions (the model's chat template, as `lever
generate` applies it), POST /v1/completions (the prompt as it is, or token
ids), GET /v1/models, GET /health (no token needed), GET /metrics
(Prometheus text, lever.serve.prom).

- Requests run one at a time on the engine thread, first come first served
  (lever.serve.generation_queue); at most `max_queue` wait, one more is a 429.
- `stream: true` answers with server-sent events in OpenAI's chunk format
  (`data: {...}` per piece, `data: [DONE]` last); the chunk that ends the
  choice carries the `speculative` object, and with
  `stream_options.include_usage` one more chunk carries `usage`.
- Cancellation: a client that disconnects (streamed or not) cancels its
  request -- dropped if it still waits, stopped at the engine's next token
  or prefill chunk if it runs, its engine state freed either way; /metrics
  counts it.  A prefill longer than `max_prefill_s` is stopped the same way
  and answered 422 prefill_timeout (lever.serve.generation.PrefillPace).
- Chat templates render off the event loop, CHAT_THREADS at a time, each
  in a worker process under a budget (lever.model.chat_template): a failing
  or hostile template is a 400 chat_template naming it while every other
  endpoint answers; more than `max_queue` chats waiting to render is a 429.
- Every response carries `usage` and `speculative`: mode, draft,
  target_passes, drafted, accepted (draft tokens), mean_accepted_length
  (tokens per target pass), acceptance_rate, target ("dram" or "flash"),
  bytes_read_per_token (flash reads per generated token; null for a target
  in DRAM, which reads nothing), seed (null when greedy).
- A request whose `model` names a model this server does not host is served
  by its own model (as llama.cpp's server does; responses name the served
  model), with one warning line in the log per such name (at most
  MAX_LOGGED_MODEL_NAMES names, so a client cannot grow the set without end).
- Authentication, limits and hardening are the verifier server's: a bearer
  token (401 none, 403 wrong), bodies over `max_body_bytes` refused (413),
  header and body deadlines (connections.py, 408), connection caps (503;
  /health and /metrics are answered beyond them), idle keep-alive
  connections closed after `keepalive_timeout_s`.
- Shutdown (SIGINT or SIGTERM, lever.http.shutdown): new requests get 503,
  running ones get the drain's seconds to finish, then are cancelled
  (`cancel_work`): a stream then ends with an error chunk (code
  `shutting_down`) and `data: [DONE]`, as every stream that fails does.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from aiohttp import web

from ..errors import LeverError
from ..http.common import HttpError, client_gone, error_headers, guard_middleware, http_logger, read_body
from ..http.connections import ConnectionGuard
from ..sampling import SamplingParams
from . import openai_schema as schema
from .generation import Delta, Generator, Outcome, PrefillTimeout
from .generation_queue import Cancelled, GenerationQueue, Job, QueueFull
from .prom import CONTENT_TYPE, HttpCounters, exposition

OPEN_PATHS = ("/health",)          # answered without a token
CHAT_THREADS = 2                   # chat requests whose template renders at once (lever.model.chat_template's workers)
UNCAPPED_PATHS = ("/health", "/metrics")   # answered beyond the connection limits (GET, HEAD)
MAX_LOGGED_MODEL_NAMES = 256       # other-model names warned about once each; later new names are not logged


@dataclass(frozen=True)
class ServeLimits:
    """Limits of `lever serve`. Bytes are bytes, seconds seconds, tokens tokens."""

    max_queue: int = 16                  # requests waiting for the engine at most
    max_tokens: int = 4096               # completion tokens per request at most
    max_body_bytes: int = 1 << 20
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 256
    max_connections_per_ip: int = 64
    max_prefill_s: float = 300.0         # a request's prefill at most (then a 422 prefill_timeout)
    keepalive_timeout_s: float = 5.0     # an idle keep-alive connection is closed after this long

    def __post_init__(self) -> None:
        for name in ("max_queue", "max_tokens", "max_body_bytes", "max_connections", "max_connections_per_ip"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout_s", "body_timeout_s", "max_prefill_s", "keepalive_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")


class OpenAIServer:
    """The application: `generator` (lever.serve.generation.Generator) runs
    the requests; `model_name` is what /v1/models lists and requests name;
    token: the bearer token (None: no authentication, loopback only --
    enforced by the command); defaults: the sampling of requests that do
    not set it (the command's --temperature, --top-p, --top-k, --seed)."""

    def __init__(self, generator: Generator, model_name: str, limits: ServeLimits = ServeLimits(),
                 token: str | None = None, defaults: SamplingParams = SamplingParams(), log=None):
        self.generator, self.model_name, self.limits, self.token = generator, model_name, limits, token
        self.engine = generator.counters
        self.http = HttpCounters()
        self.queue = GenerationQueue(limits.max_queue)
        self.started, self.created = time.monotonic(), int(time.time())
        self.log = log or (lambda line: print(f"lever serve: {line}", file=sys.stderr, flush=True))
        self.other_models: set[str] = set()      # `model` names asked for that this server does not host
        self.http_log = http_logger(f"lever.serve.{id(self)}", self.log)
        self.connections = ConnectionGuard(None, limits.header_timeout_s, limits.max_connections,
                                           limits.max_connections_per_ip, on_refused=self._refused,
                                           on_timeout=self._timed_out, open_paths=UNCAPPED_PATHS,
                                           keepalive_timeout_s=limits.keepalive_timeout_s)
        self.chat_pool = ThreadPoolExecutor(CHAT_THREADS, thread_name_prefix="lever-serve-chat")
        self.chats_parsing = 0                   # chat requests on (or waiting for) the chat pool
        tokenizer = generator.loaded.tokenizer
        self.served = schema.ServedModel(
            name=model_name, vocab_size=generator.loaded.config.vocab_size, context=generator.context,
            max_tokens=limits.max_tokens, defaults=defaults,
            encode_chat=lambda messages: tokenizer.encode(tokenizer.apply_chat_template(messages)),
            encode_text=tokenizer.encode)

    def app(self) -> web.Application:
        guard = guard_middleware(self.connections, self.token, OPEN_PATHS, self._error, self.log)
        app = web.Application(middlewares=[guard], client_max_size=self.limits.max_body_bytes)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.on_cleanup.append(self._stop)
        return app

    # -- plumbing ------------------------------------------------------------------------

    def _error(self, e: HttpError) -> web.Response:
        body = schema.error_body(e.status, e.code, e.message, e.param)
        return error_headers(web.json_response(body, status=e.status), e.status)

    def _refused(self) -> None:
        self.http.connections_refused += 1

    def _timed_out(self) -> None:
        self.http.connections_timed_out += 1

    async def _body(self, request: web.Request) -> dict:
        raw = await read_body(request, self.limits.max_body_bytes, self.limits.body_timeout_s)
        conn = self.connections.watch(request.transport)
        if conn is not None:
            conn.body_read()
        return schema.decode_json(raw)

    # -- endpoints -----------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "model": self.model_name, "queue_depth": self.queue.depth,
                                  "active_generations": self.queue.active})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(schema.models_list(self.model_name, self.created))

    async def metrics(self, request: web.Request) -> web.Response:
        text = exposition(self.http, self.engine, self.queue, time.monotonic() - self.started)
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, await self._parse_chat(await self._body(request)), "chatcmpl")

    async def _parse_chat(self, body: dict) -> schema.GenRequest:
        """parse_chat off the event loop, on the chat pool (CHAT_THREADS threads):
        the chat template renders in a worker process under its budget
        (lever.model.chat_template), so a slow or hostile template never
        stalls other requests; more than max_queue chats waiting there is a 429."""
        if self.chats_parsing >= CHAT_THREADS + self.limits.max_queue:
            raise schema.OpenAIError(429, "queue_full", f"the server is busy: {self.chats_parsing} chat requests "
                                                        f"wait for their template; retry later")
        self.chats_parsing += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.chat_pool, schema.parse_chat, body,
                                                                    self.served)
        finally:
            self.chats_parsing -= 1

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, schema.parse_completion(await self._body(request), self.served), "cmpl")

    def _note_other_model(self, req: schema.GenRequest) -> None:
        """Warn, once per name, that a request named a model this server does not host."""
        name = req.requested_model
        if name is None or name in self.other_models or len(self.other_models) > MAX_LOGGED_MODEL_NAMES:
            return
        self.other_models.add(name)
        if len(self.other_models) > MAX_LOGGED_MODEL_NAMES:
            self.log(f"more than {MAX_LOGGED_MODEL_NAMES} other model names requested; serving "
                     f"{self.model_name!r} for them without logging each")
            return
        self.log(f"a request names the model {schema.show(name)}, which this server does not host: serving "
                 f"{self.model_name!r} instead (logged once per name)")

    async def _generate(self, request: web.Request, req: schema.GenRequest, prefix: str) -> web.StreamResponse:
        """Queue `req` on the engine and answer it, whole or streamed; the job
        is cancelled whenever this handler ends before the job does (the
        client disconnected: aiohttp cancels the handler)."""
        self._note_other_model(req)
        job = Job(lambda j: self.generator.run(req, j, self.limits.max_prefill_s), asyncio.get_running_loop())
        try:
            self.queue.submit(job)
        except QueueFull as e:
            raise schema.OpenAIError(429, "queue_full", f"the server is busy: {e}; retry later") from None
        rid, created = f"{prefix}-{secrets.token_hex(12)}", int(time.time())
        try:
            if req.stream:
                return await self._stream(request, req, job, rid, created)
            try:
                outcome: Outcome = await asyncio.shield(job.done)
            except LeverError as e:
                raise self._failure(e) from None
            return web.json_response(schema.response(req, rid, created, outcome.text, outcome.token_ids,
                                                     outcome.finish_reason, outcome.speculative))
        finally:
            if not job.done.done():          # the client left (this handler was cancelled) or a write failed
                job.cancel()
            job.done.add_done_callback(lambda f: f.cancelled() or f.exception())   # never "never retrieved"

    async def _stream(self, request: web.Request, req: schema.GenRequest, job: Job, rid: str,
                      created: int) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if req.kind == "chat":                              # the role first, as OpenAI does
            await resp.write(schema.sse(schema.chunk(req, rid, created, first=True)))
        while not job.done.done():
            getter = asyncio.ensure_future(job.events.get())
            try:
                await asyncio.wait([getter, job.done], return_when=asyncio.FIRST_COMPLETED)
            finally:
                getter.cancel()
            if getter.done() and not getter.cancelled():
                delta: Delta = getter.result()
                if delta.text or delta.token_ids:
                    await self._send(request, resp, schema.chunk(req, rid, created, delta.text, delta.token_ids))
        while not job.events.empty():                      # pieces posted just before the end
            delta = job.events.get_nowait()
            await self._send(request, resp, schema.chunk(req, rid, created, delta.text, delta.token_ids))
        failure = None
        try:
            outcome: Outcome = job.done.result()
        except LeverError as e:                          # the headers are sent: the failure goes in the stream
            failure = self._failure(e)
        except Exception as e:  # noqa: BLE001 -- a bug: logged, and told to the client in the stream
            self.log(f"internal error mid-stream: {type(e).__name__}: {e}")
            failure = HttpError(500, "internal", f"the server failed ({type(e).__name__})")
        if failure is not None:                          # an error chunk, then the end of the stream as usual
            await self._send(request, resp, schema.error_body(failure.status, failure.code, failure.message))
            await resp.write(schema.sse("[DONE]"))
            await resp.write_eof()
            return resp
        await self._send(request, resp, schema.chunk(req, rid, created, finish_reason=outcome.finish_reason,
                                                     speculative=outcome.speculative))
        if req.include_usage:
            await self._send(request, resp, schema.usage_chunk(req, rid, created, len(outcome.token_ids),
                                                               outcome.speculative))
        await resp.write(schema.sse("[DONE]"))
        await resp.write_eof()
        return resp

    def _failure(self, e: LeverError) -> HttpError:
        """A run that ended in `e`: cancelled by the server (shutting down: 503), its
        prefill over --max-prefill-seconds (422), or failed (500, logged)."""
        if isinstance(e, Cancelled) and self.connections.draining:
            return HttpError(503, "shutting_down", "the server shut down before the request finished")
        if isinstance(e, Cancelled):
            return HttpError(503, "cancelled", f"the request was cancelled: {e}")
        if isinstance(e, PrefillTimeout):
            return HttpError(422, "prefill_timeout", str(e)[:300], "prompt")
        self.log(f"generation failed: {type(e).__name__}: {e}")
        return HttpError(500, "generation_failed", f"generation failed: {e}"[:300])

    @staticmethod
    async def _send(request: web.Request, resp: web.StreamResponse, obj: dict) -> None:
        """Write one event; a client that has gone raises ConnectionResetError (the job is then cancelled)."""
        if client_gone(request):
            raise ConnectionResetError("the client went away")
        await resp.write(schema.sse(obj))

    def cancel_work(self) -> None:
        """Stop every request: the waiting ones are dropped, the running one stops at its next token."""
        self.queue.close()

    async def _stop(self, app) -> None:
        self.queue.close()
        self.chat_pool.shutdown(wait=False, cancel_futures=True)
