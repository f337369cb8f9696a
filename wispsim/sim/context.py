"""The run context: what one run's SimPy processes share.

It sits below the devices, servers and arrival processes, which get it handed in: the scenario
and seed, the shared components (acceptance model, drafting controller), the device constants
every device reads, the id counters, the serving and the server the devices submit to, and the
run's :class:`~wispsim.sim.recorder.Recorder` (window, record tables, watchdog), which owns every
record.
"""

from __future__ import annotations

from itertools import count
from typing import Any, Protocol

import simpy

from wispsim.config import Scenario
from wispsim.model.acceptance import AcceptanceModel, expected_accept_ratio, make_acceptance
from wispsim.model.drafting import Controller, make_controller
from wispsim.model.network import draft_token_bytes
from wispsim.model.profiles import Profile
from wispsim.model.speculation import Speculation
from wispsim.sim.recorder import DeviceRound, Recorder
from wispsim.sim.records import MEMORY_ROWS

__all__ = ["ArrivalProcess", "DeviceRound", "RunContext"]


class ArrivalProcess(Protocol):
    """What the context needs of an arrival process (:mod:`wispsim.sim.arrivals`)."""

    n: int
    open: bool

    @property
    def gates(self) -> bool: ...  # whether gate() may ever hold a device back

    def gate(self, index: int) -> simpy.Event | None: ...

    def lengths(self, index: int) -> tuple[int, int] | None: ...


class RunContext:
    """State shared by one run's processes (module text)."""

    def __init__(
        self,
        env: simpy.Environment,
        scenario: Scenario,
        seed: int,
        profile: Profile,
        memory_rows: int = MEMORY_ROWS,
    ) -> None:
        self.env = env
        self.scenario = scenario
        self.seed = seed
        self.profile = profile
        # the window, the record tables and the watchdog
        self.recorder = Recorder(env, scenario, memory_rows)
        self.acceptance: AcceptanceModel = make_acceptance(scenario.acceptance)
        self.controller: Controller = make_controller(scenario.drafting)
        dr = scenario.drafting
        k_nominal = dr.k if dr.controller == "fixed" else dr.k_max
        self.alpha_init = expected_accept_ratio(self.acceptance.nominal_rate(), k_nominal)
        self.alpha_ema = scenario.devices.alpha_ema
        self.header_bytes = scenario.network.header_bytes
        self.draft_token_bytes = draft_token_bytes(scenario.network, profile.model.vocab_size)
        self.request_ids = count()
        self.batch_ids = count()
        # verifying rounds or generating responses (a wispsim.sim.serving component, which runs the
        # responses and so sits above this module)
        self.serving: Any
        # what devices submit to: a Verifier or a CentralizedServer, a router in front of several,
        # or a client of a real server
        self.server: Any
        self.speculation: Speculation | None = None  # server-side drafting (centralized-sd)
        # each replica's API-server processes where the host CPU is modelled (wispsim.sim.front),
        # for what the run says binds
        self.api_fronts: list[Any] = []
        # each replica's engine (a Verifier or a CentralizedServer), for what the run says binds
        self.engines: list[Any] = []
        # (mean, max) output tokens of a request trace's requests, where one sets the lengths
        self.request_outputs: tuple[float, float] | None = None
        self.arrivals: ArrivalProcess
        self.devices_started = 0
