"""manifest.json as JSON: strict parsing into typed values, and its checksum.

Every field is read with its exact JSON type (an integer field refuses
"4096", 4096.0 and true); a missing, extra or mistyped field is a
`StoreError` naming it ("extents[3].offset").  The checksum
(`manifest_sha256`) is the SHA-256 of the canonical JSON of every other
field: keys sorted, no spaces, ASCII only.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import StoreError

CHECKSUM_FIELD = "manifest_sha256"
MAX_DEPTH = 8                      # nesting of a valid manifest: 5 (extents[].tensors[].shape[])
_MAX_INT = (1 << 63) - 1


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(text: bytes, path: Path) -> dict:
    """The manifest's top-level object; StoreError for anything but strict JSON
    (NaN and Infinity are refused) nested at most MAX_DEPTH deep."""
    try:
        raw = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise StoreError(f"{path}: malformed manifest (not valid JSON: {str(e)[:200]}); "
                         f"re-run `lever convert`") from None
    if not isinstance(raw, dict):
        raise StoreError(f"{path}: malformed manifest (the top level is not an object)")
    if _depth(raw) > MAX_DEPTH:
        raise StoreError(f"{path}: malformed manifest (nested more than {MAX_DEPTH} levels deep)")
    return raw


def _depth(value, level: int = 1) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level)
    return level - 1


def digest(raw: dict) -> str:
    """SHA-256 (hex) of the canonical JSON of `raw` without its checksum field."""
    body = {k: v for k, v in raw.items() if k != CHECKSUM_FIELD}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


class Fields:
    """Typed reads of one JSON object at `where` ("extents[3]") of manifest `path`."""

    def __init__(self, obj, where: str, path: Path):
        self.path, self.where = path, where
        if type(obj) is not dict:
            self.fail(f"must be an object, got {_show(obj)}")
        self.obj = obj

    def fail(self, problem: str, key: str | None = None):
        field = f"{self.where}.{key}" if key and self.where else (key or self.where)
        raise StoreError(f"{self.path}: malformed manifest: {field} {problem}; re-run `lever convert`")

    def only(self, *keys: str) -> None:
        """No keys but these may be present."""
        extra = sorted(set(self.obj) - set(keys))
        if extra:
            self.fail("is not a field of this format", extra[0])

    def get(self, key: str):
        if key not in self.obj:
            self.fail("is missing", key)
        return self.obj[key]

    def int(self, key: str, low: int = 0, high: int = _MAX_INT) -> int:
        v = self.get(key)
        if type(v) is not int:
            self.fail(f"must be an integer, got {_show(v)}", key)
        if not low <= v <= high:
            self.fail(f"{v} is outside {low}..{high}", key)
        return v

    def str(self, key: str) -> str:
        v = self.get(key)
        if type(v) is not str:
            self.fail(f"must be a string, got {_show(v)}", key)
        return v

    def list(self, key: str) -> list:
        v = self.get(key)
        if type(v) is not list:
            self.fail(f"must be a list, got {_show(v)}", key)
        return v

    def ints(self, key: str, low: int = 0, high: int = _MAX_INT) -> tuple[int, ...]:
        """A list of integers, each in low..high."""
        items = self.list(key)
        for i, v in enumerate(items):
            if type(v) is not int or not low <= v <= high:
                self.fail(f"must hold integers in {low}..{high}, item {i} is {_show(v)}", key)
        return tuple(items)

    def sub(self, key: str) -> "Fields":
        return Fields(self.get(key), f"{self.where}.{key}" if self.where else key, self.path)


def _show(v) -> str:
    text = json.dumps(v) if not isinstance(v, (dict, list)) else type(v).__name__
    return text[:40]
