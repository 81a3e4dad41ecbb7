"""The verifier server under hostile or careless clients (issue 12):

- any bytes in the bearer token, any number in the sampling settings: a 4xx,
  never a 500; an unexpected exception is a counted 500 with a JSON body,
  logged once;
- every answer's status is counted in /v1/metrics, aiohttp's own 400s too;
- slow clients are cut off (headers, body), connections are capped (the
  health check and metrics answered beyond the cap), idle keep-alive
  connections closed; the auth scheme is case-insensitive;
- a long prefill runs in chunks: another session's round is not stuck behind it;
- an open whose client went away frees its slot;
- the server's token file must be long enough and private.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from lever.cli import main
from lever.http.connections import BUSY_BODY
from lever.commands.serve_verifier import read_server_token
from lever.remote.protocol import Limits, ProtocolError, encode
from lever.remote.server import ServerThread, VerifierServer
from lever.remote.session import VerifierSession
from lever.sampling import MIN_TEMPERATURE, MIN_TOP_P
from test_remote import TOKEN, Raw
from test_speculative import random_hf, save_and_load
from waiting import deadline, wait_until


def make_server(target, log=None, **limits):
    base = dict(max_sessions=3, max_session_tokens=120, max_tree_nodes=8, idle_ttl_s=60, max_body_bytes=4096)
    return VerifierServer(target, "tiny", Limits(**{**base, **limits}), token=TOKEN, log=log or (lambda line: None))


@pytest.fixture()
def hardened(tiny_pair):
    lines: list[str] = []
    server = make_server(tiny_pair[0], log=lines.append, header_timeout_s=0.5, body_timeout_s=0.5)
    with ServerThread(server) as running:
        yield running, Raw(running.url, TOKEN), lines


def raw_exchange(port: int, data: bytes) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it (or the answer is complete)."""
    with socket.create_connection(("127.0.0.1", port), timeout=deadline(10)) as sock:
        sock.sendall(data)
        answer = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
                head, _, body = answer.partition(b"\r\n\r\n")
                length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")]
                if length and len(body) >= length[0]:
                    break
        except (ConnectionResetError, socket.timeout):
            pass
        return answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def request_bytes(method: str, path: str, body: bytes = b"", headers: dict | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: x"]
    for k, v in (headers or {}).items():
        lines.append(k.encode() + b": " + (v if isinstance(v, bytes) else v.encode()))
    lines.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


# -- no 500 for bad input ------------------------------------------------------------------

@pytest.mark.parametrize("token", [b"\xff\xfe", "s3cret-tok\u00e9n".encode(), b"s3cret-token\x01", b"\xc3\xa9" * 40,
                                   TOKEN.encode() + b"\x80", b"\x7f", b"a" * 5000])
def test_any_bytes_in_the_token_are_a_4xx(hardened, token):
    running, raw, lines = hardened
    answer = raw_exchange(running.port, request_bytes("GET", "/v1/info", headers={"Authorization": b"Bearer " + token}))
    assert status_of(answer) in (400, 401, 403, 431), answer[:200]
    assert raw("GET", "/v1/health")[0] == 200
    assert not [line for line in lines if "internal error" in line]


def test_the_audits_token_with_a_non_ascii_byte_gets_a_401_saying_why(hardened):
    running, _, _ = hardened
    answer = raw_exchange(running.port, request_bytes("GET", "/v1/info",
                                                      headers={"Authorization": b"Bearer " + TOKEN.encode() + b"\xff"}))
    assert status_of(answer) == 401
    assert b'"code":"unauthorized"' in answer and b"printable ASCII" in answer


@pytest.mark.parametrize("field,number,text", [
    ("top_p", "1e400", "top_p must be finite, got inf"),
    ("temperature", "1e-300", "temperature must be 0 (greedy) or between 0.001 and 100, got 1e-300"),
    ("top_p", "1e-50", "top_p must be between 1e-06 and 1, got 1e-50"),      # rounds to 0 in float32
])
def test_the_audits_sampling_settings_get_a_422_naming_the_field(hardened, field, number, text):
    """The audit's 500s (an OverflowError at open; inf/nan at the first round):
    now refused at open, with the field and the accepted range."""
    _, raw, _ = hardened
    body = ('{"v": 1, "prompt": [1, 2], "sampling": {"%s": %s}}' % (field, number)).encode()
    status, answer, _ = raw("POST", "/v1/sessions", raw=body)
    assert status == 422 and answer["error"]["code"] == "bad_sampling"
    assert text in answer["error"]["message"], answer


NUMBERS = ["1e400", "-1e400", "1e-400", "1" + "0" * 400, "NaN", "Infinity", "-Infinity", "1e-300", "1e-30", "-0.0",
           "true", "\"0.5\"", "[]", "{}", "null"]


@pytest.mark.parametrize("field", ["temperature", "top_p", "top_k"])
@pytest.mark.parametrize("number", NUMBERS)
def test_absurd_sampling_numbers_are_a_422(hardened, field, number):
    running, raw, lines = hardened
    body = ('{"v": 1, "prompt": [1, 2], "sampling": {"%s": %s}}' % (field, number)).encode()
    status, answer, _ = raw("POST", "/v1/sessions", raw=body)
    if field == "temperature" and number in ("-0.0", "1e-400"):          # both are 0: greedy
        assert status == 201, answer
    else:
        assert status in (400, 422), (status, answer)
        assert len(answer["error"]["message"]) < 300


def test_absurd_seeds_and_rounds_are_a_4xx(hardened):
    running, raw, _ = hardened
    for seed in ["1" + "0" * 400, "-1", "1e3", "9223372036854775808"]:
        status, _, _ = raw("POST", "/v1/sessions", raw=('{"v": 1, "prompt": [1], "seed": %s}' % seed).encode())
        assert status == 422
    sid = raw.open([1, 2])
    for number in ["1" + "0" * 400, "9223372036854775808", "1e400", "-1"]:
        body = ('{"v": 1, "round": %s, "tokens": [2], "parents": [-1]}' % number).encode()
        assert raw("POST", f"/v1/sessions/{sid}/rounds", raw=body)[0] == 400
    body = b'{"v": 1, "round": 0, "tokens": [2, ' + b"9" * 400 + b'], "parents": [-1, 0]}'
    status, answer, _ = raw("POST", f"/v1/sessions/{sid}/rounds", raw=body)
    assert status == 422 and len(answer["error"]["message"]) < 300
    assert raw.round(sid, 0, [2], [-1])[0] == 200                      # the session is untouched


def test_a_sampled_session_with_the_smallest_settings_works(hardened):
    running, raw, _ = hardened
    sid = raw.open([1, 2], sampling={"temperature": MIN_TEMPERATURE, "top_p": MIN_TOP_P}, seed=3)
    assert raw.round(sid, 0, [2, 3, 4], [-1, 0, 1])[0] == 200


def test_an_unexpected_exception_is_a_counted_500_logged_once(hardened, monkeypatch):
    running, raw, lines = hardened

    # /v1/info reads session_capacity: make that fail like a bug would
    monkeypatch.setattr(VerifierServer, "session_capacity", property(lambda self: {}["missing"]))
    status, body, _ = raw("GET", "/v1/info")
    assert status == 500 and body["error"]["code"] == "internal"
    assert len([line for line in lines if "internal error" in line]) == 1
    assert "KeyError" in lines[-1] and "\n" not in lines[-1]
    monkeypatch.undo()
    assert raw("GET", "/v1/metrics")[1]["statuses"]["500"] == 1
    assert raw("GET", "/v1/info")[0] == 200


def test_every_status_is_counted(hardened):
    running, raw, _ = hardened
    raw("GET", "/v1/health")
    raw("GET", "/v1/info", token=None)                                  # 401
    raw("GET", "/v1/info", token="wrong")                               # 403
    raw("GET", "/v1/nowhere")                                           # 404
    raw("PUT", "/v1/sessions")                                          # 405
    raw("POST", "/v1/sessions", {"prompt": [99]})                       # 422
    assert status_of(raw_exchange(running.port, b"GARBAGE\r\n\r\n")) == 400       # aiohttp's own parser
    assert status_of(raw_exchange(running.port, b"GET / HTTP/1.1\r\nBad Header\r\n\r\n")) == 400
    statuses = raw("GET", "/v1/metrics")[1]["statuses"]
    for code, count in {"200": 1, "401": 1, "403": 1, "404": 1, "405": 1, "422": 1, "400": 2}.items():
        assert statuses.get(code) == count, statuses


# -- slow clients, connection limits ---------------------------------------------------------

def closed_by_server(sock: socket.socket, seconds: float) -> bool:
    """True once the server has closed `sock`; False if it had not after deadline(seconds)."""
    sock.settimeout(deadline(seconds))
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except socket.timeout:
        return False
    return True


def test_slow_headers_are_cut_off(hardened):
    running, raw, _ = hardened
    socks = [socket.create_connection(("127.0.0.1", running.port)) for _ in range(6)]
    for i, sock in enumerate(socks[1:]):       # socks[0] sends nothing at all
        sock.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\n" + (b"X-Slow: " if i % 2 else b""))
    for sock in socks:
        assert closed_by_server(sock, 5.0)
        sock.close()
    metrics = raw("GET", "/v1/metrics")[1]
    assert metrics["connections"]["timed_out"] >= 6
    # a keep-alive connection that sends complete requests is not cut off between them by the
    # header deadline (each pause is longer than its 0.5 s, shorter than the 5 s keep-alive timeout)
    sock = socket.create_connection(("127.0.0.1", running.port), timeout=deadline(5))
    for _ in range(3):
        sock.sendall(request_bytes("GET", "/v1/health"))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(0.6)
    sock.close()


def test_slow_body_gets_408(hardened):
    running, raw, _ = hardened
    sock = socket.create_connection(("127.0.0.1", running.port), timeout=deadline(10))
    head = request_bytes("POST", "/v1/sessions", headers={"Authorization": f"Bearer {TOKEN}"})
    sock.sendall(head.replace(b"Content-Length: 0", b"Content-Length: 100") + b'{"v": 1, ')
    answer = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    sock.close()
    # the body deadline (0.5 s) ended it: the socket's own timeout is only a safety net
    assert answer.startswith(b"HTTP/1.1 408") and b"body_timeout" in answer, answer[:200]
    assert raw("GET", "/v1/metrics")[1]["statuses"]["408"] == 1


def test_connections_over_the_cap_get_503_but_health_and_metrics_are_answered(tiny_pair):
    server = make_server(tiny_pair[0], max_connections_per_ip=4, header_timeout_s=5)
    with ServerThread(server) as running:
        guard = running.server.connections
        held = [socket.create_connection(("127.0.0.1", running.port)) for _ in range(4)]
        wait_until(lambda: len(guard.open) == 4, 10, "the server to hold the four connections")
        answer = raw_exchange(running.port, request_bytes("GET", "/v1/info", headers={"Authorization": f"Bearer {TOKEN}"}))
        assert status_of(answer) == 503 and b"too_many_connections" in answer
        # the health check and the metrics are answered beyond the cap, on a connection closed after them
        answer = raw_exchange(running.port, request_bytes("GET", "/v1/health"))
        assert status_of(answer) == 200 and b"connection: close" in answer.lower(), answer[:300]
        answer = raw_exchange(running.port, request_bytes("GET", "/v1/metrics", headers={"Authorization": f"Bearer {TOKEN}"}))
        assert status_of(answer) == 200 and json.loads(answer.partition(b"\r\n\r\n")[2])["connections"]["refused"] == 1
        assert status_of(raw_exchange(running.port, request_bytes("GET", "/v1/metrics"))) == 401    # still a token
        assert status_of(raw_exchange(running.port, request_bytes("POST", "/v1/health"))) == 503    # GET or HEAD only
        assert status_of(raw_exchange(running.port, b"G" * 9000)) == 503         # no request line in 8 KiB
        silent = socket.create_connection(("127.0.0.1", running.port))          # beyond the cap, sends nothing:
        wait_until(lambda: len(guard.extra) == 1, 10, "the server to screen the silent connection")
        assert closed_by_server(silent, 15.0)                                    # the header deadline (5 s)
        silent.close()
        for sock in held:
            sock.close()
        wait_until(lambda: not guard.open and not guard.extra, 10, "the server to see the connections closed")
        raw = Raw(running.url, TOKEN)
        assert raw("GET", "/v1/info")[0] == 200
        metrics = raw("GET", "/v1/metrics")[1]
        assert metrics["connections"]["refused"] == 3 and metrics["statuses"]["503"] == 3


def test_idle_keepalive_connections_are_closed_and_leave_the_cap(tiny_pair):
    """Connections idle between requests go after the keep-alive timeout; those over the cap got a
    503 meanwhile (the reproducer: 64 idle keep-alive connections held for good)."""
    server = make_server(tiny_pair[0], max_connections_per_ip=4, keepalive_timeout_s=0.5)
    with ServerThread(server) as running:
        guard = running.server.connections
        idle = [socket.create_connection(("127.0.0.1", running.port), timeout=deadline(10)) for _ in range(4)]
        for sock in idle:
            sock.sendall(request_bytes("GET", "/v1/health"))
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        assert len(guard.open) == 4
        info = request_bytes("GET", "/v1/info", headers={"Authorization": f"Bearer {TOKEN}"})
        assert status_of(raw_exchange(running.port, info)) == 503
        for sock in idle:
            assert closed_by_server(sock, 5.0)
            sock.close()
        wait_until(lambda: not guard.open, 10, "the idle connections to leave the cap")
        assert status_of(raw_exchange(running.port, info)) == 200


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "bEaReR"])
def test_the_auth_scheme_is_case_insensitive(hardened, scheme):
    """RFC 7235: the scheme is a case-insensitive token (the reproducer: `bearer TOKEN` got 401)."""
    running, _, _ = hardened
    answer = raw_exchange(running.port, request_bytes("GET", "/v1/info", headers={"Authorization": f"{scheme} {TOKEN}"}))
    assert status_of(answer) == 200, answer[:300]
    answer = raw_exchange(running.port, request_bytes("GET", "/v1/info", headers={"Authorization": f"{scheme} wrong"}))
    assert status_of(answer) == 403
    answer = raw_exchange(running.port, request_bytes("GET", "/v1/info", headers={"Authorization": f"Basic {TOKEN}"}))
    assert status_of(answer) == 401


