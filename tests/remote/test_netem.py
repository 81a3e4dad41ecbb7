"""lever.remote.netem: the loopback delay/loss proxy, against tiny servers run here.

Delays are checked from below (a proxied exchange takes at least the round
trip it adds: load only makes it longer); that the proxy does not serialise
is checked by behaviour (concurrent requests meet at the upstream) or, for a
stream, against a bound half of what serialising would take at the least.
No check needs an idle machine (see tests/waiting.py)."""

import http.client
import http.server
import random
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time

import pytest

from lever.remote import netem
from lever.remote.netem import LinkProxy, parse_upstream
from waiting import IGNORING_STOP_SIGNALS, deadline, read_line, wait_exit

# What a failed request over a dropped connection may raise (reset, EOF, cut-off body).
REQUEST_ERRORS = (OSError, http.client.HTTPException)


# -- tiny upstream servers ----------------------------------------------------------------------

class _EchoHandler(socketserver.BaseRequestHandler):
    """Echoes every byte back until the client half-closes, then closes."""

    def handle(self):
        while True:
            data = self.request.recv(65536)
            if not data:
                return
            self.request.sendall(data)


class _HttpHandler(http.server.BaseHTTPRequestHandler):
    """GET <path> -> 200 with body b"ok <path>", written in one piece; records each path.
    A path under /together- first waits until `server.barrier`'s parties have all arrived."""

    def do_GET(self):
        self.server.seen.append(self.path)
        if self.path.startswith("/together-"):
            self.server.barrier.wait(timeout=deadline(10))
        body = b"ok " + self.path.encode()
        head = b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
        self.wfile.write(head + body)

    def log_message(self, *args):
        pass


class _QuietThreadingMixIn(socketserver.ThreadingMixIn):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass   # connections reset by the proxy are expected here


class _EchoServer(_QuietThreadingMixIn, socketserver.TCPServer):
    pass


class _HttpServer(_QuietThreadingMixIn, http.server.HTTPServer):
    pass


def _serve(server):
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    return server


@pytest.fixture(scope="module")
def echo_server():
    server = _serve(_EchoServer(("127.0.0.1", 0), _EchoHandler))
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def http_server():
    server = _HttpServer(("127.0.0.1", 0), _HttpHandler)
    server.seen = []
    _serve(server)
    yield server
    server.shutdown()
    server.server_close()


# -- clients ------------------------------------------------------------------------------------

def _echo(port: int, payload: bytes) -> bytes:
    """Send payload (from a thread), half-close, and read everything until EOF."""
    with socket.create_connection(("127.0.0.1", port), timeout=deadline(10)) as sock:
        def send():
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        received = bytearray()
        while True:
            data = sock.recv(65536)
            if not data:
                break
            received += data
        sender.join()
    return bytes(received)


def _get(port: int, path: str = "/") -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline(10))
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        assert response.status == 200
        return response.read()
    finally:
        conn.close()


def _timed_get(port: int, path: str = "/") -> float:
    start = time.monotonic()
    _get(port, path)
    return time.monotonic() - start


def _proxy(server, **kwargs) -> LinkProxy:
    host, port = server.server_address[:2]
    return LinkProxy(host, port, **kwargs)


# -- pass-through -------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [3000, 1_000_000])
def test_bytes_pass_through_unchanged(echo_server, size):
    payload = random.Random(size).randbytes(size)
    with _proxy(echo_server) as proxy:
        assert _echo(proxy.port, payload) == payload
        stats = proxy.stats()
    assert stats["connections"] == 1
    assert stats["bytes_up"] == stats["bytes_down"] == size
    assert stats["dropped_up"] == stats["dropped_down"] == 0


def test_http_through_proxy_and_url(http_server):
    with _proxy(http_server) as proxy:
        assert proxy.url == f"http://127.0.0.1:{proxy.port}"
        assert _get(proxy.port, "/hello") == b"ok /hello"


# -- delay --------------------------------------------------------------------------------------

