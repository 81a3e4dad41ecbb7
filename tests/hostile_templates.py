"""Chat templates that try to exhaust whoever renders them, and GGUF copies
of a model carrying one (`with_chat_template`), for the template-budget
tests (tests/model/test_chat_template.py, tests/serve/test_serve_templates.py).

Each HOSTILE entry: (the template, a fragment of the error it must end in)."""

from __future__ import annotations

import struct
from pathlib import Path

HOSTILE = {
    # 10^10 empty iterations: only the time budget (the worker killed) stops it
    "nested_range_loop": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                          "did not finish rendering within"),
    # recursion without end: the call-depth cap (else a RecursionError)
    "infinite_recursion": ("{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}", "calls nest deeper"),
    # a 10 GB string in one multiplication: refused before it is made
    "huge_string_multiply": ("{% set s='a'*100000 %}{% set t=s*100000 %}", "10,000,000,000 items"),
    # 10 GB of output, 100 kB a step: the output cap
    "huge_output": ("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", "output is over the budget"),
    # doubling by `~` (no cap sees it): the worker's address-space limit
    "doubling_concat": ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}{{ ns.s|length }}", "memory budget"),
}


def with_chat_template(source: Path, target: Path, template: str) -> Path:
    """Write a copy of the GGUF `source` whose tokenizer.chat_template is
    `template`: the key-value entry is replaced and the header re-padded to
    the file's alignment, so the tensor data (and its relative offsets)
    follow unchanged."""
    import gguf
    reader = gguf.GGUFReader(str(source))
    field = reader.fields["tokenizer.chat_template"]
    start = field.offset
    end = start + sum(part.nbytes for part in field.parts)
    header_end = max(t.field.offset + sum(p.nbytes for p in t.field.parts) for t in reader.tensors)
    key, value = b"tokenizer.chat_template", template.encode()
    entry = (struct.pack("<Q", len(key)) + key + struct.pack("<I", gguf.GGUFValueType.STRING)
             + struct.pack("<Q", len(value)) + value)
    data = source.read_bytes()
    header = data[:start] + entry + data[end:header_end]
    header += b"\0" * (-len(header) % reader.alignment)
    target.write_bytes(header + data[reader.data_offset:])
    return target


_COPIES: dict[tuple[str, str], Path] = {}


def hostile_gguf(source: Path, name: str) -> Path:
    """A copy of the GGUF `source` carrying HOSTILE[name], made once per test
    process (the copies live in one temp directory, removed at exit)."""
    key = (str(source), name)
    if key not in _COPIES:
        import atexit
        import shutil
        import tempfile
        if not _COPIES:
            _COPIES[("", "")] = Path(tempfile.mkdtemp(prefix="lever-hostile-"))
            atexit.register(shutil.rmtree, _COPIES[("", "")], True)
        _COPIES[key] = with_chat_template(source, _COPIES[("", "")] / f"{name}.gguf", HOSTILE[name][0])
    return _COPIES[key]
