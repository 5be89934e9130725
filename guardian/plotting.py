"""matplotlib for the ``--plot`` options, headless, and a clear error where it is not installed."""

from __future__ import annotations

from typing import Any

INSTALL = "--plot needs matplotlib: pip install 'vllm-guardian[plot]'"


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
