"""`lever serve` under many connections (issue 42): idle keep-alive
connections at the per-address cap do not lock out the health check and
the metrics, and they time out and leave the cap; the printed URL brackets
an IPv6 host.  Servers run in-process on 127.0.0.1 (lever.serve.site.serve_thread)."""

from __future__ import annotations

import contextlib
import io
import json
import socket

import pytest

pytest.importorskip("aiohttp")

from lever.cli import build_parser, main  # noqa: E402
from lever.commands.serve import build_server  # noqa: E402
from lever.serve.site import serve_thread  # noqa: E402
from waiting import deadline, wait_until  # noqa: E402

pytestmark = pytest.mark.real

IDLE = 64           # the reproducer: 64 idle keep-alive connections (the default --max-connections-per-ip)


def get(port: int, path: str, sock: socket.socket | None = None) -> tuple[int, dict, bytes]:
    """GET `path` (on `sock`, kept open, or on a fresh connection): (status, JSON body or {}, head)."""
    own = sock is None
    sock = sock or socket.create_connection(("127.0.0.1", port), timeout=deadline(10))
    try:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
        head, _, body = answer.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(body) < length:
            body += sock.recv(65536)
        status = int(head.split(b" ", 2)[1])
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = {}
        return status, parsed, head.lower()
    finally:
        if own:
            sock.close()


@pytest.fixture()
def capped(smollm2_path, lever_cache):
    args = build_parser().parse_args(["serve", "--model", str(smollm2_path), "--cache-dir", str(lever_cache),
                                      "--keepalive-timeout", "1"])
    server, _ = build_server(args)
    with serve_thread(server) as site:
        yield server, site


def test_idle_keepalive_connections_leave_health_and_metrics_answered(capped):
    server, site = capped
    idle = [socket.create_connection(("127.0.0.1", site.port), timeout=deadline(10)) for _ in range(IDLE)]
    try:
        for sock in idle:                                    # one request each, then idle (keep-alive)
            assert get(site.port, "/v1/models", sock)[0] == 200
        assert len(server.connections.open) == IDLE
        status, body, _ = get(site.port, "/v1/models")
        assert status == 503 and body["error"]["code"] == "too_many_connections"
        status, body, head = get(site.port, "/health")
        assert status == 200 and body["status"] == "ok" and b"connection: close" in head
        status, _, _ = get(site.port, "/metrics")
        assert status == 200
        # the idle ones time out (--keepalive-timeout 1): the cap is free again
        wait_until(lambda: not server.connections.open, 30, "the idle connections to be closed")
        assert get(site.port, "/v1/models")[0] == 200
        assert server.http.connections_refused == 1
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.parametrize("command", ["serve", "serve-verifier"])
def test_an_ipv6_host_is_bracketed_in_the_printed_url(command, smollm2_path, lever_cache, monkeypatch):
    """The reproducer: `serve-verifier --host ::1` printed http://::1:PORT.  The site is not started
    (servers here bind 127.0.0.1 only): its `serve_forever` reports a port at once."""
    import lever.remote.server
    import lever.serve.site

    def listening(server, host, port, on_ready=None, **kw):
        assert host == "::1"
        on_ready(4321)

    monkeypatch.setattr(lever.serve.site, "serve_forever", listening)
    monkeypatch.setattr(lever.remote.server, "serve_forever", listening)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main([command, "--model", str(smollm2_path), "--cache-dir", str(lever_cache), "--host", "::1",
                     "--max-tree-nodes" if command == "serve-verifier" else "--max-queue", "4"]) == 0
    printed = out.getvalue() + err.getvalue()
    assert "http://[::1]:4321" in printed and "http://::1" not in printed, printed
