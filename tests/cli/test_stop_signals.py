"""SIGINT and SIGTERM stop Lever's servers and long commands whatever signal
dispositions they inherited (issue 46), and a server drains first (issue 42).

Every child here starts with SIGINT and SIGTERM ignored, as a background job
of a non-interactive shell starts with SIGINT ignored (`bash -c 'cmd &'`):
through IGNORING_STOP_SIGNALS, a wrapper that ignores both and then execs the command.
Each must still stop on either signal within its bound: a server's drain
(`--drain-seconds`, then at most FINAL_GRACE_S three times), at once for
`lever generate` (exit 128 + the signal); netem's command line is stopped the
same way in tests/remote/test_netem.py.

The servers listen on 127.0.0.1 only; waits are for lines, ports and exits
(tests/waiting.py), their limits safety nets."""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")

from lever.http.shutdown import FINAL_GRACE_S  # noqa: E402
from waiting import IGNORING_STOP_SIGNALS, deadline, read_line, wait_exit, wait_until  # noqa: E402

pytestmark = pytest.mark.real


COUNTING = "Count: 1, 2, 3, 4,"          # a prompt SmolLM2 continues for hundreds of tokens
STOPS = pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])


def test_the_wrapper_really_ignores_both_signals():
    """Else the tests below would prove nothing."""
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN, " \
           "signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)"
    out = subprocess.run([*IGNORING_STOP_SIGNALS, "-c", code], capture_output=True, text=True, timeout=deadline(30))
    assert out.stdout.split() == ["True", "True"], out.stderr


def drain_bound(drain_s: float) -> float:
    """Seconds within which a server exits after the first signal (lever.http.shutdown), with room to exit."""
    return drain_s + 3 * FINAL_GRACE_S + 5


class Server:
    """`lever serve` or `lever serve-verifier` on 127.0.0.1, started ignoring SIGINT and SIGTERM;
    its log (stderr) goes to a file, read by `log()`."""

    def __init__(self, command: str, model: Path, cache: Path, tmp_path: Path, drain_s: float, *extra: str):
        self.log_path = tmp_path / f"{command}.log"
        self.drain_s = drain_s
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([*IGNORING_STOP_SIGNALS, "-m", "lever.cli", command, "--model", str(model), "--port", "0",
                                      "--cache-dir", str(cache), "--drain-seconds", str(drain_s), *extra],
                                     stdout=subprocess.PIPE, stderr=self._log, text=True)
        self.url = ""

    def wait_serving(self) -> str:
        """The server's URL, once its log says it serves."""
        found = wait_until(lambda: re.search(r"(http://127\.0\.0\.1:\d+)", self.serving_line())
                           or self.proc.poll() is not None, 120, "the server to serve")
        assert self.proc.poll() is None, self.log()
        self.url = found.group(1)
        return self.url

    def serving_line(self) -> str:
        return next((line for line in self.log().splitlines() if "serving" in line), "")

    def log(self) -> str:
        return self.log_path.read_text()

    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stopped(self, seconds: float) -> int:
        """Its exit status, waited for at most the drain bound plus `seconds`."""
        try:
            return wait_exit(self.proc, drain_bound(self.drain_s) + seconds, "the server after the signal")
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self._log.close()


@pytest.fixture()
def servers():
    started: list[Server] = []
    yield started
    for server in started:
        server.close()


class Stream:
    """A streamed /v1/completions request read on a thread: `events` gets each
    `data:` payload as it arrives; `ended` is set at the end of the body."""

    def __init__(self, port: int, max_tokens: int):
        self.events: list[str] = []
        self.ended = threading.Event()
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline(60))
        body = {"prompt": COUNTING, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        self.conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for raw in self.resp:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    self.events.append(line[len("data: "):])
        except (OSError, http.client.HTTPException):
            pass
        finally:
            self.ended.set()

    def texts(self) -> list[dict]:
        return [json.loads(e) for e in self.events if e != "[DONE]"]

    def wait_end(self, seconds: float) -> None:
        assert self.ended.wait(deadline(seconds)), f"the stream did not end within {deadline(seconds):g} s"
        self.conn.close()


def keepalive_get(conn: http.client.HTTPConnection, path: str) -> tuple[int, dict]:
    conn.request("GET", path)
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read() or b"{}")


# -- lever serve: the drain ------------------------------------------------------------------

