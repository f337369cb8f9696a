"""The run context: what one run's SimPy processes share.

It sits below the devices, servers and arrival processes, which get it handed in: the scenario
and seed, the shared components (acceptance model, drafting controller), the device constants
every device reads, the id counters, the serving and the server the devices submit to, and the
run's :class:`~wispsim.sim.recorder.Recorder` (window, record tables, watchdog), which owns every
record.
"""

from __future__ import annotations

from itertools import count
from typing import TYPE_CHECKING, Any, Protocol

import simpy

from wispsim.config import Scenario
from wispsim.model.acceptance import AcceptanceModel, expected_accept_ratio, make_acceptance
from wispsim.model.drafting import Controller, make_controller
from wispsim.model.network import draft_token_bytes
from wispsim.model.profiles import Profile
from wispsim.model.speculation import Speculation
from wispsim.sim.recorder import DeviceRound, Recorder
from wispsim.sim.records import MEMORY_ROWS

if TYPE_CHECKING:
    from wispsim.sim.serving import Serving

__all__ = ["ArrivalProcess", "DeviceRound", "RunContext"]


class ArrivalProcess(Protocol):
    """What the context needs of an arrival process (:mod:`wispsim.sim.arrivals`)."""

    n: int
    open: bool

    def gate(self, index: int) -> simpy.Event | None: ...

    def lengths(self, index: int) -> tuple[int, int] | None: ...


class RunContext:
    """State shared by one run's processes (module text)."""

    def shared_hit(self, prompt: int) -> int:
        """Prompt tokens a centralized request finds in the prefix cache: the shared prefix once
        an earlier request computed it, in whole KV blocks, the last prompt token always computed
        (as vLLM's prefix caching; nothing evicts a prefix every request reuses)."""
        if not self._shared:
            return 0
        if not self._shared_seen:
            self._shared_seen = True
            return 0
        bs = self.profile.kv_block_size or 16
        return min(self._shared, prompt - 1) // bs * bs

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
        self.stream_pad = dr.k_max + 2
        self.request_ids = count()
        self.batch_ids = count()
        self.serving: Serving  # verifying rounds or generating responses (wispsim.sim.servers)
        # what devices submit to: a Verifier or a CentralizedServer, a router in front of several,
        # or a client of a real server
        self.server: Any
        self.speculation: Speculation | None = None  # server-side drafting (centralized-sd)
        # (mean, max) output tokens of a request trace's requests, where one sets the lengths
        self.request_outputs: tuple[float, float] | None = None
        self.arrivals: ArrivalProcess
        self.devices_started = 0
        srv = scenario.server
        # the API server's latency in front of a centralized engine (server.frontend), seconds
        self.frontend = float(getattr(profile.estimator, "frontend", 0.0)) if srv.frontend else 0.0
        # a prompt prefix every request shares (workload.shared_prefix_tokens), cached once computed
        self._shared = scenario.workload.shared_prefix_tokens if srv.prefix_cache else 0
        self._shared_seen = False
