"""A first estimate of capacity from the model's own facts: one server, in the mean, with its tail.

Before anything is simulated, the parts a run is made of already say roughly where the knee is:
the cost form prices a pass, the acceptance model says how many tokens a round commits, the
workload how long responses are, the KV cache and ``max_num_seqs`` how many run at once, the host
how fast it takes requests. :func:`fluid_capacity` puts them together for one class (SLO ``s``
tok/s) in steady state, every rate at its mean (a *fluid* model: no queueing variance), and asks
of the ``epsilon`` tail -- the slowest-drafting devices, the shortest responses -- whether it
still keeps the SLO. It returns the largest N it finds feasible and the resource that stops N + 1.
The capacity search brackets from it (:mod:`wispsim.study.capacity_search`); the sweep prints it
beside the simulated answer. It is an estimate, not an answer: the simulated violation rate
decides.

**Running.** Of N closed-loop devices at most ``A`` run at once: the responses the KV cache holds
and ``max_num_seqs``; the rest wait. What a response holds is averaged over the time it runs, so a
long one counts as often as it is running (:func:`held_context`): vLLM's blocks grow with the
output, ``prompt + E[O^2] / 2 E[O]`` on average (``prompt + 0.62 output`` at a coefficient of
variation of 0.5, not ``output / 2``), its last block half full; admission control reserves
``prompt + growth + k_max + 1`` in whole blocks and more for a response that outgrows it
(:func:`reserved_context`). The ``A`` running ones go as fast as the server lets them:

- *speculative*: a round drafts ``k`` tokens (``k / draft speed`` and the predictor's calls),
  crosses the link twice, waits for the pass in progress (half a pass on average) and is verified
  in the next: ``tau = draft + network + 1.5 T(B)``, the batch ``B = A T(B) / tau`` (Little's law
  on the GPU), and it commits ``c = (1 - a^(k+1)) / (1 - a)`` tokens (acceptance ``a``): a
  running response makes ``c / tau`` tok/s. A batch member verifies ``k + 1`` tokens over the
  context (:func:`held_context`; without prefix caching the whole context again; where the
  engine reuses whole blocks only, as stock vLLM does, half a block of its prefix again too),
  and one round in ``output / c`` is a response's first (its prompt). Past ``max_batch_tokens``
  or ``max_num_seqs`` rounds wait for passes of the largest batch.
- *centralized*: every step decodes one token (server-side speculation: the mean accepted run
  plus one, after its drafting) for each of the ``A`` running responses and prefills the
  prompts of the ones that start (``A * prompt / output`` tokens a step): ``tokens / T(A)`` tok/s.
  **Preemption**: vLLM admits a waiting request as soon as its prompt fits, so with the cache
  holding the running ones and a queue waiting, the blocks a running response grows into are
  found by preempting the newest, which is prefilled again when it is readmitted: a step
  prefills up to one token more per running response (:data:`RECOMPUTE`, the bound; the
  simulated engine, which schedules as vLLM's does, recomputes 0.67-0.76 of that).

Where the host is modelled, the engine core's CPU per step joins each pass (or overlaps it under
async scheduling), and the API servers' CPU is shared: the ``A`` running responses together
commit at most as many tokens a second as the API servers pass (``api_servers / api CPU per
committed token``), so past that each runs at its share, and they must have the CPU to keep all
N at ``s``: N devices at ``s`` tok/s send ``N s / c`` rounds a second (``N s / output`` requests
under centralized serving), each costing the API server its CPU (``cpu`` binds past
``--api-server-count``). When they bind, devices do not run at their own speed: they share the
rounds the API servers pass, which is why this check is on the rate the SLO needs, not the rate
devices would send.

**The tail.** A running device at the ``epsilon`` quantile of draft speed must still make ``s``
tok/s (else ``gpu`` binds, or the batch limit that held the pass). The waiting ones wait
``W = (N / A - 1) * output / v - think`` (closed loop: a response's cycle is N / A running times,
and a device's think time between responses is part of that cycle, not of the wait), and a
response at the ``epsilon`` quantile of output length must still finish at ``s``:
``W <= output_eps * (1 / s - 1 / v)`` (else ``kv`` or ``max_num_seqs`` binds).

**Drafting as the device drafts.** ``k`` and ``c`` are not the configured K and the formula for
it: :func:`drafting` runs the scenario's own drafting controller (a rejection predictor stops a
draft at its first predicted rejection) over responses drawn from its own acceptance model,
without a clock, and takes the mean tokens sent, draft passes and predictor calls paid, and
tokens committed per round. What is not modelled: bursts, queueing variance and the spread of
acceptance between responses; the simulated answer includes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from wispsim.config import Scenario
from wispsim.config.dist import Dist
from wispsim.config.limits import MAX_DEVICES
from wispsim.model.acceptance import make_acceptance
from wispsim.model.drafting import make_controller
from wispsim.model.host_cpu import for_server
from wispsim.model.memory import block_size, kv_window
from wispsim.model.profiles import Profile
from wispsim.model.speculation import resolve as resolve_speculation

QUEUE_PASSES = 1.5  # a round waits for the pass in progress (half, on average), then its own
# prompt tokens vLLM prefills again per token decoded while its KV cache is full under a waiting
# queue (module text, "Preemption"): the most there can be, every block a running response grows
# into freed by preempting the newest (the simulated engine recomputes 0.67-0.76 of them)
RECOMPUTE = 1.0
QUANTILES = np.linspace(0.0005, 0.9995, 1000)  # a distribution's moments, clipping included


@cache
def _grid(dist: Dist) -> np.ndarray:
    """``dist`` at :data:`QUANTILES`: its moments, clipping included, as means over the grid."""
    return np.array([dist.quantile(q) for q in QUANTILES])


def reserved_context(prompt: Dist, output: Dist, growth: float, round_tokens: int, block: int) -> float:
    """The mean KV an admitted response reserves, over the time it runs
    (:class:`wispsim.model.admission.Admission`): its prompt, ``growth`` tokens (more once it
    outgrows them: a response of ``O > growth`` holds ``growth^2 / 2 O + O / 2`` on average over
    its life), one round's tokens and half a block unfilled; weighted by how long each runs."""
    o, p = _grid(output), float(np.mean(_grid(prompt)))
    grown = np.where(o <= growth, growth, growth * growth / (2 * o) + o / 2)
    return p + float(np.mean(o * grown)) / float(np.mean(o)) + round_tokens + block / 2


