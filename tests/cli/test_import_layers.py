"""Layers that only point down: the imports between lever's modules form no
cycle (module by module, and between lever's subpackages and top-level
modules), and lever's own modules are imported inside functions only where
an allowlisted reason says why.

The graph is read from the source with `ast` (nothing is imported): every
`import` / `from ... import` of a lever module, at module level (under `if
TYPE_CHECKING:` too) and inside functions, relative imports resolved.  The
module graph (every module a node) must have no strongly-connected component
of more than one module: no allowlist exempts a cycle.  For the layer check,
nodes are collapsed to lever's subpackages and top-level modules
(lever.model, lever.store, lever.values, ...); `lever._native` (the C++
extension) is a leaf.  The layer order it enforces, bottom up, is in
docs/layout.md.
"""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from lever.values import DTYPE_NAMES, dtype_name

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "lever"
NATIVE = "lever._native"

# (importing module, imported module, reason): fnmatch patterns over dotted module names.
FUNCTION_LEVEL_ALLOWED = [
    ("lever", "lever.api",
     "lever.load / lever.generate import the API on first call: `import lever` stays light"),
    ("lever.cli", "lever.commands.*",
     "build_parser imports the subcommands only when a parser is built: `import lever.cli` stays fast"),
    ("lever.commands.*", "*",
     "a subcommand imports the layers it runs only when it runs, so building the parser stays fast"),
    ("lever.gguf.registry", "lever.gguf.assemble",
     "assemble (tqdm) is imported only when a model is looked up: `import lever.api` stays light "
     "(assemble imports the registry's entries from gguf.entry, never the registry)"),
    ("lever.memory.plan", "lever.model.native_loader",
     "native_loader imports the gguf package: only when a GGUF's head is sized"),
    ("lever.model.loading", "lever.model.native_loader",
     "native_loader imports the gguf package: only when a GGUF is loaded natively"),
    ("lever.reference.torch_model", "lever.reference.*",
     "gguf_loader, checkpoint_loader and linear import torch (the torch extra)"),
    ("lever.runtime", "lever.remote.client", "the HTTP clients (http.client, ssl) load only when a run verifies on a "
     "server: `import lever.api` stays light"),
    ("lever.runtime", "lever.remote.vllm_verifier", "as lever.remote.client: only when a run verifies on vLLM"),
    ("lever.runtime", "lever.remote.server",
     "the verifier server is an aiohttp application (the server extra): imported when one is made"),
    ("lever.mode_lever", "lever.gguf.assemble",
     "keeps tqdm out of `import lever.api`: only matching a registered model's file needs it"),
]


