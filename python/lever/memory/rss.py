"""Resident memory of this process, from /proc/self/status (Linux).

All sizes are in bytes. `rss_bytes` is VmRSS (now), `peak_rss_bytes` is
VmHWM (the high-water mark since start or the last `reset_peak()`; never
below VmRSS, which the kernel's lazily summed counters can briefly allow),
`anon_bytes` / `file_bytes` split VmRSS into anonymous memory (heap, weight
buffers, KV cache) and file-backed pages (mapped libraries, mmapped files);
RssShmem makes up the rest. `major_faults` counts page faults that had to
read from storage (getrusage ru_majflt). Where /proc is missing (not Linux),
both RSS numbers fall back to ru_maxrss, the peak, and the split is 0.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import asdict, dataclass

STATUS = "/proc/self/status"
_FIELDS = {"VmRSS": "rss_bytes", "VmHWM": "peak_rss_bytes",
           "RssAnon": "anon_bytes", "RssFile": "file_bytes"}


@dataclass(frozen=True)
class RssSnapshot:
    """One reading of this process's memory; sizes in bytes, faults a count."""

    rss_bytes: int
    peak_rss_bytes: int
    anon_bytes: int
    file_bytes: int
    major_faults: int

    def to_dict(self) -> dict:
        return asdict(self)


def read_status(path: str = STATUS) -> dict[str, int]:
    """The kB fields of a /proc/<pid>/status file, in bytes ({} if unreadable)."""
    out: dict[str, int] = {}
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def max_rss_bytes(who: int = resource.RUSAGE_SELF) -> int:
    """getrusage's ru_maxrss in bytes (kilobytes on Linux, bytes on macOS)."""
    value = resource.getrusage(who).ru_maxrss
    return value if sys.platform == "darwin" else value * 1024


def major_faults(who: int = resource.RUSAGE_SELF) -> int:
    """Major page faults so far (pages read from storage on access)."""
    return resource.getrusage(who).ru_majflt


def snapshot(path: str = STATUS) -> RssSnapshot:
    """This process's RSS now, its peak, the anonymous/file split and major faults."""
    status = read_status(path)
    values = {name: status.get(key) for key, name in _FIELDS.items()}
    if values["rss_bytes"] is None or values["peak_rss_bytes"] is None:
        peak = max_rss_bytes()
        values["rss_bytes"] = values["rss_bytes"] or peak
        values["peak_rss_bytes"] = values["peak_rss_bytes"] or peak
    peak = max(values["peak_rss_bytes"], values["rss_bytes"])     # VmHWM can lag VmRSS a little
    return RssSnapshot(values["rss_bytes"], peak, values["anon_bytes"] or 0,
                       values["file_bytes"] or 0, major_faults())


def current_rss() -> int:
    """Resident set size now, bytes."""
    return snapshot().rss_bytes


def peak_rss() -> int:
    """Highest resident set size so far, bytes."""
    return snapshot().peak_rss_bytes


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (writes 5 to /proc/self/clear_refs);
    False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
