"""One batch, as every part of the model sees it: its shape, its limits and its block arithmetic.

A pass over a batch (a verification batch, a decode step, a prefill chunk or a mix) is priced from
a few sums over its members, its :class:`Shape`: N_linear = sum L_new, N_interactions =
sum (L_new + L_cached) * L_new, N_cached = sum L_cached, the number of requests, how many of
them arrive anew (every verification round; a sequence's first prefill chunk), N_interactions and
N_cached again over the members vLLM's attention backend runs as prefills (more new tokens than
its ``reorder_batch_threshold``, :attr:`Shape.prefill_above`: MLA runs them in another form) and
N_logits, the rows the LM head computes logits for (vLLM's ``logits_indices``: every new token of
a verification round, whose draft positions all need logits; one per request of a generation
step, the last token it schedules, whether a decode or a prefill chunk; k + 1 per request where the server
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


class Window:
    """Sliding-window attention as vLLM's engine keeps it: ``windowed`` of ``layers`` layers
    attend to (and cache) only the last ``tokens`` tokens (gpt-oss: 18 of 36 at 128; Gemma;
    Mistral-7B-v0.1).

    **KV held.** vLLM's hybrid KV cache manager splits the layers into groups of equal size (the
    smaller of the two kinds' counts, or the larger where it is under 1.5 times the smaller;
    ``kv_cache_utils``), one block table per group over one pool of pages; a block of the
    simulator's memory (its KV capacity in tokens over ``block_size``, every layer counted) holds
    ``layers / size`` pages (a group's page holds ``size`` layers' tokens).
    A sequence of ``t`` tokens holds ceil(t / B) pages in each full-attention group and, in each
    windowed group, only the pages from the one holding the first token the step's ``new`` tokens
    attend to (token t - new - window + 1: vLLM frees the pages wholly before it) to its last.
    Memory under a window is counted in pages, as vLLM counts it (:meth:`pages`, :meth:`pool`).

    **Pass.** A windowed layer reads the KV of at most ``tokens`` cached tokens per sequence and
    each new token attends to at most ``tokens`` keys there: :meth:`cached` and
    :meth:`interactions` are a member's L_cached and (L_new + L_cached) x L_new (:class:`Shape`)
    averaged over the layers with the windowed ones capped, which the cost forms price as before.
    """

    __slots__ = ("full_groups", "groups", "layers", "share", "size", "tokens")

    def __init__(self, tokens: int, layers: int, windowed: int) -> None:
        if not tokens > 0 or not 0 < windowed <= layers:
            raise ValueError(f"a window of {tokens} tokens on {windowed} of {layers} layers")
        self.tokens = tokens
        self.share = windowed / layers
        full = layers - windowed
        size = min(full, windowed) if full else windowed  # vLLM's group size
        if full and max(full, windowed) < 1.5 * size:
            size = max(full, windowed)  # fewer padding layers (vLLM pads the smaller kind)
        self.layers = layers
        self.size = size
        self.full_groups = -(-full // size)
        self.groups = self.full_groups + -(-windowed // size)

    def pool(self, blocks: int) -> int:
        """Pages in the memory of ``blocks`` blocks counted over every layer."""
        return blocks * self.layers // self.size

    def pages(self, tokens: int, new: int, block_size: int) -> int:
        """Pages a sequence of ``tokens`` tokens holds in a step of ``new`` new tokens."""
        whole = -(-tokens // block_size)
        first = tokens - new - self.tokens + 1  # the first token the step attends to
        window = whole - first // block_size if first > 0 else whole
        return self.full_groups * whole + (self.groups - self.full_groups) * window

    def cached(self, l_cached: int) -> int:
        """L_cached averaged over the layers, the windowed ones reading at most the window."""
        over = l_cached - self.tokens
        return l_cached - round(self.share * over) if over > 0 else l_cached

    def interactions(self, l_new: int, l_cached: int) -> int:
        """(L_new + L_cached) x L_new averaged over the layers, the windowed ones' keys capped."""
        total = l_new + l_cached
        over = total - self.tokens
        return total * l_new - round(self.share * over * l_new) if over > 0 else total * l_new


