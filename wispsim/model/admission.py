"""KV admission control: a session-aware verifier's gate on new responses (``server.verifier.kv_policy``).

With ``lru`` (vLLM's automatic prefix cache) every response starts at once and idle prefixes are
evicted least recently used first when memory runs short, so past the memory cliff rounds turn
cold. With ``admission`` the verifier does what centralized serving does: a response's first round
is admitted only when its reservation fits beside those of the responses already admitted, and
waits otherwise; an admitted response's prefix stays cached until the response ends.

A response's reservation is the KV blocks of ``max(prompt + growth, current length) + k_max + 1``
tokens: its prompt, the output it is expected to grow by (``server.verifier.kv_growth``: the workload's
``mean`` output, or its ``max`` for a hard guarantee), and one round's draft and bonus token. The
reservations of all admitted responses fit in ``(1 - server.verifier.kv_headroom)`` of the cache. A
response that outgrows its reservation (longer than the expected output) grows it; with ``mean``
growth the cache can then overflow, and the memory model evicts an admitted prefix as a last
resort (counted as an eviction in the batch records), never silently.

Where each admitted response takes a slot of the engine's own (a resident session is a paused
vLLM request, and vLLM runs at most ``max_num_seqs`` requests, paused ones included),
``max_sessions`` caps how many are admitted at once: under ``server.verifier.kind: resident``
(the ``vllm-sessions`` and ``wisp-grpc`` builds, both sessions kept in vLLM) the scenario's
``max_num_seqs``, in the simulator and the real server alike (the real server's engine is built
with that ``--max-num-seqs``). A re-submitted round holds a
slot only while it is verified, so the stock build has no such cap.

Waiting responses are admitted in ``server.verifier.kv_admission_order``: ``fcfs`` (arrival order, the head
blocks the rest, so nobody starves) or ``deadline`` (earliest first-round deadline first, so a
tighter class goes ahead; still head-of-line, so a large prompt is not starved by small ones).
The time a response waits counts against its SLO like any other: its first round's deadline is
set when it arrives, not when it is admitted.

This is a pure object (no clock, no SimPy): the simulated verifier and the real server
(:mod:`wispsim.serve.verify`) both drive it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from wispsim.config import Scenario
from wispsim.model.batch import blocks as blocks_of

KV_POLICIES = ("lru", "admission")
ADMISSION_ORDERS = ("fcfs", "deadline")


@dataclass(slots=True)
class _Waiting:
    session: int
    prompt: int
    arrival: float
    deadline: float
    seq: int
    item: Any  # what the caller queues: a round (simulated or real)


@dataclass(slots=True)
class Admission:
    """Which responses hold a KV reservation, and which wait for one.

    ``offer`` is called with a response's first round (any later round of an admitted response
    passes straight through); ``grow`` after each round with the response's committed length;
    ``release`` when the response ends, returning the waiting rounds admitted in its place.
    """

    total_blocks: int
    block_size: int
    growth_tokens: int
    round_tokens: int  # k_max + 1: one round's draft and bonus token
    headroom: float = 0.0
    order: str = "fcfs"
    max_sessions: int | None = None  # at most this many admitted at once (None: as many as fit)
    reserved: dict[int, int] = field(default_factory=dict)  # session -> blocks reserved
    prompts: dict[int, int] = field(default_factory=dict)  # session -> its prompt's tokens
    waiting: list[_Waiting] = field(default_factory=list)
    used: int = 0
    _seq: int = 0

    @property
    def limit(self) -> int:
        """Blocks the reservations may take: the cache less its headroom."""
        return max(int(self.total_blocks * (1.0 - self.headroom)), 1)

    def blocks(self, tokens: int) -> int:
        return blocks_of(tokens, self.block_size)

    def reservation(self, prompt: int, length: int | None = None) -> int:
        """Blocks reserved for a response of ``prompt`` tokens now ``length`` tokens long."""
        tokens = max(prompt + self.growth_tokens, length or 0)
        return self.blocks(tokens + self.round_tokens)

    def admitted(self, session: int) -> bool:
        return session in self.reserved

    def _fits(self, blocks: int) -> bool:
        # an empty server admits anything (the scenario checks guarantee one response fits)
        if self.max_sessions is not None and len(self.reserved) >= self.max_sessions:
            return False
        return not self.reserved or self.used + blocks <= self.limit

    def _admit(self, session: int, prompt: int, blocks: int) -> None:
        self.reserved[session] = blocks
        self.prompts[session] = prompt
        self.used += blocks

    def offer(self, session: int, prompt: int, arrival: float, deadline: float, item: Any) -> bool:
        """A response's first round arrives: True if it may be queued now, else it waits."""
        if session in self.reserved:
            return True
        need = self.reservation(prompt)
        if not self.waiting and self._fits(need):
            self._admit(session, prompt, need)
            return True
        self.waiting.append(_Waiting(session, prompt, arrival, deadline, self._seq, item))
        self._seq += 1
        if self.order == "deadline":
            self.waiting.sort(key=lambda w: (w.deadline, w.seq))
        return False

    def grow(self, session: int, length: int) -> None:
        """After a round: the response is ``length`` tokens; its reservation covers at least that."""
        held = self.reserved.get(session)
        if held is None or length + self.round_tokens <= held * self.block_size:
            return  # still inside its reservation (most rounds: this is on the hot path)
        need = self.reservation(self.prompts[session], length)
        if need > held:
            self.reserved[session] = need
            self.used += need - held

    def release(self, session: int) -> list[Any]:
        """A response ended (or was abandoned): free its reservation and admit who now fits,
        in order, stopping at the first that does not. Returns the admitted waiting items."""
        held = self.reserved.pop(session, None)
        self.prompts.pop(session, None)
        if held is not None:
            self.used -= held
        else:  # a response that ends while still waiting leaves the line
            self.waiting = [w for w in self.waiting if w.session != session]
        return self.admit_waiting()

    def admit_waiting(self) -> list[Any]:
        out: list[Any] = []
        while self.waiting:
            w = self.waiting[0]
            need = self.reservation(w.prompt)
            if not self._fits(need):
                break
            self.waiting.pop(0)
            self._admit(w.session, w.prompt, need)
            out.append(w.item)
        return out

    def clear(self) -> None:
        self.reserved.clear()
        self.prompts.clear()
        self.waiting.clear()
        self.used = 0


def make_admission(
    scenario: Scenario, total_blocks: int, block_size: int, outputs: tuple[float, float] | None = None
) -> Admission | None:
    """The scenario's admission control for one replica of ``total_blocks`` blocks, or None
    under ``server.verifier.kv_policy: lru``. ``outputs``: (mean, max) output tokens where the workload's
    distribution does not describe them (a request trace sets every response's length)."""
    srv = scenario.server
    if srv.verifier.kv_policy != "admission":
        return None
    out = scenario.workload.output_tokens
    mean, top = outputs if outputs is not None else (out.nominal(), out.support()[1])
    growth = {"mean": mean, "max": top, "none": 0.0}[srv.verifier.kv_growth]
    adm: Admission = Admission(
        total_blocks,
        block_size,
        math.ceil(min(growth, 1e9)),  # check_memory already requires a finite maximum
        scenario.drafting.largest + 1,
        srv.verifier.kv_headroom,
        srv.verifier.kv_admission_order,
    )
    if srv.verifier.kind == "resident":  # a paused session holds one of the engine's request slots
        adm.max_sessions = srv.engine.max_num_seqs
    return adm