@STOPS
def test_serve_drains_then_ends_a_running_stream_with_an_error_chunk_and_done(stop, smollm2_path, lever_cache,
                                                                             tmp_path, servers):
    """The reproducers: SIGTERM cut the stream at once (no final chunk, no [DONE]); SIGINT waited for
    the generation without a limit.  Now both drain for --drain-seconds, then end the stream."""
    server = Server("serve", smollm2_path, lever_cache, tmp_path, 1.0)
    servers.append(server)
    server.wait_serving()
    stream = Stream(server.port(), max_tokens=4000)         # hundreds of tokens: it outlasts the drain
    wait_until(lambda: len(stream.events) >= 2, 60, "the stream's first tokens")
    server.proc.send_signal(stop)
    stream.wait_end(drain_bound(1.0))
    assert stream.events[-1] == "[DONE]", stream.events[-3:]
    last = json.loads(stream.events[-2])
    assert last["error"]["code"] == "shutting_down", last
    assert server.stopped(0) == 0
    log = server.log()
    name = signal.Signals(stop).name
    assert f"{name}: shutting down" in log and "1 running request(s) get up to 1 s" in log, log
    assert "1 s passed: cancelling 1 running request(s)" in log and log.rstrip().endswith("stopped"), log


def test_serve_lets_a_running_stream_finish_within_the_drain(smollm2_path, lever_cache, tmp_path, servers):
    server = Server("serve", smollm2_path, lever_cache, tmp_path, 300.0)
    servers.append(server)
    server.wait_serving()
    stream = Stream(server.port(), max_tokens=40)
    wait_until(lambda: stream.events, 60, "the stream's first token")
    server.proc.send_signal(signal.SIGTERM)
    stream.wait_end(60)
    assert stream.events[-1] == "[DONE]"
    assert stream.texts()[-1]["choices"][0]["finish_reason"] in ("length", "stop"), stream.events[-3:]
    assert not any("error" in e for e in stream.texts())
    # it exits once the stream is done: well within the 300 s drain
    assert wait_exit(server.proc, 60, "lever serve after its last request") == 0
    assert "stopped (every running request finished)" in server.log()


def test_a_second_signal_ends_the_drain_and_new_requests_get_503(smollm2_path, lever_cache, tmp_path, servers):
    server = Server("serve", smollm2_path, lever_cache, tmp_path, 300.0)
    servers.append(server)
    server.wait_serving()
    idle = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=deadline(30))
    assert keepalive_get(idle, "/health")[0] == 200                 # a keep-alive connection, open before the signal
    stream = Stream(server.port(), max_tokens=4000)
    wait_until(lambda: stream.events, 60, "the stream's first token")
    server.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "SIGTERM: shutting down" in server.log(), 30, "the drain to start")
    status, body = keepalive_get(idle, "/v1/models")
    assert status == 503 and body["error"]["code"] == "shutting_down", body
    idle.close()
    assert not stream.ended.is_set()                                # the drain waits for it...
    server.proc.send_signal(signal.SIGINT)                          # ...until a second signal
    stream.wait_end(30)
    assert stream.events[-1] == "[DONE]" and json.loads(stream.events[-2])["error"]["code"] == "shutting_down"
    assert wait_exit(server.proc, 30, "lever serve after the second signal") == 0    # not the 300 s drain
    assert "a second signal: cancelling 1 running request(s)" in server.log()


# -- every long-running command stops on both signals, whatever it inherited ----------------

@STOPS
def test_serve_verifier_stops(stop, smollm2_path, lever_cache, tmp_path, servers):
    """The hang of issue 46: serve-verifier started with SIGINT ignored never stopped."""
    server = Server("serve-verifier", smollm2_path, lever_cache, tmp_path, 2.0, "--max-tree-nodes", "4")
    servers.append(server)
    server.wait_serving()
    conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=deadline(30))
    assert keepalive_get(conn, "/v1/health")[0] == 200
    conn.close()
    server.proc.send_signal(stop)
    assert server.stopped(0) == 0
    log = server.log()
    assert f"{signal.Signals(stop).name}: shutting down" in log and "stopped (no request was running)" in log, log


@STOPS
def test_serve_stops_when_idle(stop, smollm2_path, lever_cache, tmp_path, servers):
    server = Server("serve", smollm2_path, lever_cache, tmp_path, 2.0)
    servers.append(server)
    server.wait_serving()
    server.proc.send_signal(stop)
    assert server.stopped(0) == 0
    assert "stopped (no request was running)" in server.log()


@STOPS
def test_generate_stops_with_128_plus_the_signal(stop, smollm2_path, lever_cache):
    proc = subprocess.Popen([*IGNORING_STOP_SIGNALS, "-m", "lever.cli", "generate", "--model", str(smollm2_path), "--cache-dir",
                             str(lever_cache), "--prompt", COUNTING, "--no-chat", "--max-new-tokens", "4000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.read(1), "no text generated"          # it generates: now stop it
        proc.send_signal(stop)
        assert wait_exit(proc, 30, "lever generate after the signal") == 128 + stop
        err = proc.stderr.read().decode()
        assert ("lever: interrupted" if stop == signal.SIGINT else "lever: stopped by SIGTERM") in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
