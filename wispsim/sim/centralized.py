"""Centralized serving: the server generates every token with continuous batching (SPEC 3.3).

vLLM-style iteration-level scheduling. Each step decodes one token for every running response
whose prompt is processed, and spends the rest of a per-step token budget
(``server.prefill_chunk_tokens``) on prefill chunks of responses still being prefilled, oldest
first (chunked prefill). A response whose last prefill chunk runs in a step gets its first token
from that step; the response's ``done`` event succeeds with that step's end time (the device adds
the downlink time to get its first-token time). Step latency comes from the same estimator: a
decode is (L_new = 1, L_cached = context), a chunk is (L_new = chunk, L_cached = tokens already
prefilled).

KV memory: a waiting response is admitted (oldest first, at most ``max_batch_requests`` running)
when free blocks cover its whole context; each decode grows the context by one token. When a
decode needs a block and none is free, the most recently admitted response is preempted: its
blocks are freed and it goes back to the front of the queue to be recomputed (vLLM's recompute
preemption).

With server-side speculation (``spec``, :mod:`wispsim.model.speculation`) a decoding response's
step verifies ``k + 1`` tokens (L_new = k + 1), holds KV for them (vLLM's lookahead slots), and
commits the accepted run of its drafts plus one token; the drafter's passes follow the target's
in the same step (for the responses whose prefill ends in it too: their first drafts). Its
``done`` event succeeds with :class:`Served` (first-token time, chunks) either way: a step's
tokens reach the device as one chunk.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator
from itertools import count
from typing import Any

import simpy

from wispsim.model.batch import Shape, blocks
from wispsim.model.latency import Pricing, StepTime
from wispsim.model.speculation import Speculation
from wispsim.sim.generation import Generation, PromptCache, Served
from wispsim.sim.records import BatchRecord


class _Seq:
    __slots__ = (
        "blocks",
        "chunks",
        "context",
        "done",
        "eligible",
        "first",
        "generated",
        "hit",
        "new",
        "output",
        "prefilled",
        "prompt",
        "rid",
        "runs",
        "scheduled",
        "submitted",
        "t_eligible",
    )

    def __init__(self, g: Generation, hit: int) -> None:
        self.rid = g.rid
        self.prompt = prompt = g.prompt
        self.output = g.output
        self.done = g.done
        self.generated = 0
        self.first = 0.0  # when the step that gave the first token ended (done's value)
        self.hit = min(hit, prompt - 1)  # prompt tokens the prefix cache holds (a shared system prompt)
        self.prefilled = self.hit  # tokens of prompt + generated-so-far whose KV is computed
        self.new = True  # not yet scheduled: its first chunk is a request arriving anew
        self.context = prompt  # tokens that must be in KV before decoding
        self.blocks = 0
        self.chunks = 0  # steps that gave it tokens (one streamed chunk each)
        self.runs = g.runs  # speculation: drafts accepted in a row from each output position
        self.submitted = 0.0  # when the engine received it
        self.eligible = 0  # the first step that could have run it (async scheduling: one later)
        self.t_eligible = math.nan  # when that step began
        self.scheduled = -1.0  # when the first step that ran a chunk of it began


class CentralizedServer:
    """One GPU replica generating every token with continuous batching (module docstring)."""

    def __init__(
        self,
        env: simpy.Environment,
        total_blocks: int,
        block_size: int,
        max_running: int,
        step_tokens: int,
        pricing: Pricing,
        batches: list[Any],
        batch_ids: count[int],
        replica: int = 0,
        async_scheduling: bool = False,
        spec: Speculation | None = None,
        prompts: PromptCache | None = None,
    ) -> None:
        self.env = env
        self.prompts = prompts or PromptCache(block_size, False)  # this replica's prefix cache
        self.spec = spec
        self.lookahead = spec.k + 1 if spec is not None else 1  # KV slots a decode step writes
        # vLLM's async scheduling forms step n+1 while step n runs: a request arriving during a
        # step can join only the step after next (unless the engine is idle)
        self.async_scheduling = async_scheduling
        self._known = 0  # waiting requests that arrived before the running step began
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.max_running = max_running
        self.step_tokens = step_tokens
        self.pricing = pricing  # a step's time by its parts, at one point (wispsim.model.latency)
        self.batches = batches
        self._ids = batch_ids
        self.replica = replica
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.free = total_blocks
        self.preemptions = 0
        self._wake: simpy.Event | None = None
        self._in_step = False
        self._steps = 0  # steps begun
        # responses waiting for the step they could first join to begin, by that step's number
        self._eligible: dict[int, list[_Seq]] = {}
        env.process(self.loop())

    def outstanding_tokens(self) -> int:
        """Tokens still to process here (prefill and decode), for routing."""
        return sum(
            s.prompt - min(s.prefilled, s.prompt) + s.output - s.generated for s in self.running
        ) + sum(s.prompt + s.output - s.generated for s in self.waiting)

    def submit(self, g: Generation) -> simpy.Event:
        """Queue a response to generate; returns the event of its ``done`` value."""
        if self.spec is not None and g.runs is None:
            raise ValueError("a speculating server needs each response's acceptance runs")
        s = _Seq(g, self.prompts.hit(g))
        s.submitted = self.env.now
        s.eligible = self._steps + (1 if self.async_scheduling and self._in_step else 0)
        self._eligible.setdefault(s.eligible, []).append(s)
        self.waiting.append(s)
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None
        return g.done

    def _blocks(self, tokens: int) -> int:
        return blocks(tokens, self.block_size)

    def _admit(self, limit: int) -> None:
        while self.waiting and len(self.running) < self.max_running and limit > 0:
            limit -= 1
            s = self.waiting[0]
            need = self._blocks(s.context + self.lookahead)
            if need > self.free:
                break
            self.waiting.popleft()
            s.blocks = need
            self.free -= need
            self.running.append(s)

    def _preempt_last(self) -> None:
        s = self.running.pop()
        self.free += s.blocks
        s.blocks = 0
        s.prefilled = s.hit  # the prefix cache still holds the shared prompt
        s.context = s.prompt + s.generated
        self.waiting.appendleft(s)
        self._known += 1
        self.preemptions += 1

    def loop(self) -> Generator[Any, Any, None]:
        """The engine's steps: schedule -> run -> postprocess (vLLM's ``EngineCore.step``)."""
        env = self.env
        while True:
            idle = not self.running
            if idle and not self.waiting:
                self._wake = env.event()
                yield self._wake
            step = self._schedule(idle)
            if step is None:
                continue
            start = env.now
            for s in self._eligible.pop(self._steps, ()):
                s.t_eligible = start
            self._steps += 1
            bid = next(self._ids)
            used = self.total_blocks - self.free
            self._known = len(self.waiting)  # what the step scheduled during this one can see
            self._in_step = True
            yield env.timeout(step.latency)
            self._in_step = False
            finished = self._postprocess(step.work)
            self.batches.append(
                BatchRecord(
                    bid,
                    self.replica,
                    "step",
                    start,
                    env.now,
                    len(step.work),
                    len(self.running) + len(self.waiting) + len(finished),
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

    # --- schedule: admit, grow (preempting), compose, price --------------------------------
    def _schedule(self, idle: bool) -> _Step | None:
        """The next step: admit what fits, grow every decode by its lookahead (preempting the
        newest where memory runs out), compose the step and price it; None if nothing runs."""
        self._admit(self._known if self.async_scheduling and not idle else len(self.waiting))
        if not self.running:  # the head of the queue can never fit: a config error upstream
            raise RuntimeError("a centralized request does not fit in KV memory")
        self._grow()
        step = self._compose()
        if not step.work:
            return None
        price = self.pricing
        step.t_hat = price.cost.price(step.shape)
        gpu = price.gpu(step.shape, step.t_hat)
        if self.spec is not None:  # the drafter's passes, with the step's noise draw
            sh = step.shape
            drafting = self.spec.draft_time(
                sh.n_linear, sh.n_interactions, sh.n_cached, step.decoding, step.decoded_context
            )
            gpu += drafting * (gpu / step.t_hat if step.t_hat > 0 else 1.0)
            step.t_hat += drafting
        # the engine core's CPU: before the GPU's work, or beside it (async)
        step.took = price.step(gpu, step, _engine_work)
        step.latency = step.took.total
        return step

    def _grow(self) -> None:
        """Give every decoding sequence the blocks of its next tokens, preempting the newest
        sequence while memory runs out (vLLM's recompute preemption)."""
        i = 0
        while i < len(self.running):
            s = self.running[i]
            if s.prefilled >= s.context:
                need = self._blocks(s.context + self.lookahead) - s.blocks
                while need > self.free and self.running[-1] is not s:
                    self._preempt_last()
                if need > self.free:  # s itself is the newest: preempt it
                    self._preempt_last()
                    continue
                s.blocks += need
                self.free -= need
            i += 1

    def _compose(self) -> _Step:
        """Decodes for every prefilled sequence, then prefill chunks oldest first within the
        step's token budget (chunked prefill)."""
        budget = self.step_tokens
        step = _Step()
        shape = step.shape
        work = step.work
        for s in self.running:
            if s.prefilled >= s.context:
                new, cached = self.lookahead, s.context
                arriving = False
                step.decoding += 1
                step.decoded_context += cached
            else:
                if budget <= 0:
                    continue
                new = min(s.context - s.prefilled, budget)
                cached = s.prefilled
                arriving = s.new  # its first chunk: the request arrives anew
                if s.new:
                    s.scheduled = self.env.now
                    step.hashed += s.context  # the engine core hashes its whole prompt
                s.new = False
                if cached + new >= s.context:  # its prefill ends: the drafter proposes for it too
                    step.decoding += 1
                    step.decoded_context += s.context
            budget -= new
            work.append((s, new))
            shape.add(new, cached, arriving)
        return step

    # --- postprocess: commit the step's tokens, finish responses ------------------------------
    def _postprocess(self, work: list[tuple[_Seq, int]]) -> list[_Seq]:
        """Commit what the step produced; returns the responses it finished (their blocks freed,
        their ``done`` succeeded with :class:`Served`)."""
        now = self.env.now
        finished = []
        for s, new in work:
            if s.prefilled >= s.context:  # decode step
                step = 1
                if s.runs is not None:  # the accepted drafts and the target's own token
                    k = self.lookahead - 1
                    run = s.runs[s.generated] if s.generated < len(s.runs) else 0
                    step = min((run if run < k else k) + 1, s.output - s.generated)
                s.context += step
                s.prefilled += step
                s.generated += step
                s.chunks += 1
            else:
                s.prefilled += new
                if s.prefilled >= s.context:  # prefill completed: first token comes out
                    if not s.generated:  # (not a recompute after preemption)
                        s.first = now
                    s.generated += 1
                    s.chunks += 1
            if s.generated >= s.output:
                finished.append(s)
        for s in finished:
            self.running.remove(s)
            self.free += s.blocks
            eligible = s.t_eligible if s.t_eligible <= s.scheduled else s.scheduled
            s.done.succeed(Served(s.first, s.chunks, s.submitted, eligible, s.scheduled))
        return finished


class _Step:
    """One engine step as scheduled: the (sequence, new tokens) it runs, its shape, the decodes
    the drafter proposes for, and its estimate and latency once priced."""

    __slots__ = ("decoded_context", "decoding", "hashed", "latency", "shape", "t_hat", "took", "work")

    def __init__(self) -> None:
        self.work: list[tuple[_Seq, int]] = []
        self.shape = Shape()
        self.hashed = 0  # prompt tokens of the requests arriving in it (the engine core hashes them)
        self.decoding = 0
        self.decoded_context = 0
        self.t_hat = 0.0
        self.latency = 0.0
        self.took = StepTime(0.0, 0.0, 0.0)


def _engine_work(step: _Step) -> tuple[int, int, int, int]:
    """What the engine core does for a step: its requests, those arriving anew (a response's first
    prefill chunk), no resumed sessions, and the prompt tokens it hashes."""
    return len(step.work), step.shape.n_arrivals, 0, step.hashed
