"""The verifier server (`lever serve-verifier`): an aiohttp application that
hosts a target and verifies the trees edge clients send (protocol.py).

- Target passes run one at a time on a single compute thread; the event
  loop keeps answering health checks, refusals and other sessions' requests
  meanwhile.
- With a batch window (`batch_window_s` > 0, `--batch-window-ms`), the
  rounds of different sessions arriving within the window (and while a pass
  runs) are verified in ONE target pass (lever.remote.batcher), each session
  attending only its own cache and tree, each answered exactly as alone.
  /v1/metrics counts target passes, batched rounds and trees per pass.
- A prompt is prefilled in chunks of `Limits.prefill_chunk` tokens, one
  compute job each, so a long prefill delays another session's round by one
  chunk at most.  An open whose client went away before its answer (every
  client waiting for that open_id) is given up and frees its slot.
- Every request but /v1/health needs ``Authorization: Bearer <token>`` when
  the server has a token: none (or one with bytes that are not printable
  ASCII) -> 401, a wrong one -> 403.
- A body over the limit is refused from its Content-Length, before any of it
  is read (a chunked one once the limit is passed), and the connection closed.
- Slow clients are cut off: request headers must be complete within
  `header_timeout_s` (connections.py), a body within `body_timeout_s` (408);
  connections over `max_connections` (or `max_connections_per_ip`) get a 503,
  but /v1/health and /v1/metrics are answered beyond them; an idle
  keep-alive connection is closed after `keepalive_timeout_s`.
- SIGINT or SIGTERM drain the server (lever.http.shutdown): new requests get
  503, running ones get `--drain-seconds` to finish, then are cancelled.
- Sessions idle longer than the TTL are closed by a reaper task.
- Bad input gets a 4xx and never touches other sessions; an unexpected
  failure inside a session closes that session only (its client rebuilds it);
  any other unexpected exception is a 500 with a JSON body, logged once.
  Every answer's status is counted in /v1/metrics.
"""

from __future__ import annotations

import asyncio
import secrets
import ssl
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from ..http.common import (HttpError, SiteThread, client_gone, error_headers, guard_middleware, http_logger,
                           read_body, start_guarded_site)
from ..http.connections import ConnectionGuard
from ..http.shutdown import DEFAULT_DRAIN_S, serve_until_stopped
from ..http.logs import StatusCounter
from .batcher import PassStats, TreeBatcher, Waiting, batching_unsupported, verify_batch
from .metrics import Metrics
from .protocol import VERSION, Limits, ProtocolError, decode, encode, parse_open, parse_round
from .session import VerifierSession

OPEN_PATHS = ("/v1/health",)                     # answered without a token
UNCAPPED_PATHS = ("/v1/health", "/v1/metrics")   # answered beyond the connection limits (GET, HEAD)