# -- chunked prefill, abandoned opens ----------------------------------------------------------

@pytest.fixture(scope="module")
def long_target(tmp_path_factory):
    """A random target with a long context, slow enough that a 2,000-token prefill takes a while."""
    hf = random_hf("llama", False, seed=5, vocab_size=64, hidden_size=128, intermediate_size=256,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                   max_position_embeddings=2304)
    return save_and_load(hf, tmp_path_factory.mktemp("long-target"))


CHUNK = 64


def test_a_long_prefill_does_not_stall_another_sessions_round(long_target, monkeypatch):
    """A 1,024-token prefill runs as 16 compute jobs of 64 tokens: another
    session's round, arriving meanwhile, runs between two of them, not after
    the last.  The order of the compute jobs is the evidence, not their times:
    the long prefill's second chunk waits (on the compute thread) until the
    round has reached the server, so the round is queued behind that chunk
    whatever the machine's load."""
    jobs: list[str] = []
    round_arrived = threading.Event()
    step, answer, verify = VerifierSession.prefill_step, VerifierSession.answer_round, VerifierServer._verify

    def logged_step(self, chunk_tokens):
        if self.prompt_tokens > CHUNK:              # the long prefill's chunks
            if jobs.count("chunk") == 1:
                assert round_arrived.wait(deadline(30)), "the round never reached the server"
            jobs.append("chunk")
        return step(self, chunk_tokens)

    def logged_answer(self, req):
        jobs.append("round")
        return answer(self, req)

    async def signalled_verify(self, session, req):
        round_arrived.set()
        return await verify(self, session, req)

    monkeypatch.setattr(VerifierSession, "prefill_step", logged_step)
    monkeypatch.setattr(VerifierSession, "answer_round", logged_answer)
    monkeypatch.setattr(VerifierServer, "_verify", signalled_verify)
    server = VerifierServer(long_target, "long", Limits(max_session_tokens=2200, prefill_chunk=CHUNK),
                            log=lambda line: None)
    with ServerThread(server) as running:
        raw = Raw(running.url)
        short = raw.open([1, 2, 3])
        prompt = [(7 * i) % 64 for i in range(1024)]
        opened = {}
        thread = threading.Thread(target=lambda: opened.update(status=raw("POST", "/v1/sessions",
                                                                          {"prompt": prompt})[0]))
        thread.start()
        wait_until(lambda: jobs, 30, "the long prefill to start")
        status, _, _ = raw.round(short, 0, [3], [-1])
        thread.join(deadline(120))
    assert status == 200 and opened.get("status") == 201
    assert jobs.count("chunk") >= 1024 // CHUNK and jobs.count("round") == 1
    assert "chunk" in jobs[jobs.index("round"):], f"the round waited for the whole prefill: {jobs}"