class Shape:
    """The sums a cost form prices (module docstring). Mutable: a batch grows one member at a
    time; :meth:`add` and :meth:`add_alike` are the only places the sums are formed."""

    __slots__ = (
        "n_arrivals", "n_cached", "n_interactions", "n_linear", "n_logits", "n_prefill_cached",
        "n_prefill_interactions", "n_requests", "prefill_above", "raw_cached", "raw_interactions",
        "window",
    )  # fmt: skip

    def __init__(
        self,
        n_linear: int = 0,
        n_interactions: int = 0,
        n_cached: int = 0,
        n_requests: int = 0,
        n_arrivals: int = 0,
        n_logits: int | None = None,
        window: Window | None = None,
        n_prefill_interactions: int = 0,
        n_prefill_cached: int = 0,
        prefill_above: int = 1,
    ) -> None:
        self.window = window  # sliding-window layers: the members' sums capped (:class:`Window`)
        # a member with more new tokens is a prefill to the attention backend (vLLM's
        # ``reorder_batch_threshold``: 1, or more where the backend decodes short queries)
        self.prefill_above = prefill_above
        # under a window, the sums uncapped (:meth:`uncapped`); else the n_ sums are those
        self.raw_interactions = n_interactions
        self.raw_cached = n_cached
        self.n_linear = n_linear
        self.n_interactions = n_interactions
        self.n_cached = n_cached
        self.n_requests = n_requests
        self.n_arrivals = n_arrivals
        self.n_logits = n_linear if n_logits is None else n_logits  # unsaid: every new token
        # the sums over the members run as prefills (``prefill_above``)
        self.n_prefill_interactions = n_prefill_interactions
        self.n_prefill_cached = n_prefill_cached

    def add(self, l_new: int, l_cached: int, arriving: bool = True, logits: int | None = None) -> None:
        """One more member of L_new new and L_cached cached tokens (``arriving``: it is a request
        arriving anew, as every verification round is; ``logits``: the rows the LM head computes
        for it, unsaid every new token's, as a verification round needs)."""
        self.n_linear += l_new
        w = self.window
        if w is None:
            pairs = (l_new + l_cached) * l_new  # each new token attends to L_total
            cached = l_cached
        else:
            pairs = w.interactions(l_new, l_cached)
            cached = w.cached(l_cached)
            self.raw_interactions += (l_new + l_cached) * l_new
            self.raw_cached += l_cached
        self.n_interactions += pairs
        self.n_cached += cached
        if l_new > self.prefill_above:  # a prefill to the attention backend (module docstring)
            self.n_prefill_interactions += pairs
            self.n_prefill_cached += cached
        self.n_requests += 1
        self.n_arrivals += arriving
        self.n_logits += l_new if logits is None else logits

    def add_alike(
        self, count: int, l_new: int, l_cached_sum: int, arriving: bool = True, windowed_sum: int = -1
    ) -> None:
        """``count`` members of L_new new tokens each, their L_cached summing to ``l_cached_sum``
        (an engine step's decodes, logits at every new token): the same sums as ``count`` calls of
        :meth:`add`. Under a :class:`Window`, ``windowed_sum`` is the sum of min(L_cached,
        window): the sums then are :meth:`add`'s where no member's L_cached + L_new crosses the
        window's end, and at most ``count`` x L_new x L_new more where one does."""
        self.n_linear += count * l_new
        w = self.window
        if w is None:
            pairs = (count * l_new + l_cached_sum) * l_new
            cached = l_cached_sum
        else:
            if windowed_sum < 0:
                raise ValueError("Shape.add_alike under a window needs windowed_sum")
            keys = min(windowed_sum + count * l_new, count * w.tokens)  # per windowed layer
            full = count * l_new + l_cached_sum
            pairs = round((1 - w.share) * full * l_new + w.share * keys * l_new)
            cached = round((1 - w.share) * l_cached_sum + w.share * windowed_sum)
            self.raw_interactions += full * l_new
            self.raw_cached += l_cached_sum
        self.n_interactions += pairs
        self.n_cached += cached
        if l_new > self.prefill_above:
            self.n_prefill_interactions += pairs
            self.n_prefill_cached += cached
        self.n_requests += count
        self.n_arrivals += count * arriving
        self.n_logits += count * l_new

    def uncapped(self) -> tuple[int, int]:
        """(N_interactions, N_cached) with every layer counted in full: what a drafter's own
        layers, which keep every token, read and attend to."""
        if self.window is None:
            return self.n_interactions, self.n_cached
        return self.raw_interactions, self.raw_cached

    @classmethod
    def of(cls, members: Iterable[tuple[int, int]], arriving: bool = True, prefill_above: int = 1) -> Shape:
        """The shape of a batch given its members' (L_new, L_cached)."""
        shape = cls(prefill_above=prefill_above)
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
        return (
            isinstance(other, Shape)
            and self.as_tuple() == other.as_tuple()
            and self.n_prefill_interactions == other.n_prefill_interactions
            and self.n_prefill_cached == other.n_prefill_cached
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            "Shape(n_linear={}, n_interactions={}, n_cached={}, n_requests={}, n_arrivals={}, "
            "n_logits={}, n_prefill_interactions={}, n_prefill_cached={})".format(
                *self.as_tuple(), self.n_prefill_interactions, self.n_prefill_cached
            )
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """What one batch may hold on a replica: KV blocks, requests and new tokens per pass."""

    total_blocks: int
    block_size: int = 16
    max_requests: int = 256
    max_new_tokens: int = 16384
    prefill_above: int = 1  # members with more new tokens are prefills to the attention backend (Shape)


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
        self.shape = Shape(prefill_above=limits.prefill_above)
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
