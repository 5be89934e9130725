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
