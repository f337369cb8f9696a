"""Figures. The only layer that imports matplotlib.

Every figure reads results only (tables in memory, or the files a results folder holds) and never
runs the simulator, so a figure can be redrawn from any results folder long after the run. Each
``NAME(..., path)`` writes one figure (PNG, or PDF/SVG when the path ends so; an existing folder
gets the default file name inside it) and returns the path written; its ``NAME_figure`` twin
returns the matplotlib Figure so what was drawn can be inspected. A missing folder or file, a
table without the columns a figure needs, a cell that is not a finite number, or an output path
that cannot be written, is a :class:`~wispsim.errors.WispsimError` whose one-line message names
the file.

Modules: ``figure`` (backend, DPI, saving), ``capacity`` (violation curves, capacity bars),
``bursts`` (compliance of bursty runs), ``attribution`` (violations by cause), ``timeseries`` (one
run over time), ``studies`` (the experiments' own figures), ``validation`` (real vs simulated),
``labels`` (class names and order).
"""

from wispsim.plots.attribution import attribution, attribution_figure
from wispsim.plots.bursts import bursty_compare, bursty_compare_figure
from wispsim.plots.capacity import (
    capacity_bars,
    capacity_bars_figure,
    violation_curves,
    violation_curves_figure,
)
from wispsim.plots.figure import figure_path
from wispsim.plots.public import public_speculative, public_tpot
from wispsim.plots.studies import (
    ablation_bars,
    ablation_bars_figure,
    acceptance_bars,
    acceptance_bars_figure,
)
from wispsim.plots.timeseries import compliance_figure, plot_timeseries
from wispsim.plots.validation import validation_figure, validation_plot

__all__ = [
    "ablation_bars",
    "ablation_bars_figure",
    "acceptance_bars",
    "acceptance_bars_figure",
    "attribution",
    "attribution_figure",
    "bursty_compare",
    "bursty_compare_figure",
    "capacity_bars",
    "capacity_bars_figure",
    "compliance_figure",
    "figure_path",
    "plot_timeseries",
    "public_speculative",
    "public_tpot",
    "validation_figure",
    "validation_plot",
    "violation_curves",
    "violation_curves_figure",
]
