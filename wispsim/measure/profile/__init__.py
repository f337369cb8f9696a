"""Latency profiles: the profiling plan, architectures, recording, fitting, deriving."""

from wispsim.measure.profile.fit import fit_command
from wispsim.measure.profile.record import record_profile

__all__ = ["fit_command", "record_profile"]
