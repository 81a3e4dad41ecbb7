"""A loopback TCP proxy that emulates a slow, lossy network link.

`LinkProxy` sits between an HTTP client and a server on the same machine (in
Lever, the verifier server) and makes the loopback connection behave like a
link with a given round-trip time and message loss, so that tests and
benchmarks can see what a remote verifier costs without a second machine.

Units: all times are in seconds (`rtt_s`); `loss` is a probability in [0, 1).

Delay: every chunk the proxy reads from one side is written to the other side
no earlier than its arrival time plus rtt_s / 2, so a request/response exchange
takes about rtt_s longer than it does directly.  Each direction has a queue of
(due time, chunk) and a writer that sleeps until each chunk is due: chunks keep
their order, and the delay does not limit throughput (many chunks can be in
flight at once, as on a real link).  Connection setup itself is not delayed.

Loss: a real link loses packets, but TCP retransmits them, so at the level an
application sees, loss shows up as a stall or as a connection that dies with a
message in flight.  The proxy models the latter: when a chunk (one read from a
socket -- a small HTTP request or response usually arrives as one) comes in
from either side, it is dropped with probability `loss` and the whole
connection is aborted with a reset on both sides.  A drop on the way down
(server to client) means the server did handle the request but the client never
got the answer -- exactly the case that idempotent retries must cope with.  The
draws come from `random.Random(seed)`, one per chunk, so a run is repeatable as
far as the chunking of the traffic is.

Buffering: chunks waiting out their delay are held in memory without a bound,
which is fine for the request/response sizes of tests and benchmarks.

Command line (runs until Ctrl-C or SIGTERM, then closes at once):

    python -m lever.remote.netem --upstream http://127.0.0.1:8000 \\
        --listen-port 8001 --rtt-ms 20 --loss 0.01
"""

from __future__ import annotations

import argparse
import asyncio
import math
import numbers
import random
import socket
import struct
import threading
import urllib.parse
from typing import Optional

from ..signals import Stopped, stop_handlers, wait_for_stop_signal

CHUNK_BYTES = 64 * 1024
UP = "up"      # client -> server
DOWN = "down"  # server -> client
_EOF = None    # queue marker: the sending side closed its half of the connection


