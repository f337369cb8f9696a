"""Centralized serving's engine: continuous batching on SimPy's clock (SPEC 3.3).

The scheduling is pure and lives in :class:`wispsim.model.continuous.ContinuousBatcher` (admit,
grow with recompute preemption, compose chunked-prefill steps, commit) over one block manager;
this is the engine loop around it, vLLM's ``EngineCore.step``: schedule -> price -> run -> commit.
A response whose last prefill chunk runs in a step gets its first token from that step; its
``done`` event succeeds with :class:`~wispsim.sim.generation.Served` once its last token is out of
the API server that streams it (:mod:`wispsim.sim.front`; when its first chunk was, the chunks,
and its times at the engine: when it arrived, when the first step it could join began, when the
first step that ran it began).

With server-side speculation (``spec``, :mod:`wispsim.model.speculation`) a decoding response's
step verifies ``k + 1`` tokens (L_new = k + 1), holds KV for them (vLLM's lookahead slots), and
commits the accepted run of its drafts plus one token; the drafter's passes follow the target's
in the same step (for the responses whose prefill ends in it too: their first drafts), priced
with the step's noise draw. A step's tokens reach the device as one chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from itertools import count
from typing import Any

import simpy

from wispsim.errors import ConfigError
from wispsim.model.batch import Window
from wispsim.model.continuous import ContinuousBatcher, Sequence, Step
from wispsim.model.latency import Pricing, StepTime
from wispsim.model.memory import KVMemory
from wispsim.model.speculation import Speculation
from wispsim.sim.generation import Generation, PromptCache, Served
from wispsim.sim.records import BatchRecord, Holdings, RecordTable


class CentralizedServer:
    """One GPU replica generating every token with continuous batching (module docstring):
    ``total_blocks`` KV blocks of ``block_size`` tokens, at most ``max_running`` responses
    running, ``step_tokens`` tokens a step; ``prompts``: its prefix cache."""

    def __init__(
        self,
        env: simpy.Environment,
        total_blocks: int,
        block_size: int,
        max_running: int,
        step_tokens: int,
        pricing: Pricing,
        batches: RecordTable,
        batch_ids: count[int],
        replica: int = 0,
        async_scheduling: bool = False,
        spec: Speculation | None = None,
        prompts: PromptCache | None = None,
        chunk_times: dict[int, list[float]] | None = None,
        static: bool = False,
        chunked: bool = True,
        v0: bool = False,
        scheduler_steps: int = 1,
        stream_steps: bool = True,
        window: Window | None = None,
    ) -> None:
        self.env = env
        # when each response's chunks left the engine, by response id (None: not kept; a benchmark
        # keeps them for vLLM's ITL, every gap between a request's chunks)
        self.chunk_times = chunk_times
        self.prompts = prompts or PromptCache(block_size, False)  # this replica's prefix cache
        self.spec = spec
        self.memory = KVMemory(total_blocks, block_size, prefix_cache=False, window=window)
        # vLLM's async scheduling forms step n+1 while step n runs: a request arriving during a
        # step can join only the step after next (unless the engine is idle)
        self.async_scheduling = async_scheduling
        lookahead = spec.k + 1 if spec is not None else 1  # KV slots a decode step writes
        # a speculating engine's attention backend decodes k + 1 tokens (vLLM raises its
        # reorder_batch_threshold to them; Triton MLA, below Hopper, does not: not modelled)
        above = max(pricing.cost.prefill_above, lookahead)
        self.batcher = ContinuousBatcher(
            self.memory, max_running, step_tokens, lookahead, async_scheduling, static,
            chunked=chunked, prefill_first=v0 and not chunked, steps=scheduler_steps, prefill_above=above,
        )  # fmt: skip
        # V0's multi-step scheduling: steps left in the running run, the step it continues, and
        # whether its tokens stream step by step (vLLM's --multi-step-stream-outputs) or at its end
        self._left = 0
        self._last: Step | None = None
        self.stream_steps = stream_steps
        self._burst = False  # the running run streams at its end
        # what the next outputs are counted from ((response, chunks, tokens) before the step or
        # run; None: not tracked), and the responses that ended since, done once it streams
        self._unit: list[tuple[Sequence, int, int]] | None = None
        self._held: list[Sequence] = []
        self.pricing = pricing  # a step's time by its parts, at one point (wispsim.model.latency)
        self.batches = batches
        self._ids = batch_ids
        self.replica = replica
        self._wake: simpy.Event | None = None
        self._in_step = False
        self._steps = 0  # steps begun
        # responses waiting for the step they could first join to begin, by that step's number
        self._eligible: dict[int, list[Sequence]] = {}
        # the API servers a step's outputs pass before they stream out: given (response, id, tokens)
        # of each response the step gave tokens; they call ``written`` for each chunk they write
        # (wispsim.sim.front); None: none, out at once
        self.outputs: Callable[[list[tuple[Sequence, int, int]]], None] | None = None
        self._unwritten: dict[Sequence, int] = {}  # outputs handed to the API servers, not yet out
        self._sent: dict[Sequence, int] = {}  # chunks out so far, of the responses tracked
        self._ended: dict[Sequence, None] = {}  # responses that ended, not yet done
        self.holdings = Holdings()
        env.process(self.loop())

    def held_shares(self, window: tuple[float, float]) -> tuple[float, float, float]:
        """Mean KV and ``max_num_seqs`` shares, seconds of steps that left work waiting (Holdings)."""
        return self.holdings.shares(window)

    @property
    def preemptions(self) -> int:
        return self.batcher.preemptions

    def outstanding_tokens(self) -> int:
        """Tokens still to process here (prefill and decode), for routing."""
        return self.batcher.outstanding_tokens()

    def submit(self, g: Generation) -> simpy.Event:
        """Queue a response to generate; returns the event of its ``done`` value."""
        if self.spec is not None and g.runs is None:
            raise ValueError("a speculating server needs each response's acceptance runs")
        if not self.batcher.chunked and g.prompt + g.output > self.batcher.step_tokens:
            raise ConfigError(
                "server.engine",
                "max_num_batched_tokens",
                f"{self.batcher.step_tokens:,} tokens cannot hold a request of {g.prompt + g.output:,} "
                "(prompt + output) without chunked prefill (vLLM needs it >= max_model_len); allowed: "
                f">= {g.prompt + g.output:,}, or enable_chunked_prefill: true",
            )
        s = Sequence(g, g.prompt, g.output, self.prompts.hit(g), g.runs)
        s.submitted = self.env.now
        # the first step it could join: the next (async scheduling: the one after), after the
        # multi-step run under way
        s.eligible = self._steps + self._left + (1 if self.async_scheduling and self._in_step else 0)
        self._eligible.setdefault(s.eligible, []).append(s)
        self.batcher.add(s)
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None
        return g.done

    def loop(self) -> Generator[Any, Any, None]:
        """The engine's steps: schedule -> price -> run -> commit (vLLM's ``EngineCore.step``)."""
        env = self.env
        batcher = self.batcher
        while True:
            fresh = not self._left
            if fresh:
                idle = not batcher.running
                if idle and not batcher.waiting:
                    self._wake = env.event()
                    yield self._wake
                step = batcher.schedule(idle, env.now)
                if step is None:
                    continue
                # a run of multi-step decodes; a prefill-only step (V0 without chunking) runs once
                self._left = batcher.run_length(step) - 1
            else:  # the rest of a multi-step run: the same sequences, no scheduling
                assert self._last is not None
                nxt = batcher.advance(self._last)
                if nxt is None:  # none of the run decodes on: it ends here
                    self._left = 0
                    batcher.release()
                    if self._burst:
                        self._stream()
                    continue
                step = nxt
                self._left -= 1
            self._last = step
            self._price(step, fresh)
            start = env.now
            for s in self._eligible.pop(self._steps, ()):
                s.t_eligible = start
            self._steps += 1
            bid = next(self._ids)
            used = self.memory.used
            running = len(batcher.running)
            self.holdings.log(
                start, step.latency, used / self.memory.total_blocks, running / batcher.max_running,
                running > len(step.work),
            )  # fmt: skip
            batcher.begin()  # what the step scheduled during this one can see
            self._in_step = True
            yield env.timeout(step.latency)
            self._in_step = False
            if fresh:  # a run streaming at its end streams what it gave since its start
                self._burst = not self.stream_steps and self._left > 0
            if fresh or not self._burst:  # what this step's (run's) chunks are counted from
                track = self._burst or self.chunk_times is not None or self.outputs is not None
                self._unit = [(s, s.chunks, s.generated) for s, _ in step.work] if track else None
            finished = batcher.commit(step, env.now, release=not self._left)
            self._held.extend(finished)
            if not (self._burst and self._left):
                self._stream()
            self.batches.append(
                BatchRecord(
                    bid,
                    self.replica,
                    "step",
                    start,
                    env.now,
                    len(step.work),
                    # (mid-way through a multi-step run the ended ones are still running)
                    len(batcher.running) + len(batcher.waiting) + (0 if self._left else len(finished)),
                    step.shape.n_linear,
                    step.shape.n_interactions,
                    step.shape.n_cached,
                    step.t_hat,
                    step.latency,
                    used,
                    0,
                    step.took.gpu,
                    step.took.cpu,
                )
            )

    def _stream(self) -> None:
        """A step's outputs -- or, where a multi-step run streams at its end, the run's -- leave
        the engine (:meth:`_deliver`), and the responses that ended in it are done once their
        last chunk is out (:meth:`written`)."""
        held, self._held = self._held, []
        for s in held:
            self._ended[s] = None
        if self._unit is not None:
            self._deliver(self._unit)
        now = self.env.now
        for s in held:
            if s in self._ended and s not in self._unwritten:  # no output tracked: out now
                self._finish(s, now)

    def _deliver(self, unit: list[tuple[Sequence, int, int]]) -> None:
        """The outputs of a step (or a run streaming at its end: one output per response) to the
        API servers (``outputs``; none: out at once): ``unit`` holds each response's chunks and
        tokens before it. The API servers call :meth:`written` for each chunk they write."""
        got = [(s, s.generated - g, c) for s, c, g in unit if s.chunks > c]
        unwritten = self._unwritten
        for s, _, c in got:
            s.chunks = c + 1  # (a run streaming at its end: its steps' tokens are one output)
            unwritten[s] = unwritten.get(s, 0) + 1
        if self.outputs is not None:
            self.outputs([(s, s.item.rid, n) for s, n, _ in got])
        else:
            now = self.env.now
            for s, _, _ in got:
                self.written(s, now, 1)

    def written(self, s: Sequence, t: float, outputs: int) -> None:
        """A chunk of response ``s`` is out of its API server at ``t`` (now or later), carrying
        ``outputs`` of the outputs handed to it (more than one: its collector merged them). Its
        first chunk's time is its first token's; every chunk's is kept where a benchmark asks
        (``chunk_times``); a response that ended is done with its last."""
        sent = self._sent.get(s, 0)
        if not sent:
            s.first = t
        self._sent[s] = sent + 1
        if self.chunk_times is not None:
            self.chunk_times.setdefault(s.item.rid, []).append(t)
        left = self._unwritten[s] - outputs
        if left:
            self._unwritten[s] = left
            return
        del self._unwritten[s]
        if s in self._ended:
            self._finish(s, t)

    def _finish(self, s: Sequence, t: float) -> None:
        """Response ``s`` is done at ``t`` (now or later): its :class:`Served`, with the chunks it
        was streamed in (where none were tracked, one per step that gave it tokens)."""
        del self._ended[s]
        eligible = s.t_eligible if s.t_eligible <= s.scheduled else s.scheduled
        served = Served(s.first, self._sent.pop(s, s.chunks), s.submitted, eligible, s.scheduled)
        delay = t - self.env.now
        if delay > 0.0:
            self.env.timeout(delay).callbacks.append(lambda _, d=s.item.done, v=served: d.succeed(v))
        else:
            s.item.done.succeed(served)

    def _price(self, step: Step, scheduled: bool = True) -> None:
        """The step's estimate and time by its parts: the GPU's pass (the drafter's passes added,
        with the step's noise draw), then the engine core's CPU beside it -- none for a later
        step of a multi-step run (not ``scheduled``: V0 advances its inputs on the GPU)."""
        price = self.pricing
        step.t_hat = price.cost.price(step.shape)
        gpu = price.gpu(step.shape, step.t_hat)
        if self.spec is not None:
            interactions, cached = step.shape.uncapped()  # the drafter's layers keep every token
            drafting = self.spec.draft_time(
                step.shape.n_linear, interactions, cached, step.decoding, step.decoded_context
            )
            gpu += drafting * (gpu / step.t_hat if step.t_hat > 0 else 1.0)
            step.t_hat += drafting
        step.took = price.step(gpu, step, Step.engine_work) if scheduled else StepTime(gpu, 0.0, gpu)
        step.latency = step.took.total
