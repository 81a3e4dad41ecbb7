"""The verifier server (`lever serve-verifier`): an aiohttp application that
hosts a target and verifies the trees edge clients send (protocol.py).

- Target passes run one at a time on a single compute thread; the event
  loop keeps answering health checks, refusals and other sessions' requests
  meanwhile.
- Every request but /v1/health needs ``Authorization: Bearer <token>`` when
  the server has a token: none -> 401, a wrong one -> 403.
- A body over the limit is refused from its Content-Length, before any of it
  is read (a chunked one once the limit is passed), and the connection closed.
- Sessions idle longer than the TTL are closed by a reaper task.
- Bad input gets a 4xx and never touches other sessions; an unexpected
  failure inside a session closes that session only (its client rebuilds it).
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from aiohttp import web

from .protocol import VERSION, Limits, ProtocolError, decode, encode, parse_open, parse_round
from .session import VerifierSession


@dataclass
class Metrics:
    """Server counters since start. Seconds are seconds, bytes are body bytes."""

    started: float = field(default_factory=time.monotonic)
    sessions_opened: int = 0
    sessions_closed: int = 0
    sessions_expired: int = 0
    sessions_failed: int = 0
    prefill_tokens: int = 0
    rounds: int = 0                    # target passes over trees (= target calls)
    replayed: int = 0                  # retried rounds answered from the stored answer
    tree_tokens: int = 0               # tokens scored in rounds (roots included)
    emitted_tokens: int = 0            # tokens committed by rounds
    compute_s: float = 0.0             # target passes, prefills included
    bytes_in: int = 0
    bytes_out: int = 0
    errors: dict = field(default_factory=dict)   # HTTP status -> count

    def to_json(self, active: int) -> dict:
        return {
            "uptime_s": round(time.monotonic() - self.started, 3),
            "sessions": {"active": active, "opened": self.sessions_opened, "closed": self.sessions_closed,
                         "expired": self.sessions_expired, "failed": self.sessions_failed},
            "target_calls": self.rounds, "replayed_rounds": self.replayed,
            "prefill_tokens": self.prefill_tokens, "tree_tokens": self.tree_tokens,
            "emitted_tokens": self.emitted_tokens,
            "tokens_per_call": round(self.emitted_tokens / self.rounds, 4) if self.rounds else None,
            "compute_s": round(self.compute_s, 4), "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
            "errors": {str(k): v for k, v in sorted(self.errors.items())},
        }


class VerifierServer:
    """Hosts `model` (a Decoder or StreamedDecoder) for edge clients.

    model_name: what /v1/info reports; token: the bearer token (None: no
    authentication -- loopback only, enforced by the command);
    verify_cost: {"n": [...], "s": [...]} seconds of one target pass over n
    tree tokens, published for the clients' tree sizing; tokenizer: an
    identifier of the target's tokenizer, for clients to check theirs."""

    def __init__(self, model, model_name: str, limits: Limits = Limits(), token: str | None = None,
                 verify_cost: dict | None = None, tokenizer: str | None = None, log=None):
        self.model, self.model_name, self.limits = model, model_name, limits
        self.token = token
        self.verify_cost = verify_cost
        self.tokenizer = tokenizer
        self.sessions: dict[str, VerifierSession] = {}
        self.open_ids: dict[str, VerifierSession] = {}     # the client's open_id -> its session
        self.opening = 0
        self.metrics = Metrics()
        self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lever-verify")
        self.log = log or (lambda line: print(f"lever serve-verifier: {line}", file=sys.stderr, flush=True))
        self._reaper: asyncio.Task | None = None

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def session_capacity(self) -> int:
        return min(self.limits.max_session_tokens, self.model.config.max_context)

    # -- the application ----------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=self.limits.max_body_bytes)
        app.router.add_get("/v1/health", self.health)
        app.router.add_get("/v1/info", self.info)
        app.router.add_get("/v1/metrics", self.metrics_handler)
        app.router.add_post("/v1/sessions", self.open_session)
        app.router.add_post("/v1/sessions/{sid}/rounds", self.verify_round)
        app.router.add_delete("/v1/sessions/{sid}", self.close_session)
        app.on_startup.append(self._start_reaper)
        app.on_cleanup.append(self._stop)
        return app

    def _reply(self, obj: dict, status: int = 200) -> web.Response:
        body = encode(obj)
        self.metrics.bytes_out += len(body)
        return web.Response(body=body, status=status, content_type="application/json")

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        try:
            if request.path != "/v1/health":
                self._authenticate(request)
            return await handler(request)
        except ProtocolError as e:
            return self._refuse(e)
        except web.HTTPException as e:          # unknown path, wrong method
            if e.status < 400:
                raise
            return self._refuse(ProtocolError(e.status, e.reason.lower().replace(" ", "_"),
                                              f"{request.method} {request.path}: {e.reason}"))

    def _refuse(self, e: ProtocolError) -> web.Response:
        self.metrics.errors[e.status] = self.metrics.errors.get(e.status, 0) + 1
        resp = self._reply(e.body(), status=e.status)
        if e.status == 401:
            resp.headers["WWW-Authenticate"] = 'Bearer realm="lever"'
        if e.status == 413:
            resp.force_close()                  # the rest of the body is never read
        return resp

    def _authenticate(self, request: web.Request) -> None:
        if self.token is None:
            return
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer ") or not header[7:].strip():
            raise ProtocolError(401, "unauthorized", "this server needs 'Authorization: Bearer <token>'")
        if not hmac.compare_digest(header[7:].strip().encode(), self.token.encode()):
            raise ProtocolError(403, "forbidden", "the bearer token is not valid for this server")

    async def _read_body(self, request: web.Request) -> dict:
        """The request's JSON body, refusing one over the limit before reading it."""
        limit = self.limits.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise ProtocolError(413, "body_too_large", f"a body of {request.content_length} bytes is over the "
                                                       f"limit of {limit} bytes")
        raw = bytearray()
        async for chunk in request.content.iter_chunked(1 << 16):
            raw += chunk
            if len(raw) > limit:
                raise ProtocolError(413, "body_too_large", f"the body is over the limit of {limit} bytes")
        self.metrics.bytes_in += len(raw)
        return decode(bytes(raw))

    # -- endpoints -----------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return self._reply({"status": "ok"})

    async def info(self, request: web.Request) -> web.Response:
        return self._reply({"model": self.model_name, "vocab_size": self.vocab_size,
                            "max_context": self.session_capacity, "limits": self.limits.to_json(),
                            "verify_cost": self.verify_cost, "tokenizer": self.tokenizer,
                            "sessions": len(self.sessions)})

    async def metrics_handler(self, request: web.Request) -> web.Response:
        return self._reply(self.metrics.to_json(active=len(self.sessions)))

    async def open_session(self, request: web.Request) -> web.Response:
        req = parse_open(await self._read_body(request), self.vocab_size, self.limits, self.session_capacity)
        known = self.open_ids.get(req.open_id) if req.open_id is not None else None
        if known is None and len(self.sessions) + self.opening >= self.limits.max_sessions:
            raise ProtocolError(429, "too_many_sessions", f"this server holds its limit of "
                                                          f"{self.limits.max_sessions} sessions; close one or retry later")
        self.opening += 1
        try:
            session, created = await self._run(None, self._create_session, req)
        finally:
            self.opening -= 1
        if created:
            self.sessions[session.id] = session
            m = self.metrics
            m.sessions_opened += 1
            m.prefill_tokens += len(req.prompt)
            m.compute_s += session.prefill_s
        return self._reply({"session": session.id, "round": 0, "position": session.position, "seed": session.seed,
                            "server_s": round(session.prefill_s, 6), "replayed": not created},
                           status=201 if created else 200)

    def _create_session(self, req) -> tuple[VerifierSession, bool]:
        """(session, created) -- on the compute thread, so that a retried open
        (same open_id) waits for the first and gets its session, not a second one."""
        if req.open_id is not None:
            known = self.open_ids.get(req.open_id)
            if known is not None and known.next_round == 0:
                return known, False
        session = VerifierSession(secrets.token_urlsafe(12), self.model, req, self.session_capacity,
                                  self.limits.max_tree_nodes)
        if req.open_id is not None:
            self.open_ids[req.open_id] = session
        return session, True

    def _forget(self, session: VerifierSession) -> None:
        self.sessions.pop(session.id, None)
        if session.open_id is not None:
            self.open_ids.pop(session.open_id, None)

    async def verify_round(self, request: web.Request) -> web.Response:
        body = await self._read_body(request)
        session = self._session(request.match_info["sid"])
        req = parse_round(body, self.vocab_size, self.limits)
        session.busy += 1
        try:
            answer = await self._run(session, session.answer_round, req)
        finally:
            session.busy -= 1
            session.last_used = time.monotonic()
        m = self.metrics
        if answer["replayed"]:
            m.replayed += 1
        else:
            m.rounds += 1
            m.tree_tokens += len(req.tokens)
            m.emitted_tokens += len(answer["accepted"]) + 1
            m.compute_s += answer["server_s"]
        return self._reply(answer)

    async def close_session(self, request: web.Request) -> web.Response:
        session = self._session(request.match_info["sid"])
        self._forget(session)
        self.metrics.sessions_closed += 1
        return self._reply({"closed": session.id, "rounds": session.next_round})

    def _session(self, sid: str) -> VerifierSession:
        session = self.sessions.get(sid)
        if session is None:
            raise ProtocolError(404, "unknown_session", f"no session {sid!r} (closed, expired, or the server "
                                                        f"restarted); open a new one")
        session.last_used = time.monotonic()
        return session

    async def _run(self, session: VerifierSession | None, fn, *args):
        """Run `fn` on the compute thread.  A ProtocolError passes through; any
        other failure closes the session it happened in (its state may be
        half-updated) and answers 500."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.compute, fn, *args)
        except ProtocolError:
            raise
        except Exception as e:  # noqa: BLE001 -- a failure of one session must not take the server down
            if session is not None:
                self._forget(session)
                self.metrics.sessions_failed += 1
            self.log(f"internal error ({type(e).__name__}: {e}); the session was closed")
            raise ProtocolError(500, "internal", f"the verifier failed ({type(e).__name__}: {e}); the session "
                                                 f"was closed, open a new one") from None

    # -- idle sessions --------------------------------------------------------------------

    async def _start_reaper(self, app) -> None:
        self._reaper = asyncio.get_running_loop().create_task(self._reap_forever())

    async def _reap_forever(self) -> None:
        period = min(self.limits.idle_ttl_s / 4, 5.0)
        while True:
            await asyncio.sleep(period)
            self.reap_idle()

    def reap_idle(self, now: float | None = None) -> int:
        """Close sessions idle for longer than the TTL; returns how many."""
        now = time.monotonic() if now is None else now
        stale = [s for s in self.sessions.values() if s.busy == 0 and now - s.last_used > self.limits.idle_ttl_s]
        for session in stale:
            self._forget(session)
        self.metrics.sessions_expired += len(stale)
        return len(stale)

    async def _stop(self, app) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        self.compute.shutdown(wait=False, cancel_futures=True)


async def start_site(server: VerifierServer, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve `server` on host:port (0: any free port); returns the runner and the port."""
    runner = web.AppRunner(server.app(), access_log=None, lingering_time=0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if port == 0 else port
    return runner, bound


def serve_forever(server: VerifierServer, host: str, port: int, on_ready=None) -> None:
    """Serve until interrupted (Ctrl-C / SIGTERM)."""
    async def main() -> None:
        runner, bound = await start_site(server, host, port)
        if on_ready is not None:
            on_ready(bound)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass


class ServerThread:
    """A VerifierServer on a background thread (tests, benchmarks, notebooks).

        with ServerThread(VerifierServer(model, "name")) as s:
            client = RemoteVerifier(s.url, ...)
    """

    def __init__(self, server: VerifierServer, host: str = "127.0.0.1", port: int = 0):
        self.server, self.host, self.port = server, host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "ServerThread":
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                runner, self.port = loop.run_until_complete(start_site(self.server, self.host, self.port))
            except BaseException as e:  # noqa: BLE001 -- reported to the starting thread
                self._error = e
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="lever-verifier-server", daemon=True)
        self._thread.start()
        ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = ["VERSION", "Limits", "Metrics", "ServerThread", "VerifierServer", "serve_forever", "start_site"]
