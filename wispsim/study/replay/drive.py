"""Driving the simulator with a recorded log: the device side as recorded, the server simulated.

:func:`replay` runs the simulator with its devices replaced by the recorded ones (the log read by
:mod:`wispsim.study.replay.read`): every recorded device walks its responses in order (each
starts after the previous one ends plus the recorded gap), and each round waits its recorded
draft and uplink time, asks the simulated server with the recorded k, accepted and committed
tokens, and waits its recorded downlink time. Only the server side is simulated, so any
scheduler, prefix cache, profile, replica count or router can be asked "what if". A per-round log
has no draft features, so another drafting controller cannot be replayed (acceptance traces are
the tool for that). Under centralized serving the recorded responses (start gaps, prompt and
output lengths, first uplink and last downlink time) go to the centralized engine instead, and a
server that drafts for itself (``centralized-sd``) has accepted what the recorded device's target
accepted. Each recorded response is served by the run's serving component, as a simulated
device's is (:mod:`wispsim.sim.serving`), so whatever the server does -- its front end, its prefix
cache, a shared prompt prefix -- the replay does too. The replayed devices write their records
through the run's recorder, as the simulated devices do.

Responses still running when recording stopped count as violations on the recorded side, as
wispsim counts its censored responses. The replay leaves such a response open where it got no
further than the recording, so the simulator censors it the same way; where the replay got
further (a faster server), the outcome is unknown and the response is left out (``truncated``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from wispsim.config import ArrivalsConfig, Scenario
from wispsim.errors import ConfigError
from wispsim.sim.arrivals import Closed
from wispsim.sim.context import DeviceRound, RunContext
from wispsim.sim.records import SimResult
from wispsim.sim.round import RoundPlan
from wispsim.sim.scenarios import Resolved, check_consistency, load_scenario
from wispsim.sim.simulation import simulate


class _RecordedRound(NamedTuple):
    """One recorded round, as the replayed device needs it."""

    lead: float  # device-side time before drafting: since the previous verdict (or t0)
    draft: float
    up: float
    down: float
    k: int
    accepted: int
    committed: int
    position: int


LEAD_NOISE_S = 1e-9  # shorter device-side leads are float rounding of the recorder, not time


@dataclass(slots=True)
class _RecordedResponse:
    """One recorded response of a device, with its rounds, as the replayed device walks it."""

    log_id: int
    slo: float
    start: float
    prompt: int
    output: int  # a lower bound if unknown (unfinished when recording stopped)
    rounds: list[_RecordedRound]
    finished: bool
    known: bool  # output length known
    measured: bool  # in the recording
    elapsed: float  # recorded time from its start to its last verdict (0 if no round)
    gap: float = 0.0  # from the end of the device's previous response (from t=0 for its first)


def _device_plans(log: pd.DataFrame, meta: Mapping[str, Any]) -> dict[int, list[_RecordedResponse]]:
    """Each device's recorded responses in start order, with the gap before each."""
    per_dev: dict[int, list[tuple[_RecordedResponse, float]]] = {}
    log = log.sort_values(["response", "round"], kind="stable")
    rid = log.response.to_numpy()
    col = {
        c: log[c].to_numpy().tolist()
        for c in ("device", "slo", "response_start", "prompt_tokens", "t_end", "measured")
    }
    output = log.output_tokens.to_numpy(float)
    # the device's own time before each round's drafting starts: after the previous verdict, or
    # after response_start for a first round
    first = log["round"].to_numpy() == 0
    before = np.where(first, log.response_start.to_numpy(), np.r_[0.0, log.t_end.to_numpy()[:-1]])
    lead = log.t_start.to_numpy() - before
    lead[lead < LEAD_NOISE_S] = 0.0
    rounds: list[_RecordedRound] = list(
        map(
            _RecordedRound,
            lead.tolist(),
            log.draft_s.tolist(),
            log.up_s.tolist(),
            log.down_s.tolist(),
            log.drafted.tolist(),
            log.accepted.tolist(),
            log.committed.tolist(),
            log.position.tolist(),
        )
    )
    firsts = np.flatnonzero(np.r_[True, rid[1:] != rid[:-1]]).tolist()
    for a, b in zip(firsts, [*firsts[1:], len(rid)], strict=True):
        last = rounds[b - 1]
        done = last.position + last.committed
        known = bool(np.isfinite(output[a]))
        out = int(output[a]) if known else done + 1  # a lower bound: it was still running
        r = _RecordedResponse(
            int(rid[a]),
            col["slo"][a],
            col["response_start"][a],
            col["prompt_tokens"][a],
            out,
            rounds[a:b],
            known and done >= out,
            known,
            col["measured"][a],
            col["t_end"][b - 1] - col["response_start"][a],
        )
        per_dev.setdefault(col["device"][a], []).append((r, col["t_end"][b - 1]))
    for u in meta.get("unfinished", []):
        r = _RecordedResponse(
            int(u["response"]),
            float(u["slo"]),
            float(u["response_start"]),
            int(u["prompt_tokens"]),
            int(u["output_tokens"]),
            [],
            False,
            True,
            bool(u["measured"]),
            0.0,
        )
        per_dev.setdefault(int(u["device"]), []).append((r, r.start))
    plan: dict[int, list[_RecordedResponse]] = {}
    for dev, items in per_dev.items():
        items.sort(key=lambda it: (it[0].start, it[0].log_id))
        prev_end = 0.0
        for r, end in items:
            r.gap = max(r.start - prev_end, 0.0)
            prev_end = end
        plan[dev] = [r for r, _ in items]
    return plan


