"""Recording and inspecting acceptance traces from real model pairs."""

from wispsim.measure.trace.inspect import format_report, inspect_trace, plot_report, window_lengths
from wispsim.measure.trace.record import record_trace

__all__ = ["format_report", "inspect_trace", "plot_report", "record_trace", "window_lengths"]
