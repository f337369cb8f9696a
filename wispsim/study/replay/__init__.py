"""Replay of recorded per-round logs: the log format, reading, driving the simulator, comparison."""

from wispsim.study.replay.log import compare, describe, log_scenario, meta_path, read_log, replay, write_log

__all__ = ["compare", "describe", "log_scenario", "meta_path", "read_log", "replay", "write_log"]
