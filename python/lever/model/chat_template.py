"""Rendering chat templates under a budget, in worker processes.

A chat template is Jinja code from the model file, rendered over a
conversation a client sent: both are untrusted.  `TemplateRenderer.render`
hands the work to a worker process (lever.model.template_worker: Jinja's
immutable sandbox with caps on ranges, sequence and integer sizes, call
depth and output size, and an address-space limit) and waits at most the
budget's `seconds`; a worker that has not answered by then is killed, and
the next render starts a fresh one.

Why a process: a render that loops 10^10 times, or one C-level operation
that allocates gigabytes, cannot be stopped inside the process that runs
it -- a thread cannot be killed, and a trace hook does not run inside one
long C call.  Killing a process bounds the CPU time, and its address-space
limit bounds the memory, whatever the template does; the in-sandbox caps
turn the common cases into precise messages quickly.  Workers are kept
between renders (a render costs a pipe round trip, not a process start).

Every failure is a LeverError naming the template (`name`): one line for
`lever generate`, a 400 for `lever serve`.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import LeverError, ModelFormatError

START_SECONDS = 60.0          # a worker's start (Python and jinja2 imported) at most, on a loaded machine
WORKER_IDLE_SECONDS = 10.0    # a worker exits after this long without a request (its ~20 MB of RSS freed)
REUSE_SECONDS = WORKER_IDLE_SECONDS / 2   # an idle worker is reused only this soon, well before it exits


@dataclass(frozen=True)
class TemplateBudget:
    """What one render may use.  seconds: wall time; memory_bytes: address
    space a worker may map beyond its own start; output_chars: characters of
    the rendered text; sequence_items: items of a str / list / tuple made by
    `*` or `+`; int_bits: bits of an integer made by `*` or `**`;
    range_items: items of one range(); call_depth: calls nested inside one
    another (macros included)."""

    seconds: float = 5.0
    memory_bytes: int = 256 << 20
    output_chars: int = 4 << 20
    sequence_items: int = 4 << 20
    int_bits: int = 1 << 16
    range_items: int = 100_000
    call_depth: int = 100

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"seconds must be > 0, got {self.seconds}")
        for name in ("memory_bytes", "output_chars", "sequence_items", "int_bits", "range_items", "call_depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class WorkerGone(Exception):
    """A worker died, or did not answer in time; it has been killed."""


class TemplateWorker:
    """One worker process (lever.model.template_worker) and its pipes."""

    def __init__(self, budget: TemplateBudget):
        root = str(Path(__file__).resolve().parents[2])         # the directory that holds the lever package
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        self.proc = subprocess.Popen([sys.executable, "-m", "lever.model.template_worker", str(budget.memory_bytes),
                                      str(WORKER_IDLE_SECONDS)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, bufsize=0)
        self._buffer = bytearray()
        self.idle_since = time.monotonic()      # when its last answer came (time.monotonic() seconds)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)
        self.max_line_bytes = 6 * budget.output_chars + 4096       # ASCII JSON: at most 6 bytes a character
        self._read_line(time.monotonic() + START_SECONDS, "start")

    def ask(self, request: dict, seconds: float) -> dict:
        """The worker's answer to `request`, waiting at most `seconds`; WorkerGone otherwise."""
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        except OSError:
            self.kill()
            raise WorkerGone("died") from None
        return self._read_line(time.monotonic() + seconds, "render")

    def _read_line(self, deadline: float, what: str) -> dict:
        """The next JSON line of the worker, before `deadline` (time.monotonic() seconds)."""
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerGone(f"timeout:{what}")
            if not self._selector.select(left):
                continue
            chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            if not chunk or len(self._buffer) + len(chunk) > self.max_line_bytes:
                self.kill()
                raise WorkerGone("died")
            self._buffer += chunk
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self.kill()
            raise WorkerGone("died")
        return answer

    def kill(self) -> None:
        """End the process now (SIGKILL) and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._selector.close()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class TemplateRenderer:
    """Renders templates in at most `workers` worker processes at a time
    (callers beyond that wait for one); thread-safe."""

    def __init__(self, budget: TemplateBudget = TemplateBudget(), workers: int = 2):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.budget = budget
        self._slots = threading.BoundedSemaphore(workers)
        self._idle: list[TemplateWorker] = []
        self._lock = threading.Lock()

    def render(self, source: str, variables: dict, name: str = "the chat template") -> str:
        """`source` rendered over `variables` (JSON values); a LeverError naming
        `name` when it fails, goes over the budget or outlives `budget.seconds`
        (ModelFormatError when it does not compile)."""
        try:
            request = {"template": source, "variables": variables, "budget": asdict(self.budget)}
            json.dumps(request)
        except (TypeError, ValueError) as e:
            raise LeverError(f"{name}: its variables must be JSON values ({e})") from None
        with self._slots:
            worker = self._take(name)
            try:
                answer = worker.ask(request, self.budget.seconds)
            except WorkerGone as e:
                raise LeverError(self._gone_message(name, str(e))) from None
            worker.idle_since = time.monotonic()
            with self._lock:
                self._idle.append(worker)
        if "text" in answer and isinstance(answer["text"], str):
            return answer["text"]
        message = f"{name} {answer.get('error', 'failed')}"
        raise (ModelFormatError if answer.get("kind") == "compile" else LeverError)(message)

    def _take(self, name: str) -> TemplateWorker:
        """An idle worker used within REUSE_SECONDS, else a new one (an older
        one is near its own idle exit: ended here rather than raced)."""
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.proc.poll() is None and time.monotonic() - worker.idle_since < REUSE_SECONDS:
                    return worker
                worker.kill()                   # ended while idle, or about to: reaped, replaced
        try:
            return TemplateWorker(self.budget)
        except WorkerGone as e:
            why = (f"did not start within {START_SECONDS:g} s" if str(e) == "timeout:start"
                   else "exited as it started (is jinja2 installed?)")
            raise LeverError(f"{name}: its worker process {why}") from None
        except OSError as e:
            raise LeverError(f"{name}: cannot start its worker process: {e.strerror or e}") from None

    def _gone_message(self, name: str, why: str) -> str:
        if why == "timeout:render":
            return (f"{name} did not finish rendering within its budget of {self.budget.seconds:g} s "
                    f"(stopped; a template that loops without end?)")
        return (f"{name} stopped its worker process (beyond the memory budget of "
                f"{self.budget.memory_bytes:,} bytes, or a crash)")

    def close(self) -> None:
        """End the idle workers (busy ones end when their render does)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


_default: TemplateRenderer | None = None
_default_lock = threading.Lock()


def default_renderer() -> TemplateRenderer:
    """The process's renderer (the default budget), made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = TemplateRenderer()
            atexit.register(_default.close)
        return _default
