"""The edge client against servers that fail in every way (issue 12): a 500
forever, a 4xx, a 429, no answer, a reset connection, a session that keeps
vanishing.  Each time the run ends within its deadline with one clear line
naming what happened, and keeps the tokens it had; a fault that goes away
is absorbed.  Also the real server whose rounds fail (the livelock of a
client that rebuilt its session forever).

What ends "at once" is checked by the requests the client made (one
rebuild: the failing round, then once more after reopening), not by the
clock; a bound on seconds only tells a deadline that was kept from one that
was not (waiting.deadline scales it), as the client's own deadlines are
the behaviour under test there."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lever.engine import SpecConfig, run_speculative
from lever.remote.client import RemoteVerifier, RemoteVerifierError, VerifierBusyError, VerifierUnreachableError
from lever.remote.protocol import Limits
from lever.remote.server import ServerThread, VerifierServer
from lever.sampling import SamplingParams
from lever.verify.target_pass import TargetVerifier
from waiting import deadline

GOOD_ROUNDS = 3            # rounds a scripted server answers before it starts failing
PROMPT = [1, 2, 3]


class Script:
    """What the fake server does: `rounds` / `opens` map the count of such
    requests so far to an action -- "ok", ("status", code, error_code),
    "hang" or "reset"."""

    def __init__(self, rounds=lambda n: "ok", opens=lambda n: "ok"):
        self.rounds, self.opens = rounds, opens
        self.count = {"rounds": 0, "opens": 0}
        self.stop = threading.Event()


def fake_server(script: Script) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def answer(self, status: int, obj: dict) -> None:
            data = json.dumps({"v": 1, **obj}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def act(self, action, ok: dict, ok_status: int = 200) -> None:
            if action == "ok":
                self.answer(ok_status, ok)
            elif action == "hang":
                script.stop.wait(30)
                self.close_connection = True
            elif action == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
            else:
                _, status, code = action
                self.answer(status, {"error": {"code": code, "message": f"scripted {code}\nsecond line"}})

        def do_GET(self):
            self.answer(200, {"model": "fake", "vocab_size": 20, "max_context": 1000,
                              "limits": {"max_tree_nodes": 8}, "verify_cost": None, "tokenizer": None})

        def do_DELETE(self):
            self.answer(200, {"closed": "s", "rounds": 0})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/v1/sessions":
                n = script.count["opens"]
                script.count["opens"] += 1
                self.act(script.opens(n), {"session": f"s{n}", "round": 0, "position": len(body["prompt"]) - 1,
                                           "seed": 1, "server_s": 0.0, "replayed": False}, 201)
            else:
                n = script.count["rounds"]
                script.count["rounds"] += 1
                r = body["round"]
                self.act(script.rounds(n), {"round": r, "accepted": [], "next": (body["tokens"][0] + 1) % 20,
                                            "position": 0, "server_s": 0.0, "calls": r + 1, "replayed": False})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run_against(script: Script, retry_deadline_s: float = 1.0, timeout_s: float = 0.5, n_tokens: int = 10):
    """Generate `n_tokens` (mode ar) against the scripted server: (result or error, seconds, verifier)."""
    server = fake_server(script)
    try:
        verifier = RemoteVerifier(f"http://127.0.0.1:{server.server_address[1]}", SamplingParams(),
                                  timeout_s=timeout_s, retry_deadline_s=retry_deadline_s, backoff_s=0.01,
                                  max_backoff_s=0.1)
        t0 = time.monotonic()
        try:
            result, _ = run_speculative(verifier, None, PROMPT, n_tokens, SamplingParams(), SpecConfig("ar"))
            outcome = result
        except RemoteVerifierError as e:
            outcome = e
        return outcome, time.monotonic() - t0, verifier
    finally:
        script.stop.set()
        server.shutdown()
        server.server_close()


def after_good(action):
    return lambda n: "ok" if n < GOOD_ROUNDS else action


def assert_clear_end(outcome, seconds: float, limit_s: float, kind, needle: str):
    """One clear line of `kind` naming `needle`, the tokens before the failure kept, and the
    end within deadline(limit_s) (kept: the scripted faults last 30 s or for ever)."""
    assert isinstance(outcome, kind), outcome
    message = str(outcome)
    assert needle in message and "\n" not in message, message
    assert seconds < deadline(limit_s), f"took {seconds:.2f} s"
    assert outcome.partial_result.token_ids == [4, 5, 6][:GOOD_ROUNDS]      # the tokens before the failure


def assert_one_rebuild(script: Script, verifier) -> None:
    """The failing round, one reopen, the round once more, and nothing after: no retrying to the deadline."""
    assert script.count == {"rounds": GOOD_ROUNDS + 2, "opens": 2}, script.count
    assert verifier.stats.rebuilds == 1 and verifier.stats.retries == 0


def test_a_500_forever_ends_after_one_rebuild():
    script = Script(rounds=after_good(("status", 500, "internal")))
    outcome, seconds, verifier = run_against(script)
    assert_clear_end(outcome, seconds, 1.0, RemoteVerifierError, "500 internal: scripted internal second line")
    assert "again after reopening" in str(outcome)
    assert_one_rebuild(script, verifier)


def test_a_4xx_forever_ends_after_one_rebuild():
    script = Script(rounds=after_good(("status", 422, "context_limit")))
    outcome, seconds, verifier = run_against(script)
    assert_clear_end(outcome, seconds, 1.0, RemoteVerifierError, "422 context_limit")
    assert outcome.status == 422
    assert_one_rebuild(script, verifier)


def test_a_vanishing_session_ends_after_one_rebuild():
    script = Script(rounds=after_good(("status", 404, "unknown_session")))
    outcome, seconds, verifier = run_against(script)
    assert_clear_end(outcome, seconds, 1.0, RemoteVerifierError, "404 unknown_session")
    assert_one_rebuild(script, verifier)


def test_alternating_refusals_end_at_the_deadline():
    def alternate(n):
        if n < GOOD_ROUNDS:
            return "ok"
        return ("status", 500, "internal") if n % 2 else ("status", 404, "unknown_session")

    outcome, seconds, verifier = run_against(Script(rounds=alternate))
    assert_clear_end(outcome, seconds, 2.5, RemoteVerifierError, "kept refusing")
    assert verifier.stats.rebuilds >= 3


def test_a_403_ends_at_once():
    script = Script(rounds=after_good(("status", 403, "forbidden")))
    outcome, seconds, verifier = run_against(script)
    assert_clear_end(outcome, seconds, 1.0, RemoteVerifierError, "403 forbidden")
    assert script.count == {"rounds": GOOD_ROUNDS + 1, "opens": 1}, script.count       # no retry, no reopen
    assert verifier.stats.rebuilds == 0 and verifier.stats.retries == 0


def test_429_is_reported_as_server_busy():
    outcome, seconds, verifier = run_against(Script(rounds=after_good(("status", 429, "too_many_sessions"))))
    assert_clear_end(outcome, seconds, 2.5, VerifierBusyError, "server busy")
    assert "did not answer" not in str(outcome) and "429" in str(outcome) and verifier.stats.retries >= 2


def test_a_busy_server_at_open_is_reported_as_busy():
    server = fake_server(Script(opens=lambda n: ("status", 429, "too_many_sessions")))
    try:
        verifier = RemoteVerifier(f"http://127.0.0.1:{server.server_address[1]}", retry_deadline_s=0.5,
                                  backoff_s=0.01)
        t0 = time.monotonic()
        with pytest.raises(VerifierBusyError, match="server busy.*429 too_many_sessions"):
            verifier.start(PROMPT)
        assert time.monotonic() - t0 < deadline(2.0)             # the 0.5 s retry deadline was kept
    finally:
        server.shutdown()
        server.server_close()


def test_no_answer_ends_within_timeout_and_deadline():
    outcome, seconds, _ = run_against(Script(rounds=after_good("hang")), retry_deadline_s=1.0, timeout_s=0.5)
    assert_clear_end(outcome, seconds, 0.5 + 1.0 + 1.0, VerifierUnreachableError, "did not answer")
    assert "timed out" in str(outcome)


def test_reset_connections_end_within_the_deadline():
    outcome, seconds, verifier = run_against(Script(rounds=after_good("reset")))
    assert_clear_end(outcome, seconds, 2.5, VerifierUnreachableError, "did not answer")
    assert verifier.stats.retries >= 2


@pytest.mark.parametrize("fault", [("status", 500, "internal"), ("status", 404, "unknown_session"), "reset",
                                   ("status", 503, "busy"), ("status", 429, "too_many_sessions")])
def test_a_fault_that_goes_away_is_absorbed(fault):
    outcome, _, verifier = run_against(Script(rounds=lambda n: fault if n == GOOD_ROUNDS else "ok"))
    assert not isinstance(outcome, Exception), outcome
    assert outcome.token_ids == [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert verifier.stats.rebuilds + verifier.stats.retries == 1


# -- the real server, whose rounds fail ------------------------------------------------------------

def test_the_real_server_failing_every_round_does_not_livelock(tiny_pair, monkeypatch):
    """The issue's livelock: each round a 500, the session closed, rebuilt, forever."""
    original, calls = TargetVerifier.verify, []

    def failing(self, tree, draft_probs=None):
        calls.append(1)
        if len(calls) > GOOD_ROUNDS:
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return original(self, tree, draft_probs)

    monkeypatch.setattr(TargetVerifier, "verify", failing)
    server = VerifierServer(tiny_pair[0], "tiny", Limits(max_sessions=2), log=lambda line: None)
    with ServerThread(server) as running:
        verifier = RemoteVerifier(running.url, retry_deadline_s=10, backoff_s=0.01)
        with pytest.raises(RemoteVerifierError, match="500 internal.*probability tensor") as info:
            run_speculative(verifier, None, PROMPT, 20, SamplingParams(), SpecConfig("ar"))
        verifier.close()                                  # ended by its one rebuild, not by the 10 s deadline
        assert len(info.value.partial_result.token_ids) == GOOD_ROUNDS
        assert "\n" not in str(info.value) and verifier.stats.rebuilds == 1
        assert not running.server.sessions                # the failed sessions were closed, none leaked
        assert running.server.metrics.statuses[500] == 2
