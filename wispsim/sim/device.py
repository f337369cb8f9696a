"""Edge devices: closed-loop clients that draft and send rounds for verification (SPEC 2.1).

A device belongs to one SLO class, drafts at its own speed (drawn once from the draft-speed
distribution), and loops: pick a response (prompt and output length), then round after round
draft k tokens, send them up, wait for the verdict, append the committed tokens; then think and
start the next response.

Random streams: each device owns four generators derived from (run seed, device index, purpose),
so device i draws the same workload, acceptance and jitter whatever N is and whichever policy runs.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import numpy as np

from wispsim.model.network import TOKEN_ID_BYTES, Link, pick_link_type
from wispsim.sim.centralized import Generation
from wispsim.sim.context import DeviceRound
from wispsim.sim.round import RoundPlan, speculative_response

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
        "_header",
        "_output",
        "_pos",
        "_prompt",
        "_runs",
        "_side",
        "_state",
        "_tok_bytes",
        "alpha_hat",
        "ctx",
        "index",
        "link",
        "once",
        "rng_accept",
        "rng_work",
        "slo",
        "start_offset",
        "tau_d",
        "tau_p",
    )
    # the current response, for next_round (set by run_speculative)
    _pos: int
    _output: int
    _prompt: int
    _runs: list[int]

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

    # --- the device as its rounds' source (wispsim.sim.round.RoundSource) -------------------
    def next_round(self, rnd: int) -> RoundPlan | None:
        """Plan the next round of the current response: k from the drafting controller,
        acceptance from the response's trace, drafting and uplink time from the device and its
        link ((latency + bytes / bandwidth) x jitter, written out)."""
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
        side = self._side
        side.forward_passes = passes
        side.predictor_calls = calls
        self._pos = pos + committed
        return (0.0, pos, k, accepted, committed, draft, up)

    def downlink(self, committed: int) -> float:
        link = self.link
        return (
            link.latency + (self._header + committed * TOKEN_ID_BYTES) / link.down_bps
        ) * link.jitter.next()

    def run_speculative(self) -> Generator[Any, Any, None]:
        """Draft and send the rounds of response after response (module text)."""
        ctx = self.ctx
        env = ctx.env
        server = ctx.server
        ctl = ctx.controller
        index, slo = self.index, self.slo
        side = self._side = DeviceRound(index, slo, self.tau_d)  # the device's side of each round's record
        self._header, self._tok_bytes = ctx.header_bytes, ctx.draft_token_bytes
        pad = ctx.stream_pad
        pending = self.start_offset  # time owed before the next thing the device does
        while True:
            pending = yield from self._gate(pending)
            think, prompt, output = self._next_response()
            stream = ctx.acceptance.new_response(self.rng_accept, prompt, output, pad)
            prompt, output = stream.prompt_len, stream.output_len
            self._runs = stream.run.tolist()
            self._state = ctl.prepare(stream)
            self._pos, self._output, self._prompt = 0, output, prompt
            t0 = env.now + pending + think
            pending += think
            resp = ctx.recorder.open_response(t0, index, slo, prompt, output)
            side.measured = ctx.recorder.is_measured(resp)
            out = yield from speculative_response(
                ctx, side, self, resp, prompt, t0, pending, self.alpha_hat, t0
            )
            self.alpha_hat, pending = out.alpha_hat, out.pending
            server.drop(resp)
            ctx.recorder.finish_response(
                resp, index, slo, t0, out.t_end, out.t_first, prompt, output, out.rounds, out.cold_rounds
            )
            if self.once:
                return

    def run_centralized(self) -> Generator[Any, Any, None]:
        """Send the prompt; the server generates every token and streams them back."""
        ctx = self.ctx
        env = ctx.env
        link = self.link
        header = ctx.header_bytes
        rec = ctx.recorder
        pending = self.start_offset
        while True:
            pending = yield from self._gate(pending)
            think, prompt, output = self._next_response()
            # same acceptance draws as the speculative loop, so trace lengths match across policies
            stream = ctx.acceptance.new_response(self.rng_accept, prompt, output, 0)
            prompt, output = stream.prompt_len, stream.output_len
            t0 = env.now + pending + think
            resp = rec.open_response(t0, self.index, self.slo, prompt, output)
            up = link.up(header + prompt * TOKEN_ID_BYTES)
            yield env.timeout(pending + think + up)
            # under centralized-sd the server drafts for itself: which of its drafts the target accepts
            spec = ctx.speculation
            runs = None if spec is None else spec.runs(stream.run, output, self.rng_accept)
            if ctx.frontend > 0:  # the API server (server.frontend): HTTP and tokenization
                yield env.timeout(ctx.frontend)
            done = ctx.server.submit(
                Generation(resp, prompt, output, env.event(), ctx.shared_hit(prompt), runs)
            )
            # when the step that gave the first token ended; the chunks the tokens came in
            first, chunks = yield done
            # one downlink time (one jitter draw) for every token: the first and the last alike
            down = link.down(header + TOKEN_ID_BYTES)
            t_end = env.now + down
            t_first = first + down
            rec.finish_response(resp, self.index, self.slo, t0, t_end, t_first, prompt, output, chunks, 1)
            pending = down
            if self.once:
                return
