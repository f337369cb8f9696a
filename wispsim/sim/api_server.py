"""The API servers in front of a replica's engine (``server.api_server_count`` processes; issue 36).

Every request passes one API-server process before the engine sees it: a serial process that
handles its requests first come, first served, each for its CPU time
(:meth:`wispsim.model.host_cpu.HostCPU.api`). A device's requests all go to one process (its
connection), ``session mod count``. While the processes keep up this only delays each request
by its own service time; when the request rate nears ``count / service`` they queue, and the
API servers, not the GPU, cap what the replica serves.

Each process is a clock of when it is next free (its work is deterministic and FIFO), so a
request costs one event: it is handed to the engine when its service ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import simpy

from wispsim.sim.verifier import Request

if TYPE_CHECKING:
    from wispsim.model.host_cpu import HostCPU
    from wispsim.sim.centralized import Generation


class ApiServers:
    """``host.api_servers`` API-server processes in front of ``engine`` (a verifier or a
    centralized server: anything with ``submit``); every other attribute is the engine's, so a
    router sees the replica as before."""

    def __init__(self, env: simpy.Environment, engine: Any, host: HostCPU, resident: bool = False) -> None:
        self.env = env
        self.engine = engine
        self.host = host
        self.resident = resident  # verification rounds after a session's first carry no prefix
        self.free_at = [0.0] * host.api_servers
        # what the API servers hold, not yet handed to the engine: a router counts it, as a real
        # one counts the requests it sent and has no answer for (it cannot see the engine's queue);
        # a dict, not a set, so it is summed in arrival order and the same seed routes the same way
        self.held: dict[Request | Generation, None] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def _serve(self, session: int, seconds: float) -> float:
        """Queue ``seconds`` of work on the session's process; returns the delay until it is done."""
        now = self.env.now
        p = session % len(self.free_at)
        start = self.free_at[p] if self.free_at[p] > now else now
        self.free_at[p] = start + seconds
        return start + seconds - now

    def outstanding(self, now: float) -> float:
        """The engine's outstanding seconds of work plus the marginal cost of the rounds the API
        servers still hold (the ``least-work`` and ``affinity`` routers' signal)."""
        held = sum(self.engine.cost(r) for r in self.held)
        return self.engine.outstanding(now) + held

    def outstanding_tokens(self) -> int:
        """The engine's outstanding tokens plus those of the responses the API servers still
        hold (centralized routing's signal)."""
        held = sum(g.prompt - g.hit + g.output for g in self.held)
        return self.engine.outstanding_tokens() + held

    def _hand(self, x: Any) -> None:
        del self.held[x]
        self.engine.submit(x)

    def submit(self, x: Request | Generation) -> simpy.Event:
        """Hand a verification round or a response to the engine when its API server is done
        with it; returns the event of its verdict."""
        self.held[x] = None
        if isinstance(x, Request):
            # a resident session's first round opens the session (a new request); the rest resume it
            resident = self.resident and self.engine.memory.cached_tokens(x.session) > 0
            sent = x.k + 1 if resident else x.prefix + x.k  # its new tokens, or its whole sequence
            delay = self._serve(x.session, self.host.api(resident, ids=sent))
            x.send(self.env, delay, self._hand)  # the arrival event is the request itself
            return x.done
        delay = self._serve(x.rid, self.host.api(False, text=x.prompt))  # a text prompt, tokenized
        self.env.timeout(delay).callbacks.append(lambda _: self._hand(x))
        return x.done
