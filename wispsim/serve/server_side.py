"""The swarm's server side (:class:`ServerClients`, a :class:`wispsim.sim.simulation.ServerSide`):
the devices of a swarm talk to a client of the real server (:mod:`wispsim.serve.swarm`) instead of
simulated replicas, with a progress tick on the wall clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wispsim.serve.clock import WallClock
from wispsim.sim.context import RunContext
from wispsim.sim.scenarios import Resolved


class ServerClients:
    """The swarm's server side (a :class:`wispsim.sim.simulation.ServerSide`): the devices talk to a
    client of the real server (made by ``connect``) instead of simulated replicas."""

    def __init__(
        self,
        env: WallClock,
        connect: Callable[[], Any],
        fleet: int,
        progress: Callable[[float, float], None] | None,
    ) -> None:
        self.env = env
        self.connect = connect
        self.fleet = fleet
        self.progress = progress
        self.remote: Any = None

    def build(self, ctx: RunContext, resolved: Resolved) -> None:
        r = self.remote = ctx.server = self.connect()
        r.fleet = self.fleet
        if self.progress is not None:
            self.env.process(_ticker(self.env, ctx, self.progress))

    def info(self, ctx: RunContext) -> dict[str, Any]:
        return {}  # run_swarm adds the server's facts and the swarm's own timing


def _ticker(env: WallClock, ctx: RunContext, progress: Callable[[float, float], None]) -> Any:
    end = ctx.recorder.window[1]
    while True:
        progress(env.now, end)
        yield env.timeout(1.0)
