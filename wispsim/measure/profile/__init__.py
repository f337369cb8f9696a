"""Latency profiles: the profiling plan, architectures, recording, fitting, reporting, deriving."""

from wispsim.measure.profile.fit_report import fit_command
from wispsim.measure.profile.record import record_profile

__all__ = ["fit_command", "record_profile"]
