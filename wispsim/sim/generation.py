"""Centralized serving's response, written once: prompt up -> the server generates -> tokens down.

Every client of a centralized server runs its responses through :func:`centralized_response`: the
simulated device (:class:`wispsim.sim.device.Device`; the real swarm runs the same device against a
client of a real server), a recorded device of a replay (:mod:`wispsim.study.replay.drive`) and a
benchmark client (:mod:`wispsim.study.bench`). What differs between them is only where the times
come from, a :class:`GenerationSource`: a simulated device draws its prompt's uplink and the
tokens' downlink from its link, a recorded one reads them from the log, a benchmark client sits
beside the server (no network). What the server does -- its front end and API servers, its prefix
cache, its engine -- is the server's (:mod:`wispsim.sim.servers` builds it), the same for all.

The server answers a :class:`Generation` with :class:`Served`: when the step that gave the first
token ended, how many chunks the tokens streamed in, and the response's own timestamps at the
server (when it reached the engine, when the first engine step it could join began, when the
first step that ran it began) -- TTFT by its parts, which the recorder keeps with the response.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import simpy

from wispsim.sim.round import Outcome

if TYPE_CHECKING:
    from wispsim.sim.context import RunContext


@dataclass(slots=True, eq=False)
class Generation:
    """A response submitted for the server to generate (what a client sends under centralized
    serving): its id, prompt and output lengths, the event its :class:`Served` value goes to;
    (server-side speculation only) the runs of drafts the target accepts from each output
    position; and what identifies its prompt to the prefix cache (``prompt_id``: the same id, the
    same prompt; ``group``: prompts of a group open with the same ``shared`` tokens; None: none)."""

    rid: int
    prompt: int
    output: int
    done: simpy.Event
    runs: list[int] | None = None
    prompt_id: int | None = None
    group: int | None = None
    shared: int = 0


class Served(NamedTuple):
    """A generated response's ``done`` value: when its first token left the server (the end of
    the step that gave it, plus the API server streaming it: :mod:`wispsim.sim.front`), how
    many chunks its tokens streamed in (one per step that gave it tokens), and its times at the
    server (NaN where a server does not say): it reached the engine, the first step it could join
    began (under async scheduling the one after next), the first step that ran it began."""

    first: float
    chunks: int
    t_engine: float = math.nan
    t_eligible: float = math.nan
    t_scheduled: float = math.nan


class PromptCache:
    """Which prompt tokens a replica's prefix cache serves a new response, the one rule for every
    client: a prompt seen before is cached whole, one whose group's shared prefix was seen has
    that prefix, in whole KV blocks, the last prompt token always computed (vLLM's automatic
    prefix caching). Nothing is evicted: a prefix every request reuses stays hot."""

    __slots__ = ("block_size", "enabled", "groups", "seen")

    def __init__(self, block_size: int, enabled: bool) -> None:
        self.block_size = block_size
        self.enabled = enabled
        self.seen: set[int] = set()
        self.groups: set[int] = set()

    def hit(self, g: Generation) -> int:
        """Prompt tokens of ``g`` already cached (and ``g``'s prompt remembered)."""
        if not self.enabled or (g.prompt_id is None and g.group is None):
            return 0
        if g.prompt_id is not None and g.prompt_id in self.seen:
            cached = g.prompt
        elif g.group is not None and g.group in self.groups:
            cached = g.shared
        else:
            cached = 0
        if g.prompt_id is not None:
            self.seen.add(g.prompt_id)
        if g.group is not None:
            self.groups.add(g.group)
        bs = self.block_size
        return min(cached, g.prompt - 1) // bs * bs


class GenerationSource(Protocol):
    """Where a client's times come from (module text)."""

    def prompt_uplink(self, prompt: int) -> float:
        """Seconds before the prompt reaches the server (after what the client still owed)."""
        ...

    def tokens_downlink(self) -> float:
        """Seconds the tokens take to come down (one draw serves the first token and the last)."""
        ...

    def server_runs(self, output: int) -> list[int]:
        """Under server-side speculation: drafts the target accepts in a row from each position."""
        ...

    def prompt_key(self) -> tuple[int | None, int | None, int]:
        """What identifies the prompt to the prefix cache: (prompt id, group, shared tokens)."""
        ...


def centralized_response(ctx: RunContext, source: GenerationSource, resp: int, prompt: int, output: int,
                         t0: float, pending: float, alpha_hat: float, t_first: float,
                         ) -> Generator[Any, Any, Outcome]:  # fmt: skip
    """Run response ``resp`` (a ``prompt``-token prompt, ``output`` tokens, started at ``t0``) on
    the centralized server, the first ``pending`` seconds from now: the prompt goes up, the server
    generates every token, they come down. Returns the :class:`~wispsim.sim.round.Outcome` (one
    chunk per step that gave tokens; ``cold_rounds`` 1: the prompt is prefilled once;
    ``alpha_hat`` as it was: nothing is drafted at the edge; ``t_first`` is the server's) and
    leaves the server's times with the recorder."""
    env = ctx.env
    up = source.prompt_uplink(prompt)
    yield env.timeout(pending + up)
    # under centralized-sd the server drafts for itself: which of its drafts the target accepts
    runs = source.server_runs(output) if ctx.speculation is not None else None
    prompt_id, group, shared = source.prompt_key()
    served: Served = yield ctx.server.submit(
        Generation(resp, prompt, output, env.event(), runs, prompt_id, group, shared)
    )
    down = source.tokens_downlink()
    ctx.recorder.server_times(resp, served.t_engine, served.t_eligible, served.t_scheduled)
    return Outcome(env.now + down, served.first + down, served.chunks, 1, alpha_hat, down)