@dataclass(slots=True)
class _ReplayNotes:
    """What a replay notes besides the records: simulated -> log response ids, and the measured
    responses whose outcome the log cannot tell (id -> class)."""

    ids: dict[int, int]
    truncated: dict[int, float]


def _recording_stopped(
    ctx: RunContext, r: _RecordedResponse, resp: int, elapsed: float, notes: _ReplayNotes
) -> None:
    """The recording stopped inside response ``r``, ``elapsed`` seconds after it started here.

    If the recording measured it, it was counted there as violated (censored: late, or the run
    had to end); if the replay got no further ahead on it (``elapsed`` not below the recorded
    one), that verdict stands: the response stays open and the simulator censors it the same way.
    Otherwise the replay ran into the end of the recording and the outcome is unknown: if the
    replay measures the response and has not censored it yet, it leaves the measured set (noted in
    ``notes.truncated``)."""
    if r.measured and elapsed >= r.elapsed - 1e-9:
        return
    if ctx.recorder.is_measured(resp) and ctx.recorder.close_response(resp):
        notes.truncated[resp] = r.slo


class _RecordedSource:
    """A recorded response as the source of its times (a :class:`~wispsim.sim.round.RoundSource`
    and a :class:`~wispsim.sim.generation.GenerationSource`): each round as the log has it (its
    lead, draft, uplink and downlink times, k, accepted, committed, position); generated whole,
    its prompt goes up in the first round's lead and uplink time and its tokens come down in the
    last round's downlink time, and the drafts the recorded device's target accepted are what a
    server drafting for itself would have had accepted."""

    __slots__ = ("current", "rounds", "shared", "side")

    def __init__(self, side: DeviceRound, shared: int) -> None:
        self.side = side
        self.shared = shared
        self.rounds: list[_RecordedRound] = []
        self.current = 0

    def next_round(self, rnd: int) -> RoundPlan | None:
        if rnd >= len(self.rounds):
            return None
        self.current = rnd
        lead, draft, up, _, k, accepted, committed, pos = self.rounds[rnd]
        self.side.tau_d = draft / k  # drafting time per sent token: the log has no forward passes
        return (lead, pos, k, accepted, committed, draft, up)

    def downlink(self, committed: int) -> float:
        return self.rounds[self.current].down

    def prompt_uplink(self, prompt: int) -> float:
        return self.rounds[0].lead + self.rounds[0].up

    def tokens_downlink(self) -> float:
        return self.rounds[-1].down

    def server_runs(self, output: int) -> list[int]:
        """Drafts accepted in a row from each position, as the recorded rounds show them: a
        round at ``p`` that accepted ``a`` of its drafts had ``a - j`` accepted from ``p + j``
        (``a`` of ``k``: at least that many)."""
        runs = [0] * max(output, 1)
        for r in self.rounds:
            for j in range(r.committed):
                if r.position + j < len(runs):
                    runs[r.position + j] = r.accepted - j
        return runs

    def prompt_key(self) -> tuple[int | None, int | None, int]:
        return (None, 0, self.shared) if self.shared else (None, None, 0)


