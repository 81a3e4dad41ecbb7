"""Run a command inside a memory cgroup (a hard cap on RAM + page cache, no swap).

cgroup v2 is used where its hierarchy offers the memory controller
(`memory.max`, `memory.swap.max` 0, `memory.peak`, `memory.events` oom_kill);
otherwise cgroup v1's memory hierarchy (`memory.limit_in_bytes` and
`memory.memsw.limit_in_bytes` both set to the cap so nothing is swapped,
`memory.max_usage_in_bytes`, `memory.oom_control` oom_kill). The page cache
is dropped before each run (so a model file is read from storage, not from
a warm cache), the child joins the cgroup before it execs, its major faults
come from `os.wait4`'s rusage, and the cgroup is removed afterwards.

Needs root and a memory controller; otherwise CgroupUnavailableError says
which is missing. Sizes in bytes, times in seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import CgroupUnavailableError
from ..store.flash_reader import drop_page_cache as _drop_page_cache

CGROUP_ROOT = "/sys/fs/cgroup"
TAIL_BYTES = 16 << 10


@dataclass(frozen=True)
class MemoryController:
    """Where memory cgroups are made: `version` 1 or 2, `parent` the directory
    the run's cgroup is created in."""

    version: int
    parent: Path

    @property
    def files(self) -> dict[str, str]:
        """Control file names: limit, swap limit, peak usage, oom events."""
        if self.version == 2:
            return {"limit": "memory.max", "swap": "memory.swap.max", "peak": "memory.peak",
                    "events": "memory.events"}
        return {"limit": "memory.limit_in_bytes", "swap": "memory.memsw.limit_in_bytes",
                "peak": "memory.max_usage_in_bytes", "events": "memory.oom_control"}


@dataclass
class RunResult:
    """One run of a command. peak_bytes: the cgroup's peak usage (RAM + page
    cache) when capped, the child's peak RSS otherwise; peak_rss_bytes: the
    child's own peak RSS (its largest resident set, page cache excluded)."""

    cmd: list[str]
    rc: int                       # exit status; -N when killed by signal N
    oom_killed: bool
    peak_bytes: int
    major_faults: int
    wall_s: float
    stdout_tail: str
    stderr_tail: str
    limit_bytes: int | None = None
    cgroup_version: int | None = None
    timed_out: bool = False
    peak_rss_bytes: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def _is_root() -> bool:
    return os.geteuid() == 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _v2_dir(root: Path) -> Path:
    return root if (root / "cgroup.controllers").exists() else root / "unified"


def find_controller(root: str | os.PathLike = CGROUP_ROOT) -> MemoryController:
    """The memory controller under `root`: v2 when its hierarchy offers
    memory, else v1's `root/memory`; CgroupUnavailableError saying which is
    missing (and also when this process is not root)."""
    root = Path(root)
    if not _is_root():
        raise CgroupUnavailableError(
            f"a memory cap needs root (to create a cgroup under {root} and drop the page cache); "
            f"running as uid {os.geteuid()}")
    v2 = _v2_dir(root)
    controllers = _read(v2 / "cgroup.controllers").split()
    if "memory" in controllers:
        if "memory" not in _read(v2 / "cgroup.subtree_control").split():
            _write(v2 / "cgroup.subtree_control", "+memory")
        return MemoryController(2, v2)
    v1 = root / "memory"
    if (v1 / "memory.limit_in_bytes").exists():
        return MemoryController(1, v1)
    offered = " ".join(controllers) if controllers else "none"
    raise CgroupUnavailableError(
        f"no memory cgroup controller: cgroup v2 at {v2} offers [{offered}] and there is no "
        f"cgroup v1 memory hierarchy at {v1} (mount one, or boot with the memory controller enabled)")


