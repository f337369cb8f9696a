"""Replay of recorded per-round logs (docs/replay.md): the log format (``log``), reading and
checking a log (``read``), driving the simulator with it (``drive``), and comparing recorded with
simulated outcomes (``compare``)."""

from wispsim.study.replay.compare import compare, describe
from wispsim.study.replay.drive import log_scenario, replay
from wispsim.study.replay.log import check_loggable, meta_path, write_log
from wispsim.study.replay.read import read_log

__all__ = [
    "check_loggable", "compare", "describe", "log_scenario", "meta_path", "read_log", "replay", "write_log",
]  # fmt: skip