def check_link(rtt_s: float, loss: float) -> None:
    """Raise ValueError unless rtt_s is a finite number >= 0 and 0 <= loss < 1."""
    if not (_is_number(rtt_s) and math.isfinite(rtt_s) and rtt_s >= 0):
        raise ValueError(f"rtt_s must be a finite number of seconds >= 0, got {rtt_s!r}")
    if not (_is_number(loss) and 0 <= loss < 1):
        raise ValueError(f"loss must be a probability with 0 <= loss < 1, got {loss!r}")


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Abort a connection so that the peer sees a reset (RST), not a clean close."""
    transport = writer.transport
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()


class _Link:
    """One proxied connection: per direction, a reader that timestamps chunks and
    a writer that delivers each one when it is due."""

    def __init__(self, proxy: "LinkProxy", client: tuple, upstream: tuple):
        self.proxy = proxy
        self.client_reader, self.client_writer = client
        self.up_reader, self.up_writer = upstream
        self.tasks: list = []
        self.aborted = False
        self.finished = False   # both directions ended normally and both sides are closed

    async def run(self) -> None:
        up_queue: asyncio.Queue = asyncio.Queue()
        down_queue: asyncio.Queue = asyncio.Queue()
        self.tasks = [
            asyncio.ensure_future(self._receive(self.client_reader, up_queue, UP)),
            asyncio.ensure_future(self._deliver(up_queue, self.up_writer, UP)),
            asyncio.ensure_future(self._receive(self.up_reader, down_queue, DOWN)),
            asyncio.ensure_future(self._deliver(down_queue, self.client_writer, DOWN)),
        ]
        await asyncio.wait(self.tasks)
        if not self.aborted:
            self.finished = True
            self.client_writer.close()
            self.up_writer.close()

    def abort_unless_finished(self) -> None:
        if not self.finished:
            self.abort()

    def abort(self) -> None:
        """Reset both sides and stop all four tasks (idempotent)."""
        if self.aborted:
            return
        self.aborted = True
        _reset(self.client_writer)
        _reset(self.up_writer)
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()

    async def _receive(self, reader: asyncio.StreamReader, queue: asyncio.Queue,
                       direction: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = await reader.read(CHUNK_BYTES)
            except (ConnectionError, OSError):
                self.abort()   # the peer reset: pass the reset on
                return
            arrival = loop.time()
            if not data:
                queue.put_nowait((arrival + self.proxy._one_way_s(), _EOF))
                return
            if self.proxy._draw_drop(direction):
                self.abort()
                return
            queue.put_nowait((arrival + self.proxy._one_way_s(), data))

    async def _deliver(self, queue: asyncio.Queue, writer: asyncio.StreamWriter,
                       direction: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                if data is _EOF:
                    if writer.can_write_eof():
                        writer.write_eof()
                    else:
                        writer.close()
                    return
                writer.write(data)
                await writer.drain()
            except (ConnectionError, OSError):
                self.abort()   # the receiving side went away mid-stream
                return
            self.proxy._count(f"bytes_{direction}", len(data))


class LinkProxy:
    """Forwards TCP connections from listen_host:port to upstream host:port, adding rtt_s/2 of
    one-way delay in each direction and dropping connections with probability `loss` per message.

    Use as a context manager (`with LinkProxy(host, port, rtt_s=0.05) as proxy: ...`) or call
    `start()` and `close()`.  The proxy runs an asyncio loop in a daemon thread."""

    def __init__(self, upstream_host: str, upstream_port: int, rtt_s: float = 0.0,
                 loss: float = 0.0, seed: int = 0, listen_host: str = "127.0.0.1",
                 listen_port: int = 0):
        check_link(rtt_s, loss)
        self.upstream_host = upstream_host
        self.upstream_port = int(upstream_port)
        self.listen_host = listen_host
        self.listen_port = int(listen_port)
        self._rtt_s = float(rtt_s)
        self._loss = float(loss)
        self._rng = random.Random(seed)   # used on the loop thread only
        self._lock = threading.Lock()     # guards the link settings and the counters
        self._counts = {"connections": 0, "bytes_up": 0, "bytes_down": 0,
                        "dropped_up": 0, "dropped_down": 0}
        self._port: Optional[int] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._stop: Optional[asyncio.Event] = None
        self._start_error: Optional[BaseException] = None
        self._closed = False
        self._links: set = set()      # open connections (loop thread only)
        self._handlers: set = set()   # one task per accepted connection (loop thread only)

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> "LinkProxy":
        """Start listening (in a daemon thread); returns self once the port is open."""
        with self._lock:
            if self._thread is not None or self._closed:
                raise RuntimeError("LinkProxy.start() may be called only once")
            self._loop = asyncio.new_event_loop()
            ready = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True,
                                            name="lever-netem")
        self._thread.start()
        ready.wait()
        if self._start_error is not None:
            self._thread.join()
            with self._lock:
                self._closed = True
            raise self._start_error
        return self

    def close(self) -> None:
        """Stop listening, abort open connections and join the thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread, stop = self._loop, self._thread, self._stop
        if thread is None:
            return
        if stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:   # the loop has already finished
                pass
        thread.join()

    def __enter__(self) -> "LinkProxy":
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def port(self) -> int:
        """The port the proxy listens on (known once started)."""
        if self._port is None:
            raise RuntimeError("LinkProxy is not listening yet: call start() first")
        return self._port

    @property
    def url(self) -> str:
        """Base URL of the proxy, e.g. "http://127.0.0.1:8001"."""
        host = self.listen_host
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    # -- link settings and statistics ---------------------------------------------------------

    def set_link(self, rtt_s: Optional[float] = None, loss: Optional[float] = None) -> None:
        """Change the round-trip time and/or loss; applies to chunks arriving from now on."""
        with self._lock:
            new_rtt = self._rtt_s if rtt_s is None else rtt_s
            new_loss = self._loss if loss is None else loss
            check_link(new_rtt, new_loss)
            self._rtt_s, self._loss = float(new_rtt), float(new_loss)

    def stats(self) -> dict:
        """Counters so far plus the current settings.  `connections` counts accepted client
        connections; bytes are counted when delivered; `dropped_*` count aborted connections
        by the direction of the dropped message (up: client -> server)."""
        with self._lock:
            return dict(self._counts, rtt_s=self._rtt_s, loss=self._loss)

    def _one_way_s(self) -> float:
        with self._lock:
            return self._rtt_s / 2

    def _draw_drop(self, direction: str) -> bool:
        """One draw per chunk (whatever the loss), so the sequence depends only on the seed."""
        with self._lock:
            loss = self._loss
        drop = self._rng.random() < loss
        if drop:
            self._count(f"dropped_{direction}")
        return drop

    def _count(self, key: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[key] += amount

    # -- the event loop thread ----------------------------------------------------------------

    def _run(self, ready: threading.Event) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve(ready))
        except BaseException as error:   # bind failures end up in start()
            if not ready.is_set():
                self._start_error = error
        finally:
            ready.set()
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    async def _serve(self, ready: threading.Event) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._accept, self.listen_host, self.listen_port)
        self._port = server.sockets[0].getsockname()[1]
        ready.set()
        try:
            await self._stop.wait()
        finally:
            await self._stop_listening(server)
            await self._abort_everything()
            try:
                await asyncio.wait_for(server.wait_closed(), 2.0)
            except asyncio.TimeoutError:
                pass

    @staticmethod
    async def _stop_listening(server: asyncio.AbstractServer) -> None:
        """Close the listener without racing a connection accepted at the same moment (asyncio
        fails to attach one whose server has just closed): stop accepting, give accepts already
        under way the one loop iteration they need to set up, then close."""
        loop = asyncio.get_running_loop()
        for sock in server.sockets:
            try:
                loop.remove_reader(sock.fileno())
            except (NotImplementedError, ValueError):   # not a selector loop: just close
                pass
        await asyncio.sleep(0)
        server.close()

    async def _abort_everything(self) -> None:
        """Reset every open connection and wait until no other task is left on the loop
        (repeated, since a connection accepted just before the listener closed may still
        be setting up)."""
        current = asyncio.current_task()
        while True:
            for link in list(self._links):
                link.abort()
            for handler in list(self._handlers):
                handler.cancel()
            others = [task for task in asyncio.all_tasks() if task is not current]
            if not others:
                return
            await asyncio.wait(others)

    def _accept(self, client_reader: asyncio.StreamReader,
                client_writer: asyncio.StreamWriter) -> None:
        # Our own task (not one start_server makes from a coroutine), so that closing can
        # find and cancel it from the moment the connection exists.
        handler = asyncio.ensure_future(self._handle(client_reader, client_writer))
        self._handlers.add(handler)
        handler.add_done_callback(lambda task: self._handler_done(task, client_writer))

    def _handler_done(self, handler: asyncio.Future, client_writer: asyncio.StreamWriter) -> None:
        self._handlers.discard(handler)
        if not client_writer.transport.is_closing():   # cancelled before it could run
            _reset(client_writer)

    async def _handle(self, client_reader: asyncio.StreamReader,
                      client_writer: asyncio.StreamWriter) -> None:
        self._count("connections")
        try:
            upstream = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            client_writer.close()   # upstream unreachable: the client just sees the close
            return
        link = _Link(self, (client_reader, client_writer), upstream)
        self._links.add(link)
        try:
            await link.run()
        finally:   # also when the proxy closes and cancels this task
            link.abort_unless_finished()
            self._links.discard(link)


