"""argparse value types of the `lever` commands, defined once.

Each type turns an option's text into a value of the stated unit and range,
or raises argparse.ArgumentTypeError with one clear line, which the parser
(lever.cli) prints as `lever: error: argument --OPTION: ...` with exit
status 2. Ranges come from lever.commands.limits and lever.sampling.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Callable

from .limits import MAX_NUMBER_CHARS, MAX_READ_RATE, MAX_SIZE_BYTES, MIN_READ_RATE


def _short(text: str) -> str:
    """`text` quoted for a message, cut to a readable length."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _number_text(text: str) -> str:
    if len(text) > MAX_NUMBER_CHARS:
        raise argparse.ArgumentTypeError(f"{_short(text)} is too long for a number "
                                         f"(at most {MAX_NUMBER_CHARS} characters)")
    return text.strip()


def integer(lo: int, hi: int) -> Callable[[str], int]:
    """An integer from lo to hi inclusive."""
    def parse(text: str) -> int:
        try:
            value = int(_number_text(text), 10)
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer from {lo:,} to {hi:,}, got {_short(text)}")
        return value
    parse.__name__ = "integer"
    return parse


def real(lo: float, hi: float) -> Callable[[str], float]:
    """A finite number from lo to hi inclusive."""
    def parse(text: str) -> float:
        value = _float_or_fail(text)
        if not (math.isfinite(value) and lo <= value <= hi):
            raise argparse.ArgumentTypeError(f"expected a number from {lo:g} to {hi:g}, got {_short(text)}")
        return value
    parse.__name__ = "number"
    return parse


def sampling(field: str, parse: Callable[[str], object]) -> Callable[[str], object]:
    """An argparse type for the sampling field `field` of lever.sampling's
    SamplingParams: text parsed by `parse`, then checked against the ranges
    SamplingParams defines (temperature 0 or MIN..MAX_TEMPERATURE, top_p
    MIN_TOP_P..1, top_k 0..MAX_TOP_K, seed 0..MAX_SEED), whose message names
    the range; nothing is clamped or turned into greedy."""
    def check(text: str):
        from ..sampling import SamplingParams
        value = parse(text)
        try:
            SamplingParams(**{field: value})
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return value
    check.__name__ = field
    return check