def test_an_open_whose_client_went_away_frees_its_slot(tiny_pair, monkeypatch):
    """The prefill's chunks after the first wait (on the compute thread) until
    the server has seen the client go: the open is then given up at the next
    chunk boundary, after a few of its 100 chunks, whatever the machine's load."""
    original = VerifierSession.prefill_step
    steps: list[int] = []
    server = make_server(tiny_pair[0], max_sessions=1, prefill_chunk=1)

    def gated_step(self, chunk_tokens):
        if self.open_id == "gone":
            steps.append(chunk_tokens)
            if len(steps) > 1:
                wait_until(lambda: not server.connections.open, 30, "the server to see the client go")
        return original(self, chunk_tokens)

    monkeypatch.setattr(VerifierSession, "prefill_step", gated_step)
    with ServerThread(server) as running:
        body = json.dumps({"v": 1, "prompt": [i % 20 for i in range(100)], "open_id": "gone"}).encode()
        sock = socket.create_connection(("127.0.0.1", running.port))
        sock.sendall(request_bytes("POST", "/v1/sessions", body, {"Authorization": f"Bearer {TOKEN}"}))
        wait_until(lambda: steps, 30, "the prefill to start")
        sock.close()                                  # the client gives up before the answer
        wait_until(lambda: running.server.opening == 0, 30, "the open to be given up")
        assert not running.server.sessions and not running.server.open_ids
        assert len(steps) <= 3                        # given up within a chunk or so, not after 100 of them
        raw = Raw(running.url, TOKEN)
        raw.open([1, 2])                               # the slot is free
        metrics = raw("GET", "/v1/metrics")[1]["sessions"]
        assert metrics["abandoned"] == 1 and metrics["opened"] == 1


