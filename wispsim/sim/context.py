"""The run context: state shared by one run's SimPy processes.

It sits below the devices, verifiers and arrival processes, which get it handed in: the
scenario, the shared components (acceptance model, drafting controller), the id counters and the
record lists every process appends to, and the watchdog that ends the run once every measured
response is decided.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from itertools import count
from typing import Any, Protocol

import simpy

from wispsim.config import Scenario
from wispsim.model.acceptance import AcceptanceModel, expected_accept_ratio, make_acceptance
from wispsim.model.drafting import Controller, make_controller
from wispsim.model.network import draft_token_bytes
from wispsim.model.profiles import Profile


class ArrivalProcess(Protocol):
    """What the context needs of an arrival process (:mod:`wispsim.sim.arrivals`)."""

    n: int
    open: bool

    def gate(self, index: int) -> simpy.Event | None: ...


class RunContext:
    """State shared by one run's processes: config, shared components and record lists."""

    def __init__(self, env: simpy.Environment, scenario: Scenario, seed: int, profile: Profile) -> None:
        self.env = env
        self.scenario = scenario
        self.seed = seed
        self.profile = profile
        wl = scenario.workload
        self.window = (wl.warmup_s, wl.warmup_s + wl.duration_s)
        self.acceptance: AcceptanceModel = make_acceptance(scenario.acceptance)
        self.controller: Controller = make_controller(scenario.drafting)
        dr = scenario.drafting
        k_nominal = dr.k if dr.controller == "fixed" else dr.k_max
        self.alpha_init = expected_accept_ratio(self.acceptance.nominal_rate(), k_nominal)
        self.alpha_ema = scenario.devices.alpha_ema
        self.header_bytes = scenario.network.header_bytes
        self.draft_token_bytes = draft_token_bytes(scenario.network, profile.model.vocab_size)
        self.stream_pad = dr.k_max + 2
        # records as plain tuples in the field order of RoundRecord, BatchRecord, ResponseRecord
        self.rounds: list[tuple[Any, ...]] = []
        self.batches: list[tuple[Any, ...]] = []
        self.responses: list[tuple[Any, ...]] = []
        self._response_ids = count()
        self.request_ids = count()
        self.batch_ids = count()
        # measured responses not yet decided: id -> (t0, SLO deadline, device, slo, prompt, output)
        self.outstanding: dict[int, tuple[float, float, int, float, int, int]] = {}
        self._measured: set[int] = set()
        self.done = env.event()
        self.server: Any  # a Verifier, or a router in front of several
        self.central: Any  # a CentralizedServer, or a CentralRouter
        self.arrivals: ArrivalProcess
        self.devices_started = 0

    def open_response(self, t0: float, device: int, slo: float, prompt: int, output: int) -> int:
        rid = next(self._response_ids)
        if self.window[0] <= t0 < self.window[1]:
            self._measured.add(rid)
            self.outstanding[rid] = (t0, t0 + output / slo, device, slo, prompt, output)
        return rid

    def is_measured(self, rid: int) -> bool:
        return rid in self._measured

    def close_response(self, rid: int) -> bool:
        """A response finished; False if it had already been recorded as censored."""
        if rid in self._measured:
            return self.outstanding.pop(rid, None) is not None
        return True

    def watchdog(self) -> Generator[Any, Any, None]:
        """Ends the run once every measured response is decided (see the module docstring)."""
        env = self.env
        end = self.window[1]
        yield env.timeout(end)
        limit = end + self.scenario.workload.drain_limit_s
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

    def _censor(self, rid: int, now: float) -> None:
        t0, _, dev, slo, prompt, output = self.outstanding.pop(rid)
        self.responses.append(
            (
                dev,
                slo,
                rid,
                t0,
                math.nan,
                prompt,
                output,
                0,
                0,
                output / (now - t0) if now > t0 else math.inf,
                True,
                True,
                True,
            )
        )