class VerifierServer:
    """Hosts `model` (a model of the numpy protocol, lever.model.loading, or a
    StreamedDecoder) for edge clients.

    model_name: what /v1/info reports; token: the bearer token (None: no
    authentication -- loopback only, enforced by the command);
    verify_cost: {"n": [...], "s": [...]} seconds of one target pass over n
    tree tokens, published for the clients' tree sizing; tokenizer: an
    identifier of the target's tokenizer, for clients to check theirs;
    batch_window_s: seconds a round waits for other sessions' rounds to share
    its target pass (0: every round its own pass, one at a time);
    max_batch_trees: rounds per batched pass at most.  A target that cannot
    run batched passes (lever.remote.batcher.batching_unsupported) with a
    window > 0 is a ValueError."""

    def __init__(self, model, model_name: str, limits: Limits = Limits(), token: str | None = None,
                 verify_cost: dict | None = None, tokenizer: str | None = None, log=None,
                 batch_window_s: float = 0.0, max_batch_trees: int = 8):
        self.model, self.model_name, self.limits = model, model_name, limits
        self.token = token
        self.verify_cost = verify_cost
        self.tokenizer = tokenizer
        self.sessions: dict[str, VerifierSession] = {}
        self.open_ids: dict[str, VerifierSession] = {}     # the client's open_id -> its session
        self.opening = 0                                    # slots held by opens not registered yet
        self.metrics = Metrics()
        self.passes = PassStats()
        if not batch_window_s >= 0:
            raise ValueError(f"the batch window must be >= 0 seconds, got {batch_window_s}")
        if max_batch_trees < 1:
            raise ValueError(f"max_batch_trees must be >= 1, got {max_batch_trees}")
        self.batch_window_s, self.max_batch_trees = float(batch_window_s), int(max_batch_trees)
        self.batcher: TreeBatcher | None = None
        if batch_window_s > 0:
            reason = batching_unsupported(model)
            if reason is not None:
                raise ValueError(f"cannot batch verification: {reason}; run without a batch window")
            self.batcher = TreeBatcher(batch_window_s, max_batch_trees, self._run_batch,
                                       open_sessions=lambda: len(self.sessions))
        self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lever-verify")
        self.log = log or (lambda line: print(f"lever serve-verifier: {line}", file=sys.stderr, flush=True))
        self.http_log = http_logger(f"lever.serve-verifier.{id(self)}", self.log)
        self.connections = ConnectionGuard(None, limits.header_timeout_s, limits.max_connections,
                                           limits.max_connections_per_ip, on_refused=self._refused,
                                           on_timeout=self._timed_out, open_paths=UNCAPPED_PATHS,
                                           keepalive_timeout_s=limits.keepalive_timeout_s)
        self._reaper: asyncio.Task | None = None

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def session_capacity(self) -> int:
        return min(self.limits.max_session_tokens, self.model.config.max_context)

    # -- the application ----------------------------------------------------------------

    def app(self) -> web.Application:
        guard = guard_middleware(self.connections, self.token, OPEN_PATHS, self._refuse, self.log)
        app = web.Application(middlewares=[guard], client_max_size=self.limits.max_body_bytes)
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

    def _refuse(self, e: HttpError) -> web.Response:
        """The JSON answer to a refused request (any HttpError, as the protocol's error body)."""
        return error_headers(self._reply(ProtocolError(e.status, e.code, e.message).body(), status=e.status),
                             e.status)

    def _refused(self) -> None:
        self.metrics.connections_refused += 1
        self.metrics.count(503)

    def _timed_out(self) -> None:
        self.metrics.connections_timed_out += 1

    async def _read_body(self, request: web.Request) -> dict:
        """The request's JSON body, refusing one over the limit before reading
        it, and one not received within `body_timeout_s` seconds (408)."""
        raw = await read_body(request, self.limits.max_body_bytes, self.limits.body_timeout_s)
        conn = self.connections.watch(request.transport)
        if conn is not None:
            conn.body_read()
        self.metrics.bytes_in += len(raw)
        return decode(raw)

    # -- endpoints -----------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return self._reply({"status": "ok"})

    async def info(self, request: web.Request) -> web.Response:
        return self._reply({"model": self.model_name, "vocab_size": self.vocab_size,
                            "max_context": self.session_capacity, "limits": self.limits.to_json(),
                            "verify_cost": self.verify_cost, "tokenizer": self.tokenizer,
                            "sessions": len(self.sessions)})

    async def metrics_handler(self, request: web.Request) -> web.Response:
        batching = {"window_ms": round(self.batch_window_s * 1e3, 3) if self.batcher else 0,
                    "max_trees": self.max_batch_trees if self.batcher else 1}
        return self._reply({**self.metrics.to_json(active=len(self.sessions)), **self.passes.to_json(),
                            "batching": batching})

    async def open_session(self, request: web.Request) -> web.Response:
        req = parse_open(await self._read_body(request), self.vocab_size, self.limits, self.session_capacity)
        known = self.open_ids.get(req.open_id) if req.open_id is not None else None
        if known is not None and known.next_round == 0:       # a retried open: the first one's session
            return await self._answer_open(request, known, created=False)
        if len(self.sessions) + self.opening >= self.limits.max_sessions:
            raise ProtocolError(429, "too_many_sessions", f"this server holds its limit of "
                                                          f"{self.limits.max_sessions} sessions; close one or retry later")
        self.opening += 1                      # the slot is held until the session is registered or given up
        try:
            session = await self._run(None, VerifierSession, secrets.token_urlsafe(12), self.model, req,
                                      self.session_capacity, self.limits.max_tree_nodes)
        except BaseException as e:
            self.opening -= 1
            if isinstance(e, asyncio.CancelledError):   # aiohttp cancels the handler when its client goes
                self.metrics.sessions_abandoned += 1
            raise
        known = self.open_ids.get(req.open_id) if req.open_id is not None else None
        if known is not None and known.next_round == 0:     # the same open twice at once: the first wins
            self.opening -= 1
            return await self._answer_open(request, known, created=False)
        if req.open_id is not None:
            self.open_ids[req.open_id] = session
        session.prefill = background(self._prefill(session))
        return await self._answer_open(request, session, created=True)

    async def _prefill(self, session: VerifierSession) -> None:
        """Prefill `session` chunk by chunk (one compute job each, so other
        sessions' rounds run in between), then register it.  Given up, slot
        freed, as soon as no client waits for it any more."""
        try:
            while True:
                if self._nobody_waits(session):
                    raise asyncio.CancelledError
                if await self._run(session, session.prefill_step, self.limits.prefill_chunk):
                    break
        except BaseException:
            self._forget(session)
            if self._nobody_waits(session):
                self.metrics.sessions_abandoned += 1
            raise
        finally:
            self.opening -= 1
        self.sessions[session.id] = session
        session.last_used = time.monotonic()
        m = self.metrics
        m.sessions_opened += 1
        m.prefill_tokens += session.prompt_tokens
        m.compute_s += session.prefill_s

    async def _answer_open(self, request: web.Request, session: VerifierSession, created: bool) -> web.Response:
        """Wait for `session`'s prefill and answer; if this client went away
        and no other waits, the open is given up (its slot freed)."""
        session.waiters.append(request)
        answered = False
        try:
            await asyncio.shield(session.prefill)
            if client_gone(request):
                raise ProtocolError(400, "gone", "the client went away before the session was ready")
            answered = session.answered = True
            return self._reply({"session": session.id, "round": 0, "position": session.position,
                                "seed": session.seed, "server_s": round(session.prefill_s, 6),
                                "replayed": not created}, status=201 if created else 200)
        finally:
            session.waiters.remove(request)
            if not answered and not session.answered and not session.waiters:
                self._abandon(session)

    def _abandon(self, session: VerifierSession) -> None:
        """Give up an open nobody waits for: stop its prefill, or close it if it is ready."""
        if not session.prefill.done():
            self._forget(session)               # at once: a retry of this open makes a new one
            session.prefill.cancel()            # its cleanup frees the slot
        elif session.id in self.sessions and session.next_round == 0:
            self._forget(session)
            self.metrics.sessions_abandoned += 1

    def _nobody_waits(self, session: VerifierSession) -> bool:
        """True when every client waiting for `session`'s open has gone (or none waits)."""
        return all(client_gone(r) for r in session.waiters)

    def _forget(self, session: VerifierSession) -> None:
        self.sessions.pop(session.id, None)
        if session.open_id is not None and self.open_ids.get(session.open_id) is session:
            del self.open_ids[session.open_id]

    async def verify_round(self, request: web.Request) -> web.Response:
        body = await self._read_body(request)
        session = self._session(request.match_info["sid"])
        req = parse_round(body, self.vocab_size, self.limits)
        # a task of its own: if the client goes away, the round still completes and is counted
        # (its retry is then answered from the stored answer)
        return self._reply(await asyncio.shield(background(self._verify(session, req))))

    async def _verify(self, session: VerifierSession, req) -> dict:
        session.busy += 1
        try:
            if self.batcher is not None:
                answer = await self.batcher.submit(session, req)
            else:
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
            if self.batcher is None:            # a batched pass's seconds are counted once, by _run_batch
                m.compute_s += answer["server_s"]
                self.passes.record(1)
        return answer

    async def _run_batch(self, batch: list[Waiting]) -> None:
        """One compute job for the rounds of `batch` (one per session): each
        round's checks (a replay, a refusal), one target pass over the trees
        that remain, each session's rule and commit; then every waiter gets
        its own answer or error.  A failure inside a session's steps, or of
        the pass (then every session in it), closes those sessions (500)."""
        loop = asyncio.get_running_loop()
        outcomes, trees, seconds = await loop.run_in_executor(self.compute, batch_job, batch)
        self.metrics.compute_s += seconds
        self.passes.record(trees)
        for w, outcome in zip(batch, outcomes):
            if w.future.done():
                continue
            if isinstance(outcome, ProtocolError):
                w.future.set_exception(outcome)
            elif isinstance(outcome, Exception):
                w.future.set_exception(self._session_failed(w.session, outcome))
            else:
                w.future.set_result(outcome)

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
            raise self._session_failed(session, e) from None

    def _session_failed(self, session: VerifierSession | None, e: Exception) -> ProtocolError:
        """An unexpected failure inside `session`: close it (its state may be
        half-updated), log it, and return the 500 to answer."""
        if session is not None:
            self._forget(session)
            self.metrics.sessions_failed += 1
        self.log(f"internal error ({type(e).__name__}: {e}); the session was closed")
        return ProtocolError(500, "internal", f"the verifier failed ({type(e).__name__}: {e}); the session "
                                              f"was closed, open a new one")

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

    def cancel_work(self) -> None:
        """At the drain's end: nothing to stop here -- a round is one target
        pass (or prefill chunk) on the compute thread; the runner's cleanup
        then cancels the handlers still waiting (their clients retry
        elsewhere or later)."""

    async def _stop(self, app) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        self.compute.shutdown(wait=False, cancel_futures=True)


