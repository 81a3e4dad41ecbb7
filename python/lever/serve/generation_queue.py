"""The one engine thread of `lever serve`: jobs run one at a time, first in
first out, because a model is not thread-safe.

- `GenerationQueue.submit(job)` queues a job, or raises `QueueFull` when
  `max_waiting` jobs already wait (the running one not counted).
- A job is cancelled from any thread (`Job.cancel`, e.g. when its client
  disconnects): a waiting job leaves the queue at once and never runs
  (counted in `dropped`); a running one raises `Cancelled` from its next
  `Job.check()` (the engine calls it for every token), which ends the run.
- Results, failures and streamed events go back to the asyncio loop that
  submitted the job (`Job.done`, `Job.events`).
- `freed` counts jobs whose run has ended, however it ended: their engine
  state (KV cache, draft state) belongs to the run and is released with it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Callable

from ..errors import LeverError


class QueueFull(Exception):
    """The queue holds its limit of waiting jobs."""


class Cancelled(LeverError):
    """Raised inside a running job once it is cancelled (its client left)."""


class Job:
    """One unit of engine work: `work(job)` runs on the engine thread and its
    return value (or exception) completes `done` on `loop`.  `post(event)`
    (engine thread) puts an event on `events` for the loop."""

    def __init__(self, work: Callable[["Job"], object], loop: asyncio.AbstractEventLoop):
        self.work, self.loop = work, loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.done: asyncio.Future = loop.create_future()
        self._cancelled = threading.Event()
        self.queue: "GenerationQueue | None" = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop this job: dropped if still waiting, stopped at its next check if running."""
        if self._cancelled.is_set():
            return
        self._cancelled.set()
        if self.queue is not None:
            self.queue.discard(self)

    def check(self) -> None:
        """Engine side: raise Cancelled once the job is cancelled."""
        if self._cancelled.is_set():
            raise Cancelled("the client went away; generation stopped")

    def post(self, event) -> None:
        """Engine side: hand `event` to the loop (dropped if the loop has closed)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:
            pass

    def _finish(self, result=None, error: BaseException | None = None) -> None:
        def settle() -> None:
            if self.done.done():
                return
            if error is not None:
                self.done.set_exception(error)
            else:
                self.done.set_result(result)
        try:
            self.loop.call_soon_threadsafe(settle)
        except RuntimeError:
            pass


class GenerationQueue:
    """A FIFO of jobs served by one daemon thread.  Counters: `dropped`
    (cancelled while waiting), `cancelled` (stopped while running), `failed`
    (raised anything else), `completed`, `freed` (runs ended)."""

    def __init__(self, max_waiting: int, name: str = "lever-serve-engine"):
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {max_waiting}")
        self.max_waiting = max_waiting
        self.waiting: deque[Job] = deque()
        self.running: Job | None = None
        self.dropped = self.cancelled = self.failed = self.completed = self.freed = 0
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Jobs waiting (the running one not counted)."""
        return len(self.waiting)

    @property
    def active(self) -> int:
        """Jobs running: 0 or 1."""
        return 0 if self.running is None else 1

    def submit(self, job: Job) -> None:
        with self._cv:
            if self._closed:
                raise QueueFull("the server is shutting down")
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull(f"{len(self.waiting)} requests already wait (--max-queue {self.max_waiting})")
            job.queue = self
            self.waiting.append(job)
            self._cv.notify()

    def discard(self, job: Job) -> None:
        """Take a cancelled `job` out of the queue if it still waits."""
        with self._cv:
            try:
                self.waiting.remove(job)
            except ValueError:
                return
            self.dropped += 1
        job._finish(error=Cancelled("the client went away before the request ran"))

    def close(self) -> None:
        """Stop taking jobs; waiting ones are cancelled, the running one is told to stop."""
        with self._cv:
            self._closed = True
            waiting, self.waiting = list(self.waiting), deque()
            running = self.running
            self._cv.notify()
        for job in waiting:
            job._cancelled.set()
            job._finish(error=Cancelled("the server is shutting down"))
        if running is not None:
            running._cancelled.set()

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self.waiting and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                job = self.running = self.waiting.popleft()
            if job.cancelled:                   # cancelled between leaving the queue and starting
                self.dropped += 1
                job._finish(error=Cancelled("the client went away before the request ran"))
            else:
                self._run(job)
            with self._cv:
                self.running = None

    def _run(self, job: Job) -> None:
        """Run `job`; the counters are updated before its client hears the end."""
        result = error = None
        try:
            result = job.work(job)
        except Cancelled as e:
            self.cancelled += 1
            error = e
        except BaseException as e:  # noqa: BLE001 -- one request's failure is its own; the engine goes on
            self.failed += 1
            error = e
        else:
            self.completed += 1
        self.freed += 1
        job._finish(result, error)