def held_context(prompt: Dist, output: Dist) -> float:
    """The mean context of a running response, over the time it runs (and so over its rounds or
    decode steps): its prompt, and of its output ``O`` the half it has written, weighted by how
    long it runs (``E[O^2] / 2 E[O]``: a long response is running more of the time)."""
    o, p = _grid(output), float(np.mean(_grid(prompt)))
    return p + float(np.mean(o * o)) / (2 * float(np.mean(o)))


@dataclass(frozen=True)
class FluidEstimate:
    """The largest N (devices of one class on one replica) the fluid model finds feasible, the
    resource that stops N + 1 (``binds``: gpu, kv, cpu, max_num_seqs, max_batch_tokens; none
    past the device limit), and the batch and pass (``pass_ms``) it serves N with."""

    devices: int
    binds: str
    batch: float = 0.0
    pass_ms: float = math.nan

    def describe(self) -> str:
        return f"~{self.devices} ({self.binds})"


@dataclass(frozen=True)
class Running:
    """``A`` responses running: the mean and the slow-tail token speed of one, the batch and the
    pass, and the API servers' CPU seconds per committed token (a round's, or a response's, over
    the tokens it commits)."""

    speed: float
    slow: float
    batch: float
    pass_s: float
    api_per_token: float
    limit: str  # what holds the pass: gpu, or the batch limit that capped it


def _solve(f: Callable[[float], float], lo: float, hi: float) -> float:
    """A root of the decreasing ``f`` on [lo, hi] (bisection; ``hi`` if f(hi) >= 0)."""
    if f(hi) >= 0:
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        if f(mid) >= 0:
            lo = mid
        else:
            hi = mid
    return lo


