"""One batch, as every part of the model sees it: its shape, its limits and its block arithmetic.

A pass over a batch (a verification batch, a decode step, a prefill chunk or a mix) is priced from
a few sums over its members, its :class:`Shape`: N_linear = sum L_new, N_interactions =
sum (L_new + L_cached) * L_new, N_cached = sum L_cached, the number of requests, how many of
them arrive anew (every verification round; a sequence's first prefill chunk) and N_logits, the
rows the LM head computes logits for (vLLM's ``logits_indices``: every new token of a verification
round, whose draft positions all need logits; one per request of a generation step, the last
token it schedules, whether a decode or a prefill chunk; k + 1 per request where the server
speculates). Every cost form
(:mod:`wispsim.model.cost`) prices a shape and nothing else, so a batch is described once.

:class:`Batch` is a batch being formed: its members, its shape, its KV blocks and new tokens,
with the GPU replica's limits checked when a member is added (:meth:`Batch.fits`). A scheduler
grows one and returns it with the estimate it planned with (:attr:`Batch.estimate`), so the
server never prices the batch a second way.

KV memory is counted in blocks: :func:`blocks` is the one ceiling every part uses.
*(BLIS separates forming a batch from pricing it: ``batch_formation.go`` and ``StepTime(batch)``.)*
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


def blocks(tokens: int, block_size: int) -> int:
    """KV blocks that hold ``tokens`` tokens: ceil(tokens / block_size)."""
    return -(-tokens // block_size)


class Shape:
    """The sums a cost form prices (module docstring). Mutable: a batch grows one member at a
    time; :meth:`add` and :meth:`add_alike` are the only places the sums are formed."""

    __slots__ = ("n_arrivals", "n_cached", "n_interactions", "n_linear", "n_logits", "n_requests")

    def __init__(
        self,
        n_linear: int = 0,
        n_interactions: int = 0,
        n_cached: int = 0,
        n_requests: int = 0,
        n_arrivals: int = 0,
        n_logits: int | None = None,
    ) -> None:
        self.n_linear = n_linear
        self.n_interactions = n_interactions
        self.n_cached = n_cached
        self.n_requests = n_requests
        self.n_arrivals = n_arrivals
        self.n_logits = n_linear if n_logits is None else n_logits  # unsaid: every new token

    def add(self, l_new: int, l_cached: int, arriving: bool = True, logits: int | None = None) -> None:
        """One more member of L_new new and L_cached cached tokens (``arriving``: it is a request
        arriving anew, as every verification round is; ``logits``: the rows the LM head computes
        for it, unsaid every new token's, as a verification round needs)."""
        self.n_linear += l_new
        self.n_interactions += (l_new + l_cached) * l_new  # each new token attends to L_total
        self.n_cached += l_cached
        self.n_requests += 1
        self.n_arrivals += arriving
        self.n_logits += l_new if logits is None else logits

    def add_alike(self, count: int, l_new: int, l_cached_sum: int, arriving: bool = True) -> None:
        """``count`` members of L_new new tokens each, their L_cached summing to ``l_cached_sum``
        (an engine step's decodes, logits at every new token): the same sums as ``count`` calls of
        :meth:`add`."""
        self.n_linear += count * l_new
        self.n_interactions += (count * l_new + l_cached_sum) * l_new
        self.n_cached += l_cached_sum
        self.n_requests += count
        self.n_arrivals += count * arriving
        self.n_logits += count * l_new

    @classmethod
    def of(cls, members: Iterable[tuple[int, int]], arriving: bool = True) -> Shape:
        """The shape of a batch given its members' (L_new, L_cached)."""
        shape = cls()
        for l_new, l_cached in members:
            shape.add(l_new, l_cached, arriving)
        return shape

    def as_tuple(self) -> tuple[int, int, int, int, int, int]:
        return (
            self.n_linear,
            self.n_interactions,
            self.n_cached,
            self.n_requests,
            self.n_arrivals,
            self.n_logits,
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shape) and self.as_tuple() == other.as_tuple()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            "Shape(n_linear={}, n_interactions={}, n_cached={}, n_requests={}, n_arrivals={}, "
            "n_logits={})".format(*self.as_tuple())
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """What one batch may hold on a replica: KV blocks, requests and new tokens per pass."""

    total_blocks: int
    block_size: int = 16
    max_requests: int = 256
    max_new_tokens: int = 16384


class Member(Protocol):
    l_new: int
    l_cached: int


M = TypeVar("M", bound=Member)


class Batch(Generic[M]):
    """A batch being formed: members in dispatch order, their :class:`Shape`, the KV blocks their
    L_total needs and their new tokens; the replica's :class:`Limits` are checked by :meth:`fits`
    before a member is added. ``estimate`` is T_hat of the batch as its scheduler priced it."""

    __slots__ = ("blocks", "estimate", "limits", "members", "new_tokens", "shape")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.members: list[M] = []
        self.shape = Shape()
        self.blocks = 0
        self.new_tokens = 0
        self.estimate = 0.0

    def need(self, r: Member) -> int:
        """KV blocks member ``r`` needs for its L_total."""
        return -(-(r.l_new + r.l_cached) // self.limits.block_size)  # blocks(), inlined

    def fits(self, r: Member, need: int | None = None) -> bool:
        """Whether ``r`` can join without breaking a limit (``need``: its blocks, if known)."""
        lim = self.limits
        return (
            len(self.members) < lim.max_requests
            and self.new_tokens + r.l_new <= lim.max_new_tokens
            and self.blocks + (self.need(r) if need is None else need) <= lim.total_blocks
        )

    def add(self, r: M, need: int | None = None) -> None:
        """Add ``r`` (its limits checked by the caller with :meth:`fits`)."""
        self.members.append(r)
        self.shape.add(r.l_new, r.l_cached)
        self.blocks += self.need(r) if need is None else need
        self.new_tokens += r.l_new
