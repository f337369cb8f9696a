"""The replay log format: one row per verification round, and a JSON sidecar (docs/replay.md).

A **replay log** records what every device of a speculative deployment did, round by round, in
Parquet or CSV (chosen by the file's suffix), with a sidecar ``LOG.meta.json``. :data:`COLUMNS` is
the format: the device-side columns (device, slo, response, round, response_start, prompt_tokens,
output_tokens, position, t_start, draft_s, up_s, t_arrival, down_s, t_end, drafted, accepted,
committed, measured) are required; the recorded server-side outcomes (queue_s, verify_s,
t_dispatch, batch, replica) may be missing or empty. Times are seconds from one common origin. The
sidecar holds the measurement ``window`` [start, end) (required) and, optionally, where the log
came from, the resolved scenario, and the responses that started but completed no round before
recording stopped (``unfinished``).

This module holds the format and :func:`write_log`, which writes the log of a simulated run
(``wispsim run --log``). Reading and checking a log is :mod:`~wispsim.study.replay.read`,
replaying it :mod:`~wispsim.study.replay.drive`, and comparing recorded with simulated outcomes
:mod:`~wispsim.study.replay.compare`.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from wispsim.errors import ConfigError

if TYPE_CHECKING:
    from wispsim.sim.records import SimResult

FORMAT = "wispsim replay log 1"
SUFFIXES = (".parquet", ".csv")


@dataclass(frozen=True, slots=True)
class Column:
    """One column of the log: ``kind`` is int, float, time (seconds, >= 0) or bool."""

    name: str
    kind: str
    unit: str
    meaning: str
    required: bool = True
    may_be_empty: bool = False


COLUMNS: tuple[Column, ...] = (
    Column("device", "int", "-", "device id"),
    Column("slo", "float", "tokens/s", "the device's SLO class: target token speed"),
    Column("response", "int", "-", "response id, unique in the log"),
    Column("round", "int", "-", "index of the round within its response: 0, 1, 2, ..."),
    Column("response_start", "time", "s", "when the user asked (t0; the response's speed counts from here)"),
    Column("prompt_tokens", "int", "tokens", "prompt length"),
    Column(
        "output_tokens",
        "int",
        "tokens",
        "output length; empty if the response was unfinished when recording stopped and is unknown",
        may_be_empty=True,
    ),
    Column("position", "int", "tokens", "output tokens committed before this round"),
    Column("t_start", "time", "s", "drafting of this round starts"),
    Column("draft_s", "time", "s", "drafting time of the round (forward passes and predictor calls)"),
    Column("up_s", "time", "s", "uplink transfer time (the first round also carries the prompt)"),
    Column("t_arrival", "time", "s", "the round arrives at the server"),
    Column("queue_s", "time", "s", "waiting in the server's queue", required=False, may_be_empty=True),
    Column("verify_s", "time", "s", "GPU time of the round's batch", required=False, may_be_empty=True),
    Column("t_dispatch", "time", "s", "the round's batch starts", required=False, may_be_empty=True),
    Column("batch", "int", "-", "id of the round's batch", required=False, may_be_empty=True),
    Column("replica", "int", "-", "verifier replica that ran the batch", required=False, may_be_empty=True),
    Column("down_s", "time", "s", "downlink transfer time of the verdict"),
    Column("t_end", "time", "s", "the verdict is back at the device"),
    Column("drafted", "int", "tokens", "draft tokens sent for verification (k >= 1)"),
    Column("accepted", "int", "tokens", "accepted draft tokens (L <= k)"),
    Column("committed", "int", "tokens", "tokens committed (L + 1, less if the response ended)"),
    Column("measured", "bool", "-", "the response started inside the measurement window"),
)
COLUMN_NAMES = tuple(c.name for c in COLUMNS)
REQUIRED = tuple(c.name for c in COLUMNS if c.required)
SERVER_SIDE = ("queue_s", "verify_s", "t_dispatch", "batch", "replica")
UNFINISHED_KEYS = (
    "device",
    "slo",
    "response",
    "response_start",
    "prompt_tokens",
    "output_tokens",
    "measured",
)


def meta_path(path: str | Path) -> Path:
    """The sidecar of log ``path``: ``LOG.meta.json``."""
    p = Path(path)
    return p.with_name(p.name + ".meta.json")


def log_frame(result: SimResult) -> pd.DataFrame:
    """The log of a speculative run: one row per completed round (columns :data:`COLUMN_NAMES`)."""
    r = result.rounds
    resp = result.responses.set_index("response")
    # a response still running, unmeasured, when the run ended has no response record: its start
    # is its first round's start and its prompt follows from that round's tokens
    first = r[r["round"] == 0].set_index("response")
    ids = r.response
    start = ids.map(resp.t_start).fillna(ids.map(first.t_start))
    prompt = ids.map(resp.prompt_len).fillna(ids.map(first.l_new + first.l_cached - first.k - first.position))
    b = result.batches
    replica_of = pd.Series(b.replica.to_numpy(), index=b.batch.to_numpy(), dtype="int64")
    out = pd.DataFrame(
        {
            "device": r.device,
            "slo": r.slo,
            "response": ids,
            "round": r["round"],
            "response_start": start,
            "prompt_tokens": prompt.astype("int64"),
            "output_tokens": ids.map(resp.output_len).astype("Int64"),
            "position": r.position,
            "t_start": r.t_start,
            "draft_s": r.draft_time,
            "up_s": r.uplink_time,
            "t_arrival": r.arrival,
            "queue_s": r.dispatch - r.arrival,
            "verify_s": r.verify_time,
            "t_dispatch": r.dispatch,
            "batch": r.batch,
            "replica": r.batch.map(replica_of).astype("Int64"),
            "down_s": r.downlink_time,
            "t_end": r.t_end,
            "drafted": r.k,
            "accepted": r.accepted,
            "committed": r.committed,
            "measured": r.measured,
        }
    )
    return out.reset_index(drop=True)


def _unfinished_responses(result: SimResult) -> list[dict[str, Any]]:
    """Responses recorded as censored that completed no round (so absent from the rounds)."""
    resp = result.responses
    gone = resp[~resp.response.isin(result.rounds.response)]
    return [
        {
            "device": int(x["device"]),
            "slo": float(x["slo"]),
            "response": int(x["response"]),
            "response_start": float(x["t_start"]),
            "prompt_tokens": int(x["prompt_len"]),
            "output_tokens": int(x["output_len"]),
            "measured": bool(x["measured"]),
        }
        for x in gone.to_dict("records")
    ]


def check_loggable(scenario: Any, path: str | Path) -> None:
    """A run whose per-round log ``replay`` can read: a speculative one (centralized serving has
    no verification rounds); a one-line error naming ``path`` otherwise, before any work."""
    if scenario.server.mode != "speculative":
        raise ConfigError(
            str(path),
            "",
            f"a {scenario.policy} run has no verification rounds; replay needs the log of a "
            "speculative run (wisp, sled, fcfs, wisp-fixed)",
        )


def write_log(result: SimResult, path: str | Path) -> Path:
    """Write the per-round log of ``result`` to ``path`` (.parquet or .csv) and its sidecar."""
    from wispsim.version import __version__

    p = Path(path)
    if p.suffix.lower() not in SUFFIXES:
        raise ConfigError(str(p), "", f"unknown log format {p.suffix!r}; name it .parquet or .csv")
    sc = result.scenario
    check_loggable(sc, p)
    df = log_frame(result)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix.lower() == ".csv":
        df.to_csv(p, index=False, float_format="%.17g")
    else:
        df.to_parquet(p, index=False)
    meta = {
        "format": FORMAT,
        "source": "wispsim run",
        "policy": sc.policy,
        "seed": result.seed,
        "scenario_name": sc.name,
        "window": list(result.window),
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "wispsim_version": __version__,
        "devices": result.devices,
        "sim_end": result.sim_end,
        "unfinished": _unfinished_responses(result),
        "scenario": sc.to_dict(),
    }
    meta_path(p).write_text(json.dumps(meta, indent=1))
    return p