def _largest_n(check: Callable[[int], str | None]) -> tuple[int, str]:
    """The largest N that ``check`` passes (None: feasible; else the resource that binds), and what
    binds at the next N (doubling, then bisection; up to :data:`MAX_DEVICES`)."""
    first = check(1)
    if first is not None:
        return 0, first
    lo, hi = 1, 2
    while hi <= MAX_DEVICES and check(hi) is None:
        lo, hi = hi, hi * 2
    if hi > MAX_DEVICES:
        return MAX_DEVICES, "none"
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if check(mid) is None:
            lo = mid
        else:
            hi = mid
    return lo, str(check(hi))


def _network_s(sc: Scenario) -> float:
    """A round's two crossings of the link, weighted by the links' shares (latency only)."""
    links, shares = sc.network.link_types, sc.network.links
    total = sum(shares.values()) or 1.0
    return sum(2 * links[name].latency_ms / 1000.0 * share / total for name, share in shares.items())


@dataclass(frozen=True)
class Drafting:
    """A round as the device drafts it, in the mean: tokens sent (``k``), draft forward passes
    and predictor calls paid, tokens committed."""

    k: float
    passes: float
    calls: float
    committed: float


DRAFTING_RESPONSES = 200  # responses :func:`drafting` draws: enough for a mean within ~1%


def drafting(sc: Scenario, responses: int = DRAFTING_RESPONSES, seed: int = 0) -> Drafting:
    """The mean round of ``sc``'s drafting controller over ``responses`` responses drawn from its
    acceptance model (prompt at its nominal length, outputs from the workload's distribution):
    the device's own loop (``wispsim.sim.device``), without a clock or a server."""
    wl = sc.workload
    key = tuple(
        repr(x) for x in (sc.acceptance, sc.drafting, wl.prompt_tokens, wl.output_tokens, responses, seed)
    )
    if key not in _DRAFTING:
        _DRAFTING[key] = _draft_rounds(sc, responses, seed)
    return _DRAFTING[key]


_DRAFTING: dict[tuple[str, ...], Drafting] = {}


def _draft_rounds(sc: Scenario, responses: int, seed: int) -> Drafting:
    acceptance, controller = make_acceptance(sc.acceptance), make_controller(sc.drafting)
    rng = np.random.default_rng(seed)
    pad = sc.drafting.k_max + 2
    prompt = max(1, round(sc.workload.prompt_tokens.nominal()))
    outputs = np.atleast_1d(sc.workload.output_tokens.sample(rng, responses))
    sent = passes = calls = committed = rounds = 0
    for out in outputs:
        stream = acceptance.new_response(rng, prompt, max(1, int(out)), pad)
        state, run, output, pos = controller.prepare(stream), stream.run, stream.output_len, 0
        while pos < output:
            remaining = output - pos
            k, p, c = controller.plan(state, pos, remaining)
            accepted = min(int(run[pos]), k)
            step = accepted + 1 if accepted < remaining else remaining
            sent, passes, calls, committed, rounds = (
                sent + k,
                passes + p,
                calls + c,
                committed + step,
                rounds + 1,
            )
            pos += step
    n = max(rounds, 1)
    return Drafting(sent / n, passes / n, calls / n, committed / n)


def _committed(rate: float, k: int) -> float:
    """Tokens a round of ``k`` drafts commits in the mean: the accepted run and the bonus token."""
    return (1 - rate ** (k + 1)) / (1 - rate) if rate < 1 else k + 1.0


