"""Recording and inspecting acceptance traces from real model pairs."""

from wispsim.measure.trace.inspect import format_report, inspect_trace, window_lengths
from wispsim.measure.trace.record import record_trace
from wispsim.measure.trace.vllm_record import record_trace_vllm

__all__ = [
    "format_report",
    "inspect_trace",
    "record_trace",
    "record_trace_vllm",
    "window_lengths",
]
