"""A replica's front: what a request passes before the engine sees it (issue 36; issue 43).

Every request passes the server's front end (``server.host.frontend``: the calibrated HTTP and
tokenization latency, :attr:`wispsim.model.profiles.Profile.frontend`) and one API-server
process (``server.host.api_server_count`` processes; :meth:`wispsim.model.host_cpu.HostCPU.api`): a
serial process that handles its requests first come, first served, each for its CPU time. A
device's requests all go to one process (its connection), ``session mod count``. While the
processes keep up this only delays each request by its own service time; when the request rate
nears ``count / service`` they queue, and the API servers, not the GPU, cap what the replica
serves. Each process is a clock of when it is next free (its work is deterministic and FIFO), so a
request costs one event: it is handed to the engine when its service ends.

What a request costs there is the serving component's: a verification round parses its token ids
(all of them re-submitted, its new ones resident: the verifier's kind,
:mod:`wispsim.model.verifier_kinds`); a response to generate has its text prompt tokenized, after
the front end's latency. The front end's latency is charged to responses only, as it was
calibrated (on public benchmark runs of centralized serving). A response's tokens come back the
same way, as vLLM V1's API server passes them (:meth:`GenerationFront.stream`): its output
handler walks each engine step's message, making each response's output and putting it in the
response's collector, a slice of 128 outputs at a time, and each response's task then writes what
its collector holds as one chunk (a server-sent event). The handler reads the next message without
yielding when one is queued, so a process that falls behind *merges* a response's outputs of
several steps into one chunk -- which saves the chunk's cost, not the output's
(``benchmarks/vllm/merge_cost.py``) -- and a busy API server delays first tokens, stretches the
gaps between chunks and, in a closed loop, the next request.

A front counts what it holds, not yet handed to the engine, in what a router reads of its replica
(a real router counts the requests it sent and has no answer for: it cannot see the engine's
queue); everything else a router asks goes to the engine, by name. The run's only replica takes
its rounds as data (:mod:`wispsim.sim.inbox`): :meth:`RoundFront.accept` is its API servers' part.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

if TYPE_CHECKING:
    from wispsim.model.continuous import Sequence
    from wispsim.model.host_cpu import HostCPU
    from wispsim.model.verifier_kinds import VerifierKind
    from wispsim.sim.centralized import CentralizedServer
    from wispsim.sim.generation import Generation
    from wispsim.sim.verifier import Request, Verifier


# outputs the handler walks before it lets other tasks run (vLLM's VLLM_V1_OUTPUT_PROC_CHUNK_SIZE)
OUTPUT_SLICE = 128


class _Front:
    """The API-server processes of one replica: when each is next free, and when it was busy from
    ``since`` on (``spans``: start and end pairs, contiguous work merged), for what a run says
    binds (:mod:`wispsim.analysis.binding`)."""

    def __init__(self, env: simpy.Environment, host: HostCPU, since: float = 0.0) -> None:
        self.env = env
        self.host = host
        self.free_at = [0.0] * host.api_servers
        self.since = since  # the measurement window's start: earlier work is not kept
        self.spans = [array("d") for _ in range(host.api_servers)]

    def _book(self, p: int, start: float, end: float) -> None:
        """Process ``p`` works from ``start`` to ``end`` (it was free at ``start``)."""
        if end <= self.since:
            return
        s = self.spans[p]
        if s and s[-1] == start:
            s[-1] = end
        else:
            s.append(start if start > self.since else self.since)
            s.append(end)

    def _serve(self, session: int, seconds: float) -> float:
        """Queue ``seconds`` of work on the session's process; returns the delay until it is done."""
        return self._serve_at(session, seconds, self.env.now)

    def _serve_at(self, session: int, seconds: float, now: float) -> float:
        """:meth:`_serve` for work that arrives at ``now`` (no later than anything queued after it)."""
        p = session % len(self.free_at)
        f = self.free_at[p]
        self.free_at[p] = end = (f if f > now else now) + seconds
        s = self.spans[p]
        if f >= now and s and s[-1] == f:  # back to back: the span goes on (_book, inlined)
            s[-1] = end
        else:
            self._book(p, f if f > now else now, end)
        return end - now

    def busy(self, window: tuple[float, float]) -> list[float]:
        """Seconds each process worked inside ``window``."""
        w0, w1 = window
        out = []
        for s in self.spans:
            a = np.frombuffer(s, dtype=float) if len(s) else np.zeros(2)
            out.append(float((np.clip(a[1::2], w0, w1) - np.clip(a[0::2], w0, w1)).sum()))
        return out


