"""Edge devices: closed-loop clients of the server (SPEC 2.1).

A device belongs to one SLO class, drafts at its own speed (drawn once from the draft-speed
distribution), and loops: pick a response (prompt and output length), have the server serve it,
think, start the next one. How a response is served is the run's serving component's
(:mod:`wispsim.sim.serving`): under edge drafting, round after round the device drafts k tokens,
sends them up, waits for the verdict and appends the committed tokens; under centralized
serving it sends the prompt and the server streams every token back. The device is the source of
its responses' times either way: its drafting controller, acceptance trace and link.

Random streams: each device owns four generators derived from (run seed, device index, purpose),
so device i draws the same workload, acceptance and jitter whatever N is and whichever policy runs.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import numpy as np

from wispsim.model.network import TOKEN_ID_BYTES, Link, pick_link_type
from wispsim.sim.context import DeviceRound
from wispsim.sim.round import Outcome, RoundPlan, Rounds
from wispsim.sim.verdict import call_at_start

if TYPE_CHECKING:
    from wispsim.model.fleet import DeviceSpec
    from wispsim.sim.context import RunContext

# purposes of the per-device random streams (spawn keys)
STREAM_CONST, STREAM_WORK, STREAM_ACCEPT, STREAM_NET = 0, 1, 2, 3


def device_rng(seed: int, device: int, purpose: int) -> np.random.Generator:
    """Device ``device``'s random stream for ``purpose`` (one of the STREAM_* keys)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(device, purpose)))