def test_an_open_whose_client_went_away_while_its_session_was_built_is_counted(tiny_pair, monkeypatch):
    """The client leaves before its session exists (the KV cache is still
    being allocated): the slot is freed and the open counts as abandoned."""
    import lever.remote.server as server_module
    building, built = threading.Event(), threading.Event()
    server = make_server(tiny_pair[0], max_sessions=1, prefill_chunk=1)

    def slow_session(*args):                          # the first built (on the compute thread) once its client is gone
        if building.is_set():
            return VerifierSession(*args)
        building.set()
        try:
            wait_until(lambda: not server.connections.open, 30, "the server to see the client go")
            return VerifierSession(*args)
        finally:
            built.set()

    monkeypatch.setattr(server_module, "VerifierSession", slow_session)
    with ServerThread(server) as running:
        body = json.dumps({"v": 1, "prompt": [1, 2, 3], "open_id": "early"}).encode()
        sock = socket.create_connection(("127.0.0.1", running.port))
        sock.sendall(request_bytes("POST", "/v1/sessions", body, {"Authorization": f"Bearer {TOKEN}"}))
        assert building.wait(deadline(10))
        sock.close()                                  # gone while the session is still being built
        wait_until(lambda: running.server.opening == 0, 30, "the open to be given up")
        assert not running.server.sessions and not running.server.open_ids
        assert built.wait(deadline(30))               # the discarded construction has finished
        raw = Raw(running.url, TOKEN)
        raw.open([1, 2])                               # the slot is free
        metrics = raw("GET", "/v1/metrics")[1]["sessions"]
        assert metrics["abandoned"] == 1 and metrics["opened"] == 1


