"""matplotlib is the `plot` extra, not a dependency: imported only to draw a
chart, and when it is missing the command says in one line what to install
(`lever profile --plot` refuses before measuring; the charts `lever bench`
and `lever probe train` draw by default are skipped with that line)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:                           # Python < 3.11
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomllib (3.11) or tomli")

from lever.cli import main
from lever.errors import LeverError
from lever.plotting import PLOT_INSTALL, PlotUnavailableError, pyplot, require_matplotlib

ROOT = Path(__file__).resolve().parents[2]
HINT = "pip install 'matplotlib>=3.5' (lever-llm's plot extra)"


@pytest.fixture
def no_matplotlib(monkeypatch):
    """`import matplotlib` fails, as where the extra is not installed (even if it was imported already)."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError):
        import matplotlib  # noqa: F401


def test_the_plot_extra_holds_matplotlib_and_the_tests_install_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("matplotlib")]
    extras = project["optional-dependencies"]
    assert [d for d in extras["plot"] if d.startswith("matplotlib")]
    assert "lever-llm[plot]" in extras["test"] and "lever-llm[plot]" in extras["bench"]
    assert PLOT_INSTALL == HINT


def test_a_missing_matplotlib_is_one_line_naming_the_extra(no_matplotlib):
    for call in (lambda: pyplot("lever bench's chart"), lambda: require_matplotlib("lever bench's chart")):
        with pytest.raises(PlotUnavailableError) as e:
            call()
        assert isinstance(e.value, LeverError)
        assert str(e.value) == f"lever bench's chart needs matplotlib: {HINT}"


def chart_calls(tmp_path):
    from lever.commands.bench_plot import plot, plot_capped
    from lever.cost.plot import plot_cost_model
    from lever.probe.plot import plot_probe_report
    png = tmp_path / "x.png"
    return {"bench": lambda: plot({}, png), "bench --memory-cap": lambda: plot_capped({}, png),
            "profile --plot": lambda: plot_cost_model(None, png),
            "probe train": lambda: plot_probe_report({}, png)}


@pytest.mark.parametrize("chart", ["bench", "bench --memory-cap", "profile --plot", "probe train"])
def test_every_chart_asks_for_the_extra(chart, tmp_path, no_matplotlib):
    with pytest.raises(PlotUnavailableError, match=r"needs matplotlib: pip install 'matplotlib>=3\.5' "
                                                   r"\(lever-llm's plot extra\)$"):
        chart_calls(tmp_path)[chart]()


def test_bench_writes_its_json_and_says_what_to_install(tmp_path, no_matplotlib, capsys):
    from lever.commands.bench_plot import plot
    from lever.commands.bench_report import write_outputs
    write_outputs({"modes": {}}, tmp_path, "bench", plot)
    out = capsys.readouterr().out
    assert json.loads((tmp_path / "bench.json").read_text()) == {"modes": {}}
    assert not (tmp_path / "bench.png").exists()
    assert f"# PNG skipped: lever bench's chart needs matplotlib: {HINT}\n" in out


def test_profile_plot_is_refused_before_anything_is_measured(tmp_path, no_matplotlib, capsys, monkeypatch):
    import lever.runtime
    def never(*a, **k):
        raise AssertionError("the profile started before the missing matplotlib was reported")
    monkeypatch.setattr(lever.runtime, "build", never)
    assert main(["profile", "--draft", "some-draft", "--plot", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert err == f"lever: error: lever profile --plot needs matplotlib: {HINT}\n"


def test_commands_do_not_import_matplotlib_unless_they_draw():
    code = ("import sys\n"
            "from lever.cli import build_parser\n"
            "import lever.commands.bench, lever.commands.bench_report, lever.commands.bench_plot\n"
            "import lever.commands.profile, lever.commands.probe, lever.cost.plot, lever.probe.plot\n"
            "build_parser()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