@dataclass(frozen=True)
class Import:
    importer: str          # dotted module name
    imported: str          # dotted module name (a lever module, or lever._native)
    file: str              # path relative to python/
    line: int
    in_function: bool

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def module_name(path: Path, root: Path) -> tuple[str, bool]:
    """(dotted name of the module at `path` under `root`, whether it is a package's __init__)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def lever_imports(package: Path) -> list[Import]:
    """Every import of a lever module in the .py files under `package` (a
    directory named after the top package), module level and in functions."""
    root = package.parent
    top = package.name
    files = sorted(package.rglob("*.py"))
    modules = {module_name(p, root)[0] for p in files} | {f"{top}._native"}
    found = []
    for path in files:
        name, is_package = module_name(path, root)
        tree = ast.parse(path.read_text(), filename=str(path))
        in_function = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                in_function.update(id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == top]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)] + ([node.module] if node.module else [])
                    base = ".".join(base)
                else:
                    base = node.module or ""
                if base.split(".")[0] == top:
                    # `from pkg import mod` imports the module pkg.mod; `from mod import name`, mod
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in dict.fromkeys(targets):
                found.append(Import(name, target, str(path.relative_to(root)), node.lineno, id(node) in in_function))
    return found


def layer(module: str) -> str:
    """The node of `module` in the layer graph: its subpackage or top-level module."""
    parts = module.split(".")
    return ".".join(parts[:2])


def layer_graph(imports: list[Import]) -> tuple[dict[str, set[str]], dict[tuple[str, str], list[Import]]]:
    """(layer -> layers it imports, (layer, layer) -> the imports making that edge)."""
    graph: dict[str, set[str]] = {}
    evidence: dict[tuple[str, str], list[Import]] = {}
    for imp in imports:
        a, b = layer(imp.importer), layer(imp.imported)
        graph.setdefault(a, set())
        graph.setdefault(b, set())
        if a != b:
            graph[a].add(b)
            evidence.setdefault((a, b), []).append(imp)
    return graph, evidence


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of `graph` as [a, b, ..., a] (each node importing the next), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {n: WHITE for n in graph}
    for start in sorted(graph):
        if color[start] != WHITE:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        color[start] = GREY
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                color[path.pop()] = BLACK
                stack.pop()
            elif color.get(nxt, WHITE) == GREY:
                return path[path.index(nxt):] + [nxt]
            elif color.get(nxt, WHITE) == WHITE:
                color[nxt] = GREY
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def module_graph(imports: list[Import]) -> tuple[dict[str, set[str]], dict[tuple[str, str], list[Import]]]:
    """(module -> modules it imports, (module, module) -> the imports making that
    edge), counting every import: module level, `if TYPE_CHECKING:`, in functions."""
    graph: dict[str, set[str]] = {}
    evidence: dict[tuple[str, str], list[Import]] = {}
    for imp in imports:
        graph.setdefault(imp.importer, set()).add(imp.imported)
        graph.setdefault(imp.imported, set())
        evidence.setdefault((imp.importer, imp.imported), []).append(imp)
    return graph, evidence


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`: its strongly-connected components of more
    than one node, and single nodes importing themselves (Tarjan, iterative),
    each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return sorted(found)


def describe_component(component: list[str], evidence) -> str:
    """The modules of one import cycle and the imports between them (file:line)."""
    members = set(component)
    lines = [" <-> ".join(component)]
    for (a, b), imps in sorted(evidence.items()):
        if a in members and b in members:
            lines += [f"  {i.where()}: {a} imports {b}" + (" (inside a function)" if i.in_function else "")
                      for i in imps]
    return "\n".join(lines)


def describe(cycle: list[str], evidence) -> str:
    lines = [" -> ".join(cycle)]
    for a, b in zip(cycle, cycle[1:]):
        shown = evidence.get((a, b), [])[:3]
        lines.append(f"  {a} -> {b}: " + ", ".join(f"{i.where()} imports {i.imported}" for i in shown))
    return "\n".join(lines)


def allowed(imp: Import, rules=FUNCTION_LEVEL_ALLOWED):
    """The allowlist rule a function-level import falls under, or None."""
    return next((r for r in rules if fnmatch.fnmatchcase(imp.importer, r[0])
                 and fnmatch.fnmatchcase(imp.imported, r[1])), None)


# ------------------------------------------------------------------------------------ the checks


def test_no_import_cycle_between_modules():
    """Every import counts (module level, TYPE_CHECKING, inside functions): no
    module reaches itself again; no allowlist applies."""
    imports = lever_imports(PACKAGE)
    graph, evidence = module_graph(imports)
    assert len(graph) > 100                                  # every module of the package
    cycles = strongly_connected(graph)
    assert not cycles, ("import cycles between lever's modules (move the shared part into a module both "
                        "import):\n" + "\n".join(describe_component(c, evidence) for c in cycles))


def test_no_import_cycle_between_layers():
    imports = lever_imports(PACKAGE)
    assert len(imports) > 100                                # the walk found the package
    graph, evidence = layer_graph(imports)
    assert NATIVE in graph and not graph[NATIVE]             # the extension is a leaf
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between lever's layers:\n" + describe(cycle, evidence)


def test_function_level_imports_of_lever_modules_are_allowlisted():
    imports = [i for i in lever_imports(PACKAGE) if i.in_function and i.imported != NATIVE]
    stray = [f"{i.where()}: {i.importer} imports {i.imported} inside a function" for i in imports if not allowed(i)]
    assert not stray, ("move these imports to module level (or allowlist them in FUNCTION_LEVEL_ALLOWED "
                       "with a reason):\n" + "\n".join(stray))
    used = {allowed(i) for i in imports}
    stale = [f"{r[0]} -> {r[1]}" for r in FUNCTION_LEVEL_ALLOWED if r not in used]
    assert not stale, "allowlist entries that match no function-level import any more: " + ", ".join(stale)


def test_every_allowlist_entry_has_a_one_line_reason():
    for importer, imported, reason in FUNCTION_LEVEL_ALLOWED:
        assert reason.strip() and "\n" not in reason, (importer, imported)


# ----------------------------------------------------------------------- the checks themselves


def test_find_cycle_finds_a_cycle_and_only_a_cycle():
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": set(), "e": {"a"}}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    assert all(b in graph[a] for a, b in zip(cycle, cycle[1:]))
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) is None
    assert find_cycle({}) is None


def test_the_collector_sees_a_cycle_made_inside_a_function(tmp_path):
    """Two subpackages of a synthetic package: one imports the other at module
    level (relative), the other imports back inside a function."""
    pkg = tmp_path / "lever"
    for d in ("low", "high"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "values.py").write_text("X = 1\n")
    (pkg / "high" / "a.py").write_text("from ..low import b\nfrom .. import _native\n")
    (pkg / "low" / "b.py").write_text("from lever.values import X\n\n\ndef f():\n    from ..high.a import g\n")
    imports = lever_imports(pkg)
    assert Import("lever.low.b", "lever.high.a", "lever/low/b.py", 5, True) in imports
    assert Import("lever.high.a", NATIVE, "lever/high/a.py", 2, False) in imports
    graph, evidence = layer_graph(imports)
    cycle = find_cycle(graph)
    assert cycle is not None and set(cycle) == {"lever.high", "lever.low"}
    assert "lever/low/b.py:5" in describe(cycle, evidence)
    assert not allowed(Import("lever.low.b", "lever.high.a", "lever/low/b.py", 5, True))
    (pkg / "low" / "b.py").write_text("from lever.values import X\n")
    assert find_cycle(layer_graph(lever_imports(pkg))[0]) is None


def test_strongly_connected_finds_every_cycle_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": {"g"}, "h": set()}
    assert strongly_connected(graph) == [["a", "b", "c"], ["d", "e"], ["g"]]
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []
    assert strongly_connected({}) == []
    chain = {str(i): {str(i + 1)} for i in range(5000)} | {"5000": {"0"}}      # deep: no recursion limit
    assert len(strongly_connected(chain)[0]) == 5001


def test_the_module_graph_sees_a_planted_cycle_inside_one_subpackage(tmp_path):
    """A cycle the layer graph cannot see (both modules in one subpackage),
    made of a TYPE_CHECKING import one way and a function-level import the
    other, is found; a third module importing into it is not part of it."""
    pkg = tmp_path / "lever"
    (pkg / "cost").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cost" / "__init__.py").write_text("")
    (pkg / "cost" / "measure.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .profile import Key\n")
    (pkg / "cost" / "profile.py").write_text("def key():\n    from lever.cost import measure\n")
    (pkg / "cost" / "quick.py").write_text("from . import measure\n")
    imports = lever_imports(pkg)
    assert find_cycle(layer_graph(imports)[0]) is None                 # one layer: invisible there
    graph, evidence = module_graph(imports)
    cycles = strongly_connected(graph)
    assert cycles == [["lever.cost.measure", "lever.cost.profile"]]
    text = describe_component(cycles[0], evidence)
    assert "lever/cost/measure.py:4" in text and "lever/cost/profile.py:2" in text and "inside a function" in text
    (pkg / "cost" / "profile.py").write_text("def key():\n    from lever.cost import timing\n")
    assert strongly_connected(module_graph(lever_imports(pkg))[0]) == []


# ------------------------------------------------------------------------------ lever.values


SPELLINGS = {"float32": "float32", "fp32": "float32", "f32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_dtype_name_accepts_every_spelling_in_any_case(spelling):
    for text in (spelling, spelling.upper(), spelling.capitalize()):
        assert dtype_name(text) == SPELLINGS[spelling]
    assert DTYPE_NAMES == SPELLINGS


def test_dtype_name_accepts_torch_dtypes_when_torch_is_imported():
    torch = pytest.importorskip("torch")
    assert dtype_name(torch.float32) == "float32" and dtype_name(torch.bfloat16) == "bfloat16"
    with pytest.raises(ValueError, match="unsupported compute dtype"):
        dtype_name(torch.float16)


@pytest.mark.parametrize("bad", ["float16", "fp16", "half", "", "bf", "float32 ", "int8", None, 3, 2.0,
                                 np.float32, np.dtype("float32"), b"bf16"])
def test_dtype_name_rejects_anything_else_in_one_line(bad):
    with pytest.raises(ValueError) as e:
        dtype_name(bad)
    message = str(e.value)
    assert "\n" not in message and repr(bad) in message and "float32 or bfloat16" in message


def test_dtype_name_never_imports_torch():
    code = ("import sys\nfrom lever.values import dtype_name\n"
            "try:\n    dtype_name(object())\nexcept ValueError:\n    pass\n"
            "assert dtype_name('BF16') == 'bfloat16'\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