def test_a_retried_open_waits_for_the_first_and_shares_its_session(tiny_pair, monkeypatch):
    original = VerifierSession.prefill_step

    def slow_step(self, chunk_tokens):
        time.sleep(0.01)
        return original(self, chunk_tokens)

    monkeypatch.setattr(VerifierSession, "prefill_step", slow_step)
    server = make_server(tiny_pair[0], max_sessions=1, prefill_chunk=2)
    with ServerThread(server) as running:
        raw = Raw(running.url, TOKEN)
        answers = []
        body = {"prompt": [i % 20 for i in range(60)], "open_id": "twice"}
        threads = [threading.Thread(target=lambda: answers.append(raw("POST", "/v1/sessions", body)[:2]))
                   for _ in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(deadline(30))
        assert sorted(s for s, _ in answers) == [200, 201]
        assert answers[0][1]["session"] == answers[1][1]["session"]
        assert len(running.server.sessions) == 1


# -- the token file ----------------------------------------------------------------------------

def test_the_servers_token_file_must_be_long_and_private(tmp_path, capsys):
    def refused(path, needle):
        assert main(["serve-verifier", "--model", str(tmp_path / "no-model"), "--token-file", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("lever: error:") and needle in err[0], err

    short = tmp_path / "short"
    short.write_text("abc\n")
    os.chmod(short, 0o600)
    refused(short, "at least 16")
    open_file = tmp_path / "open"
    open_file.write_text("x" * 32)
    os.chmod(open_file, 0o644)
    refused(open_file, "chmod 600")
    os.chmod(open_file, 0o640)
    refused(open_file, "readable by other users")
    odd = tmp_path / "odd"
    odd.write_text("caf\u00e9" * 8)
    os.chmod(odd, 0o600)
    refused(odd, "printable ASCII")
    good = tmp_path / "good"
    good.write_text("x" * 32 + "\n")
    os.chmod(good, 0o600)
    assert read_server_token(str(good)) == "x" * 32


def test_the_shared_busy_body_is_the_protocols_error_body():
    """lever.http's raw 503 (both servers') is the edge-cloud protocol's error body, byte for byte."""
    expected = ProtocolError(503, "too_many_connections", "this server holds its limit of open connections; "
                                                          "retry later")
    assert BUSY_BODY == encode(expected.body())