def _replay_device(
    ctx: RunContext, dev: int, responses: list[_RecordedResponse], notes: _ReplayNotes
) -> Generator[Any, Any, None]:
    """One recorded device, response by response, each served by the run's serving component as
    the simulated device's are (its rounds verified, or its tokens generated)."""
    env = ctx.env
    serving = ctx.serving
    alpha_hat = ctx.alpha_init
    pending = 0.0  # time owed before the next thing the device does
    side = DeviceRound(dev, 0.0)
    # the log does not say how many forward passes and predictor calls a round took
    side.forward_passes = side.predictor_calls = -1
    source = _RecordedSource(side, ctx.scenario.workload.shared_prefix_tokens)
    for r in responses:
        slo, prompt = r.slo, r.prompt
        pending += r.gap
        t0 = env.now + pending
        resp = ctx.recorder.open_response(t0, dev, slo, prompt, r.output)
        notes.ids[resp] = r.log_id
        if not r.rounds or (serving.needs_length and not r.known):
            _recording_stopped(ctx, r, resp, 0.0, notes)  # nothing to replay of it
            continue
        side.slo = slo
        source.rounds = r.rounds
        out = yield from serving.respond(
            ctx, source, resp, prompt, r.output, t0, pending, alpha_hat, math.nan
        )
        alpha_hat, pending = out.alpha_hat, out.pending
        if r.finished:
            serving.end(ctx, resp)
            ctx.recorder.finish_response(
                resp, dev, slo, t0, out.t_end, out.t_first, prompt, r.output, out.rounds, out.cold_rounds
            )
        else:
            _recording_stopped(ctx, r, resp, out.t_end - t0, notes)


class _RecordedDevices:
    """The replay's device side (a :class:`wispsim.sim.simulation.DeviceSide`): every recorded device
    of ``plan`` walks its responses as recorded, writing what it learns into ``notes``."""

    def __init__(self, plan: dict[int, list[_RecordedResponse]], notes: _ReplayNotes) -> None:
        self.plan = plan
        self.notes = notes

    def launch(self, ctx: RunContext, devices: int) -> None:
        ctx.arrivals = Closed(ctx, 0)  # the recorded gaps pace the devices: nothing gates them
        for dev in sorted(self.plan):
            ctx.env.process(_replay_device(ctx, dev, self.plan[dev], self.notes))
        ctx.devices_started = len(self.plan)


def replay_scenario(scenario: Scenario, meta: Mapping[str, Any], devices: int) -> Scenario:
    """``scenario`` with the log's measurement window, closed arrivals and its device count (so
    ``measured`` means what it meant in the recording, and scenario.yaml says what ran)."""
    w0, w1 = (float(v) for v in meta["window"])
    return scenario.replace(
        workload=dataclasses.replace(scenario.workload, warmup_s=w0, duration_s=w1 - w0),
        arrivals=ArrivalsConfig(),
        devices=dataclasses.replace(scenario.devices, count=max(devices, 1)),
    )


def _check_kv_fits(resolved: Resolved, log: pd.DataFrame) -> None:
    longest = int((log.prompt_tokens + log.position + log.drafted + 1).max())
    for prof, cap in zip(resolved.profiles, resolved.capacities, strict=True):
        if longest > cap:
            need = f"a logged round needs {longest} tokens of KV cache, more than its {cap} tokens"
            raise ConfigError(prof.name, "", need)


def replay(
    scenario: Scenario, log: pd.DataFrame, meta: Mapping[str, Any], seed: int | None = None
) -> SimResult:
    """Simulate ``scenario``'s server side under the recorded device-side behaviour of ``log``.

    ``seed`` (default: the log's seed, else the scenario's) seeds the server's noise; with the
    policy and seed of a ``wispsim run`` log the run is reproduced. ``info["log_response"]`` maps
    each simulated response id to the log's response id; ``info["truncated"]`` holds the responses
    (id -> class) that the replay measures but whose outcome the log cannot tell, because the
    recording stopped inside them and the replay got further (see :func:`_recording_stopped`);
    they are left out of the simulated records.
    """
    plan = _device_plans(log, meta)
    resolved = check_consistency(replay_scenario(scenario, meta, len(plan)))  # the one check of what runs
    sc = resolved.scenario
    _check_kv_fits(resolved, log)
    notes = _ReplayNotes({}, {})
    if seed is None:
        seed = int(meta.get("seed", sc.seed))
    res = simulate(resolved, seed=seed, load=_RecordedDevices(plan, notes))
    res.info["log_response"] = notes.ids
    res.info["truncated"] = notes.truncated
    return res


def log_scenario(
    meta: Mapping[str, Any], source: str, overrides: Mapping[str, Any] | None = None
) -> Scenario:
    """The scenario stored in the log's sidecar (merged over the default), with ``overrides``;
    its names checked, its consistency left to :func:`replay` (which checks what it runs, once)."""
    # replay drives its own arrivals (closed); a recorded trace path may not resolve here
    stored = {k: v for k, v in (meta.get("scenario") or {}).items() if k != "arrivals"}
    return load_scenario(overrides=overrides, base=stored, source=source, consistency=False)