def test_rtt_adds_one_round_trip(http_server):
    with _proxy(http_server, rtt_s=0.1) as proxy:
        assert proxy._one_way_s() == 0.05           # half the round trip each way
        assert _timed_get(proxy.port) >= 0.09


def test_delay_does_not_serialise_concurrent_requests(http_server):
    """Four requests through a delaying proxy meet at the upstream (a barrier of
    four): a proxy that forwarded one connection at a time would never get
    them there together, and the barrier would break."""
    http_server.barrier = threading.Barrier(4)
    with _proxy(http_server, rtt_s=0.2) as proxy:
        times, errors = [None] * 4, []

        def one(i):
            try:
                times[i] = _timed_get(proxy.port, f"/together-{i}")
            except BaseException as e:           # reported below
                errors.append(e)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors and not http_server.barrier.broken, errors
    assert all(t is not None and t >= 0.18 for t in times), times


def test_delay_does_not_serialise_a_stream(echo_server):
    """1 MB crosses as at least 16 reads of at most 64 KiB each way: each waits out
    rtt/2 from its own arrival, not in turn.  In turn, the way up alone would take
    16 x rtt/2 = 3.2 s; the bound is half that, far above the 0.4 s it takes."""
    payload = random.Random(0).randbytes(1_000_000)
    with _proxy(echo_server, rtt_s=0.4) as proxy:
        start = time.monotonic()
        assert _echo(proxy.port, payload) == payload
        elapsed = time.monotonic() - start
    assert 0.38 <= elapsed < 1.6, elapsed


def test_set_link_changes_delay_at_run_time(http_server):
    """A round trip of 1 s once set, none once reset: a GET then ends in under
    half of it (a GET still delayed would take the whole second)."""
    with _proxy(http_server) as proxy:
        proxy.set_link(rtt_s=1.0)
        assert proxy.stats()["rtt_s"] == 1.0
        assert _timed_get(proxy.port) >= 0.95
        proxy.set_link(rtt_s=0.0)
        assert _timed_get(proxy.port) < 0.5
        proxy.set_link(loss=0.25)
        assert (proxy.stats()["rtt_s"], proxy.stats()["loss"]) == (0.0, 0.25)
        with pytest.raises(ValueError):
            proxy.set_link(rtt_s=0.1, loss=1.0)
        assert (proxy.stats()["rtt_s"], proxy.stats()["loss"]) == (0.0, 0.25)


# -- loss ---------------------------------------------------------------------------------------

def _run_requests(port: int, count: int, prefix: str) -> int:
    failures = 0
    for i in range(count):
        try:
            assert _get(port, f"/{prefix}-{i}") == f"ok /{prefix}-{i}".encode()
        except REQUEST_ERRORS:
            failures += 1
    return failures


def test_loss_drops_some_connections(http_server):
    with _proxy(http_server, loss=0.5, seed=1234) as proxy:
        failures = _run_requests(proxy.port, 30, "lossy")
        stats = proxy.stats()
    assert 0 < failures < 30
    assert stats["dropped_up"] + stats["dropped_down"] == failures
    assert stats["connections"] == 30


def test_no_loss_never_drops(http_server):
    with _proxy(http_server, loss=0.0) as proxy:
        assert _run_requests(proxy.port, 30, "clean") == 0
        stats = proxy.stats()
    assert stats["dropped_up"] == stats["dropped_down"] == 0


def test_drop_up_loses_request_and_drop_down_loses_only_the_answer(http_server):
    seen_up = seen_down = False
    with _proxy(http_server, loss=0.5, seed=7) as proxy:
        for i in range(200):
            path = f"/retry-{i}"
            before = proxy.stats()
            try:
                _get(proxy.port, path)
                failed = False
            except REQUEST_ERRORS:
                failed = True
            after = proxy.stats()
            if after["dropped_down"] > before["dropped_down"]:
                # The server handled the request; only the answer was lost.
                assert failed and path in http_server.seen
                seen_down = True
            elif after["dropped_up"] > before["dropped_up"]:
                assert failed and path not in http_server.seen
                seen_up = True
            else:
                assert not failed and path in http_server.seen
            if seen_up and seen_down:
                break
    assert seen_up and seen_down


