"""How a run's devices are served: verifying their drafts, or generating every token.

Speculative and centralized serving are two server components (:mod:`wispsim.sim.servers`) with
one way to submit. Which one a scenario runs is read from its policy preset here, once
(:func:`serving_of`); a run, its replay and the real swarm ask the :class:`Serving` they are
handed (``ctx.serving``) to pick between the two. Besides this, ``server.mode`` is read only where
a scenario is checked (:mod:`wispsim.sim.scenarios`, and whether server-side speculation applies,
:func:`wispsim.model.speculation.resolve`) and where the real server is built
(:mod:`wispsim.serve.app`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from wispsim.config import Scenario

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Serving:
    """How a run's devices are served: ``verifies`` (edge drafting: the server verifies rounds)
    or not (the server generates every token)."""

    verifies: bool

    def pick(self, speculative: T, centralized: T) -> T:
        """The one of two things (device loops, remote clients) that fits this serving."""
        return speculative if self.verifies else centralized


def serving_of(scenario: Scenario) -> Serving:
    """The scenario's serving (policy preset ``server.mode``)."""
    return Serving(verifies=scenario.server.mode != "centralized")
