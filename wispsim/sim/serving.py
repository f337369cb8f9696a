"""How a run's devices are served: one component per kind of serving (issue 43).

Edge drafting (:class:`SpeculativeServing`: the server verifies the rounds a device drafts) and
centralized serving (:class:`CentralizedServing`: the server generates every token) are two
components with the same face. Each has one response process, fed by a timing source -- the
simulated device (:class:`wispsim.sim.device.Device`), a recorded device of a replay, a benchmark
client, the real swarm's device -- and builds its simulated replicas. Which one a scenario runs is
decided once, here (:func:`serving_of`, the one place ``server.mode`` picks an implementation);
the rest of a run asks the component it is handed (``ctx.serving``):

- ``respond(ctx, source, resp, prompt, output, t0, pending, alpha_hat, t_first)``: run one
  response (a generator; returns its :class:`~wispsim.sim.round.Outcome`);
- ``end(ctx, resp)``: the response is over (a verifier frees its prefix and reservation);
- ``pad``: positions an acceptance stream needs past the output (drafts beyond the last token);
- ``needs_length``: whether a response cannot start without its output length (a recorded
  response whose length is unknown cannot be generated).

The simulated replicas of each are built by the one server factory (:mod:`wispsim.sim.servers`).

A speculative server's own strategy, how a round reaches its engine (re-submitted or resident), is
the verifier's kind (:mod:`wispsim.model.verifier_kinds`), chosen here as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wispsim.config import Scenario
from wispsim.model.verifier_kinds import VerifierKind, verifier_kind
from wispsim.sim.generation import centralized_response
from wispsim.sim.round import speculative_response

if TYPE_CHECKING:
    from wispsim.sim.context import RunContext


class SpeculativeServing:
    """Edge drafting: the server verifies rounds (SPEC 2, 3.1, 3.2). A response's rounds come
    from its source (a :class:`~wispsim.sim.round.RoundSource`)."""

    name = "speculative"
    needs_length = False
    respond = staticmethod(speculative_response)

    def __init__(self, scenario: Scenario) -> None:
        self.kind: VerifierKind = verifier_kind(scenario.server.verifier.kind)
        self.pad = scenario.drafting.k_max + 2

    def end(self, ctx: RunContext, resp: int) -> None:
        ctx.server.drop(resp)


class CentralizedServing:
    """Centralized serving: the server generates every token (SPEC 3.3), and under
    ``centralized-sd`` drafts for itself. A response's times come from its source (a
    :class:`~wispsim.sim.generation.GenerationSource`)."""

    name = "centralized"
    needs_length = True
    pad = 0
    respond = staticmethod(centralized_response)

    def end(self, ctx: RunContext, resp: int) -> None:
        return None


Serving = SpeculativeServing | CentralizedServing


def serving_of(scenario: Scenario) -> Serving:
    """The scenario's serving component (policy preset ``server.mode``)."""
    if scenario.server.mode == "centralized":
        return CentralizedServing()
    return SpeculativeServing(scenario)
