"""The recorder of one run: its measurement window, its record tables, and its watchdog.

Every round, batch and response record of a run is made here, from named structures: a round
record is the device's side of the round (:class:`DeviceRound`, which a device fills) and the
:class:`~wispsim.sim.verifier.Request` as the server finished it (:meth:`Recorder.record_round`);
a response record from what :meth:`Recorder.finish_response` is told; batch records are appended by
the servers to :attr:`Recorder.batches`. Simulated devices, replayed ones
(:mod:`wispsim.study.replay.drive`) and the real swarm's all write through it, so their records
are the same. The watchdog ends the run once every measured response is decided, recording the
undecided ones as censored (the window: :mod:`wispsim.sim.simulation`).

A run stopped early (:meth:`Recorder.complete_until`, :meth:`Recorder.decided_before`,
:meth:`Recorder.cut`) ends as if its window had closed at the cut: every response that started
before it is decided by then, so it measures the responses the run with the shorter window
measures, each with the same verdict. (One that run would have censored past its SLO may have
finished here, late: violated either way.)
"""

from __future__ import annotations

import math
import struct
from collections.abc import Generator
from itertools import count
from typing import TYPE_CHECKING, Any

import pandas as pd
import simpy

from wispsim.config import Scenario
from wispsim.sim.records import (
    MEMORY_ROWS,
    BatchRecord,
    RecordTable,
    ResponseRecord,
    RoundRecord,
    StoredRecords,
)

if TYPE_CHECKING:
    from wispsim.sim.verifier import Request


# the fields of DeviceRound (its slots)
DEVICE_ROUND_FIELDS = (
    "accepted",
    "budget",
    "committed",
    "device",
    "downlink_time",
    "draft_time",
    "forward_passes",
    "measured",
    "position",
    "predictor_calls",
    "round",
    "slo",
    "t_end",
    "t_start",
    "tau_d",
    "uplink_time",
)


class DeviceRound:
    """The device's side of one round: the fields of a
    :class:`~wispsim.sim.records.RoundRecord` (same names) that the server does not fill.

    A device keeps one and refills it round after round, then hands it with the round's
    :class:`~wispsim.sim.verifier.Request` to :meth:`RunContext.record_round`, which packs the
    record at once and keeps neither: the hot path allocates nothing for it. ``device``, ``slo``
    and (per device) ``tau_d`` are set once, ``measured`` once per response."""

    __slots__ = DEVICE_ROUND_FIELDS

    device: int
    slo: float  # the device's class: target tokens/s
    round: int  # index within the response
    position: int  # committed output tokens before the round
    t_start: float  # drafting starts
    tau_d: float  # seconds per draft forward pass
    draft_time: float
    forward_passes: int  # -1: unknown (a replayed log)
    predictor_calls: int  # -1: unknown
    accepted: int
    committed: int
    uplink_time: float
    budget: float  # the round's server-side budget (tau_c)
    downlink_time: float
    t_end: float  # the verdict is back at the device
    measured: bool  # the round's response is measured

    def __init__(self, device: int, slo: float, tau_d: float = 0.0) -> None:
        self.device = device
        self.slo = slo
        self.tau_d = tau_d
        self.measured = False
        self.round = self.position = self.forward_passes = self.predictor_calls = 0
        self.accepted = self.committed = 0
        self.t_start = self.draft_time = self.uplink_time = self.budget = 0.0
        self.downlink_time = self.t_end = 0.0


