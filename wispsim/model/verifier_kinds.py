"""How a speculative server hands a round to its engine: the verifier's kind (``server.verifier.kind``).

A strategy of the verification component, chosen once by name where a server is built, instead
of a flag tested wherever the two differ (issue 43):

``resubmit``
    Every round is a new request carrying the session's whole sequence, which the engine hashes
    and looks up in its prefix cache (a stock ``vllm serve``): the API server parses every token
    id, the engine core takes a new request and hashes the whole prompt, and the prefix cache
    reuses what the scenario's ``server.engine.prefix_reuse`` says (vLLM's whole blocks, or every token).
``resident``
    Each session stays in the engine between rounds and a round sends only what the engine does
    not hold: its new tokens over the session's KV, reused token by token (no block tail to
    forward again), a resumed session for the engine core and the API server, hashing only the new
    tokens. A session's first round opens it: it sends its whole sequence as a new request. A
    profile's per-arrival term (``roofline.arrival``) is not charged: a resumed round does not
    arrive anew.

Both are pure (no clock): the simulated verifier, its API servers and the real server ask the
same object. Whether a round opens its session is read one way, from what the engine holds of it
(:meth:`VerifierKind.opens`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from wispsim.registry import Registry

T = TypeVar("T")


class RoundLike(Protocol):
    """What a kind reads of a verification round (:class:`wispsim.sim.verifier.Request`)."""

    prefix: int
    k: int
    l_new: int
    l_cached: int


class VerifierKind:
    """The re-submitting verifier (module text); :class:`Resident` overrides what differs."""

    name: ClassVar[str] = "resubmit"
    resident: ClassVar[bool] = False  # sessions stay in the engine between rounds

    def reuse(self, prefix_reuse: str) -> str:
        """How the prefix cache reuses a round's prefix (``token`` or ``block``)."""
        return prefix_reuse

    def cost(self, estimator: T) -> T:
        """The cost form a round is priced with."""
        return estimator

    def opens(self, held: int) -> bool:
        """Whether a round over ``held`` tokens the engine holds of its session arrives anew."""
        return True

    def api_work(self, r: RoundLike, held: int) -> tuple[bool, int]:
        """What the API server does for round ``r``: (a resumed session?, token ids it parses)."""
        return False, r.prefix + r.k

    def engine_work(self, members: Sequence[RoundLike]) -> tuple[int, int, int, int]:
        """What the engine core does for a batch: requests, new requests, resumed sessions and
        prompt tokens hashed (:meth:`wispsim.model.host_cpu.HostCPU.engine`'s arguments)."""
        n = len(members)
        return n, n, 0, sum(r.prefix + r.k for r in members)


class Resident(VerifierKind):
    """The session-resident verifier (module text)."""

    name = "resident"
    resident = True

    def reuse(self, prefix_reuse: str) -> str:
        return "token"

    def cost(self, estimator: T) -> T:
        arrival: object = getattr(estimator, "arrival", None)
        if dataclasses.is_dataclass(estimator) and arrival:
            return dataclasses.replace(estimator, arrival=0.0)  # type: ignore[type-var]
        return estimator

    def opens(self, held: int) -> bool:
        return held == 0

    def api_work(self, r: RoundLike, held: int) -> tuple[bool, int]:
        resumed = not self.opens(held)
        return resumed, (r.k + 1 if resumed else r.prefix + r.k)

    def engine_work(self, members: Sequence[RoundLike]) -> tuple[int, int, int, int]:
        # a resumed session reuses every token it holds: what it forwards is what it hashes
        n = len(members)
        arrivals = sum(self.opens(r.l_cached) for r in members)
        return n, arrivals, n - arrivals, sum(r.l_new for r in members)


VERIFIER_KINDS: Registry[type[VerifierKind]] = Registry("verifier kind")
VERIFIER_KINDS.register("resubmit")(VerifierKind)
VERIFIER_KINDS.register("resident")(Resident)


def verifier_kind(name: str) -> VerifierKind:
    """The kind called ``name`` (``server.verifier.kind``)."""
    kind: Any = VERIFIER_KINDS.get(name, field="server.verifier.kind")
    return kind()  # type: ignore[no-any-return]
