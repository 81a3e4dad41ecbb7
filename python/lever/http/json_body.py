"""JSON request bodies as both of Lever's servers read them: parsed, and every
string in them (field names too) checked to be valid Unicode text.

JSON can carry text that is not Unicode: an unpaired UTF-16 surrogate
written as an escape (``"\\ud800"``), or raw bytes that are not UTF-8 (an
encoded surrogate such as ``ED A0 80``, an overlong form such as ``C0 AF``,
a stray ``FF``).  Python's decoder lets the escapes (and, from bytes,
encoded surrogates) through as lone surrogates, which later break whatever
expects text -- the tokenizer, above all.  `parse_json` therefore turns
bytes that are not UTF-8 into lone surrogates as well (``surrogateescape``)
instead of refusing the whole body, and `invalid_text` finds the first
string holding one, by its place in the body, so that the server's 400 can
name the field.  NUL characters are valid text and pass.
"""

from __future__ import annotations

import json

SHOWN_PATH_CHARS = 80           # characters of a field's path quoted in a message


def parse_json(raw: bytes):
    """The JSON value of `raw` (UTF-8, or UTF-16/32 as RFC 8259 detects it;
    a UTF-8 byte-order mark is skipped).  Bytes that do not decode become
    lone surrogates inside their string (see `invalid_text`).  Raises
    ValueError for text that is not JSON (UnicodeDecodeError included) and
    RecursionError for absurdly deep nesting."""
    encoding = json.detect_encoding(raw)
    errors = "surrogateescape" if encoding.startswith("utf-8") else "surrogatepass"
    return json.loads(raw.decode(encoding, errors))


def _bad_char(text: str) -> int | None:
    """The index of the first lone surrogate in `text`, else None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _describe(text: str, at: int) -> str:
    code = ord(text[at])
    what = (f"a byte 0x{code - 0xDC00:02X} that is not UTF-8 (or an unpaired \\u{code:04x} escape)"
            if 0xDC80 <= code <= 0xDCFF else f"an unpaired UTF-16 surrogate U+{code:04X}")
    return f"is not valid Unicode text: {what} at character {at} (send UTF-8, and escapes only in pairs)"


def join_path(parent: str, key) -> str:
    """`parent`'s member `key`: "a.b" for an object's field, "a[3]" for a list item."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def invalid_text(value, path: str = "") -> tuple[str, str] | None:
    """The first string in the decoded JSON `value` that is not valid
    Unicode text, as (its path, e.g. "messages[0].content" -- for a field
    name, the object holding it -- and a reason that reads after the path),
    or None when all are valid.  Iterative: any depth json.loads accepts."""
    stack = [(path, None, value)]              # (the parent's path, the key in it, the value)
    while stack:
        parent, key, item = stack.pop()
        if isinstance(item, str):
            at = _bad_char(item)
            if at is not None:
                return _where(parent, key) or "(the body)", _describe(item, at)
        elif isinstance(item, dict):
            where = _where(parent, key)
            for name in item:
                at = _bad_char(name)
                if at is not None:
                    return where or "(the body)", "has a field name that " + _describe(name, at)
            stack.extend((where, name, child) for name, child in reversed(item.items())
                         if isinstance(child, (str, dict, list)))
        elif isinstance(item, list):
            where = _where(parent, key)
            stack.extend((where, i, child) for i, child in reversed(list(enumerate(item)))
                         if isinstance(child, (str, dict, list)))
    return None


def _where(parent: str, key) -> str:
    return parent if key is None else join_path(parent, key)


def shown_path(path: str) -> str:
    """`path` cut to SHOWN_PATH_CHARS characters for a message."""
    return path if len(path) <= SHOWN_PATH_CHARS else path[:SHOWN_PATH_CHARS] + "..."
