"""Latency profiles: the profiling plan, architectures, recording, fitting, deriving."""