class RoundFront(_Front):
    """The API servers in front of a verification replica (:class:`~wispsim.sim.verifier.Verifier`)."""

    def __init__(
        self, env: simpy.Environment, engine: Verifier, host: HostCPU, kind: VerifierKind, since: float = 0.0
    ) -> None:
        super().__init__(env, host, since)
        self.engine = engine
        self.kind = kind
        engine.inbox.front = self  # rounds posted as data pass these API servers (sim.inbox)
        # a dict, not a set, so it is summed in arrival order and the same seed routes the same way
        self.held: dict[Request, None] = {}

    def _hand(self, r: Request) -> None:
        del self.held[r]
        self.engine.submit(r)

    def submit(self, r: Request) -> simpy.Event:
        """Hand a round to the verifier when its API server is done with it; returns the event of
        its verdict."""
        self.held[r] = None
        resumed, ids = self.kind.api_work(r, self.engine.held(r.session))
        delay = self._serve(r.session, self.host.api(resumed, ids=ids))
        r.send(self.env, delay, self._hand)  # the arrival event is the request itself
        return r.done

    def accept(self, r: Request, t: float) -> float:
        """:meth:`submit` for a round that reached the server at ``t`` (the engine as it was then),
        as data (:mod:`wispsim.sim.inbox`): returns when the API server hands it over."""
        resumed, ids = self.kind.api_work(r, self.engine.held(r.session))
        return t + self._serve_at(r.session, self.host.api(resumed, ids=ids), t)

    def post(self, r: Request) -> None:
        """A round whose uplink ends at ``r.arrival``, as data (:mod:`wispsim.sim.inbox`)."""
        self.engine.post(r)

    def cost(self, r: Request) -> float:
        return self.engine.cost(r)

    def outstanding(self, now: float) -> float:
        """The verifier's outstanding seconds of work plus the marginal cost of the rounds the API
        servers still hold (the ``least-work`` and ``affinity`` routers' signal)."""
        held = sum(self.engine.cost(r) for r in self.held)
        return self.engine.outstanding(now) + held

    def drop(self, session: int) -> None:
        self.engine.drop(session)


