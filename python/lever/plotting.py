"""Charts need matplotlib, which is not a dependency of Lever but its `plot`
extra (`pip install 'matplotlib>=3.5'`: lever.extras): a phone or a server image runs
without it. Only code that draws a chart asks for it, through `pyplot`, so
nothing else ever imports matplotlib.

A chart the user asked for (`lever profile --plot PATH`) calls
`require_matplotlib` before the work starts, so a missing extra is one
`lever: error:` line at once; a chart a command draws by default (`lever
bench`'s PNG, `lever probe train`'s report.png) is skipped with the same line
as a note (`PlotUnavailableError`'s message).
"""

from __future__ import annotations

from .errors import LeverError
from .extras import install_hint

PLOT_INSTALL = install_hint("plot")


class PlotUnavailableError(LeverError):
    """matplotlib cannot be imported; the message names what needed it and the extra to install."""


def _import(what: str):
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailableError(f"{what} needs matplotlib: {PLOT_INSTALL}") from None
    return matplotlib


def require_matplotlib(what: str) -> None:
    """PlotUnavailableError (one line: `what` needs matplotlib, and the pip command)
    unless matplotlib can be imported."""
    _import(what)


def pyplot(what: str):
    """matplotlib.pyplot on the Agg backend (PNG files, no display); `what`
    (e.g. "lever bench's chart") names the chart in the PlotUnavailableError
    raised when matplotlib is not installed."""
    matplotlib = _import(what)
    matplotlib.use("Agg")
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:          # an installation missing one of matplotlib's own dependencies
        raise PlotUnavailableError(f"{what} needs a working matplotlib ({e}): {PLOT_INSTALL}") from None
    return plt
