"""Replay of recorded per-round logs: the log format, reading, driving the simulator, comparison."""
