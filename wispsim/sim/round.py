"""One speculative round, written once: plan -> draft -> uplink -> server -> downlink -> record.

Every device that drafts at the edge runs its responses through :func:`speculative_response`:
the simulated device (:class:`wispsim.sim.device.Device`; the real swarm runs the same device
against a client of the real server), and the recorded device of a replay
(:mod:`wispsim.study.replay.drive`). What differs between them is only where a round's facts come
from, a :class:`RoundSource`: the simulated device plans k with its drafting controller, draws
acceptance from its trace and transfer times from its link; a recorded device reads them from
the log. The request the server sees, the device's accept-rate estimate, the first-token time and
the round record are made here, the same way for all.
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


def speculative_response(ctx: RunContext, source: RoundSource, resp: int, prompt: int, output: int,
                         t0: float, pending: float, alpha_hat: float, t_first: float,
                         ) -> Generator[Any, Any, Outcome]:  # fmt: skip
    """Run response ``resp`` (a ``prompt``-token prompt, started at ``t0``) round by round from
    ``source``, the first ``pending`` seconds from now, with accept-rate estimate ``alpha_hat``;
    every round is recorded with the source's ``side`` of it (the device's side of the round
    record). ``t_first``: the response's first-token time if no round runs; ``output`` is the
    source's to know (its rounds end the response). Returns the :class:`Outcome`."""
    side = source.side
    side.measured = ctx.recorder.is_measured(resp)
    env = ctx.env
    submit = ctx.server.submit  # called with the request when its uplink ends (Request.send)
    # or the request is posted as data, where the server takes it so (sim.inbox)
    post = getattr(ctx.server, "post", None)
    record_round = ctx.recorder.record_round
    req_ids = ctx.request_ids
    verdict = Verdict  # the event of a round's verdict (a batch succeeds its members' at once)
    w = ctx.alpha_ema
    slo = side.slo
    next_round, downlink = source.next_round, source.downlink
    t_end = t0
    rnd = cold = 0
    while True:
        plan = next_round(rnd)
        if plan is None:
            break
        lead, pos, k, accepted, committed, draft, up = plan
        if lead:
            pending += lead
        now = env.now
        t_start = now + pending
        delay = pending + draft + up
        arrival = now + delay  # when the request reaches the server (Request.send's timeout: same sum)
        n_hat = alpha_hat * k + 1.0
        budget = n_hat / slo - draft - up
        prefix = prompt + pos
        req = Request(
            next(req_ids), resp, arrival, arrival + budget, n_hat, k, prefix, prefix + committed, verdict(env)
        )
        # the request reaches the server when its uplink ends (a timeout's callback, or data the
        # server reads then), and the device sleeps until the verdict: one resume per round
        if post is None:
            req.send(env, delay, submit)
        else:
            post(req)
        yield req.done
        down = downlink(committed)
        t_end = env.now + down
        if rnd == 0:  # the first round's verdict brings the first token
            t_first = t_end
            ctx.recorder.first_token(resp, t_end)
            ctx.recorder.server_times(resp, req.arrival, req.arrival, req.dispatch)
        cold += req.cold
        side.round = rnd
        side.position = pos
        side.t_start = t_start
        side.draft_time = draft
        side.accepted = accepted
        side.committed = committed
        side.uplink_time = up
        side.budget = budget
        side.downlink_time = down
        side.t_end = t_end
        record_round(side, req)
        alpha_hat += w * (accepted / k - alpha_hat)
        rnd += 1
        pending = down
    return Outcome(t_end, t_first, rnd, cold, alpha_hat, pending)
