"""Figures. The only layer that imports matplotlib.

Every figure reads results only (tables in memory, or the files a results folder holds) and never
runs the simulator. Each ``NAME(..., path)`` writes one figure and returns the path written; its
``NAME_figure`` twin returns the matplotlib Figure so what was drawn can be inspected.
"""

from wispsim.plots.capacity import (
    attribution,
    attribution_figure,
    bursty_compare,
    bursty_compare_figure,
    capacity_bars,
    capacity_bars_figure,
    violation_curves,
    violation_curves_figure,
)
from wispsim.plots.figure import figure_path
from wispsim.plots.timeseries import compliance_figure, plot_timeseries

__all__ = [
    "attribution",
    "attribution_figure",
    "bursty_compare",
    "bursty_compare_figure",
    "capacity_bars",
    "capacity_bars_figure",
    "compliance_figure",
    "figure_path",
    "plot_timeseries",
    "violation_curves",
    "violation_curves_figure",
]
