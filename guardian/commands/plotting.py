"""matplotlib for the ``--plot`` options, headless, and a clear error where it is not installed."""

from __future__ import annotations

from typing import Any

INSTALL = "--plot needs matplotlib: pip install matplotlib into guardian's environment (in a checkout: pip install -e '.[plot]')"


class PlotUnavailable(RuntimeError):
    pass


def pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: a GPU host has no display
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(INSTALL) from None
    return plt


def check() -> None:
    """Raise PlotUnavailable now, before a command spends minutes on work whose plot it then could not draw."""
    pyplot()


def plain_log_axis(axis: Any) -> None:
    """A log scale's ticks as plain numbers (200, not 2x10^2), minor ticks unlabelled."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    axis.set_major_formatter(ScalarFormatter())
    axis.set_minor_formatter(NullFormatter())
