"""One simulation run: build the servers -> launch the devices -> run -> collect the records.

:func:`simulate` is the only entry point the rest of the package uses, and it reads as one step:
it builds what the devices talk to, launches the devices, runs SimPy until every *measured*
response is decided, and packs the round, batch and response records into a
:class:`~wispsim.sim.records.SimResult`. What runs is made of components handed in (as desmod
hands its components the environment), not switched on by flags:

- a :class:`ServerSide` builds the server the devices talk to, ``ctx.server``, for the run's
  serving (``ctx.serving``: :mod:`wispsim.sim.servers`, the one server factory). The default,
  :class:`~wispsim.sim.servers.SimulatedServers`, builds one simulated replica per profile (a
  :class:`~wispsim.sim.verifier.Verifier` or a :class:`~wispsim.sim.centralized.CentralizedServer`),
  behind a router where there are several; :mod:`wispsim.serve.swarm` hands in one that installs
  clients of a real server.
- a :class:`DeviceSide` starts the load. The default, :class:`SimulatedDevices`, is the
  scenario's arrival process launching simulated devices (:class:`~wispsim.sim.device.Device`);
  :mod:`wispsim.study.replay.drive` hands in one that drives recorded devices.
- ``env``, the clock: a fresh :class:`simpy.Environment` by default; the swarm hands in one on
  the wall clock.

Measurement window: responses that start in [warmup, warmup + duration) are measured. Devices keep
generating load after the window closes until every measured response has finished, or has run
past the time at which it could still meet its SLO (then it is a certain violation and is recorded
as censored), or ``drain_limit_s`` has passed. Measuring only responses that *finish* inside a
window would drop the slow ones and bias the violation rate down; this avoids that.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

import simpy
import threadpoolctl

from wispsim.config.limits import MAX_DEVICES
from wispsim.errors import ConfigError
from wispsim.model.fleet import device_specs, fleet_size
from wispsim.sim.arrivals import make_arrivals
from wispsim.sim.context import RunContext
from wispsim.sim.device import Device
from wispsim.sim.records import MEMORY_ROWS, SimResult
from wispsim.sim.scenarios import Resolved
from wispsim.sim.servers import SimulatedServers, request_outputs
from wispsim.sim.serving import serving_of


class ServerSide(Protocol):
    """What the devices of a run talk to (see the module text)."""

    def build(self, ctx: RunContext, resolved: Resolved) -> None:
        """Set ``ctx.server`` (for ``ctx.serving``), before any device starts."""
        ...

    def info(self, ctx: RunContext) -> dict[str, Any]:
        """What the server side adds to the result's ``info`` once the run has ended."""
        ...


class DeviceSide(Protocol):
    """The load of a run: who starts devices, and when (see the module text)."""

    def launch(self, ctx: RunContext, devices: int) -> None:
        """Set ``ctx.arrivals``, start the device processes (``devices``: the scenario's count,
        or the caller's) and count them in ``ctx.devices_started``."""
        ...


def simulate(
    resolved: Resolved,
    devices: int | None = None,
    seed: int | None = None,
    *,
    servers: ServerSide | None = None,
    load: DeviceSide | None = None,
    env: simpy.Environment | None = None,
    memory_rows: int = MEMORY_ROWS,
) -> SimResult:
    """Run one simulation of a resolved scenario with ``devices`` devices (default: its
    ``devices.count``).

    ``resolved`` is a :class:`~wispsim.sim.scenarios.Resolved`, taken as it is: nothing is loaded
    or checked again (:func:`wispsim.sim.scenarios.check`, ``wispsim.check`` from Python,
    resolves a scenario, once). A bad device count names the field ``devices.count``; the
    entrance hall (:mod:`wispsim.runs`) names the option that set it. ``servers``, ``load``
    and ``env`` are the run's components (module text; default: simulated servers, the arrival
    process with simulated devices, a fresh SimPy environment). ``memory_rows``: records a table
    keeps in memory before it spills to a temporary Parquet file (:mod:`wispsim.sim.records`); the
    records, and every summary of them, are the same either way.
    """
    run = Run(resolved, devices, seed, servers=servers, load=load, env=env, memory_rows=memory_rows)
    with paced_for_runs():
        run.env.run(until=run.ctx.recorder.done)  # every measured response decided
    return run.result()


