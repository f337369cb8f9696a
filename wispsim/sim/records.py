"""Flat records: one per completed round, batch and response.

These named tuples are the simulator's only output and also the Parquet schema; every summary is
computed from them (:mod:`wispsim.analysis.metrics`). Times are simulated seconds.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from wispsim.config import Scenario


class RoundRecord(NamedTuple):
    """One completed verification round: the device side and what the server did with it."""

    device: int
    slo: float  # the device's class: target tokens/s
    response: int  # global response id
    round: int  # index within the response
    position: int  # committed output tokens before the round
    t_start: float  # drafting starts
    tau_d: float  # the device's seconds per draft forward pass
    draft_time: float
    forward_passes: int
    predictor_calls: int
    k: int  # tokens sent for verification
    accepted: int  # L
    committed: int  # L + 1 (less on the last round if the response ends)
    uplink_time: float
    arrival: float  # at the server
    budget: float  # tau_c: server-side budget of the round
    deadline: float
    n_hat: float
    dispatch: float
    verify_time: float
    batch: int
    l_new: int
    l_cached: int
    cold: bool
    downlink_time: float
    t_end: float  # verdict back at the device
    measured: bool  # the round belongs to a measured response

    @property
    def queue_time(self) -> float:
        return self.dispatch - self.arrival


class BatchRecord(NamedTuple):
    """One batch a replica ran: a verification batch, or a step of the centralized engine."""

    batch: int
    replica: int
    kind: str  # "verify" | "step" (centralized)
    t_dispatch: float
    t_end: float
    size: int
    queue_len: int  # requests waiting when the batch was formed (incl. the batch)
    n_linear: int
    n_interactions: int
    n_cached: int
    t_hat: float  # the estimator's latency
    latency: float  # the simulated "true" latency
    blocks_used: int  # KV blocks held after allocation
    evictions: int


class ResponseRecord(NamedTuple):
    """One response: finished, or censored when the run decided it could not meet its SLO."""

    device: int
    slo: float
    response: int
    t_start: float
    t_end: float
    prompt_len: int
    output_len: int
    rounds: int
    cold_rounds: int
    speed: float  # output tokens / wall time (an upper bound if censored)
    violated: bool
    measured: bool  # started inside the measurement window
    censored: bool  # unfinished when it could no longer meet its SLO and the run ended


_DTYPES = {int: "int64", float: "float64", bool: "bool", str: "object"}


def frame(records: list[typing.Any], cls: typing.Any) -> pd.DataFrame:
    """A DataFrame with the record type's columns and dtypes.

    ``records`` are tuples in the field order of ``cls`` (the simulator appends plain tuples on
    its hot path; the named tuple class is the schema).
    """
    hints = typing.get_type_hints(cls)
    fields = cls._fields
    columns = list(zip(*records, strict=True)) if records else [()] * len(fields)
    return pd.DataFrame(
        {f: np.array(col, dtype=_DTYPES[hints[f]]) for f, col in zip(fields, columns, strict=True)}
    )


@dataclass
class SimResult:
    """Records of one run, with what produced them."""

    scenario: Scenario
    seed: int
    devices: int
    rounds: pd.DataFrame
    batches: pd.DataFrame
    responses: pd.DataFrame
    window: tuple[float, float]
    sim_end: float
    wall_s: float
    kv_blocks: int
    info: dict[str, Any] = field(default_factory=dict)
    block_size: int = 16  # tokens per KV block (server.block_size, or the profile's engine's)