def _float_or_fail(text: str) -> float:
    try:
        return float(_number_text(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {_short(text)}") from None


def _int_or_fail(text: str) -> int:
    try:
        return int(_number_text(text), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {_short(text)}") from None


temperature = sampling("temperature", _float_or_fail)
top_p = sampling("top_p", _float_or_fail)
top_k = sampling("top_k", _int_or_fail)
seed = sampling("seed", _int_or_fail)


def size(text: str) -> int:
    """A size in bytes: '600MB' (10^6), '1.5GiB' (2^30), '512M' (2^20) or a
    byte count, from 1 byte to MAX_SIZE_BYTES."""
    from ..errors import LeverError
    from ..values import parse_size
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"a size must be positive (from 1 byte to {MAX_SIZE_BYTES >> 40} TiB), "
                                         f"got {_short(text)}")
    try:
        value = parse_size(_number_text(text))
    except LeverError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    except (OverflowError, ValueError):          # digits beyond a float's range
        raise argparse.ArgumentTypeError(f"expected a size from 1 byte to {MAX_SIZE_BYTES >> 40} TiB, "
                                         f"got {_short(text)}") from None
    if not 1 <= value <= MAX_SIZE_BYTES:
        raise argparse.ArgumentTypeError(f"expected a size from 1 byte to {MAX_SIZE_BYTES >> 40} TiB, "
                                         f"got {_short(text)}")
    return value


def read_rate(text: str) -> float:
    """A read-bandwidth cap in bytes/s ('200MB/s', '1.5GiB/s', a number of
    bytes/s): 0 (no cap) or from MIN_READ_RATE to MAX_READ_RATE."""
    from ..errors import LeverError
    from ..values import parse_rate
    try:
        value = parse_rate(_number_text(text))
    except LeverError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value != 0 and not MIN_READ_RATE <= value <= MAX_READ_RATE:
        raise argparse.ArgumentTypeError(f"expected 0 (no cap) or a rate from {MIN_READ_RATE / 1e6:g}MB/s to "
                                         f"{MAX_READ_RATE / 1e12:g}TB/s, got {_short(text)}")
    return value


def name(text: str) -> str:
    """A non-empty name, path or URL (an empty one would read as 'not given')."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must not be empty, got {_short(text)}")
    return text


def url(text: str) -> str:
    """A server's URL: http:// or https://, a host, and a port from 1 to
    65535 when one is given (default 80 / 443); no user name or password."""
    from urllib.parse import urlsplit
    expected = f"expected http://HOST:PORT or https://HOST:PORT, got {_short(text)}"
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must not be empty, got {_short(text)}")
    try:
        parts = urlsplit(text.strip())
        host = parts.hostname
    except ValueError:                      # e.g. an unclosed IPv6 bracket
        raise argparse.ArgumentTypeError(expected) from None
    if parts.scheme not in ("http", "https") or not host:
        raise argparse.ArgumentTypeError(expected)
    try:
        port = parts.port                   # ValueError: not a number, or beyond 65535
    except ValueError:
        port = 0
    if port == 0:
        raise argparse.ArgumentTypeError(f"{expected} (the port must be a number from 1 to 65535)")
    if parts.username is not None or parts.password is not None:
        raise argparse.ArgumentTypeError(f"{_short(text)}: a user name or password does not go in the URL "
                                         f"(use --token-file)")
    return text.strip()


def directory(text: str) -> str:
    """A directory that may not exist yet (it is created), but not a file."""
    if not text:
        raise argparse.ArgumentTypeError("expected a directory, got ''")
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text}: exists and is not a directory")
    return text


def store_dir(text: str) -> str:
    """An existing flash store directory (its contents are checked when it is opened)."""
    if not os.path.isdir(text):
        what = "is not a directory" if os.path.exists(text) else "no such store directory"
        raise argparse.ArgumentTypeError(f"{text}: {what} (make a store with `lever convert MODEL --out DIR`)")
    return text


def output_file(text: str) -> str:
    """A file to write: its directory must exist and it must not be a directory."""
    if not text:
        raise argparse.ArgumentTypeError("expected a file name, got ''")
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a directory, expected a file name")
    if not path.absolute().parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: the directory {path.absolute().parent} does not exist")
    return text


def file_stem(text: str) -> str:
    """A file name without directory, e.g. 'bench' for bench.json and bench.png."""
    if not text or text in (".", "..") or "/" in text or "\0" in text or os.sep in text:
        raise argparse.ArgumentTypeError(f"expected a file name without '/', got {_short(text)}")
    return text


def prefetch_depth(text: str) -> int | str:
    """'auto' or an integer 1..MAX_PREFETCH_DEPTH: read buffers in the flash reader's ring."""
    from ..errors import LeverError
    from ..store.residency import parse_prefetch_depth
    try:
        return parse_prefetch_depth(_number_text(text))
    except LeverError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def weight_layout(text: str) -> str:
    """A store's weight layout for `lever convert` (lever.store.manifest.WEIGHT_LAYOUTS):
    'repacked' (8-row groups for the batched kernels) or 'gguf' (the GGUF's row order)."""
    from ..store.manifest import WEIGHT_LAYOUTS
    value = text.strip()
    if value not in WEIGHT_LAYOUTS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(WEIGHT_LAYOUTS)}, got {_short(text)}")
    return value


def bucket_list(what: str, hi: int) -> Callable[[str], str]:
    """A comma-separated list of bucket sizes from 1 to `hi` ('1,8,16'), normalised
    (sorted, duplicates dropped) and kept as text, so that a child command line
    (bench --memory-cap) passes it on as one argument (lever.npu.buckets.parse_buckets).
    what: "row buckets" or "context buckets", for the message."""
    def parse(text: str) -> str:
        from ..errors import LeverError
        from ..npu.buckets import parse_buckets
        if len(text) > 4 * MAX_NUMBER_CHARS:
            raise argparse.ArgumentTypeError(f"{_short(text)} is too long for a list of {what}")
        try:
            return ",".join(map(str, parse_buckets(text, what, limit=hi)))
        except LeverError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = "bucket list"
    return parse


def soc_model(text: str) -> str:
    """A Snapdragon SoC model id the qnn backend prepares graphs for (lever.npu.runtime.SOCS)."""
    from ..npu.runtime import SOCS
    value = text.strip()
    if value not in SOCS:
        raise argparse.ArgumentTypeError(f"unsupported SoC model {_short(text)}: choose one of "
                                         + ", ".join(f"{k} ({v[0]}, HTP v{v[1]})" for k, v in SOCS.items()))
    return value


def dtype(text: str) -> str:
    """A compute dtype in any spelling lever.values accepts (float32, fp32, f32,
    bfloat16, bf16; any case) -> its one name, "float32" or "bfloat16"."""
    from ..values import DTYPE_NAMES
    name = DTYPE_NAMES.get(text.strip().lower())
    if name is None:
        raise argparse.ArgumentTypeError(f"expected a compute dtype ({', '.join(DTYPE_NAMES)}), got {_short(text)}")
    return name
