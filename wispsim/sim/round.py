"""One speculative round, written once: plan -> draft -> uplink -> server -> downlink -> record.

Every device that drafts at the edge runs its responses' rounds through :class:`Rounds`: the
simulated device (:class:`wispsim.sim.device.Device`, from its verdicts' callbacks; the real swarm
runs the same device against a client of the real server), and, through the process
:func:`speculative_response`, the recorded device of a replay (:mod:`wispsim.study.replay.drive`).
What differs between them is only where a round's facts come from, a :class:`RoundSource`: the
simulated device plans k with its drafting controller, draws acceptance from its trace and transfer
times from its link; a recorded device reads them from the log. The request the server sees, the
device's accept-rate estimate, the first-token time and the round record are made here, the same
way for all.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from wispsim.sim.verdict import Verdict
from wispsim.sim.verifier import Request

if TYPE_CHECKING:
    from wispsim.sim.context import DeviceRound, RunContext


# A round's device-side facts before it is sent, a plain tuple (made once per round):
#   lead       device time before drafting starts (besides what the previous round owed)
#   position   committed output tokens before the round
#   k          draft tokens sent
#   accepted   of them, the target accepts
#   committed  tokens the round commits (accepted + the target's own, within the output)
#   draft      seconds drafting (and asking the predictor)
#   up         seconds on the uplink
RoundPlan = tuple[float, int, int, int, int, float, float]


class RoundSource(Protocol):
    """Where a device's rounds come from (module text), with the device's side of each round's
    record (``side``)."""

    side: DeviceRound

    def next_round(self, rnd: int) -> RoundPlan | None:
        """Round ``rnd`` of the response, or None once the response is over. A source may fill
        the device-side fields of the round record that only it knows (``forward_passes``,
        ``predictor_calls``, ``tau_d``)."""
        ...

    def downlink(self, committed: int) -> float:
        """Seconds the verdict of ``committed`` tokens takes to come down."""
        ...


class Outcome(NamedTuple):
    """How a response's rounds went, for its response record."""

    t_end: float  # its last verdict reached the device
    t_first: float  # its first verdict did
    rounds: int
    cold_rounds: int  # rounds whose prefix the server no longer held
    alpha_hat: float  # the device's accept-rate estimate after them
    pending: float  # device time still owed (the last downlink)


class Rounds:
    """One response's rounds, round after round from its ``source``, the first ``pending`` seconds
    from now, with accept-rate estimate ``alpha_hat`` (a response of ``prompt`` tokens started at
    ``t0``; ``t_first``: its first-token time if no round runs). :meth:`send` plans the next round
    and sends its request to the server (None once the source says the response is over);
    :meth:`received` takes its verdict and records the round, with the source's ``side`` of it.
    :func:`speculative_response` drives them as a process; the simulated device drives them from
    the verdicts' callbacks (:meth:`wispsim.sim.device.Device.start`): the same steps, in the same
    order, without a process to resume each round."""

    __slots__ = (
        "accepted", "alpha_hat", "budget", "cold", "committed", "ctx", "draft", "env", "k", "pending",
        "pos", "post", "prompt", "req", "resp", "rnd", "side", "slo", "source", "submit", "t_end",
        "t_first", "t_start", "up", "w",
    )  # fmt: skip

    def __init__(self, ctx: RunContext, source: RoundSource, resp: int, prompt: int, t0: float,
                 pending: float, alpha_hat: float, t_first: float) -> None:  # fmt: skip
        side = self.side = source.side
        side.measured = ctx.recorder.is_measured(resp)
        self.ctx, self.env, self.source = ctx, ctx.env, source
        self.submit = ctx.server.submit  # called with the request when its uplink ends (Request.send)
        # or the request is posted as data, where the server takes it so (sim.inbox)
        self.post = getattr(ctx.server, "post", None)
        self.w = ctx.alpha_ema
        self.slo = side.slo
        self.resp, self.prompt, self.pending, self.alpha_hat = resp, prompt, pending, alpha_hat
        self.t_end, self.t_first = t0, t_first
        self.rnd = self.cold = 0
        self.pos = self.k = self.accepted = self.committed = 0
        self.t_start = self.draft = self.up = self.budget = 0.0
        self.req: Request | None = None  # the round in flight (sent, its verdict awaited)

    def send(self) -> Request | None:
        """Plan the next round and send its request (the server gets it when its uplink ends);
        None once the response is over."""
        plan = self.source.next_round(self.rnd)
        if plan is None:
            return None
        lead, pos, k, accepted, committed, draft, up = plan
        pending = self.pending + lead if lead else self.pending
        env = self.env
        now = env.now
        delay = pending + draft + up
        arrival = now + delay  # when the request reaches the server (Request.send's timeout: same sum)
        n_hat = self.alpha_hat * k + 1.0
        budget = n_hat / self.slo - draft - up
        prefix = self.prompt + pos
        req = Request(
            next(self.ctx.request_ids), self.resp, arrival, arrival + budget, n_hat, k, prefix,
            prefix + committed, Verdict(env),
        )  # fmt: skip
        self.t_start = now + pending
        self.pos, self.k, self.accepted, self.committed = pos, k, accepted, committed
        self.draft, self.up, self.budget = draft, up, budget
        # the request reaches the server when its uplink ends (a timeout's callback, or data the
        # server reads then), and the device sleeps until the verdict
        post = self.post
        if post is None:
            req.send(env, delay, self.submit)
        else:
            post(req)
        self.req = req
        return req

    def received(self) -> None:
        """The verdict of the round :meth:`send` sent last came: its downlink, the first token if
        it is the first round, the round's record."""
        req = self.req
        assert req is not None, "received() before send()"
        ctx = self.ctx
        rnd, accepted, k = self.rnd, self.accepted, self.k
        down = self.source.downlink(self.committed)
        t_end = self.t_end = self.env.now + down
        if rnd == 0:  # the first round's verdict brings the first token
            self.t_first = t_end
            ctx.recorder.first_token(self.resp, t_end)
            ctx.recorder.server_times(self.resp, req.arrival, req.arrival, req.dispatch)
        self.cold += req.cold
        side = self.side
        side.round = rnd
        side.position = self.pos
        side.t_start = self.t_start
        side.draft_time = self.draft
        side.accepted = accepted
        side.committed = self.committed
        side.uplink_time = self.up
        side.budget = self.budget
        side.downlink_time = down
        side.t_end = t_end
        ctx.recorder.record_round(side, req)
        self.alpha_hat += self.w * (accepted / k - self.alpha_hat)
        self.rnd = rnd + 1
        self.pending = down

    def outcome(self) -> Outcome:
        """How the response's rounds went (once :meth:`send` returned None)."""
        return Outcome(self.t_end, self.t_first, self.rnd, self.cold, self.alpha_hat, self.pending)


def speculative_response(ctx: RunContext, source: RoundSource, resp: int, prompt: int, output: int,
                         t0: float, pending: float, alpha_hat: float, t_first: float,
                         ) -> Generator[Any, Any, Outcome]:  # fmt: skip
    """Run response ``resp`` (a ``prompt``-token prompt, started at ``t0``) round by round from
    ``source`` as a process (:class:`Rounds`: arguments as there); ``output`` is the source's to
    know (its rounds end the response). Returns the :class:`Outcome`."""
    rounds = Rounds(ctx, source, resp, prompt, t0, pending, alpha_hat, t_first)
    req = rounds.send()
    while req is not None:
        yield req.done  # one resume per round
        rounds.received()
        req = rounds.send()
    return rounds.outcome()