def _write(path: Path, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as e:
        raise CgroupUnavailableError(f"cannot write {value!r} to {path}: {e.strerror}") from None


def drop_page_cache() -> None:
    """sync, then drop the whole page cache (needs root); CgroupUnavailableError if refused."""
    outcome = _drop_page_cache()
    if outcome.startswith("could not"):
        raise CgroupUnavailableError(f"{outcome} (a capped run starts with a cold page cache; needs root)")


def _make_cgroup(ctl: MemoryController, limit_bytes: int) -> Path:
    path = ctl.parent / f"lever-{os.getpid()}-{time.monotonic_ns()}"
    try:
        path.mkdir()
    except OSError as e:
        raise CgroupUnavailableError(f"cannot create the cgroup {path}: {e.strerror}") from None
    files = ctl.files
    try:
        _write(path / files["limit"], str(limit_bytes))
        if (path / files["swap"]).exists():                # absent without swap accounting
            _write(path / files["swap"], "0" if ctl.version == 2 else str(limit_bytes))
    except CgroupUnavailableError:
        _remove_cgroup(path)
        raise
    return path


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return 0


def _remove_cgroup(path: Path) -> None:
    """Kill what is left in the cgroup (processes the run started), then rmdir it."""
    for _ in range(50):
        for pid in _read(path / "cgroup.procs").split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
    raise CgroupUnavailableError(f"cannot remove the cgroup {path} (processes still in it)")


def _tail(f, n: int) -> str:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - n))
    return f.read().decode("utf-8", errors="replace")


def _spawn_and_wait(cmd, preexec, timeout_s, tail_bytes, env, cwd):
    """Start `cmd`, wait with os.wait4: (rc, rusage, wall_s, stdout tail, stderr tail, timed_out)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                preexec_fn=preexec, env=env, cwd=cwd)
        expired = threading.Event()

        def kill():
            expired.set()
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        timer = threading.Timer(timeout_s, kill) if timeout_s else None
        if timer:
            timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            if timer:
                timer.cancel()
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        return proc.returncode, usage, wall, _tail(out, tail_bytes), _tail(err, tail_bytes), expired.is_set()


def run_capped(cmd, limit_bytes: int, *, root: str | os.PathLike = CGROUP_ROOT, drop_caches: bool = True,
               timeout_s: float | None = None, tail_bytes: int = TAIL_BYTES, env=None, cwd=None) -> RunResult:
    """Run `cmd` (argv list) in a fresh memory cgroup capped at `limit_bytes`
    (RAM + page cache, no swap), after dropping the page cache; the cgroup is
    removed afterwards. A run past `timeout_s` seconds is killed (timed_out)."""
    ctl = find_controller(root)
    if drop_caches:
        drop_page_cache()
    path = _make_cgroup(ctl, int(limit_bytes))
    procs = str(path / "cgroup.procs")

    def join():                       # in the child, before exec
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    try:
        rc, usage, wall, out, err, timed_out = _spawn_and_wait(cmd, join, timeout_s, tail_bytes, env, cwd)
        files = ctl.files
        peak_text = _read(path / files["peak"]).strip()
        peak = int(peak_text) if peak_text.isdigit() else usage.ru_maxrss * 1024
        oom = _counter(_read(path / files["events"]), "oom_kill") > 0
    finally:
        _remove_cgroup(path)
    return RunResult(list(cmd), rc, oom, peak, usage.ru_majflt, wall, out, err,
                     int(limit_bytes), ctl.version, timed_out, usage.ru_maxrss * 1024)


def run_uncapped(cmd, *, drop_caches: bool = False, timeout_s: float | None = None,
                 tail_bytes: int = TAIL_BYTES, env=None, cwd=None) -> RunResult:
    """Run `cmd` without a cap; peak_bytes is the child's peak RSS (ru_maxrss).
    `drop_caches` (needs root) starts it with a cold page cache."""
    if drop_caches:
        drop_page_cache()
    rc, usage, wall, out, err, timed_out = _spawn_and_wait(cmd, None, timeout_s, tail_bytes, env, cwd)
    return RunResult(list(cmd), rc, False, usage.ru_maxrss * 1024, usage.ru_majflt, wall, out, err,
                     None, None, timed_out, usage.ru_maxrss * 1024)