def batch_job(batch: list[Waiting]) -> tuple[list, int, float]:
    """The compute-thread side of a batched pass: (one outcome per round -- its
    answer dict, or the exception for it --, trees scored in the pass, seconds
    the job took).
    Checks run in arrival order, before the pass; a round refused there (or
    replayed) takes no part in it; a failure of the pass is every scored
    round's outcome."""
    t0 = time.perf_counter()
    outcomes, trees = batch_outcomes(batch)
    return outcomes, trees, time.perf_counter() - t0


def batch_outcomes(batch: list[Waiting]) -> tuple[list, int]:
    """`batch_job` without the clock: (outcomes, trees scored)."""
    outcomes: list = [None] * len(batch)
    scored = []
    for i, w in enumerate(batch):
        try:
            checked = w.session.check_round(w.request)
        except Exception as e:  # noqa: BLE001 -- this round's own outcome
            outcomes[i] = e
            continue
        if isinstance(checked, dict):
            outcomes[i] = checked
        else:
            scored.append((i, checked))
    if not scored:
        return outcomes, 0
    try:
        verdicts = verify_batch([batch[i].session.verifier for i, _ in scored], [tree for _, tree in scored])
    except Exception as e:  # noqa: BLE001 -- the pass failed: every round in it
        for i, _ in scored:
            outcomes[i] = e
        return outcomes, len(scored)
    for (i, _), verdict in zip(scored, verdicts):
        if isinstance(verdict, Exception):
            outcomes[i] = verdict
            continue
        try:
            outcomes[i] = batch[i].session.commit_round(batch[i].request, verdict)
        except Exception as e:  # noqa: BLE001
            outcomes[i] = e
    return outcomes, len(scored)


