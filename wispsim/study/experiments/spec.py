"""Study specs: the YAML files under ``experiments/``, found, loaded and checked.

A spec names its ``study`` kind (a name in :data:`STUDIES`; the kinds register themselves from
:mod:`~wispsim.study.experiments.capacity_studies` and :mod:`~wispsim.study.experiments.run_studies`),
its parameters, and a ``quick`` block of overrides for a reduced run. Every field a study reads is
checked here, before any simulation runs, with a one-line error naming the file and the field.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from wispsim.config import POLICIES, deep_merge
from wispsim.errors import ConfigError, WispsimError
from wispsim.model.profiles import find_profile
from wispsim.paths import checkout_dir
from wispsim.registry import Registry
from wispsim.study.experiments.checks import numbers

# study kind -> function(Context) -> Section (wispsim.study.experiments.run)
STUDIES: Registry[Callable[..., Any]] = Registry("study")


def experiments_dir() -> Path:
    """``experiments/`` of the checkout (the studies are project files, not package data)."""
    here = Path.cwd() / "experiments"
    if here.is_dir():
        return here
    repo = checkout_dir() / "experiments"
    if repo.is_dir():
        return repo
    raise WispsimError("experiments/: not found; run from the wispsim checkout")


def list_experiments() -> list[str]:
    """The studies under ``experiments/``, in the order of their ``order`` keys (then by name)."""
    specs = []
    for p in sorted(experiments_dir().glob("*.yaml")):
        specs.append((load_spec(p.stem).get("order", 100), p.stem))
    return [name for _, name in sorted(specs)]


# every field some study kind reads (the kinds share one namespace of fields)
STUDY_FIELDS = (
    "about", "alternatives", "api_measurements", "arms", "at_capacity_details", "bands", "baselines",
    "calibration", "calibration_of", "classes", "commands", "data", "devices", "discussion",
    "discussion_for", "engine", "epsilon", "every_variant_side_by_side", "exclude_groups", "exclude_runs",
    "factor", "fit", "fit_start", "fix", "groups", "k_max", "light", "light_load_devices", "max_devices",
    "measurements", "merge_measurements", "name", "order", "policies", "policy", "price_tier", "prices",
    "profiles", "published", "quick", "references", "regimes", "replicas", "runs", "scenario", "search",
    "seed", "seeds", "set", "spec_method", "start", "stop", "stream_measurements", "study", "tail",
    "targets", "thresholds", "title", "tokenize_measurements", "trace", "traces",
    "transport_measurements", "variants", "warm_rounds", "window", "window_s", "write_calibration",
    "write_host_cpu",
)  # fmt: skip


def load_spec(name: str) -> dict[str, Any]:
    """The spec of study ``name`` (``experiments/NAME.yaml``, or a path), its study kind checked."""
    path = Path(name)
    if not path.is_file():
        path = experiments_dir() / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(p.stem for p in sorted(experiments_dir().glob("*.yaml")))
        raise ConfigError("experiment", "", f"unknown experiment {name!r}; known: {known}")
    try:
        spec = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(str(path), "", f"malformed YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(spec, dict) or "study" not in spec:
        raise ConfigError(
            str(path), "study", f"an experiment file names its study; known: {', '.join(STUDIES.names())}"
        )
    STUDIES.get(spec["study"], str(path), "study")
    for block, where in (
        (spec, ""),
        (spec.get("quick") if isinstance(spec.get("quick"), dict) else {}, "quick."),
    ):
        extra = sorted(str(k) for k in set(block) - set(STUDY_FIELDS))
        if extra:  # a typo would be read as absent
            raise ConfigError(
                str(path), f"{where}{extra[0]}", f"unknown field; allowed: {', '.join(STUDY_FIELDS)}"
            )
    spec.setdefault("name", path.stem)
    return spec


def resolve(spec: dict[str, Any], quick: bool) -> dict[str, Any]:
    """The spec with its ``quick`` block merged over it when ``quick``, checked field by field."""
    base = {k: v for k, v in spec.items() if k != "quick"}
    if "quick" in spec and not isinstance(spec["quick"], dict):
        raise ConfigError(_spec_source(spec), "quick", "must be a mapping of overrides")
    if quick and isinstance(spec.get("quick"), dict):
        base = deep_merge(base, spec["quick"])
    _check_spec(base)
    return base


def _spec_source(spec: dict[str, Any]) -> str:
    return f"experiments/{spec.get('name', '?')}.yaml"


def _check_spec(spec: dict[str, Any]) -> None:
    """One-line errors for the fields studies read (before any simulation runs)."""
    src = _spec_source(spec)

    def number_list(key: str, integer: bool) -> None:
        if key in spec:
            numbers(src, key, spec[key], integer)

    def integer(key: str, minimum: int) -> None:
        if key in spec and (
            isinstance(spec[key], bool) or not isinstance(spec[key], int) or spec[key] < minimum
        ):
            raise ConfigError(src, key, f"must be an integer >= {minimum}, got {spec[key]!r}")

    number_list("classes", integer=False)
    if spec.get("study") == "attribution":  # one N
        integer("devices", 1)
    else:
        number_list("devices", integer=True)
    for key, minimum in (
        ("seeds", 1),
        ("seed", 0),
        ("start", 1),
        ("max_devices", 1),
        ("light_load_devices", 1),
    ):
        integer(key, minimum)
    if "epsilon" in spec:
        e = spec["epsilon"]
        if isinstance(e, bool) or not isinstance(e, int | float) or not 0 <= e < 1:
            raise ConfigError(src, "epsilon", f"must be in [0, 1), got {e!r}")
    if "policies" in spec:
        pols = spec["policies"]
        if not isinstance(pols, list) or not pols:
            raise ConfigError(src, "policies", f"must be a non-empty list; allowed: {', '.join(POLICIES)}")
        for pol in pols:
            if pol not in POLICIES:
                raise ConfigError(src, "policies", f"unknown policy {pol!r}; allowed: {', '.join(POLICIES)}")
    if "thresholds" in spec:
        ts = spec["thresholds"]
        if not isinstance(ts, list) or not ts:
            raise ConfigError(src, "thresholds", "must be a non-empty list of numbers in [0, 1] or null")
        for t in ts:
            if t is not None and (isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t <= 1):
                raise ConfigError(
                    src, "thresholds", f"must be numbers in [0, 1] or null (the shipped), got {t!r}"
                )
    number_list("k_max", integer=True)
    number_list("replicas", integer=True)
    if "traces" in spec:
        ts = spec["traces"]
        if not isinstance(ts, list) or not ts or not all(isinstance(t, str) and t for t in ts):
            raise ConfigError(src, "traces", "must be a non-empty list of request trace names or paths")
    if spec.get("window_s") is not None:
        w = spec["window_s"]
        if isinstance(w, bool) or not isinstance(w, int | float) or not w > 0:
            raise ConfigError(
                src, "window_s", f"must be a number of seconds > 0 or null (the whole trace), got {w!r}"
            )
    for key in ("references", "policy"):
        refs = spec.get(key)
        for pol in [refs] if isinstance(refs, str) else refs or []:
            if pol not in POLICIES:
                raise ConfigError(src, key, f"unknown policy {pol!r}; allowed: {', '.join(POLICIES)}")
    if "targets" in spec:
        if not isinstance(spec["targets"], list) or not spec["targets"]:
            raise ConfigError(src, "targets", "must be a non-empty list of profile names")
        for t in spec["targets"]:
            if isinstance(
                t, dict
            ):  # a variant: {name, profile, roofline: {...}, set: {...}} (parameters or fields changed)
                if (
                    set(t) - {"name", "profile", "roofline", "set"}
                    or not t.get("name")
                    or not t.get("profile")
                ):
                    raise ConfigError(
                        src,
                        "targets",
                        "a variant is {name, profile, roofline, set}, got " + " ".join(repr(t).split())[:80],
                    )
                for part, what in (
                    ("roofline", "parameters"),
                    ("set", "scenario fields (server.verifier.kind: ...)"),
                ):
                    if not isinstance(t.get(part) or {}, dict):
                        raise ConfigError(src, "targets", f"{t['name']}: {part} must be a mapping of {what}")
                t = t["profile"]
            try:
                find_profile(str(t))
            except WispsimError:
                raise ConfigError(src, "targets", f"no profile {t!r} (see `wispsim profile list`)") from None
    for key, allowed in (("stop", ("sequential", "horizon")), ("search", ("knee", "exact"))):
        if key in spec and spec[key] not in allowed:
            raise ConfigError(src, key, f"got {spec[key]!r}; allowed: {', '.join(allowed)}")
    if "set" in spec and not isinstance(spec["set"], dict):
        raise ConfigError(src, "set", "must be a mapping of field.path: value")


def seeds(spec: dict[str, Any]) -> list[int]:
    """The seeds a spec asks for: ``seeds`` of them, from ``seed`` on."""
    first = int(spec.get("seed", 0))
    return [first + i for i in range(int(spec.get("seeds", 1)))]