# -- command line -----------------------------------------------------------------------------

def parse_upstream(url: str) -> tuple:
    """(host, port) from an upstream URL such as "http://127.0.0.1:8000"."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"upstream must be an http:// URL with a host, got {url!r}")
    return parts.hostname, parts.port or 80


MAX_RTT_MS = 60_000.0          # milliseconds: the longest round trip the proxy emulates


def _bounded(kind, lo, hi, what: str):
    """An argparse type: a finite `kind` (int or float) from lo to hi, else one line naming the range."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected {what} from {lo:g} to {hi:g}, got {text!r}")
        return value
    return parse


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lever.remote.netem",
        description="Forward TCP connections to an upstream server over an emulated link "
                    "(round-trip delay and message loss).")
    parser.add_argument("--upstream", required=True,
                        help="server to forward to, e.g. http://127.0.0.1:8000")
    parser.add_argument("--listen-host", default="127.0.0.1", help="default: 127.0.0.1")
    parser.add_argument("--listen-port", type=_bounded(int, 0, 65535, "a port"), default=0,
                        help="default: 0 (any free port)")
    parser.add_argument("--rtt-ms", type=_bounded(float, 0.0, MAX_RTT_MS, "milliseconds"), default=0.0,
                        help="round-trip time to add, in milliseconds (default: 0)")
    parser.add_argument("--loss", type=_bounded(float, 0.0, 0.99, "a probability"), default=0.0,
                        help="probability of dropping each message, 0 <= loss < 1 (default: 0)")
    parser.add_argument("--seed", type=_bounded(int, 0, 2**63 - 1, "a seed"), default=0,
                        help="seed for the loss draws")
    args = parser.parse_args(argv)
    try:
        host, port = parse_upstream(args.upstream)
        proxy = LinkProxy(host, port, rtt_s=args.rtt_ms / 1000.0, loss=args.loss,
                          seed=args.seed, listen_host=args.listen_host,
                          listen_port=args.listen_port)
    except ValueError as error:
        parser.error(str(error))
    # SIGINT / SIGTERM stop it whatever dispositions it inherited (a background job of a script
    # starts with SIGINT ignored): explicit handlers, a signal during the set-up raising Stopped,
    # then a wait that wakes whichever thread the signal is delivered to (lever.signals); the stop
    # is the same whenever it comes (close the listener, reset open links, join).
    with stop_handlers():
        try:
            try:
                proxy.start()
            except OSError as error:
                parser.exit(1, f"netem: cannot listen on {args.listen_host}:{args.listen_port}: "
                               f"{error}\n")
            print(f"netem: listening on {proxy.url} -> {args.upstream} "
                  f"(rtt {args.rtt_ms:g} ms, loss {args.loss:g}); Ctrl-C to stop", flush=True)
            wait_for_stop_signal()
        except Stopped:
            pass
        finally:
            proxy.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