def background(coro) -> asyncio.Future:
    """Run `coro` as a task of its own (it completes even if the request that
    started it is cancelled); its exception is retrieved, never logged as lost."""
    task = asyncio.ensure_future(coro)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return task


async def start_site(server: VerifierServer, host: str, port: int,
                     ssl_context: ssl.SSLContext | None = None) -> tuple[web.AppRunner, int]:
    """Serve `server` on host:port (0: any free port), over TLS when
    `ssl_context` is given; returns the runner and the port."""
    return await start_guarded_site(server.app(), server.connections, server.limits.header_timeout_s, host, port,
                                    ssl_context, StatusCounter, server.metrics, server.http_log)


def serve_forever(server: VerifierServer, host: str, port: int, on_ready=None,
                  ssl_context: ssl.SSLContext | None = None, drain_s: float = DEFAULT_DRAIN_S) -> None:
    """Serve until SIGINT or SIGTERM, then drain for at most `drain_s` seconds (lever.http.shutdown)."""
    serve_until_stopped(lambda: start_site(server, host, port, ssl_context), server.connections,
                        server.cancel_work, server.log, drain_s, on_ready)


class ServerThread(SiteThread):
    """A VerifierServer on a background thread (tests, benchmarks, notebooks).

        with ServerThread(VerifierServer(model, "name")) as s:
            client = RemoteVerifier(s.url, ...)
    """

    def __init__(self, server: VerifierServer, host: str = "127.0.0.1", port: int = 0,
                 ssl_context: ssl.SSLContext | None = None):
        super().__init__(lambda h, p: start_site(server, h, p, ssl_context), host, port,
                         "https" if ssl_context else "http")
        self.server, self.ssl_context = server, ssl_context


__all__ = ["VERSION", "Limits", "Metrics", "ServerThread", "VerifierServer", "serve_forever", "start_site"]
