"""The chat-template worker: a child process that renders Jinja chat templates
under a budget (lever.model.chat_template starts, feeds and kills it).

A model's chat template is code from the model file, and the conversation
comes from a client, so rendering is untrusted work.  It runs here, in
Jinja's immutable sandbox with caps on top (`BudgetedSandbox`):

- `range` of more than `range_items` items, a string / list / tuple over
  `sequence_items` items made by `*` or `+`, an integer over `int_bits`
  bits made by `*` or `**`, calls nested deeper than `call_depth` (a macro
  that recurses without end), and rendered text over `output_chars`
  characters each stop the render with a `BudgetExceeded` naming the cap;
- the process's address space is capped (RLIMIT_AS, `memory_bytes` over
  what it has once started), so what the caps do not see (`~` doubling a
  string, a huge `format` width) ends in a MemoryError here;
- the parent kills the process when a render outlives its time budget (a
  loop of 10^10 steps), which no in-process limit could do to a thread.

Protocol, one JSON object per line: the parent writes {"template",
"variables", "budget"}; the worker answers {"text"} or {"error", "kind"}
(kind: compile, render, budget, memory, recursion).  It writes
{"ready": true} once started, and exits at the end of its input or after
`idle_seconds` without a request (a worker costs about 20 MB of RSS; an
idle one does not stay beside the model).  It
imports only the standard library and jinja2, so it starts quickly.
"""

from __future__ import annotations

import json
import math
import select
import sys
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class BudgetExceeded(Exception):
    """A render went over one of its caps (the message names it)."""


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own `tojson` HTML-escapes; chat templates expect plain JSON (as in HF).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _size(value) -> int | None:
    """Items of a str / list / tuple (None for anything else)."""
    return len(value) if isinstance(value, (str, list, tuple)) else None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class BudgetedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with the caps of one render (`budget`, a dict
    of the TemplateBudget fields; see the module doc).  Chat-template
    conventions as Hugging Face's: trim_blocks, lstrip_blocks, loop controls,
    plain-JSON `tojson`, `raise_exception`, `strftime_now`."""

    intercepted_binops = frozenset({"*", "+", "**"})

    def __init__(self, budget: dict):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        self.budget = budget
        self.depth = 0
        self.filters["tojson"] = _tojson
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.globals["range"] = self._range

    def _range(self, *args):
        items = range(*args)
        if len(items) > self.budget["range_items"]:
            raise BudgetExceeded(f"range() of {len(items):,} items is over the budget of "
                                 f"{self.budget['range_items']:,}")
        return items

    def call_binop(self, context, operator, left, right):
        self._check_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def _check_binop(self, operator: str, left, right) -> None:
        """Refuse, before it is computed, a `*` / `+` / `**` whose result is over the caps."""
        cap, bits = self.budget["sequence_items"], self.budget["int_bits"]
        sizes = _size(left), _size(right)
        items = None
        if operator == "*" and sizes[0] is not None and _is_int(right):
            items = sizes[0] * max(right, 0)
        elif operator == "*" and sizes[1] is not None and _is_int(left):
            items = sizes[1] * max(left, 0)
        elif operator == "+" and None not in sizes:
            items = sizes[0] + sizes[1]
        if items is not None and items > cap:
            raise BudgetExceeded(f"a value of {items:,} items (made by {operator!r}) is over the budget of {cap:,}")
        if _is_int(left) and _is_int(right):
            if operator == "*":
                need = left.bit_length() + right.bit_length()
            elif operator == "**" and abs(left) > 1:
                need = int(max(right, 0) * math.log2(abs(left))) + 1
            else:
                need = 0
            if need > bits:
                raise BudgetExceeded(f"an integer of about {need:,} bits (made by {operator!r}) is over the "
                                     f"budget of {bits:,}")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 -- Jinja's signature
        if __self.depth >= __self.budget["call_depth"]:
            raise BudgetExceeded(f"calls nest deeper than the budget of {__self.budget['call_depth']} "
                                 f"(a macro that recurses without end?)")
        __self.depth += 1
        try:
            return super().call(__context, __obj, *args, **kwargs)
        finally:
            __self.depth -= 1


@lru_cache(maxsize=16)
def compiled(source: str, budget_key: str):
    """`source` compiled in a BudgetedSandbox of the budget `budget_key` (its JSON)."""
    return BudgetedSandbox(json.loads(budget_key)).from_string(source)


def render(source: str, variables: dict, budget: dict) -> dict:
    """The answer to one request: {"text"} or {"error", "kind"}."""
    try:
        template = compiled(source, json.dumps(budget, sort_keys=True))
    except jinja2.TemplateError as e:
        return {"error": f"does not compile: {e}", "kind": "compile"}
    except RecursionError:
        return {"error": "does not compile: it nests too deeply", "kind": "recursion"}
    except MemoryError:
        return {"error": f"does not compile within the memory budget of {budget['memory_bytes']:,} bytes",
                "kind": "memory"}
    template.environment.depth = 0
    pieces, chars = [], 0
    try:
        for piece in template.generate(**variables):
            chars += len(piece)
            if chars > budget["output_chars"]:
                raise BudgetExceeded(f"its output is over the budget of {budget['output_chars']:,} characters")
            pieces.append(piece)
        return {"text": "".join(pieces)}
    except BudgetExceeded as e:
        return {"error": f"went over its budget: {e}", "kind": "budget"}
    except MemoryError:
        return {"error": f"went over its memory budget of {budget['memory_bytes']:,} bytes", "kind": "memory"}
    except RecursionError:
        return {"error": "recursed too deeply", "kind": "recursion"}
    except jinja2.TemplateError as e:
        return {"error": f"failed on this conversation: {e}", "kind": "render"}
    except Exception as e:  # noqa: BLE001 -- the template's own error (a TypeError, ...): reported, not fatal
        return {"error": f"failed on this conversation: {type(e).__name__}: {e}", "kind": "render"}


def cap_memory(extra_bytes: int) -> None:
    """Cap this process's address space at what it maps now plus `extra_bytes`
    (Linux; elsewhere the time budget alone bounds a render)."""
    try:
        import resource
        with open("/proc/self/status", encoding="ascii") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (size + extra_bytes, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except (ImportError, OSError, ValueError, StopIteration):
        pass


def requests(idle_seconds: float):
    """The lines of stdin, one request at a time, until its end or until
    none comes for `idle_seconds` (the parent sends one request and reads
    its answer before the next, so nothing waits in stdin's buffer)."""
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], idle_seconds)
        if not ready:
            return
        line = sys.stdin.readline()
        if not line:
            return
        yield line


def main(argv: list[str]) -> int:
    """Serve render requests on stdin/stdout; argv[0]: the memory budget in
    bytes, argv[1]: seconds without a request after which the worker exits."""
    cap_memory(int(argv[0]))
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in requests(float(argv[1])):
        try:
            request = json.loads(line)
            answer = render(request["template"], request["variables"], request["budget"])
        except MemoryError:
            answer = {"error": "went over its memory budget", "kind": "memory"}
        except (ValueError, KeyError, TypeError) as e:
            answer = {"error": f"the worker got a bad request ({type(e).__name__})", "kind": "render"}
        try:
            text = json.dumps(answer)
        except MemoryError:
            text = json.dumps({"error": "went over its memory budget", "kind": "memory"})
        out.write(text + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