def fluid_capacity(
    scenario: Scenario, slo: float, profile: Profile, kv_tokens: int, epsilon: float | None = None
) -> FluidEstimate:
    """The fluid estimate (module text) of one replica of ``scenario``'s server, priced by
    ``profile`` with ``kv_tokens`` of KV cache, serving devices of SLO ``slo`` tok/s;
    ``epsilon``: the tail that must keep it (default: the scenario's)."""
    sc, srv = scenario, scenario.server
    eps = sc.epsilon if epsilon is None else epsilon
    out = sc.workload.output_tokens
    prompt, output, short = sc.workload.prompt_tokens.nominal(), out.nominal(), out.quantile(eps)
    think = sc.workload.think_time_s.nominal()  # a device's pause between its responses
    host = for_server(srv, profile.host)
    rate = make_acceptance(sc.acceptance).nominal_rate()
    seqs = srv.engine.max_num_seqs
    if srv.mode == "centralized":
        running, at_once = _centralized(sc, profile, kv_tokens, prompt, output, rate, host)
    else:
        running, at_once = _speculative(sc, profile, kv_tokens, prompt, output, rate, host, eps)
    held = "max_num_seqs" if at_once == seqs else "kv"
    # vLLM's plain LRU prefix cache admits everyone: past the contexts it holds it evicts the
    # prefixes of running responses, their rounds turn cold, and the replica collapses
    thrashes = (
        srv.mode != "centralized"
        and srv.verifier.kv_policy != "admission"
        and srv.engine.enable_prefix_caching
    )
    api_servers = host.api_servers if host is not None else math.inf
    # the share of a device's cycle spent in a response at the SLO (output / s against
    # output / s + think): all of it without think time; at most that many run at once
    duty = output / (output + think * slo)
    state: dict[int, Running] = {}

    def check(n: int) -> str | None:
        if thrashes and n > at_once:
            return "kv"
        a = min(max(1, math.ceil(n * duty)), at_once)
        r = state[n] = running(a)
        # the API servers pass at most api_servers / api_per_token committed tokens a second,
        # shared by the A running responses: past that their rounds queue there
        share = api_servers / (a * r.api_per_token) if r.api_per_token > 0 else math.inf
        speed, slow = min(r.speed, share), min(r.slow, share)
        if slow < slo:
            return "cpu" if share < r.slow else r.limit
        # a closed loop through A slots: a response waits (N / A - 1) output / v, less the time
        # its device spent thinking (while it thinks it holds no place in the queue)
        if n > a and (n / a - 1) * output / speed - think > short * (1 / slo - 1 / speed):
            return held
        # too little API-server CPU to keep all N at slo (a device thinking sends nothing)
        if n * duty * slo * r.api_per_token > api_servers:
            return "cpu"
        return None

    n, binds = _largest_n(check)
    if n == 0:
        return FluidEstimate(0, binds)
    r = state[n]
    return FluidEstimate(n, binds, r.batch, r.pass_s * 1e3)


