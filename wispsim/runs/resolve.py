"""The resolver: scenario file + ``--set`` + command-line options -> one checked scenario, once.

Every command starts here. :func:`resolve` reads the file (or the default scenario, or a shipped
one by name), merges the ``--set`` overrides, applies the policy preset, then the options
(``--policy``, ``--arrivals``, ``--replicas``/``--router``, ``--devices``/``--classes``,
``--fleet``, ``--profile``, ``--seed``), and checks the result once: the plug-in names, the
profiles, the KV memory, the lengths, the arrival trace, that every class is reachable. It
returns a :class:`~wispsim.sim.scenarios.Resolved` (the scenario with each replica's profile, KV
capacity and block size), which :func:`wispsim.sim.simulation.simulate` takes as it is: nothing
parses, merges or checks the scenario again on the way.

A check that fails is one line naming whoever set the field at fault: the option, ``--set``, or
the file.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from wispsim.config import DeviceGroup, FieldError, Scenario, parse_set
from wispsim.config.limits import MAX_ARRIVAL_RATE, MAX_REPLICAS, MAX_SEED
from wispsim.config.schema import POLICY_NAMES
from wispsim.errors import ConfigError
from wispsim.sim.arrivals import driven_by_trace
from wispsim.sim.router import ROUTERS
from wispsim.sim.scenarios import Resolved, check_consistency, dotted_fields, load_scenario, relabel

# which scenario fields each command-line option sets, so a failed check names the option
OPTION_FIELDS: dict[str, tuple[str, ...]] = {
    "--classes": ("devices.classes", "devices.groups"),
    "--devices": ("devices.count",),
    "--fleet": ("devices.groups",),
    "--arrivals": ("arrivals", "workload"),
    "--replicas": ("server.replicas", "server.replica_profiles"),
    "--router": ("server.router",),
    "--profile": ("server.profile", "server.replica_profiles"),
    "--policy": (
        "policy",
        "drafting.controller",
        "server.mode",
        "server.scheduler",
        "server.engine.enable_prefix_caching",
    ),
}
# the option-only fields below runs/ name: a profile's (profile derive) and simulate's device count
DERIVE_OPTIONS = {
    "precision": "--dtype",
    "kv_dtype": "--kv-dtype",
    "gpu_count": "--count",
    "tensor_parallel_size": "--count",
    "model.arch": "--arch",
    "gpu": "--gpu",
}


@contextmanager
def blaming(owners: dict[str, str]) -> Iterator[None]:
    """A :class:`ConfigError` raised below the entrance hall names a field; re-raised naming the
    option that set it (``owners``: field -> option), if any did."""
    try:
        yield
    except ConfigError as e:
        raise relabel(e, owners) from None


@dataclass(frozen=True)
class Options:
    """The command-line options that change a scenario; None where not given."""

    policy: str | None = None
    devices: int | None = None
    classes: tuple[float, ...] | None = None
    seed: int | None = None
    arrivals: str | None = None
    tail: float = 300.0  # with a trace: seconds measured after it ends
    replicas: int | None = None
    router: str | None = None
    fleet: tuple[DeviceGroup, ...] | None = None
    profile: str | None = None

    def owners(self) -> dict[str, str]:
        """Dotted scenario field -> the option that set it (for one-line errors)."""
        out: dict[str, str] = {}
        for opt, fields in OPTION_FIELDS.items():
            if getattr(self, opt.removeprefix("--")) is not None:
                out.update(dict.fromkeys(fields, opt))
        return out


# the field an option sets outright (the first it owns): a --set of it too would be overridden
OPTION_SETS = {opt: fields[0] for opt, fields in OPTION_FIELDS.items()} | {"--seed": "seed"}


def check_twice(options: Options, fields: Iterable[str], named: dict[str, str] | None = None) -> None:
    """An option and a ``--set`` of the field it sets: refused (which wins would be a guess);
    ``named``: an option as the command spells it (compare's ``--policies``)."""
    for opt, field in OPTION_SETS.items():
        if getattr(options, opt.removeprefix("--")) is None:
            continue
        for f in fields:
            if f == field or f.startswith(field + "."):
                raise ConfigError("--set", f, f"{(named or {}).get(opt, opt)} sets it too; give one of them")


def resolve(
    file: Path | str | None = None,
    sets: list[str] | None = None,
    options: Options | None = None,
    *,
    base: dict | None = None,
    source: str | None = None,
) -> Resolved:
    """The scenario a command runs, checked once (see the module text). ``base`` is a scenario
    mapping the file is merged over (a replay log's, a validation's); ``source`` names it."""
    options = options or Options()
    overrides = parse_set(sets or [])
    check_twice(options, dotted_fields(overrides))
    if options.policy is not None and options.policy in POLICY_NAMES:
        # the policy --policy chooses is the one whose preset the file and --set are checked
        # against (an unknown name is refused by apply_options, naming --policy)
        overrides = {**overrides, "policy": options.policy}
    sc = load_scenario(file, overrides, base=base, source=source, consistency=False)
    sc = apply_options(sc, options)
    label = source or (str(file) if file is not None else "default scenario")
    owners = {**dict.fromkeys(dotted_fields(parse_set(sets or [])), "--set"), **options.owners()}
    try:
        return check_consistency(sc, label)
    except ConfigError as e:
        raise relabel(e, owners) from None


def load(
    file: Path | str | None = None,
    sets: list[str] | None = None,
    *,
    base: dict | None = None,
    source: str | None = None,
    policy: str | None = None,
) -> Scenario:
    """The scenario file with ``sets`` merged and its policy preset applied (``policy``: this one,
    as ``--policy`` chooses it, ``--set`` checked against its preset), its plug-in names checked,
    but not yet :func:`check`-ed: for a command that derives several scenarios from one (a
    sweep's policies) and checks each once."""
    overrides = parse_set(sets or [])
    if policy is not None:
        overrides = {**overrides, "policy": policy}
    return load_scenario(file, overrides, base=base, source=source, consistency=False)


def check(sc: Scenario, options: Options | None = None) -> Resolved:
    """The one consistency check of a scenario (profiles, memory, lengths, reachability), an
    error blamed on the option that set the field at fault."""
    try:
        return check_consistency(sc, "scenario")
    except ConfigError as e:
        raise relabel(e, (options or Options()).owners()) from None


def apply_options(sc: Scenario, o: Options) -> Scenario:
    """``o`` applied to ``sc`` in the order a user reads them: policy, arrivals, replicas and
    router, fleet, profile, devices and classes, seed."""
    owners = o.owners()
    if o.policy is not None:
        with blaming(owners):
            sc = sc.with_policy(o.policy)
    with applying("--arrivals", {"tail": "--tail"}):
        sc = apply_arrivals(sc, o.arrivals, o.tail)
    if o.replicas is not None and not 1 <= o.replicas <= MAX_REPLICAS:
        raise ConfigError("--replicas", "", f"must be in [1, {MAX_REPLICAS}], got {o.replicas}")
    if o.router is not None:
        ROUTERS.get(o.router, "--router")
    with applying("--replicas", {"router": "--router"}):
        sc = sc.with_replicas(o.replicas, o.router)
    if o.fleet is not None:
        with applying("--fleet"):
            sc = sc.replace(devices=dataclasses.replace(sc.devices, groups=o.fleet))
    if o.profile is not None:
        with applying("--profile"):
            srv = dataclasses.replace(sc.server, profile=o.profile, replica_profiles=())
            sc = sc.replace(server=srv)
    if o.devices is not None or o.classes is not None:
        with blaming(owners), applying("--devices", {"class": "--classes", "slo": "--classes"}):
            sc = sc.with_devices(sc.devices.count if o.devices is None else o.devices, o.classes)
    if o.seed is not None:
        with applying("--seed"):
            sc = sc.replace(seed=o.seed)
    return sc


@contextmanager
def applying(option: str, by_field: dict[str, str] | None = None) -> Iterator[None]:
    """Apply an option to a scenario: a schema check that fails (a :class:`FieldError`) becomes
    a one-line :class:`ConfigError` naming ``option`` (or, when the failing field's name
    contains a key of ``by_field``, that key's option)."""
    try:
        yield
    except FieldError as e:
        name = next((o for k, o in (by_field or {}).items() if k in (e.field or "")), option)
        raise ConfigError(name, "", f"{e.field}: {e.problem}" if e.field else e.problem) from None


def apply_arrivals(sc: Scenario, text: str | None, tail: float = 300.0) -> Scenario:
    """``--arrivals``: FILE, concurrency:FILE, rate:FILE, requests:FILE or poisson:RATE.

    A trace sets the measurement window to the trace's span plus ``tail`` seconds (its last
    value holding), so recovery after the last burst is measured too."""
    if text is None:
        return sc
    kind, _, rest = text.partition(":")
    if kind == "poisson":
        try:
            rate = float(rest)
        except ValueError:
            rate = -1.0
        if not 0 < rate <= MAX_ARRIVAL_RATE:
            raise ConfigError(
                "--arrivals",
                "",
                f"poisson:RATE needs a rate in (0, {MAX_ARRIVAL_RATE:g}] responses/s, got {rest!r}",
            )
        try:
            return sc.with_arrivals(dataclasses.replace(sc.arrivals, process="poisson", rate=rate))
        except FieldError as e:
            raise ConfigError("--arrivals", e.field, e.problem) from None
    if kind == "requests" and rest:
        process, path = "requests", rest
    elif kind in ("concurrency", "rate") and rest:
        process, path = "trace", rest
    else:
        process, kind, path = "trace", sc.arrivals.kind, text
    if not (math.isfinite(tail) and tail >= 0):
        raise ConfigError("--tail", "", f"must be a finite number >= 0, got {tail}")
    try:
        return driven_by_trace(sc, process, path, kind, tail, "--arrivals")
    except FieldError as e:
        raise ConfigError("--arrivals", f"workload.{e.field}", e.problem) from None


#: Points of one time series (run's --step over the run's length).
MAX_SERIES_POINTS = 1_000_000


def check_series_step(step: float, span: float, option: str = "--step") -> None:
    """A time-series step that gives at most :data:`MAX_SERIES_POINTS` points over ``span`` s."""
    if span / step > MAX_SERIES_POINTS:
        raise ConfigError(
            option,
            "",
            f"{step:g} s gives {span / step:.3g} points over {span:g} s; "
            f"at most {MAX_SERIES_POINTS} (use a step >= {span / MAX_SERIES_POINTS:.3g} s)",
        )


def check_poisson_rate(arrivals: str | None) -> None:
    """``--arrivals poisson:RATE`` with a finite rate of at most ``MAX_ARRIVAL_RATE`` (the rest of
    the option is checked where it is applied)."""
    kind, _, rest = (arrivals or "").partition(":")
    if kind != "poisson":
        return
    try:
        rate = float(rest)
    except ValueError:
        return
    if not math.isfinite(rate) or rate > MAX_ARRIVAL_RATE:
        raise ConfigError(
            "--arrivals",
            "",
            f"poisson:RATE needs a finite rate in (0, {MAX_ARRIVAL_RATE:g}] responses/s, got {rest!r}",
        )


def check_backend(backend: str, address: str | None) -> None:
    """``--backend`` and ``--address``, checked before any work (the runner checks them again)."""
    from wispsim.study.runners import BACKENDS

    if backend not in BACKENDS:
        raise ConfigError("--backend", "", f"got {backend!r}; allowed: {', '.join(BACKENDS)}")
    if address and backend != "ray":
        raise ConfigError("--address", "", "only with --backend ray")


def check_seeds(first: int, count: int, option: str = "--seed") -> list[int]:
    """``count`` consecutive seeds from ``first``, all within ``0 .. MAX_SEED``."""
    if first + count - 1 > MAX_SEED:
        raise ConfigError(option, "", f"{first} + {count} seeds goes past the largest seed {MAX_SEED}")
    return [first + i for i in range(count)]


def check_start(start: int, most: int, start_opt: str = "--start", most_opt: str = "--max-devices") -> None:
    if start > most:
        raise ConfigError(start_opt, "", f"must be <= {most_opt} ({most}), got {start}")