class Recorder:
    """One run's window, record tables and watchdog (module text)."""

    def __init__(self, env: simpy.Environment, scenario: Scenario, memory_rows: int = MEMORY_ROWS) -> None:
        self.env = env
        self.window = scenario.workload.window()
        # how long after the window measured responses may run (a request trace's longest
        # response can be longer than the workload's: simulate sets it from the trace then)
        self.drain_s = scenario.drain_limit_s()
        # records in the field order of RoundRecord, BatchRecord, ResponseRecord (see RecordTable)
        self.rounds = RecordTable(RoundRecord, memory_rows)
        self.batches = RecordTable(BatchRecord, memory_rows)
        self.responses = RecordTable(ResponseRecord, memory_rows)
        # the open chunk of packed round rows: record_round extends it (see RecordTable)
        assert self.rounds.pack is not None  # round records are numbers and flags only
        self._round_buf = self.rounds.buf
        self._pack_round = self.rounds.pack
        self._chunk_bytes = self.rounds.chunk_bytes
        self._response_ids = count()
        # measured responses not yet decided: id -> (t0, SLO deadline, device, slo, prompt, output)
        self.outstanding: dict[int, tuple[float, float, int, float, int, int]] = {}
        self._measured: set[int] = set()
        # when the first token of an undecided measured response reached its device (first_token)
        self._first: dict[int, float] = {}
        # a response's times at the server, until it is recorded (server_times)
        self._times: dict[int, tuple[float, float, float]] = {}
        # measured responses decided so far: (start, device, SLO, violated), in decision order
        self.decided: list[tuple[float, int, float, bool]] = []
        self._cut: float | None = None  # the window's end moved here (cut)
        # a centralized engine's chunk times by response id, where a run keeps them (a benchmark:
        # vLLM's ITL is every gap between a request's chunks); None: not kept
        self.chunk_times: dict[int, list[float]] | None = None
        self.done = env.event()

    def close(self) -> tuple[StoredRecords, pd.DataFrame, pd.DataFrame]:
        """The run's records once it has ended: the round table, the batches and the responses
        (in response order)."""
        responses = self.responses.close().frame().sort_values("response", kind="stable")
        rounds = self.rounds.close()
        if self._cut is not None:  # responses from the cut on were measured when they began: no more
            responses.loc[responses.t_start >= self._cut, "measured"] = False
            kept = responses.response[responses.measured].to_numpy()
            rounds.patch(lambda df: df.assign(measured=df.measured & df.response.isin(kept)))
        return rounds, self.batches.close().frame(), responses.reset_index(drop=True)

    # --- stopping early -------------------------------------------------------------------------
    def complete_until(self) -> float:
        """The latest time ``t`` such that every measured response that started before it is
        decided now: finished, or past the time it could still meet its SLO (a certain violation).
        Never past now or the window's end."""
        now = self.env.now
        t = min(now, self.window[1])
        for t0, deadline, *_ in self.outstanding.values():
            if t0 < t and deadline >= now:
                t = t0
        return t

    def decided_before(self, t: float) -> list[tuple[float, int, float, bool]]:
        """(start, device, SLO, violated) of every measured response that started before ``t``,
        which :meth:`complete_until` says are decided (the ones past their SLO: violated)."""
        rows = [d for d in self.decided if d[0] < t]
        rows += [(t0, dev, slo, True) for t0, _, dev, slo, _, _ in self.outstanding.values() if t0 < t]
        return rows

    def cut(self, t: float) -> None:
        """End the run now, its window closed at ``t`` (at most :meth:`complete_until`): responses
        that started from ``t`` on are no longer measured, the ones before it that are still
        running are past their SLO and recorded as censored, as the watchdog would."""
        assert t <= self.complete_until() + 1e-12, "a cut leaves no measured response undecided"
        self.window = (self.window[0], t)
        self._cut = t
        for rid, entry in list(self.outstanding.items()):
            if entry[0] >= t:
                del self.outstanding[rid]
                self._first.pop(rid, None)
                self._measured.discard(rid)
            else:
                self._censor(rid, self.env.now)
        if not self.done.triggered:
            self.done.succeed()

    def open_response(self, t0: float, device: int, slo: float, prompt: int, output: int) -> int:
        """A new response id; the response is measured if it starts (``t0``) inside the window."""
        rid = next(self._response_ids)
        if self.window[0] <= t0 < self.window[1]:
            self._measured.add(rid)
            self.outstanding[rid] = (t0, t0 + output / slo, device, slo, prompt, output)
        return rid

    def is_measured(self, rid: int) -> bool:
        """Whether response ``rid`` started inside the measurement window."""
        return rid in self._measured

    def close_response(self, rid: int) -> bool:
        """A response finished; False if it had already been recorded as censored."""
        if rid in self._measured:
            self._first.pop(rid, None)
            return self.outstanding.pop(rid, None) is not None
        return True

    def first_token(self, rid: int, t: float) -> None:
        """Response ``rid``'s first token reaches its device at ``t`` (possibly later than now):
        kept only while the response is measured and undecided, so the watchdog can record it if
        it censors the response (:meth:`finish_response` is handed it again)."""
        if rid in self.outstanding:
            self._first[rid] = t

    def server_times(self, rid: int, engine: float, eligible: float, scheduled: float) -> None:
        """Response ``rid``'s times at the server (:class:`~wispsim.sim.records.ResponseRecord`'s
        ``t_engine``, ``t_eligible``, ``t_scheduled``), kept until it is recorded."""
        self._times[rid] = (engine, eligible, scheduled)

    def watchdog(self) -> Generator[Any, Any, None]:
        """Ends the run once every measured response is decided (the window: see
        :mod:`wispsim.sim.simulation`)."""
        env = self.env
        end = self.window[1]
        yield env.timeout(end)
        limit = end + self.drain_s
        while True:
            now = env.now
            hard = now >= limit
            for rid, entry in list(self.outstanding.items()):
                if hard or now > entry[1]:
                    self._censor(rid, now)
            if not self.outstanding:
                self.done.succeed()
                return
            yield env.timeout(min(0.5, max(limit - now, 1e-9)))

    def record_round(self, side: DeviceRound, req: Request) -> None:
        """Record a completed round: the device's ``side`` of it, and ``req`` as the server
        finished it.

        Called once per round, so it packs the row (field order of
        :class:`~wispsim.sim.records.RoundRecord`) into the open chunk and does nothing else."""
        buf = self._round_buf
        try:
            buf += self._pack_round(
                side.device,
                side.slo,
                req.session,
                side.round,
                side.position,
                side.t_start,
                side.tau_d,
                side.draft_time,
                side.forward_passes,
                side.predictor_calls,
                req.k,
                side.accepted,
                side.committed,
                side.uplink_time,
                req.arrival,
                side.budget,
                req.deadline,
                req.n_hat,
                req.dispatch,
                req.verify_time,
                req.batch,
                req.l_new,
                req.l_cached,
                req.cold,
                side.downlink_time,
                side.t_end,
                side.measured,
            )
        except struct.error:  # a field of the wrong type: say which (never on the normal path)
            raise TypeError(self.rounds.bad_row(_round_row(side, req))) from None
        if len(buf) >= self._chunk_bytes:
            self.rounds.flush()

    def finish_response(self, rid: int, device: int, slo: float, t0: float, t_end: float, t_first: float,
                        prompt: int, output: int, rounds: int, cold_rounds: int) -> None:  # fmt: skip
        """Record response ``rid`` as finished at ``t_end`` (its last verdict or token is back at
        the device; its first one was at ``t_first``), unless the watchdog has already recorded it
        as censored. ``rounds``: the chunks the output reached the device in."""
        if self.close_response(rid):
            self._record_response(
                rid, device, slo, t0, t_end, t_first, t_end - t0, prompt, output, rounds, cold_rounds
            )

    def _censor(self, rid: int, now: float) -> None:
        t0, _, dev, slo, prompt, output = self.outstanding.pop(rid)
        first = self._first.pop(rid, math.nan)
        first = first if first <= now else math.nan  # still on its way down
        self._record_response(
            rid, dev, slo, t0, math.nan, first, now - t0, prompt, output, 0, 0, censored=True
        )

    def _record_response(
        self,
        rid: int,
        device: int,
        slo: float,
        t0: float,
        t_end: float,
        t_first: float,
        wall: float,
        prompt: int,
        output: int,
        rounds: int,
        cold_rounds: int,
        censored: bool = False,
    ) -> None:
        """Append a response record (field order of :class:`~wispsim.sim.records.ResponseRecord`).

        ``speed`` is output tokens over ``wall`` seconds; a censored response (still running, or
        unable to meet its SLO, when the watchdog decided it) counts as violated whatever its
        speed so far, which is an upper bound."""
        speed = output / wall if wall > 0 else math.inf
        engine, eligible, scheduled = self._times.pop(rid, _UNKNOWN_TIMES)
        measured = rid in self._measured
        if measured:
            self.decided.append((t0, device, slo, censored or speed < slo))
        self.responses.append(
            (
                device,
                slo,
                rid,
                t0,
                t_end,
                t_first,
                prompt,
                output,
                rounds,
                cold_rounds,
                speed,
                censored or speed < slo,
                measured,
                censored,
                engine,
                eligible,
                scheduled,
            )
        )


_UNKNOWN_TIMES = (math.nan, math.nan, math.nan)


def _round_row(side: DeviceRound, req: Request) -> tuple[Any, ...]:
    """The row :meth:`RunContext.record_round` packs, as a tuple (to explain a bad value)."""
    known = {name: getattr(side, name) for name in DEVICE_ROUND_FIELDS}
    known["response"] = req.session
    return tuple(known[f] if f in known else getattr(req, f) for f in RoundRecord._fields)