def _speculative(
    sc: Scenario, profile: Profile, kv_tokens: int, prompt: float, output: float, rate: float,
    host: Any, eps: float,
) -> tuple[Callable[[int], Running], int]:  # fmt: skip
    srv = sc.server
    cost = profile.estimator
    plan = drafting(sc)
    k, committed = plan.k, plan.committed
    speed = sc.devices.draft_speed
    net = _network_s(sc)
    calls_s = plan.calls * sc.devices.predictor_latency_ms / 1000.0
    draft, slow_draft = plan.passes / speed.nominal() + calls_s, plan.passes / speed.quantile(eps) + calls_s
    context = held_context(sc.workload.prompt_tokens, sc.workload.output_tokens)
    block = block_size(srv.engine.block_size, profile)
    cold = min(1.0, committed / output)  # a response's first round carries its prompt
    cached = srv.engine.enable_prefix_caching
    resident = srv.verifier.kind == "resident"
    top = float(max(1, min(srv.engine.max_num_seqs, srv.verifier.max_batch_tokens // (k + 1))))
    limit = "max_num_seqs" if top == srv.engine.max_num_seqs else "max_batch_tokens"
    # a re-submitted round whose engine reuses whole blocks only forwards its prefix's partly
    # filled last block again, half a block on average (resident sessions reuse token by token)
    tail = block / 2 if cached and not resident and srv.engine.prefix_reuse == "block" else 0.0
    warm_new, warm_cached = (k + 1.0 + tail, context - tail) if cached else (context + k + 1.0, 0.0)
    cold_new = prompt + k + 1.0
    api = host.api(resident, ids=0 if resident else int(context)) if host is not None else 0.0
    above = cost.prefill_above

    @cache
    def pass_s(b: float) -> float:
        n_lin = b * ((1 - cold) * warm_new + cold * cold_new)
        n_int = b * ((1 - cold) * warm_new * (warm_new + warm_cached) + cold * cold_new * cold_new)
        # the attention backend's prefills (wispsim.model.batch.Shape), by their mean new tokens
        warm = (1 - cold) * (warm_new > above)
        pre_int = b * (warm * warm_new * (warm_new + warm_cached) + cold * (cold_new > above) * cold_new**2)
        gpu = cost.batch(
            n_lin, n_int, b * (1 - cold) * warm_cached, b, b, None, pre_int, b * warm * warm_cached
        )
        if host is None:
            return gpu
        hashed = 0 if resident else round(b * (prompt if cached else context))
        n = max(1, round(b))
        return host.step_time(gpu, host.engine(n, n, n if resident else 0, hashed))

    def running(a: int) -> Running:
        # the batch where A rounds in a cycle of tau meet passes of T(B): B = A T(B) / tau
        b = _solve(lambda x: a * pass_s(x) / (draft + net + QUEUE_PASSES * pass_s(x)) - x, 1e-6, top)
        tau = max(draft + net + QUEUE_PASSES * pass_s(b), a * pass_s(top) / top)
        capped = a * pass_s(top) / top > draft + net + QUEUE_PASSES * pass_s(b)
        slow_tau = tau + slow_draft - draft
        return Running(
            committed / tau, committed / slow_tau, b, pass_s(b), api / committed, limit if capped else "gpu"
        )

    if srv.verifier.kv_policy == "admission":
        out = sc.workload.output_tokens
        growth = {"mean": out.nominal(), "max": out.support()[1], "none": 0.0}[srv.verifier.kv_growth]
        reserved = reserved_context(sc.workload.prompt_tokens, out, growth, sc.drafting.largest + 1, block)
        at_once = int(kv_tokens * (1.0 - srv.verifier.kv_headroom) // reserved)
        if resident:  # a paused session holds one of the engine's request slots
            at_once = min(at_once, srv.engine.max_num_seqs)
    else:  # vLLM's LRU prefix cache: the contexts it holds (past them it thrashes: ``thrashes``)
        at_once = int(kv_tokens // (context + block / 2))
    return running, max(1, min(at_once, MAX_DEVICES))


def _centralized(
    sc: Scenario, profile: Profile, kv_tokens: int, prompt: float, output: float, rate: float,
    host: Any,
) -> tuple[Callable[[int], Running], int]:  # fmt: skip
    srv = sc.server
    cost = profile.estimator
    spec = resolve_speculation(srv, profile)
    if spec is None:
        per_step, look = 1.0, 1
    else:
        length = spec.acceptance_length
        per_step = length + 1.0 if length is not None else _committed(rate, spec.k)
        look = spec.k + 1
    context = held_context(sc.workload.prompt_tokens, sc.workload.output_tokens)
    block = block_size(srv.engine.block_size, profile)  # its last block half filled, on average
    window = kv_window(srv, profile)  # windowed layers hold the window only
    if window:  # tokens of KV (counted over every layer) that a running response's pages take up
        held = window.pages(round(context), 1, block) * block * window.size / window.layers
    else:
        held = context + block / 2
    at_once = min(srv.engine.max_num_seqs, int(kv_tokens // held))
    read = window.cached(round(context)) if window else context  # cached tokens a decode reads
    above = max(cost.prefill_above, look)  # a speculating engine decodes k + 1 tokens
    api = host.api(False, text=int(prompt)) if host is not None else 0.0

    @cache
    def step_s(b: int) -> float:
        # prompt tokens prefilled per step, on average: the prompts of the responses that start,
        # and with the cache full (KV holds the running ones) those of preempted ones again
        recompute = RECOMPUTE if b == at_once < srv.engine.max_num_seqs else 0.0
        chunk = b * per_step * (prompt / output + recompute)
        starts = b * per_step / output
        n_int = b * look * (look + context) + chunk * chunk
        keys = b * window.interactions(look, round(context)) + chunk * chunk if window else n_int
        # logit rows: every decode's (k + 1 where the server speculates), a prompt's last token
        pre = chunk * chunk if prompt > above else 0.0  # a chunk is a prefill past the threshold
        gpu = cost.batch(b * look + chunk, keys, b * read, b + starts, starts, b * look + starts, pre)
        if spec is not None:  # the draft's own layers: no window
            gpu += spec.draft_time(b * look, int(n_int), int(b * context), b, int(b * context))
        if host is None:
            return gpu
        return host.step_time(gpu, host.engine(b, max(1, round(starts)), 0, round(chunk)))

    def running(a: int) -> Running:
        t = step_s(a)
        v = per_step / t
        return Running(v, v, float(a), t, api / output, "gpu")

    return running, max(1, min(at_once, MAX_DEVICES))
