"""Continuous batching as a pure scheduler: what vLLM's scheduler does each engine step (SPEC 3.3).

Iteration-level scheduling over one block manager (:class:`wispsim.model.memory.KVMemory`, the
one place KV blocks are counted). Each step decodes one token (``lookahead``: ``k + 1`` under
server-side speculation) for every running sequence whose prompt is processed, and spends the
rest of a per-step token budget (``step_tokens``: vLLM's ``max_num_batched_tokens``) on prefill
chunks of sequences still being prefilled, oldest first (chunked prefill).

- **admit**: a waiting sequence joins the running ones (oldest first, at most ``max_running``:
  vLLM's ``max_num_seqs``) when free blocks cover its whole context; under async scheduling
  (vLLM's ``--async-scheduling``: the next step is formed while this one runs) only the ones
  that arrived before the running step began (:meth:`ContinuousBatcher.begin`) can join the next;
- **grow**: every decoding sequence gets the blocks of its next tokens; when none are free the
  most recently admitted sequence is preempted (its blocks freed, back to the front of the queue
  to be recomputed: vLLM's recompute preemption);
- **compose**: the step's work, and its :class:`~wispsim.model.batch.Shape` (a decode is
  L_new = lookahead over its context; a chunk is L_new = chunk over what is already prefilled);
- **commit**: what the step produced (a decode commits the accepted run of its drafts plus one
  token; a prefill's last chunk gives the first token); finished sequences give their blocks back.

**Without chunked prefill** (vLLM's ``--no-enable-chunked-prefill``) a prompt is prefilled whole
or not at all in a step. On V1 it still runs beside the decodes (the first prompt that does not
fit the budget stops the queue); on **V0** (``prefill_first``) a step is either prefills only,
oldest first while they fit the budget, which go before any decode, or decodes only: every
arrival's prefill stalls the running decodes for a step. **Multi-step scheduling** (V0's
``--num-scheduler-steps``, ``steps``) runs a decode step ``steps`` times per scheduling
(:meth:`ContinuousBatcher.advance`): each decode holds KV for the run's tokens from its start
(vLLM's lookahead slots), nothing joins before the run ends, and a sequence that ends mid-run is
computed to the run's end (its tokens past the end discarded) and gives its blocks back then. A
prefill-only step is a run of one step (vLLM's ``init_multi_step_from_lookahead_slots``: a prompt
without chunking gets no lookahead); with chunked prefill a run's first step may hold prefill
chunks, and the sequences whose prefill ends in it decode through the rest of the run.

Under **static batching** (``static``: request-level batching, as a server built on Hugging Face
``generate`` runs it, not vLLM) a batch is admitted only when the last one has ended, and a response
that ends early stays in the batch as padding, decoded at its context until the batch's longest
response ends (``generate`` keeps computing finished rows); its blocks are given back with the batch.

Under **sliding-window layers** (the memory's :class:`~wispsim.model.batch.Window`: gpt-oss,
Gemma) a sequence holds what vLLM's hybrid KV cache manager keeps: every token in the full-attention
layers, the window in the others (admitted with the window of its first chunk, shrunk to a decode's
at its first decode), and each step's shape caps the windowed layers' reads and keys.

No clock: :class:`wispsim.sim.centralized.CentralizedServer` runs it on SimPy's, passing the time
in. *(nano-vllm's ``Scheduler`` over its ``BlockManager``.)*
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from wispsim.model.batch import Shape, Window
from wispsim.model.latency import StepTime
from wispsim.model.memory import KVMemory


class Sequence:
    """One response being generated: its lengths and progress, the blocks it holds, the step
    counts of its chunks, and (server-side speculation) the runs of drafts its target accepts
    from each output position. ``item`` is whatever the caller submitted (the response)."""

    __slots__ = (
        "blocks",
        "chunks",
        "context",
        "eligible",
        "first",
        "generated",
        "hit",
        "item",
        "new",
        "output",
        "prefilled",
        "prompt",
        "runs",
        "scheduled",
        "submitted",
        "t_eligible",
    )

    def __init__(self, item: Any, prompt: int, output: int, hit: int, runs: list[int] | None) -> None:
        self.item = item
        self.prompt = prompt
        self.output = output
        self.generated = 0
        self.first = 0.0  # when the step that gave the first token ended
        self.hit = min(hit, prompt - 1)  # prompt tokens the prefix cache holds (a shared system prompt)
        self.prefilled = self.hit  # tokens of prompt + generated-so-far whose KV is computed
        self.new = True  # not yet scheduled: its first chunk is a request arriving anew
        self.context = prompt  # tokens that must be in KV before decoding
        self.blocks = 0
        self.chunks = 0  # steps that gave it tokens (one streamed chunk each)
        self.runs = runs  # speculation: drafts accepted in a row from each output position
        self.submitted = 0.0  # when the engine received it
        self.eligible = 0  # the first step that could have run it (async scheduling: one later)
        self.t_eligible = math.nan  # when that step began
        self.scheduled = -1.0  # when the first step that ran a chunk of it began


class Step:
    """One engine step as scheduled: the (sequence, new tokens) it runs, its shape, the prompt
    tokens the engine core hashes (those arriving anew), the decodes the drafter proposes for,
    and its estimate and time once priced."""

    __slots__ = ("decoded_context", "decoding", "hashed", "latency", "shape", "t_hat", "took", "work")

    def __init__(self, window: Window | None = None, prefill_above: int = 1) -> None:
        self.work: list[tuple[Sequence, int]] = []
        self.shape = Shape(window=window, prefill_above=prefill_above)
        self.hashed = 0
        self.decoding = 0
        self.decoded_context = 0
        self.t_hat = 0.0
        self.latency = 0.0
        self.took = StepTime(0.0, 0.0, 0.0)

    def engine_work(self) -> tuple[int, int, int, int]:
        """What the engine core does for it: its requests, those arriving anew (a response's first
        prefill chunk), no resumed sessions, and the prompt tokens it hashes."""
        return len(self.work), self.shape.n_arrivals, 0, self.hashed


class ContinuousBatcher:
    """vLLM-style continuous batching over ``memory`` (module docstring)."""

    def __init__(
        self,
        memory: KVMemory,
        max_running: int,
        step_tokens: int,
        lookahead: int = 1,
        async_scheduling: bool = False,
        static: bool = False,
        chunked: bool = True,
        prefill_first: bool = False,
        steps: int = 1,
        prefill_above: int = 1,
    ) -> None:
        self.memory = memory
        # members with more new tokens are prefills to the attention backend (batch.Shape)
        self.prefill_above = prefill_above
        self.static = static  # request-level batching (module docstring)
        self.chunked = chunked  # prompts prefilled in chunks (else whole: module docstring)
        self.prefill_first = prefill_first  # V0 without chunking: prefill-only steps go first
        self.steps = steps  # steps a decode batch runs per scheduling (V0's multi-step)
        self.max_running = max_running
        self.step_tokens = step_tokens
        self.lookahead = lookahead  # KV slots a decode step writes (k + 1 under speculation)
        self.async_scheduling = async_scheduling
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0
        self._known = 0  # waiting sequences that arrived before the running step began

    def add(self, s: Sequence) -> None:
        """A sequence arrives."""
        self.waiting.append(s)

    def begin(self) -> None:
        """A step begins: what waits now is what the next step (formed during it) can see."""
        self._known = len(self.waiting)

    def outstanding_tokens(self) -> int:
        """Tokens still to process here (prefill and decode), for routing."""
        return sum(
            s.prompt - min(s.prefilled, s.prompt) + s.output - s.generated for s in self.running
        ) + sum(s.prompt + s.output - s.generated for s in self.waiting)

    # --- schedule: admit, grow (preempting), compose ------------------------------------------
    def schedule(self, idle: bool, now: float) -> Step | None:
        """The next step at time ``now`` (``idle``: no step ran before it): admit what fits, grow
        every decode by its lookahead (preempting the newest where memory runs out), compose the
        step; None if nothing runs."""
        if not (self.static and self.running):  # a static batch admits only when the last one ended
            self._admit(self._known if self.async_scheduling and not idle else len(self.waiting))
        if not self.running:  # the head of the queue can never fit: a config error upstream
            raise RuntimeError("a centralized request does not fit in KV memory")
        self._grow()
        step = self._compose(now)
        return step if step.work else None

    def _admit(self, limit: int) -> None:
        memory = self.memory
        while self.waiting and len(self.running) < self.max_running and limit > 0:
            limit -= 1
            s = self.waiting[0]
            need = memory.seq_blocks(s.context + self.lookahead, min(s.context, self.step_tokens))
            if need > memory.free:
                break
            self.waiting.popleft()
            s.blocks = need
            memory.take(need)
            self.running.append(s)

    def _victim(self) -> int:
        """Where the sequence to preempt is: the newest (under static batching the newest still
        generating: a padding row only holds finished KV, given back with its batch)."""
        if self.static:
            for i in range(len(self.running) - 1, -1, -1):
                if self.running[i].generated < self.running[i].output:
                    return i
        return len(self.running) - 1

    def _preempt_last(self) -> None:
        s = self.running.pop(self._victim())
        self.memory.give(s.blocks)
        s.blocks = 0
        s.prefilled = s.hit  # the prefix cache still holds the shared prompt
        s.context = s.prompt + s.generated
        self.waiting.appendleft(s)
        self._known += 1
        self.preemptions += 1

    def _grow(self) -> None:
        """Give every decoding sequence the blocks of its next tokens, preempting the newest
        sequence while memory runs out (vLLM's recompute preemption)."""
        grow = self.memory.grow
        running = self.running
        lookahead = self.lookahead if self.steps == 1 else self.steps  # a run's tokens, up front
        i = 0
        while i < len(running):
            s = running[i]
            if s.prefilled >= s.context and s.generated < s.output:  # (padding writes nothing)
                tokens = s.context + lookahead
                got = grow(s.blocks, tokens, lookahead)
                while got < 0 and running[self._victim()] is not s:
                    self._preempt_last()
                    got = grow(s.blocks, tokens, lookahead)
                if got < 0:  # s itself is the newest: preempt it
                    self._preempt_last()
                    continue
                s.blocks = got
            i += 1

    def _compose(self, now: float) -> Step:
        """Decodes for every prefilled sequence, then prefill chunks oldest first within the
        step's token budget (chunked prefill; without it, whole prompts; on V0, prefills alone
        where any fits: module docstring)."""
        budget = self.step_tokens
        window = self.memory.window
        span = window.tokens if window is not None else 0
        step = Step(window, self.prefill_above)
        shape = step.shape
        work = step.work
        look = self.lookahead
        chunked = self.chunked
        # V0 without chunking: a step of prefills alone when one fits, else of decodes alone
        prefills_only = self.prefill_first and any(
            s.prefilled < s.context and s.context - s.prefilled <= budget for s in self.running
        )
        blocked = False  # without chunking, the first prompt that does not fit stops the queue
        decoding = decoded = windowed = 0  # the decodes' part of the shape, added at once (add_alike)
        for s in self.running:
            if s.prefilled >= s.context:  # a decode
                if prefills_only:
                    continue
                decoding += 1
                decoded += s.context
                if span:
                    windowed += s.context if s.context < span else span
                budget -= look
                work.append((s, look))
                continue
            if budget <= 0 or blocked or (self.prefill_first and not prefills_only):
                continue
            new = min(s.context - s.prefilled, budget)
            if not chunked and new < s.context - s.prefilled:
                blocked = True
                continue
            cached = s.prefilled
            arriving = s.new  # its first chunk: the request arrives anew
            if s.new:
                s.scheduled = now
                step.hashed += s.context  # the engine core hashes its whole prompt
            s.new = False
            if cached + new >= s.context:  # its prefill ends: the drafter proposes for it too
                step.decoding += 1
                step.decoded_context += s.context
            budget -= new
            work.append((s, new))
            shape.add(new, cached, arriving, logits=1)  # vLLM: a logit row at its last scheduled token
        step.decoding += decoding
        step.decoded_context += decoded
        shape.add_alike(decoding, look, decoded, arriving=False, windowed_sum=windowed)
        return step

    # --- commit: what the step produced --------------------------------------------------------
    def commit(self, step: Step, now: float, release: bool = True) -> list[Sequence]:
        """Commit what ``step`` produced, ending at ``now``; returns the sequences it finished,
        whose blocks are given back -- at once, or (``release`` False: mid-way through a
        multi-step run) with the run's last step, which gives back every sequence that ended in
        the run."""
        finished = []
        for s, new in step.work:
            if s.generated >= s.output:  # static batching's padding: computed, nothing committed
                continue
            if s.prefilled >= s.context:  # decode step
                n = 1
                if s.runs is not None:  # the accepted drafts and the target's own token
                    k = self.lookahead - 1
                    run = s.runs[s.generated] if s.generated < len(s.runs) else 0
                    n = min((run if run < k else k) + 1, s.output - s.generated)
                s.context += n
                s.prefilled += n
                s.generated += n
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
        if self.static:  # the batch ends with its last response: every block given back then
            if all(s.generated >= s.output for s in self.running):
                for s in self.running:
                    self.memory.give(s.blocks)
                self.running.clear()
            return finished
        if not release:  # computed to the run's end (module docstring)
            return finished
        self.release(None if self.steps > 1 else finished)
        return finished

    def release(self, ended: list[Sequence] | None = None) -> None:
        """Give back the blocks of ``ended`` (None: every running sequence that has ended, at a
        multi-step run's end)."""
        if ended is None:
            ended = [s for s in self.running if s.generated >= s.output]
        for s in ended:
            self.running.remove(s)
            self.memory.give(s.blocks)

    def run_length(self, step: Step) -> int:
        """Steps the run that ``step`` (just scheduled) begins takes: ``steps``, or one for a
        prefill-only step without chunking (module docstring)."""
        if self.steps == 1 or not step.work:
            return 1
        if not self.chunked and not any(s.prefilled >= s.context for s, _ in step.work):
            return 1
        return self.steps

    def advance(self, step: Step) -> Step | None:
        """The next step of a multi-step run that began with ``step``'s sequences (module
        docstring): a decode for each of them whose prompt is processed, one that has ended
        included (computed, nothing committed); no scheduling, no growth (the run's KV was held at
        its start). None where none decodes (the run's first step only chunked prompts)."""
        window = self.memory.window
        span = window.tokens if window is not None else 0
        nxt = Step(window, self.prefill_above)
        look = self.lookahead
        decoding = decoded = windowed = 0
        for s, _ in step.work:
            if s.prefilled >= s.context:
                decoding += 1
                decoded += s.context
                if span:
                    windowed += s.context if s.context < span else span
                nxt.work.append((s, look))
        nxt.decoding = decoding
        nxt.decoded_context = decoded
        if not decoding:
            return None
        nxt.shape.add_alike(decoding, look, decoded, arriving=False, windowed_sum=windowed)
        return nxt