class GenerationFront:
    """The front end and API servers in front of a centralized replica
    (:class:`~wispsim.sim.centralized.CentralizedServer`): ``frontend`` seconds, then (``host``)
    the prompt tokenized by the connection's API-server process (``chat``: through the chat
    endpoint), which also streams the response's tokens back (:meth:`stream`)."""

    def __init__(
        self,
        env: simpy.Environment,
        engine: CentralizedServer,
        host: HostCPU | None,
        frontend: float,
        chat: bool = False,
        since: float = 0.0,
    ) -> None:
        self.env = env
        self.chat = chat  # clients call the chat endpoint (server.host.endpoint)
        self.engine = engine
        self.api = _Front(env, host, since) if host is not None else None
        self.frontend = frontend
        self.held: dict[Generation, None] = {}
        count = len(self.api.free_at) if self.api is not None else 0
        self._queue: list[list[list[tuple[Sequence, int, int]]]] = [[] for _ in range(count)]  # messages
        self._busy = [False] * count  # the handler or the tasks have work queued (events pending)
        # outputs in each response's collector not yet written, by process (insertion ordered)
        self._pending: list[dict[Sequence, int]] = [{} for _ in range(count)]
        if self.api is not None:
            engine.outputs = self.stream

    def stream(self, outputs: list[tuple[Sequence, int, int]]) -> None:
        """One engine step's outputs, ``(response, id, tokens)`` each, to the API servers that
        stream them (the module text): each process queues the step's message for its output
        handler, and the engine hears of each chunk as it is written (``engine.written``)."""
        count = len(self._queue)
        by_process: list[list[tuple[Sequence, int, int]]] = [[] for _ in range(count)]
        for item in outputs:
            by_process[item[1] % count].append(item)
        for p, mine in enumerate(by_process):
            if mine:
                self._queue[p].append(mine)
                if not self._busy[p]:
                    self._busy[p] = True
                    self._handle(p)

    def _handle(self, p: int) -> None:
        """Process ``p``'s output handler walks the oldest step message it has (vLLM's
        ``output_handler``): the message, then each output (detokenized, a ``RequestOutput`` made
        and put in its response's collector, which merges it into one not yet taken), in slices of
        :data:`OUTPUT_SLICE` with the responses' tasks let run between slices (they write their
        chunks); then it looks for the next message (:meth:`_after`)."""
        api, env = self.api, self.env
        assert api is not None
        now = env.now
        free = api.free_at[p]
        if free > now:  # the process is busy with a request: the handler goes on after it
            env.timeout(free - now).callbacks.append(lambda _: self._handle(p))
            return
        host = api.host
        msg = self._queue[p].pop(0)
        pending = self._pending[p]
        t = now + host.api_step
        for i in range(0, len(msg), OUTPUT_SLICE):
            if i:  # ``await asyncio.sleep(0)`` between slices: the woken tasks write their chunks
                t = self._write(p, t)
            for s, _, tokens in msg[i : i + OUTPUT_SLICE]:
                t += host.output(tokens)
                pending[s] = pending.get(s, 0) + 1
        api._book(p, now, t)
        api.free_at[p] = t
        env.timeout(t - now).callbacks.append(lambda _: self._after(p))

    def _after(self, p: int) -> None:
        """The handler is done with a message: the next one if it is queued (read without
        yielding, so the responses' tasks wait and their collectors merge what comes), else the
        tasks run and write a chunk each."""
        api = self.api
        assert api is not None
        if self._queue[p]:
            self._handle(p)
            return
        now = self.env.now
        free = api.free_at[p]
        start = free if free > now else now
        end = self._write(p, start)
        api._book(p, start, end)
        api.free_at[p] = end
        self._busy[p] = False

    def _write(self, p: int, t: float) -> float:
        """Every response with outputs in process ``p``'s collectors writes one chunk, in the
        order they were put, from ``t``; returns when the last is written."""
        assert self.api is not None
        chunk = self.api.host.api_chunk
        pending = self._pending[p]
        for s, outputs in pending.items():
            t += chunk
            self.engine.written(s, t, outputs)
        pending.clear()
        return t

    def _hand(self, g: Generation) -> None:
        del self.held[g]
        self.engine.submit(g)

    def _api(self, g: Generation) -> None:
        assert self.api is not None
        # a text prompt, tokenized (through the chat template where clients call the chat endpoint)
        delay = self.api._serve(g.rid, self.api.host.api(False, text=g.prompt, chat=self.chat))
        self.env.timeout(delay).callbacks.append(lambda _: self._hand(g))

    def submit(self, g: Generation) -> simpy.Event:
        """Hand a response to the engine once the front end and its API server are done with it;
        returns the event of its :class:`~wispsim.sim.generation.Served` value."""
        self.held[g] = None
        nxt: Any = self._api if self.api is not None else self._hand
        if self.frontend > 0:
            self.env.timeout(self.frontend).callbacks.append(lambda _: nxt(g))
        else:
            nxt(g)
        return g.done

    def outstanding_tokens(self) -> int:
        """The engine's outstanding tokens plus those of the responses still held here
        (centralized routing's signal)."""
        held = sum(g.prompt + g.output for g in self.held)
        return self.engine.outstanding_tokens() + held

    @property
    def preemptions(self) -> int:
        return self.engine.preemptions