class Device:
    """One edge device of a class: its constants, its random streams, and its client loop."""

    __slots__ = (
        "_current",
        "_header",
        "_output",
        "_pos",
        "_prompt",
        "_rounds",
        "_runs",
        "_state",
        "_stream",
        "_tok_bytes",
        "alpha_hat",
        "ctx",
        "index",
        "link",
        "once",
        "rng_accept",
        "rng_work",
        "side",
        "slo",
        "start_offset",
        "tau_d",
        "tau_p",
    )
    # the current response (set by run), for its rounds or its generation
    _pos: int
    _output: int
    _prompt: int
    _runs: list[int]
    _stream: Any
    # driven from callbacks (start): the response's (resp, t0, prompt, output) and its rounds
    _current: tuple[int, float, int, int]
    _rounds: Rounds

    def __init__(self, ctx: RunContext, index: int, spec: DeviceSpec, once: bool = False) -> None:
        """Device ``index`` of class ``spec.slo``; ``once``: an open session (one response, now)."""
        sc = ctx.scenario
        seed = ctx.seed
        const = device_rng(seed, index, STREAM_CONST)
        self.ctx = ctx
        self.index = index
        self.slo = spec.slo
        self.once = once
        # constants of the device, always drawn in this order
        speed = float(spec.draft_speed.sample(const))
        link_u = float(const.random())
        self.start_offset = 0.0 if once else float(const.uniform(0.0, sc.devices.start_spread_s))
        self.tau_d = 1.0 / speed
        self.tau_p = sc.devices.predictor_latency_ms / 1000.0
        lt = spec.link if spec.link is not None else pick_link_type(sc.network, link_u)
        self.link = Link(lt, sc.network.link_types[lt], device_rng(seed, index, STREAM_NET))
        self.rng_work = device_rng(seed, index, STREAM_WORK)
        self.rng_accept = device_rng(seed, index, STREAM_ACCEPT)
        self.alpha_hat = ctx.alpha_init

    def _next_response(self) -> tuple[float, int, int]:
        wl = self.ctx.scenario.workload
        rng = self.rng_work
        think = float(wl.think_time_s.sample(rng))
        prompt = int(wl.prompt_tokens.sample(rng))
        output = int(wl.output_tokens.sample(rng))
        given = self.ctx.arrivals.lengths(self.index)  # a request trace sets them
        if given is not None:
            prompt, output = given
        return (0.0 if self.once else think), prompt, output

    def _gate(self, pending: float) -> Generator[Any, Any, float]:
        """Wait while the arrival process keeps this device idle; returns the time still owed."""
        gate = self.ctx.arrivals.gate(self.index)
        if gate is None:
            return pending
        if pending > 0:
            yield self.ctx.env.timeout(pending)
        while gate is not None:
            yield gate
            gate = self.ctx.arrivals.gate(self.index)
        return 0.0

    # --- the device as its responses' source (wispsim.sim.round.RoundSource and
    # wispsim.sim.generation.GenerationSource) ----------------------------------------------
    def next_round(self, rnd: int) -> RoundPlan | None:
        """Plan the next round of the current response: k from the drafting controller,
        acceptance from the response's trace, drafting and uplink time from the device and its
        link ((latency + bytes / bandwidth) x jitter, written out)."""
        if rnd == 0:  # the response's first round: its per-response state (edge drafting only)
            self._runs = self._stream.run.tolist()
            self._state = self.ctx.controller.prepare(self._stream)
        pos, output = self._pos, self._output
        if pos >= output:
            return None
        remaining = output - pos
        k, passes, calls = self.ctx.controller.plan(self._state, pos, remaining)
        run = self._runs[pos]
        accepted = run if run < k else k
        committed = accepted + 1 if accepted < remaining else remaining
        draft = passes * self.tau_d + calls * self.tau_p
        nbytes = self._header + k * self._tok_bytes + (self._prompt * TOKEN_ID_BYTES if rnd == 0 else 0)
        link = self.link
        up = (link.latency + nbytes / link.up_bps) * link.jitter.next()
        side = self.side
        side.forward_passes = passes
        side.predictor_calls = calls
        self._pos = pos + committed
        return (0.0, pos, k, accepted, committed, draft, up)

    def downlink(self, committed: int) -> float:
        link = self.link
        return (
            link.latency + (self._header + committed * TOKEN_ID_BYTES) / link.down_bps
        ) * link.jitter.next()

    def prompt_uplink(self, prompt: int) -> float:
        return self.link.up(self._header + prompt * TOKEN_ID_BYTES)

    def tokens_downlink(self) -> float:
        # one downlink time (one jitter draw) for every token: the first and the last alike
        return self.link.down(self._header + TOKEN_ID_BYTES)

    def server_runs(self, output: int) -> list[int]:
        spec = self.ctx.speculation
        assert spec is not None
        return spec.runs(self._stream.run, output, self.rng_accept)

    def prompt_key(self) -> tuple[int | None, int | None, int]:
        # every device's prompt is its own; a shared prefix (workload.shared_prefix_tokens) is one group
        shared = self.ctx.scenario.workload.shared_prefix_tokens
        return (None, 0, shared) if shared else (None, None, 0)

    def start(self) -> None:
        """Start the device where the run starts it. Under edge drafting, where the arrival process
        never holds a device back, its loop runs from its verdicts' callbacks (:class:`Rounds`): a
        callback a round where a process would be resumed, the same steps in the same order, so
        the same records to the bit; otherwise :meth:`run` runs as a process."""
        ctx = self.ctx
        if ctx.serving.name != "speculative" or ctx.arrivals.gates:
            ctx.env.process(self.run())
        else:
            call_at_start(ctx.env, self._begin)

    def run(self) -> Generator[Any, Any, None]:
        """Response after response: pick it, have the server serve it (the run's serving
        component: rounds drafted here and verified there, or every token generated there),
        record it, think (module text)."""
        self._prepare()
        ctx = self.ctx
        serving = ctx.serving
        pending = self.start_offset  # time owed before the next thing the device does
        while True:
            pending = yield from self._gate(pending)
            resp, t0, prompt, output, pending = self._open(pending)
            out = yield from serving.respond(ctx, self, resp, prompt, output, t0, pending, self.alpha_hat, t0)
            pending = self._close(resp, t0, prompt, output, out)
            if self.once:
                return

    def _prepare(self) -> None:
        """The device's side of its rounds' records, and the sizes of its messages."""
        ctx = self.ctx
        self.side = DeviceRound(self.index, self.slo, self.tau_d)
        self._header, self._tok_bytes = ctx.header_bytes, ctx.draft_token_bytes

    def _open(self, pending: float) -> tuple[int, float, int, int, float]:
        """Pick the next response, ``pending`` seconds owed, and open its record: (its id, its
        start, prompt and output tokens, the time owed before its first round)."""
        ctx = self.ctx
        think, prompt, output = self._next_response()
        stream = ctx.acceptance.new_response(self.rng_accept, prompt, output, ctx.serving.pad)
        prompt, output = stream.prompt_len, stream.output_len
        self._stream = stream
        self._pos, self._output, self._prompt = 0, output, prompt
        t0 = ctx.env.now + pending + think
        resp = ctx.recorder.open_response(t0, self.index, self.slo, prompt, output)
        return resp, t0, prompt, output, pending + think

    def _close(self, resp: int, t0: float, prompt: int, output: int, out: Outcome) -> float:
        """Response ``resp`` is over: the server frees it and it is recorded; returns the time the
        device still owes (its last downlink)."""
        ctx = self.ctx
        self.alpha_hat = out.alpha_hat
        ctx.serving.end(ctx, resp)
        index, slo = self.index, self.slo
        ctx.recorder.finish_response(
            resp, index, slo, t0, out.t_end, out.t_first, prompt, output, out.rounds, out.cold_rounds
        )
        return out.pending

    # --- the loop of :meth:`run` under edge drafting, from callbacks (:meth:`start`) ------------
    def _begin(self, _: Any) -> None:
        self._prepare()
        self._respond(self.start_offset)

    def _respond(self, pending: float) -> None:
        resp, t0, prompt, output, pending = self._open(pending)
        self._current = (resp, t0, prompt, output)
        self._rounds = Rounds(self.ctx, self, resp, prompt, t0, pending, self.alpha_hat, t0)
        self._send()

    def _send(self) -> None:
        req = self._rounds.send()
        if req is None:  # the response is over: the next one starts now, as run()'s loop does
            resp, t0, prompt, output = self._current
            pending = self._close(resp, t0, prompt, output, self._rounds.outcome())
            if not self.once:
                self._respond(pending)
            return
        req.done.callbacks.append(self._verdict)  # type: ignore[union-attr]

    def _verdict(self, _: Any) -> None:
        self._rounds.received()
        self._send()
