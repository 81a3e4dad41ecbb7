"""Static-shape buckets: the (rows, context) shapes the NPU graphs are compiled for.

A compiled graph (a QNN context binary) has fixed shapes, so Lever compiles a
small set of buckets and pads every verification pass up to one of them.
Units: rows = tokens.

- **Row bucket N**: the new rows (tokens) one graph call runs.
- **Context bucket C**: the past rows (KV cache rows) it reads.

`BucketSet` holds the row and context buckets and the native planner
(`lever._native.BucketPlanner`, csrc/graph/bucket_planner.h) that

- ``choose(n_rows, past)``: picks the smallest row bucket >= n_rows and the
  smallest context bucket >= past;
- ``chunks(n_rows, past)``: splits a tree larger than the largest row bucket
  into consecutive chunks ``(start, end, rows, context)``; chunk
  ``[start, end)`` runs with ``past + start`` rows cached (the earlier
  chunks' rows are in the cache by then);
- ``pack(tokens, positions, mask, past, start, end, rows, context, ids_out,
  positions_out, mask_out)``: writes one chunk's graph inputs -- ids and
  positions int64 ``[N]`` (padding 0) and the additive float32 mask
  ``[N, C + N]`` (0.0 attended, ``MASKED`` not; columns ``0..C-1`` the past,
  ``C..C+N-1`` the chunk's rows; a padding row attends only itself).

`parse_buckets` reads the ``--buckets`` / ``--contexts`` options ("1,8,16").
"""

from __future__ import annotations

import operator
import re
from typing import Any, Iterable, Mapping

from .. import _native
from ..errors import LeverError

DEFAULT_ROWS = (1, 8, 16, 32, 64, 128)
DEFAULT_CONTEXTS = (128, 256, 512, 1024, 2048)

# The additive mask value of a column a row may not attend (0.0: attended).
MASKED = float(_native.BucketPlanner.MASKED)

_SIZE = re.compile(r"[0-9]+")


def _sizes(values: Iterable[Any], what: str, limit: int | None = None) -> tuple[int, ...]:
    """Positive ints (at most `limit`, when given), sorted and de-duplicated;
    LeverError naming `what` otherwise."""
    out = set()
    for v in values:
        try:
            n = operator.index(v)  # int or numpy integer, not float or str
        except TypeError:
            n = None
        if isinstance(v, bool) or n is None or n < 1:
            raise LeverError(f"{what} must be positive integers (tokens), got {v!r}")
        if limit is not None and n > limit:
            raise LeverError(f"{what} must be at most {limit:,} tokens, got {n:,}")
        out.add(n)
    if not out:
        raise LeverError(f"{what} are empty: give at least one size")
    return tuple(sorted(out))


def parse_buckets(text: str | Iterable[int], what: str = "bucket sizes", limit: int | None = None) -> tuple[int, ...]:
    """'1,8,16' -> (1, 8, 16): comma-separated positive integers (tokens), sorted
    and de-duplicated. A sequence of ints is checked the same way. LeverError for
    anything else (empty text, a non-integer, a size < 1 or, when given, > `limit`)."""
    if not isinstance(text, str):
        return _sizes(text, what, limit)
    if not text.strip():
        raise LeverError(f"no {what} given (example: 1,8,16,32)")
    parts = [p.strip() for p in text.split(",")]
    if parts and parts[-1] == "" and len(parts) > 1:
        parts.pop()  # a trailing comma
    for p in parts:
        if not _SIZE.fullmatch(p) or int(p) < 1:
            shown = "an empty entry" if p == "" else repr(p)
            raise LeverError(f"cannot read the {what} {text!r}: {shown} is not a positive integer "
                             f"(example: 1,8,16,32)")
    return _sizes((int(p) for p in parts), what, limit)


class BucketSet:
    """The row and context buckets a set of graphs is compiled for, and their planner.

    rows, contexts: tuples of tokens, ascending (given in any order, duplicates
    dropped); planner: the `_native.BucketPlanner` over them. LeverError for an
    empty list or a size < 1."""

    def __init__(self, rows: Iterable[int] = DEFAULT_ROWS, contexts: Iterable[int] = DEFAULT_CONTEXTS):
        self.rows = _sizes(rows, "row buckets")
        self.contexts = _sizes(contexts, "context buckets")
        self.planner = _native.BucketPlanner(list(self.rows), list(self.contexts))

    @classmethod
    def parse(cls, rows: str | None = None, contexts: str | None = None) -> "BucketSet":
        """From the --buckets / --contexts texts; None = the defaults."""
        return cls(DEFAULT_ROWS if rows is None else parse_buckets(rows, "row buckets"),
                   DEFAULT_CONTEXTS if contexts is None else parse_buckets(contexts, "context buckets"))

    @property
    def max_rows(self) -> int:
        return self.rows[-1]

    @property
    def max_context(self) -> int:
        return self.contexts[-1]

    def shapes(self) -> list[tuple[int, int]]:
        """Every (rows, context) bucket, rows-major ascending."""
        return [(r, c) for r in self.rows for c in self.contexts]

    def key(self) -> str:
        """'r1-8-16_c128-256': names the set (cache directories, profiles)."""
        return "r" + "-".join(map(str, self.rows)) + "_c" + "-".join(map(str, self.contexts))

    def to_json(self) -> dict:
        return {"rows": list(self.rows), "contexts": list(self.contexts)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "BucketSet":
        """Inverse of to_json; LeverError for a missing or bad field."""
        if not isinstance(d, Mapping) or "rows" not in d or "contexts" not in d:
            raise LeverError("a bucket set is a mapping with 'rows' and 'contexts' lists")
        if not isinstance(d["rows"], (list, tuple)) or not isinstance(d["contexts"], (list, tuple)):
            raise LeverError("a bucket set's 'rows' and 'contexts' must be lists of positive integers")
        return cls(d["rows"], d["contexts"])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BucketSet):
            return NotImplemented
        return self.rows == other.rows and self.contexts == other.contexts

    def __hash__(self) -> int:
        return hash((self.rows, self.contexts))

    def __repr__(self) -> str:
        return f"BucketSet(rows={self.rows}, contexts={self.contexts})"


__all__ = ["DEFAULT_ROWS", "DEFAULT_CONTEXTS", "MASKED", "BucketSet", "parse_buckets"]