# -- validation, life cycle, command line -------------------------------------------------------

@pytest.mark.parametrize("rtt_s, loss, message", [
    (-0.1, 0.0, "rtt_s"),
    (float("nan"), 0.0, "rtt_s"),
    (float("inf"), 0.0, "rtt_s"),
    (0.0, 1.0, "loss"),
    (0.0, 1.5, "loss"),
    (0.0, -0.1, "loss"),
])
def test_invalid_link_raises(rtt_s, loss, message):
    with pytest.raises(ValueError, match=message):
        LinkProxy("127.0.0.1", 1, rtt_s=rtt_s, loss=loss)


def test_close_is_idempotent_and_frees_port(echo_server):
    proxy = _proxy(echo_server).start()
    port = proxy.port
    open_conn = socket.create_connection(("127.0.0.1", port), timeout=deadline(5))
    open_conn.sendall(b"ping")
    assert open_conn.recv(16) == b"ping"
    proxy.close()
    proxy.close()
    try:   # the open connection was aborted
        assert open_conn.recv(16) == b""
    except ConnectionResetError:
        pass
    open_conn.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=deadline(5)).close()


def test_close_before_start_and_start_twice(echo_server):
    _proxy(echo_server).close()
    with _proxy(echo_server) as proxy:
        with pytest.raises(RuntimeError):
            proxy.start()


def test_unreachable_upstream_closes_client():
    with socket.socket() as probe:   # a port with nobody listening
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    with LinkProxy("127.0.0.1", dead_port) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=deadline(5)) as sock:
            try:
                assert sock.recv(16) == b""
            except ConnectionResetError:
                pass
        stats = proxy.stats()
    assert stats["dropped_up"] == stats["dropped_down"] == 0
    assert stats["bytes_up"] == stats["bytes_down"] == 0


def test_parse_upstream():
    assert parse_upstream("http://127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert parse_upstream("http://localhost/") == ("localhost", 80)
    with pytest.raises(ValueError):
        parse_upstream("127.0.0.1:8000")


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_command_line_forwards_until_interrupted(http_server, stop):
    """Runs until Ctrl-C (or SIGTERM), then exits 0: waited for by its line and its exit.
    Started with both signals ignored, as a script's background job starts (issue 46)."""
    upstream = f"http://127.0.0.1:{http_server.server_address[1]}"
    process = subprocess.Popen(
        [*IGNORING_STOP_SIGNALS, "-m", "lever.remote.netem", "--upstream", upstream,
         "--listen-port", "0", "--rtt-ms", "20", "--loss", "0"],
        stdout=subprocess.PIPE, text=True)
    try:
        line = read_line(process.stdout, 30, "netem's listening line", process)
        assert "listening on http://127.0.0.1:" in line, line
        port = int(line.split("http://127.0.0.1:")[1].split()[0])
        assert _get(port, "/cli") == b"ok /cli"
        process.send_signal(stop)
        assert wait_exit(process, 10, "netem after the signal") == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()


@pytest.mark.parametrize("argv, message", [
    (["--rtt-ms", "inf"], "argument --rtt-ms: expected milliseconds from 0 to 60000, got 'inf'"),
    (["--rtt-ms", "nan"], "argument --rtt-ms: expected milliseconds from 0 to 60000, got 'nan'"),
    (["--loss", "1"], "argument --loss: expected a probability from 0 to 0.99, got '1'"),
    (["--loss=-inf"], "argument --loss: expected a probability from 0 to 0.99, got '-inf'"),
    (["--listen-port", "99999"], "argument --listen-port: expected a port from 0 to 65535, got '99999'"),
])
def test_command_line_refuses_unbounded_numbers(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        netem.main(["--upstream", "http://127.0.0.1:1", *argv])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)
