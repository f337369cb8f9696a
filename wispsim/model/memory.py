"""Paged KV memory with a prefix cache and LRU eviction (SPEC 2.3).

Memory is counted in blocks of ``block_size`` tokens. Between rounds, a response's committed
prefix stays cached (when the prefix cache is on), holding ceil(prefix / block_size) blocks. A
batch needs blocks for every member's L_total; to make room the server evicts idle cached
prefixes, least recently used first. A session whose prefix was evicted is cold on its next
round: it forwards its whole prefix again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from mypy_extensions import mypyc_attr

from wispsim.config import Scenario, ServerConfig
from wispsim.errors import ConfigError
from wispsim.model.batch import Window
from wispsim.model.batch import blocks as blocks_of
from wispsim.model.speculation import memory_extra
from wispsim.model.startup import profile_startup

if TYPE_CHECKING:
    from wispsim.model.profiles import Profile


class _Finished(NamedTuple):
    """A round that finished outside a batch (:meth:`KVMemory.finish_round`)."""

    session: int
    prefix_after: int


@mypyc_attr(allow_interpreted_subclasses=True)  # a test subclasses it (wispsim.native)
class KVMemory:
    """Block accounting for one GPU replica's KV cache.

    ``eviction`` says how much of an idle prefix is evicted to make room: ``session`` (SPEC 2.3)
    drops the least recently used session's whole prefix, so its next round is cold; ``block``
    (what vLLM v1's prefix cache does) frees only as many blocks as needed, from the tail of the
    least recently used prefix, so that session keeps a partial prefix hit.
    """

    __slots__ = (
        "block_size",
        "cache",
        "eviction",
        "evictions",
        "prefix_cache",
        "reuse_blocks",
        "total_blocks",
        "used",
        "window",
    )

    def __init__(
        self,
        total_blocks: int,
        block_size: int,
        prefix_cache: bool,
        eviction: str = "session",
        reuse: str = "token",
        window: Window | None = None,
    ) -> None:
        # sliding-window layers: memory counted in vLLM's pages, what a running sequence holds by
        # its window (seq_blocks; the speculative path's session cache has no window)
        self.total_blocks = window.pool(total_blocks) if window is not None else total_blocks
        self.window = window
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        self.eviction = eviction
        # vLLM's prefix cache hashes whole blocks: a prefix is reused only up to its last full
        # block and the partial tail is forwarded again ("block"); "token" reuses all of it
        self.reuse_blocks = reuse == "block"
        # session -> (cached tokens, blocks held), in LRU order (oldest first: a plain dict keeps
        # insertion order, and a prefix is popped and put back each time it is used)
        self.cache: dict[int, tuple[int, int]] = {}
        self.used = 0
        self.evictions = 0

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)  # batch.blocks, written out: a decode asks every step

    # --- blocks held by running sequences (centralized serving's continuous batching) ----------
    @property
    def free(self) -> int:
        """Blocks no one holds."""
        return self.total_blocks - self.used

    def take(self, n: int) -> None:
        """A running sequence takes ``n`` free blocks (the caller checked :attr:`free`)."""
        self.used += n

    def seq_blocks(self, tokens: int, new: int = 1) -> int:
        """Blocks a running sequence of ``tokens`` tokens holds in a step of ``new`` new tokens:
        :meth:`blocks`, or under sliding-window layers its pages (:meth:`Window.pages`)."""
        if self.window is None:
            return -(-tokens // self.block_size)
        return self.window.pages(tokens, new, self.block_size)

    def grow(self, held: int, tokens: int, new: int = 1) -> int:
        """A running sequence holding ``held`` blocks now has ``tokens`` tokens, ``new`` of them
        this step: takes the blocks it lacks (or gives back the ones a window let go) and returns
        how many it holds then, or -1 (taking none) if they are not free."""
        hold = self.seq_blocks(tokens, new)
        if hold - held > self.total_blocks - self.used:
            return -1
        self.used += hold - held
        return hold

    def give(self, n: int) -> None:
        """A sequence gives ``n`` blocks back (it finished, or was preempted)."""
        self.used -= n

    def cached_tokens(self, session: int) -> int:
        entry = self.cache.get(session)
        return entry[0] if entry else 0

    def hit(self, session: int, prefix: int) -> int:
        """Tokens of a ``prefix``-token prefix the cache would serve to ``session`` now: what it
        holds of the prefix, cut to whole blocks under block-granular reuse. The one cache-hit
        rule: :meth:`refresh` writes it out for speed."""
        entry = self.cache.get(session)
        if entry is None:
            return 0
        hit = entry[0] if entry[0] < prefix else prefix
        if self.reuse_blocks:
            hit -= hit % self.block_size
        return hit

    def refresh(self, queue: Iterable[Any]) -> None:
        """Set each queued round's L_new / L_cached / cold from the cache as it is now.

        A fully cached prefix forwards only the k draft tokens; a partly evicted one (``block``
        eviction), or under block-granular reuse the tail after its last whole block, forwards
        the rest of its prefix too; an evicted or uncached one is cold. The simulated verifier and
        the real server (:mod:`wispsim.serve.verify`) both call this at each dispatch epoch.
        :meth:`hit`, written out: this runs once per queued round and epoch.
        """
        get = self.cache.get
        whole = self.block_size if self.reuse_blocks else 0
        for r in queue:
            entry = get(r.session)
            if entry is None:
                r.l_new, r.l_cached, r.cold = r.prefix + r.k, 0, True
            else:
                hit = entry[0] if entry[0] < r.prefix else r.prefix
                if whole:
                    hit -= hit % whole
                r.l_new, r.l_cached, r.cold = r.prefix - hit + r.k, hit, hit == 0

    def _evict(self, need: int, protect: set[int] | None = None) -> int:
        """Free idle prefixes LRU-first until ``need`` more blocks fit; returns sessions hit."""
        hit = 0
        for s in list(self.cache):
            short = self.used + need - self.total_blocks
            if short <= 0:
                break
            if protect and s in protect:
                continue
            tokens, held = self.cache[s]
            take = held if self.eviction == "session" else min(held, short)
            self.used -= take
            hit += 1
            if take == held:
                del self.cache[s]
            else:  # tail blocks go first; the head of the prefix stays a cache hit
                keep = held - take
                self.cache[s] = (min(tokens, keep * self.block_size), keep)
        self.evictions += hit
        return hit

    def allocate(self, batch: Iterable[tuple[int, int]]) -> int:
        """Make room for a batch of (session, L_total); returns how many prefixes were evicted.

        The batch's own cached prefixes are kept; other idle prefixes are evicted LRU-first.
        """
        bs = self.block_size
        cache = self.cache
        get = cache.get
        sized = [(s, l_total, -(-l_total // bs)) for s, l_total in batch]  # blocks(), written out
        need = 0
        for s, _, nb in sized:
            entry = get(s)
            need += nb - (entry[1] if entry else 0)
        evicted = 0
        if self.used + need > self.total_blocks:
            evicted = self._evict(need, {s for s, _, _ in sized})
            if self.used + need > self.total_blocks:
                raise RuntimeError("batch does not fit in KV memory; the scheduler must prevent this")
        pop = cache.pop
        for s, l_total, nb in sized:
            old = pop(s, None)
            self.used += nb - (old[1] if old else 0)
            cache[s] = (l_total, nb)
        return evicted

    def finish_round(self, session: int, prefix: int) -> int:
        """After a round: keep the committed prefix of ``prefix`` tokens cached (most recently
        used), or free it; returns how many prefixes were evicted (see :meth:`finish_batch`)."""
        return self.finish_batch((_Finished(session, prefix),))

    def finish_batch(self, batch: Iterable[Any]) -> int:
        """After a batch: for each member in order (a ``session`` and its committed length
        ``prefix_after``), keep the committed prefix cached (most recently used), or free it.

        The committed prefix can be one block longer than what the batch held (it includes the
        bonus token the target sampled), so keeping it may need room: idle prefixes are evicted
        LRU-first, so ``used`` never exceeds ``total_blocks``. Returns how many were evicted.
        """
        cache, bs, total = self.cache, self.block_size, self.total_blocks
        keep = self.prefix_cache
        evicted = 0
        for r in batch:  # once per round: no calls
            session = r.session
            old = cache.pop(session, None)
            if old:
                self.used -= old[1]
            nb = -(-r.prefix_after // bs)  # blocks(), written out: once per round
            if keep and 0 < nb <= total:
                if self.used + nb > total:
                    evicted += self._evict(nb)
                self.used += nb
                cache[session] = (r.prefix_after, nb)
        return evicted

    def drop(self, session: int) -> None:
        """A response finished: free its prefix."""
        old = self.cache.pop(session, None)
        if old:
            self.used -= old[1]


DEFAULT_BLOCK_SIZE = 16  # vLLM's on a GPU


def block_size(configured: int | None, profile: Profile) -> int:
    """Tokens per KV block: the scenario's ``server.engine.block_size`` if it sets one, else the one the
    profile's engine was measured with (``kv_block_size``: 128 on vLLM's CPU backend), else 16."""
    if configured is not None:
        return configured
    return profile.kv_block_size or DEFAULT_BLOCK_SIZE


def kv_window(server: ServerConfig, profile: Profile) -> Window | None:
    """The profile's sliding-window layers as the server's engine keeps them (None: all attend in
    full, or vLLM V0, which has no hybrid KV cache manager and holds every layer in full)."""
    m = profile.model
    if not m.windowed_layers or server.engine.v0:
        return None
    return Window(m.sliding_window, m.layers, m.windowed_layers)


def kv_capacity(server: ServerConfig, profile: Profile) -> int:
    """Tokens of KV cache per replica: the scenario's ``server.engine.kv_capacity_tokens`` if it sets one
    (a real engine's measured capacity), else what the profile's GPU memory leaves (after a
    server-side draft model's weights, its KV sharing every token's bytes)."""
    if server.engine.kv_capacity_tokens is not None:
        return server.engine.kv_capacity_tokens
    weights, kv = memory_extra(server, profile)
    return profile.kv_capacity_tokens(
        server.engine.gpu_memory_utilization, reserve_gib(server, profile), weights, kv
    )


def reserve_gib(server: ServerConfig, profile: Profile) -> float:
    """GiB per GPU the KV cache cannot use beyond the weights: the scenario's
    ``server.engine.activation_reserve_gib`` if it sets one, else the peak of vLLM's start-up memory
    profile at its ``max_num_seqs`` and ``max_num_batched_tokens`` (:mod:`wispsim.model.startup`)."""
    engine = server.engine
    if engine.activation_reserve_gib is not None:
        return engine.activation_reserve_gib
    return profile_startup(profile, engine.max_num_seqs, engine.max_num_batched_tokens).reserve_gib


def check_memory(
    scenario: Scenario, capacity_tokens: int, profile: Profile, source: str = "scenario"
) -> None:
    """The KV cache must have room, and hold the longest possible response."""
    wl = scenario.workload
    if capacity_tokens <= 0:
        raise ConfigError(
            source,
            "server.engine.gpu_memory_utilization",
            "no memory is left for the KV cache after the weights and the activation reserve",
        )
    bs = block_size(scenario.server.engine.block_size, profile)
    blocks = capacity_tokens // bs
    if blocks < 1:
        given = scenario.server.engine.kv_capacity_tokens is not None  # the setting at fault
        raise ConfigError(
            source,
            "server.engine.kv_capacity_tokens" if given else "server.engine.block_size",
            f"{capacity_tokens:,} tokens of KV cache hold no block of {bs:,}; allowed: >= {bs:,}"
            if given
            else f"{bs:,} tokens is more than the whole KV cache ({capacity_tokens:,} tokens); "
            f"allowed: <= {capacity_tokens:,}",
        )
    longest = wl.prompt_tokens.support()[1] + wl.output_tokens.support()[1] + scenario.drafting.largest + 1
    if not math.isfinite(longest):
        raise ConfigError(source, "workload.output_tokens.max", "must be finite (the KV fit check needs it)")
    need = blocks_of(int(longest), bs)
    if need > blocks:
        raise ConfigError(
            source,
            "workload.output_tokens",
            f"the longest response ({int(longest)} tokens of prompt + output, {need:,} blocks of {bs}) "
            f"does not fit in the KV cache ({blocks:,} blocks, {capacity_tokens} tokens); lower the "
            "length limits or the block size, or raise memory",
        )