# Objects a young collection waits for while a run runs (Python's default is 700). A round
# allocates a few short-lived objects that die young without cycles (its request, its verdict, a
# tuple or two), so collecting them every ~150 rounds only walks them; what a run keeps (devices,
# records in packed buffers) lives on. Measured: 3-4% of a run's time (benchmarks/README.md).
YOUNG_THRESHOLD = 20_000


class _Pacing:
    """The process's settings while runs are in progress (a run may run inside another's)."""

    lock = threading.Lock()
    runs = 0
    young = 700  # the threshold to give back
    froze = False  # whether the outermost run froze (not where its caller had frozen objects itself)
    blas: Any = None  # the BLAS thread limit to lift when the outermost run returns


@functools.cache
def _blas() -> threadpoolctl.ThreadpoolController:
    """The BLAS libraries loaded in this process, looked up once (importing this module loads
    numpy's, where a run's products run; one loaded later, torch's say, is left as it is)."""
    return threadpoolctl.ThreadpoolController()


def _set_blas(limiter: Any) -> Any:
    """Apply (``limiter`` None) or lift the one-thread BLAS limit, from whichever thread, without
    keeping OpenBLAS's control: threadpoolctl (3.6+) lets only the thread that last set a pthreads
    OpenBLAS's threads set them again until it lets go, so a run on another thread, or the caller,
    could not set them afterwards. Returns the limiter to lift (None where it cannot be set)."""
    try:
        if limiter is None:
            limiter = _blas().limit(limits=1, user_api="blas")
        else:
            limiter.restore_original_limits()
    except Exception:  # a BLAS threadpoolctl cannot drive: the run runs as it is
        limiter = None
    release = getattr(getattr(threadpoolctl, "OpenBLASController", None), "clear_controlling_thread", None)
    if release is not None:
        release(force=True)
    return limiter


@contextlib.contextmanager
def paced_for_runs() -> Iterator[None]:
    """Run a simulation with the process paced for it, everything given back when the outermost
    run returns (or raises); the records are the same either way.

    - The cyclic garbage collector: what existed before is frozen out of its collections
      (``gc.freeze``: the interpreter's modules, the scenario, pandas) and young collections come
      every :data:`YOUNG_THRESHOLD` objects instead of 700. Given back, the frozen objects and what
      the run made that is still uncollected go to the oldest generation. A caller that froze
      objects itself (``gc.freeze`` before a fork) keeps them frozen: only the threshold changes.
    - BLAS on one thread (threadpoolctl, as the sweep's pool workers run): a run's matrix products
      are tiny (a rejection predictor's layers over one response's positions), and OpenBLAS's pool
      makes each one wake and wait for its threads: a WISP run took 20-25% longer in-process
      (`wispsim run`: 2.1-2.4 s against 1.6-1.9 s, one Intel host; benchmarks/README.md)."""
    with _Pacing.lock:
        _Pacing.runs += 1
        if _Pacing.runs == 1:
            young, *older = gc.get_threshold()
            _Pacing.young = young
            _Pacing.froze = gc.get_freeze_count() == 0
            if _Pacing.froze:
                gc.freeze()
            gc.set_threshold(YOUNG_THRESHOLD, *older)
            _Pacing.blas = _set_blas(None)
    try:
        yield
    finally:
        with _Pacing.lock:
            _Pacing.runs -= 1
            if _Pacing.runs == 0:
                gc.set_threshold(_Pacing.young, *gc.get_threshold()[1:])
                if _Pacing.froze:
                    gc.unfreeze()
                if _Pacing.blas is not None:
                    _set_blas(_Pacing.blas)
                _Pacing.blas = None


class Run:
    """One simulation built and run in steps: :meth:`advance` to a time, look at what is decided
    (:meth:`complete_until`, :meth:`decided_before`), :meth:`cut` it short or run on, then
    :meth:`result`. Stepping changes nothing: a run advanced to its end in any steps gives the
    records :func:`simulate` gives (arguments as there). A cut run measures what the same run with
    its window closed at the cut measures, with the same verdicts (:mod:`wispsim.sim.recorder`)."""

    def __init__(
        self,
        resolved: Resolved,
        devices: int | None = None,
        seed: int | None = None,
        *,
        servers: ServerSide | None = None,
        load: DeviceSide | None = None,
        env: simpy.Environment | None = None,
        memory_rows: int = MEMORY_ROWS,
    ) -> None:
        self.wall0 = time.perf_counter()
        if not isinstance(resolved, Resolved):
            raise TypeError(
                f"simulate takes a resolved scenario, got {type(resolved).__name__}: resolve it once "
                "with wispsim.check(scenario)"
            )
        sc = resolved.scenario
        n = devices if devices is not None else sc.devices.count
        if not 1 <= n <= MAX_DEVICES:
            raise ConfigError("scenario", "devices.count", f"must be in [1, {MAX_DEVICES:,}], got {n:,}")
        self.resolved = resolved
        self.env = env = simpy.Environment() if env is None else env
        ctx = self.ctx = RunContext(
            env, sc, sc.seed if seed is None else seed, resolved.profiles[0], memory_rows
        )
        ctx.serving = serving_of(sc)
        _request_lengths(ctx)
        self.servers = SimulatedServers() if servers is None else servers
        self.servers.build(ctx, resolved)
        (SimulatedDevices() if load is None else load).launch(ctx, n)
        env.process(ctx.recorder.watchdog())

    @property
    def ended(self) -> bool:
        """Every measured response is decided (or the run was cut)."""
        return self.ctx.recorder.done.processed or self.ctx.recorder.done.triggered

    def advance(self, until: float) -> bool:
        """Run to simulated time ``until``, or to the run's end if that comes first; True once
        the run has ended."""
        done = self.ctx.recorder.done
        if not self.ended and until > self.env.now:
            with paced_for_runs():
                self.env.run(until=self.env.any_of([done, self.env.timeout(until - self.env.now)]))
        return self.ended

    def complete_until(self) -> float:
        """The latest start time before which every measured response is decided (recorder)."""
        return self.ctx.recorder.complete_until()

    def decided_before(self, t: float) -> list[tuple[float, int, float, bool]]:
        """(start, device, SLO, violated) of the measured responses that started before ``t``."""
        return self.ctx.recorder.decided_before(t)

    def cut(self, t: float) -> None:
        """End the run now, its measurement window closed at ``t`` (at most :meth:`complete_until`)."""
        self.ctx.recorder.cut(t)

    def result(self) -> SimResult:
        """The run's records and facts (run it to its end, or cut it, first)."""
        assert self.ended, "advance the run to its end or cut it first"
        return _collect(self.ctx, self.resolved, self.servers.info(self.ctx), self.wall0)


def _request_lengths(ctx: RunContext) -> None:
    """Under a request trace (checked to fit by the resolver): its output lengths go to
    ``ctx.request_outputs`` (admission control sizes responses by them), and without a drain
    limit the run drains the longest request at the slowest class."""
    sc = ctx.scenario
    outputs = ctx.request_outputs = request_outputs(sc)
    if outputs is not None and sc.workload.drain_limit_s is None:
        slos = [g.slo for g in sc.devices.groups] or list(sc.devices.classes)
        rec = ctx.recorder
        rec.drain_s = max(rec.drain_s, outputs[1] / min(slos))


class SimulatedDevices:
    """The default :class:`DeviceSide`: the scenario's arrival process launches simulated devices
    (closed: ``devices`` of them at once; open: one per session, from a fleet of device specs)."""

    def launch(self, ctx: RunContext, devices: int) -> None:
        sc = ctx.scenario
        arrivals = ctx.arrivals = make_arrivals(ctx, devices)
        specs = device_specs(sc, arrivals.n if not arrivals.open else fleet_size(sc))

        def start(index: int, once: bool) -> None:
            ctx.devices_started += 1
            Device(ctx, index, specs[index % len(specs)], once).start()

        arrivals.start(start)


def _collect(ctx: RunContext, resolved: Resolved, notes: dict[str, Any], wall0: float) -> SimResult:
    """The run's records and facts, packed into its result."""
    sc = ctx.scenario
    info: dict[str, Any] = {"kv_capacity_tokens": resolved.capacities[0], "replicas": sc.server.replicas}
    if sc.arrivals.process != "closed":
        info["devices_started"] = ctx.devices_started
    info |= notes
    rounds, batches, responses = ctx.recorder.close()
    return SimResult(
        scenario=sc,
        seed=ctx.seed,
        devices=ctx.devices_started,  # closed: N; open or replayed: as many as started
        round_records=rounds,
        batches=batches,
        responses=responses,
        window=ctx.recorder.window,
        sim_end=ctx.env.now,
        wall_s=time.perf_counter() - wall0,
        kv_blocks=resolved.capacities[0] // resolved.block_sizes[0],
        info=info,
        block_size=resolved.block_sizes[0],
    )
