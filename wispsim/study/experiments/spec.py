"""The paper's evaluation as declarative, runnable studies (SPEC 7).

One YAML file per study under ``experiments/`` names its ``study`` kind (a function registered in
:data:`STUDIES`), its parameters, and a ``quick`` block of overrides for a reduced run.
``wispsim experiment run NAME`` (or ``--all``) runs it: data and figures go to
``experiments/data/NAME/`` (``experiments/quick/NAME/`` with ``--quick``), and each study writes
a markdown section; ``experiments/REPORT.md`` (``experiments/quick/REPORT.md``) is regenerated
from every section present, in the order of the studies' ``order`` keys. Every section says what
was run (scenario, seeds, versions, wall time) and what it shows; a study's ``discussion`` field
(written by a person, after looking at the numbers) is printed under its tables, with a caution
when the tables no longer hash to its ``discussion_for`` (the numbers it was written for).

Capacity searches go through the same stored points as ``wispsim sweep`` (:mod:`wispsim.study.points`),
so a study that is interrupted resumes where it stopped and a rerun costs nothing; the section
header says which git commit computed the points it shows. The bursty and attribution studies
keep whole runs (time series, every round) rather than points and simulate again on a rerun.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import math
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from wispsim import __version__
from wispsim.config import Scenario, deep_merge, parse_set
from wispsim.errors import ConfigError, WispsimError
from wispsim.paths import checkout_dir
from wispsim.provenance import code_commit, distribution_versions
from wispsim.registry import Registry
from wispsim.sim.inputs import load_scenario

STUDIES: Registry[Callable[..., Section]] = Registry("study")


@dataclass
class Context:
    """Where a study writes, how it runs simulations, and how big it is."""

    name: str
    spec: dict[str, Any]
    out: Path
    root: Path  # experiments/ (or experiments/quick/): figures are linked relative to it
    quick: bool
    make_runner: Callable[[Path], Any]  # folder -> a runner context manager
    progress: Callable[[str], None] = lambda msg: None
    simulated: int = 0  # simulations a study ran itself (not stored points: bursty, attribution)

    def scenario(self, **overrides: Any) -> Scenario:
        """The study's scenario: its file, its ``set`` overrides, then ``overrides``."""
        sc_path = self.spec.get("scenario")
        sets = {**self.spec.get("set", {}), **overrides}
        nested = parse_set([f"{k}={json.dumps(v)}" for k, v in sets.items()])
        return load_scenario(sc_path, nested)

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()


@dataclass
class Section:
    title: str
    body: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------
# files
# ------------------------------------------------------------------------------------------


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
    specs = []
    for p in sorted(experiments_dir().glob("*.yaml")):
        specs.append((load_spec(p.stem).get("order", 100), p.stem))
    return [name for _, name in sorted(specs)]


def load_spec(name: str) -> dict[str, Any]:
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
    from wispsim.config import POLICIES

    src = _spec_source(spec)

    def number_list(key: str, integer: bool) -> None:
        if key not in spec:
            return
        v = spec[key]
        kind = "positive integers" if integer else "positive numbers"
        if not isinstance(v, list) or not v:
            raise ConfigError(src, key, f"must be a non-empty list of {kind}, got {v!r}")
        for x in v:
            ok = isinstance(x, int) if integer else isinstance(x, int | float)
            if isinstance(x, bool) or not ok or not x > 0:
                raise ConfigError(src, key, f"must be a list of {kind}, got {x!r}")

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
    if "targets" in spec:
        from wispsim.model.profiles import find_profile

        if not isinstance(spec["targets"], list) or not spec["targets"]:
            raise ConfigError(src, "targets", "must be a non-empty list of profile names")
        for t in spec["targets"]:
            try:
                find_profile(str(t))
            except WispsimError:
                raise ConfigError(src, "targets", f"no profile {t!r} (see `wispsim profile list`)") from None
    if "set" in spec and not isinstance(spec["set"], dict):
        raise ConfigError(src, "set", "must be a mapping of field.path: value")


# ------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------


def run_experiment(
    name: str,
    quick: bool,
    make_runner: Callable[[Path], Any],
    progress: Callable[[str], None] = lambda msg: None,
) -> Path:
    """Run one study; returns its results folder (with section.md)."""
    spec = load_spec(name)
    root = experiments_dir() / "quick" if quick else experiments_dir()
    out = root / ("" if quick else "data") / spec["name"]
    out.mkdir(parents=True, exist_ok=True)
    resolved = resolve(spec, quick)
    runners: list[Any] = []

    def counted(folder: Path) -> Any:
        r = make_runner(folder)
        runners.append(r)
        return r

    ctx = Context(spec["name"], resolved, out, root, quick, counted, progress)
    t0 = time.perf_counter()
    section = STUDIES.get(spec["study"], field="study")(ctx)
    wall = time.perf_counter() - t0
    computed = sum(getattr(r, "computed", 0) for r in runners)
    loaded = sum(getattr(r, "loaded", 0) for r in runners)
    # Cost of the results, summed over the runs that computed them (a rerun that only loads
    # stored points must not report its few seconds as the study's cost).
    prev = _read_json(out / "run.json")
    if computed and not loaded:  # everything computed now: earlier totals describe other points
        prev = {}
    total_sims = int(prev.get("simulations_computed_total", 0)) + computed
    total_wall = float(prev.get("compute_wall_s_total", 0.0)) + (wall if computed else 0.0)
    if runners and computed == 0 and loaded:
        cost = f"{loaded} stored simulations loaded in {wall:.0f} s" + (
            f"; computing them took {total_wall:.0f} s wall on {_cores()} cores" if total_sims else ""
        )
    elif runners:
        cost = f"{wall:.0f} s wall on {_cores()} cores ({computed} simulations run" + (
            f", {loaded} loaded from earlier runs)" if loaded else ")"
        )
    else:
        cost = f"{wall:.0f} s wall on {_cores()} cores"
    commits: dict[str, int] = {}
    for r in runners:
        for c, n in getattr(r, "commits", {}).items():
            commits[c] = commits.get(c, 0) + n
    if commits:
        made = ", ".join(f"{c} ({n})" for c, n in sorted(commits.items(), key=lambda kv: -kv[1]))
        cost += f"; points computed by commit {made}"
    if ctx.simulated:
        cost += f" ({ctx.simulated} simulations run directly, not stored)"
    header = [
        f"## {section.title}",
        "",
        f"*Study `{spec['name']}` ({spec['study']}), {'quick' if quick else 'full'} size; {cost}; "
        f"{_versions()}; {_dt.datetime.now(_dt.UTC):%Y-%m-%d}. Rerun: `wispsim experiment run {spec['name']}"
        f"{' --quick' if quick else ''}`. Data: `{ctx.rel(out)}/`.*",
        "",
    ]
    if spec.get("about"):
        header += [str(spec["about"]).strip(), ""]
    body = header + section.body
    # The discussion is prose a person wrote for particular numbers: ``discussion_for`` holds the
    # hash of the section body it was written against, and a mismatch is printed, not hidden.
    results_hash = hashlib.sha256("\n".join(section.body).encode()).hexdigest()[:12]
    if resolved.get("discussion") and not quick:
        body += ["", "**What it shows.** " + str(resolved["discussion"]).strip()]
        written_for = str(resolved.get("discussion_for", ""))
        if written_for != results_hash:
            body += [
                "",
                f"*Caution: this discussion was written for results `{written_for or 'unrecorded'}`; "
                f"the tables above are results `{results_hash}`. Check its numbers against them, then "
                f"set `discussion_for: {results_hash}` in experiments/{spec['name']}.yaml.*",
            ]
    (out / "section.md").write_text("\n".join(body) + "\n")
    (out / "run.json").write_text(
        json.dumps(
            {
                "spec": resolved,
                "wall_s": wall,
                "simulations_run": computed,
                "simulations_loaded": loaded,
                "results_hash": results_hash,
                "simulations_computed_total": total_sims,
                "compute_wall_s_total": total_wall,
                "version": __version__,
                "versions": _versions(),
                **section.facts,
            },
            indent=1,
            default=str,
        )
    )
    return out


def write_report(quick: bool) -> Path:
    root = experiments_dir() / "quick" if quick else experiments_dir()
    parts = [
        "# wispsim experiments: report" + (" (quick size)" if quick else ""),
        "",
        "Generated by `wispsim experiment run` from the sections of the studies in `experiments/`;"
        " do not edit by hand. Each section says what ran and how to rerun it.",
        "",
    ]
    for name in list_experiments():
        sec = root / ("" if quick else "data") / name / "section.md"
        if sec.is_file():
            parts += [sec.read_text(), ""]
        else:
            parts += [f"## {name}", "", f"*Not run yet: `wispsim experiment run {name}`.*", ""]
    path = root / "REPORT.md"
    path.write_text("\n".join(parts))
    return path


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _versions() -> str:
    """wispsim (with the git commit of the checkout when there is one), Python and the libraries
    whose behaviour the numbers depend on."""
    commit = code_commit()
    libs = [f"{lib} {v}" for lib, v in distribution_versions(("simpy", "numpy", "pandas")).items()]
    return (
        f"wispsim {__version__}{'' if commit == 'unknown' else ' @ ' + commit}, "
        f"Python {platform.python_version()}, " + ", ".join(libs)
    )


def _cores() -> int:
    import os

    return os.cpu_count() or 1


# ------------------------------------------------------------------------------------------
# helpers shared by studies
# ------------------------------------------------------------------------------------------


def _md_table(df: pd.DataFrame, floatfmt: str = "{:.3g}") -> list[str]:
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        cells = []
        for v in row:
            if isinstance(v, float):
                cells.append("-" if math.isnan(v) else floatfmt.format(v))
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _seeds(spec: dict[str, Any]) -> list[int]:
    first = int(spec.get("seed", 0))
    return [first + i for i in range(int(spec.get("seeds", 1)))]


def _sweep(
    ctx: Context,
    folder: Path,
    base: dict[str, Scenario],
    classes: list[float],
    mix: str,
    grid: tuple[int, ...] = (),
) -> Any:
    from wispsim.study.capacity import capacity_sweep, groups_for

    folder.mkdir(parents=True, exist_ok=True)
    spec = ctx.spec
    with ctx.make_runner(folder) as runner:
        res = capacity_sweep(
            base,
            groups_for(classes, mix),
            _seeds(spec),
            float(spec.get("epsilon", 0.05)),
            runner,
            grid=grid,
            start=int(spec.get("start", 8)),
            max_devices=int(spec.get("max_devices", 4096)),
            progress=lambda done, planned: ctx.progress(
                f"{ctx.rel(folder)}: {done}/{planned} simulations done"
            ),
        )
    res.write(folder)
    manifest = {"seeds": _seeds(spec), "epsilon": float(spec.get("epsilon", 0.05)), "policies": list(base)}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    next(iter(base.values())).to_yaml()
    (folder / "scenario.yaml").write_text(next(iter(base.values())).to_yaml())
    return res


def _with_profile(sc: Scenario, profile: str) -> Scenario:
    return sc.replace(server=dataclasses.replace(sc.server, profile=profile))


def _cap_cell(r: Any) -> str:
    """``capacity [low, high]``, or ``>= capacity`` when the search hit its ceiling (a lower bound)."""
    from wispsim.analysis.tables import saturated_mask

    d = r if isinstance(r, dict) else r._asdict()
    if bool(saturated_mask(pd.DataFrame([d])).iloc[0]):
        return f">= {int(d['capacity'])} (search ceiling)"
    return f"{int(d['capacity'])} [{int(d['ci_low'])}, {int(d['ci_high'])}]"


def _measured(cap: pd.DataFrame) -> pd.DataFrame:
    """``cap`` with saturated capacities (lower bounds) set to NaN, so ratios leave them out."""
    from wispsim.analysis.tables import saturated_mask

    return cap.assign(capacity=cap["capacity"].astype(float).mask(saturated_mask(cap)))


# ------------------------------------------------------------------------------------------
# studies
# ------------------------------------------------------------------------------------------


@STUDIES.register("capacity")
def study_capacity(ctx: Context) -> Section:
    """Capacity per policy x class x target, with intervals, speedups and goodput at capacity."""
    spec = ctx.spec
    policies = list(spec.get("policies", ["wisp", "centralized", "sled"]))
    classes = [float(c) for c in spec.get("classes", [2, 4, 6, 8])]
    targets = list(spec.get("targets", ["a100-qwen3-32b"]))
    sec = Section(spec.get("title", "Capacity table"))
    goodput_rows = []
    for target in targets:
        ctx.progress(f"capacity: {target}")
        base = {p: _with_profile(ctx.scenario(), target).with_policy(p) for p in policies}
        folder = ctx.out / target
        t0 = time.perf_counter()
        res = _sweep(ctx, folder, base, classes, "separate")
        wall = time.perf_counter() - t0
        cap = res.capacity
        wide = cap.assign(cell=[_cap_cell(r) for r in cap.itertuples()]).pivot(
            index="class", columns="policy", values="cell"
        )
        wide = wide.reindex(columns=policies).reset_index()
        num = (
            _measured(cap).pivot(index="class", columns="policy", values="capacity").reindex(columns=policies)
        )
        for other in policies[1:]:
            wide[f"{policies[0]}/{other}"] = [
                f"{a / b:.2f}" if b > 0 and a == a else "-"  # a == a: not NaN (not saturated)
                for a, b in zip(num[policies[0]], num[other], strict=True)
            ]
        sec.body += [
            f"### {target}",
            "",
            f"Capacity in devices [95% interval], {len(_seeds(spec))} seed(s):",
            "",
        ]
        sec.body += _md_table(wide)
        # goodput at capacity: the curve's rows at N = capacity
        curve = res.curve
        for r in cap.to_dict("records"):
            label = str(r["class"])
            at = curve[(curve.policy == r["policy"]) & (curve.devices == r["capacity"])]
            at = at[(at.group.astype(str) == label) & (at["class"].astype(str) == label)]
            goodput_rows.append(
                {
                    "target": target,
                    "policy": r["policy"],
                    "class": label,
                    "capacity": int(r["capacity"]),
                    "goodput_tps": float(at.goodput_tps.mean()) if len(at) else math.nan,
                    "gpu_utilization": float(at.gpu_utilization.mean()) if len(at) else math.nan,
                }
            )
        from wispsim.plots import capacity_bars, violation_curves

        bars = capacity_bars(cap, folder / "capacity.png")
        curves = violation_curves(folder, folder / "curves.png")
        sec.body += [
            "",
            f"![capacity, {target}]({ctx.rel(bars)})",
            "",
            f"![violation vs N, {target}]({ctx.rel(curves)})",
            "",
        ]
        sec.facts[f"wall_s_{target}"] = wall
    gp = pd.DataFrame(goodput_rows)
    gp.to_csv(ctx.out / "goodput_at_capacity.csv", index=False)
    if len(gp):
        table = gp.pivot_table(
            index=["target", "class"], columns="policy", values="goodput_tps"
        ).reset_index()
        sec.body += ["### System goodput at capacity (committed tokens/s)", "", *_md_table(table, "{:.0f}")]
    return sec


@STUDIES.register("mix")
def study_mix(ctx: Context) -> Section:
    """All classes share one verifier: per-class violation vs N, policy by policy."""
    from wispsim.plots import violation_curves

    spec = ctx.spec
    policies = list(spec.get("policies", ["wisp", "fcfs"]))
    classes = [float(c) for c in spec.get("classes", [2, 4, 6, 8])]
    grid = tuple(int(n) for n in spec.get("devices", [40, 60, 80, 100, 120]))
    base = {p: ctx.scenario().with_policy(p) for p in policies}
    res = _sweep(ctx, ctx.out, base, classes, "shared", grid)
    pooled = res.pooled
    sec = Section(spec.get("title", "Heterogeneous mix"))
    wide = pooled.pivot_table(
        index=["devices"], columns=["policy", "class"], values="violation_rate"
    ).sort_index()
    wide.columns = [f"{p} {c}" for p, c in wide.columns]
    sec.body += [
        f"Violation rate per class (policy and class), all on one GPU, {len(_seeds(spec))} seed(s):",
        "",
    ]
    sec.body += _md_table(wide.reset_index(), "{:.3f}")
    cap = res.capacity
    sec.body += [
        "",
        "Capacity of the whole mix (every class within epsilon): "
        + ", ".join(f"{r.policy} {_cap_cell(r)}" for r in cap.itertuples()),
    ]
    fig = violation_curves(ctx.out, ctx.out / "mix_curves.png")
    sec.body += ["", f"![per-class violation in a shared mix]({ctx.rel(fig)})"]
    return sec


@STUDIES.register("bursty")
def study_bursty(ctx: Context) -> Section:
    """The bursty trace, compliance over time, policy by policy."""
    from wispsim.analysis.timeseries import write_timeseries
    from wispsim.plots import bursty_compare
    from wispsim.sim.engine import simulate
    from wispsim.sim.inputs import apply_arrivals_option

    spec = ctx.spec
    policies = list(spec.get("policies", ["wisp", "fcfs"]))
    trace = str(spec.get("trace", "bursty"))
    rows = []
    folders: dict[str, Path] = {}
    for p in policies:
        for seed in _seeds(spec):
            ctx.progress(f"bursty: {p} seed {seed}")
            sc = apply_arrivals_option(ctx.scenario().with_policy(p), trace, float(spec.get("tail", 300)))
            folder = ctx.out / f"{p}-seed{seed}"
            folder.mkdir(parents=True, exist_ok=True)
            res = simulate(sc, seed=seed)
            ctx.simulated += 1
            (folder / "scenario.yaml").write_text(sc.to_yaml())
            _, _, bursts = write_timeseries(res, folder)
            from wispsim.analysis.metrics import summarize

            summarize(res).to_csv(folder / "summary.csv", index=False)
            if bursts is not None:
                rows.append(bursts.assign(policy=p, seed=seed))
            if seed == _seeds(spec)[0]:
                folders[p] = folder
    if not rows:
        raise ConfigError(
            f"experiments/{ctx.name}.yaml",
            "trace",
            f"{trace!r} has no bursts to measure (see `wispsim arrivals show`)",
        )
    allb = pd.concat(rows, ignore_index=True)
    allb.to_csv(ctx.out / "bursts_all.csv", index=False)
    agg = (
        allb[allb["class"] == "all"]
        .groupby(["peak", "peak_value", "policy"])
        .agg(
            compliance_at_peak=("compliance_at_peak", "mean"),
            trough=("trough", "mean"),
            recovery_s=("recovery_s", "mean"),
        )
        .reset_index()
    )
    sec = Section(spec.get("title", "Bursty stress test"))
    sec.body += [
        f"Trace `{trace}`; all classes, mean over {len(_seeds(spec))} seed(s) (per class: `bursts_all.csv`):",
        "",
    ]
    sec.body += _md_table(agg)
    fig = bursty_compare(folders, ctx.out / "bursty.png")
    sec.body += ["", f"![compliance over time]({ctx.rel(fig)})"]
    return sec


@STUDIES.register("ablation")
def study_ablation(ctx: Context) -> Section:
    """Predictor on (wisp) vs off (wisp-fixed) at small N."""
    from wispsim.study.ablation import ablate_predictor

    spec = ctx.spec
    devices = [int(n) for n in spec.get("devices", [2, 4, 8, 16])]
    with ctx.make_runner(ctx.out) as runner:
        per_seed, table = ablate_predictor(ctx.scenario(), devices, _seeds(spec), runner)
    per_seed.to_csv(ctx.out / "ablation_per_seed.csv", index=False)
    table.to_csv(ctx.out / "ablation.csv", index=False)
    cols = [
        "devices",
        "acceptance_ratio_on",
        "acceptance_ratio_off",
        "goodput_tps_on",
        "goodput_tps_off",
        "goodput_gain",
        "wdt_ms_on",
        "wdt_ms_off",
    ]
    sec = Section(spec.get("title", "Predictor ablation"))
    sec.body += [f"{len(_seeds(spec))} seed(s); on = wisp (predictor), off = wisp-fixed (K = 5):", ""]
    sec.body += _md_table(table[cols], "{:.3g}")
    fig = _ablation_figure(table, ctx.out / "ablation.png")
    sec.body += ["", f"![predictor ablation]({ctx.rel(fig)})"]
    return sec


def _ablation_figure(table: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    x = np.arange(len(table))
    for ax, metric, label in (
        (axes[0], "acceptance_ratio", "accepted / drafted"),
        (axes[1], "goodput_tps", "goodput (tok/s)"),
    ):
        ax.bar(x - 0.2, table[f"{metric}_on"], 0.4, label="predictor on (wisp)")
        ax.bar(x + 0.2, table[f"{metric}_off"], 0.4, label="off (wisp-fixed, K=5)")
        ax.set_xticks(x, [str(n) for n in table.devices])
        ax.set_xlabel("devices")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.suptitle("Rejection predictor on vs off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@STUDIES.register("attribution")
def study_attribution(ctx: Context) -> Section:
    """Violated rounds in the (queue, verify) plane: queue- or compute-dominant."""
    from wispsim.plots import attribution
    from wispsim.sim.engine import simulate

    spec = ctx.spec
    sec = Section(spec.get("title", "Violation attribution"))
    rows = []
    for p in spec.get("policies", ["wisp"]):
        n = int(spec.get("devices", 100))
        seed = _seeds(spec)[0]
        sc = ctx.scenario().with_policy(p)
        if spec.get("classes"):
            sc = sc.with_devices(n, tuple(float(c) for c in spec["classes"]))
        res = simulate(sc, devices=n, seed=seed)
        ctx.simulated += 1
        folder = ctx.out / p
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "scenario.yaml").write_text(sc.to_yaml())
        path, counts = attribution(
            res.rounds,
            res.batches,
            folder / "attribution.png",
            window=int(spec.get("window", 20)),
            factor=float(spec.get("factor", 1.5)),
            responses=res.responses,
        )
        total = sum(counts.values()) or 1
        rows.append(
            {
                "policy": p,
                "devices": n,
                **{k: v for k, v in counts.items()},
                **{f"{k}_share": v / total for k, v in counts.items()},
            }
        )
        sec.body += [f"![attribution, {p}]({ctx.rel(path)})", ""]
    table = pd.DataFrame(rows)
    table.to_csv(ctx.out / "attribution.csv", index=False)
    intro = (
        "Violated rounds of measured responses, labelled compute-dominant when the round's verify "
        f"time exceeds {spec.get('factor', 1.5)}x the moving average of the last "
        f"{spec.get('window', 20)} batches (SPEC 7), otherwise queue-dominant:"
    )
    sec.body = [intro, "", *_md_table(table), "", *sec.body]
    return sec


@STUDIES.register("estimator")
def study_estimator(ctx: Context) -> Section:
    """Fit quality of every shipped measured profile, with its report's figures."""
    from wispsim.model.profiles import available_profiles, load_profile

    sec = Section(ctx.spec.get("title", "Estimator accuracy"))
    rows = []
    for name in available_profiles():
        p = load_profile(name)
        if p.kind != "measured":
            continue
        f = p.fit
        rows.append(
            {
                "profile": name,
                "hardware": p.gpu,
                "engine": p.engine,
                "configurations": f"{f['configurations']['train']} + {f['configurations']['test']}",
                "test R^2": f["r2"]["test"],
                "test MAPE %": f["mape_pct"]["test"],
                "test MAE ms": f["mae_ms"]["test"],
                "CV R^2": f.get("cv5_r2", {}).get("mean", math.nan),
            }
        )
        src = Path(p.source).parent / f"{name}.fit"
        for fig in ("actual_vs_predicted.png", "residuals.png"):
            if (src / fig).is_file():
                dst = ctx.out / f"{name}-{fig}"
                shutil.copyfile(src / fig, dst)
                sec.body += [f"![{name}: {fig[:-4]}]({ctx.rel(dst)})", ""]
    table = pd.DataFrame(rows)
    table.to_csv(ctx.out / "estimator.csv", index=False)
    head = ["The WISP paper's A100 vLLM fit: test R^2 0.992, MAPE 4.93%. Shipped measured profiles:", ""]
    sec.body = head + (_md_table(table) if len(table) else ["(none)"]) + [""] + sec.body
    return sec


@STUDIES.register("acceptance")
def study_acceptance(ctx: Context) -> Section:
    """Capacity under trace replay vs independent Bernoulli acceptance at the same mean rate.

    Besides capacity, the section tabulates how each policy drafts under each model at light load
    (mean draft length, accepted / drafted, accepted tokens per round): a policy whose rejection
    predictor reads the draft's features sees informative features in a trace and uninformative
    ones under Bernoulli, so its drafting changes with the model, not only its acceptance.
    """
    from wispsim.model.acceptance import make_acceptance

    spec = ctx.spec
    policies = list(spec.get("policies", ["wisp", "wisp-fixed", "sled"]))
    classes = [float(c) for c in spec.get("classes", [2, 4, 6, 8])]
    light = int(spec.get("light_load_devices", 32))
    traced = ctx.scenario()
    mean = float(make_acceptance(traced.acceptance).nominal_rate())
    bern = traced.replace(acceptance=dataclasses.replace(traced.acceptance, model="bernoulli", mean=mean))
    caps, drafting = [], []
    for label, sc in (("trace", traced), ("bernoulli", bern)):
        res = _sweep(ctx, ctx.out / label, {p: sc.with_policy(p) for p in policies}, classes, "separate")
        caps.append(res.capacity.assign(acceptance=label))
        cv = res.curve[res.curve.devices <= light]
        for pol, d in cv.groupby("policy", sort=False):
            drafting.append(
                {
                    "policy": pol,
                    "acceptance": label,
                    "mean_k": float(d.mean_k.mean()),
                    "accepted/drafted": float(d.acceptance_ratio.mean()),
                    "accepted/round": float((d.acceptance_ratio * d.mean_k).mean()),
                }
            )
    cap = pd.concat(caps, ignore_index=True)
    cap.to_csv(ctx.out / "capacity.csv", index=False)
    draft = pd.DataFrame(drafting)
    draft.to_csv(ctx.out / "drafting.csv", index=False)
    wide = (
        _measured(cap)
        .pivot_table(index=["policy", "class"], columns="acceptance", values="capacity", dropna=False)
        .reset_index()
    )
    wide["policy"] = pd.Categorical(wide["policy"], policies, ordered=True)
    wide = wide.sort_values(["policy", "class"])
    wide["bernoulli/trace"] = wide["bernoulli"] / wide["trace"].where(wide["trace"] > 0)
    cells = cap.assign(cell=[_cap_cell(r) for r in cap.itertuples()])
    for label in ("trace", "bernoulli"):
        m = cells[cells.acceptance == label].set_index(["policy", "class"]).cell
        wide[label] = [m.get((p, c), "-") for p, c in zip(wide.policy, wide["class"], strict=True)]
    bars = _acceptance_figure(cap, policies, mean, ctx.out / "acceptance.png")
    sec = Section(spec.get("title", "Correlated vs independent acceptance"))
    sec.body += [
        f"Trace `{traced.acceptance.trace}` (mean per-token acceptance {mean:.3f}) against a "
        f"Bernoulli model with the same mean; capacity in devices [95% interval], "
        f"{len(_seeds(spec))} seed(s):",
        "",
    ]
    sec.body += _md_table(wide, "{:.3g}")
    sec.body += [
        "",
        f"How each policy drafts under each model at light load (N <= {light}, every class and seed):",
        "",
    ]
    sec.body += _md_table(draft, "{:.3g}")
    sec.body += ["", f"![trace vs Bernoulli]({ctx.rel(bars)})"]
    sec.facts["mean_rate"] = mean
    return sec


def _acceptance_figure(cap: pd.DataFrame, policies: list[str], mean: float, path: Path) -> Path:
    """One panel per policy: capacity per class under trace replay and under Bernoulli, with the
    95% intervals as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(policies), figsize=(3.6 * len(policies) + 0.6, 3.8), squeeze=False)
    for ax, pol in zip(axes[0], policies, strict=True):
        d = cap[cap.policy == pol]
        classes = list(dict.fromkeys(d["class"]))
        x = np.arange(len(classes))
        for i, (label, color) in enumerate((("trace", "C0"), ("bernoulli", "C1"))):
            e = d[d.acceptance == label].set_index("class").reindex(classes)
            val = e.capacity.to_numpy(float)
            err = [
                np.clip(val - e.ci_low.to_numpy(float), 0, None),
                np.clip(e.ci_high.to_numpy(float) - val, 0, None),
            ]
            ax.bar(x + (i - 0.5) * 0.4, val, 0.4, yerr=err, capsize=3, color=color, label=label)
        ax.set_xticks(x, [f"{float(c):g}" for c in classes])
        ax.set_xlabel("SLO class (tok/s)")
        ax.set_title(pol, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("devices at capacity")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(
        f"Capacity: trace replay vs independent Bernoulli at the same mean ({mean:.3f})", fontsize=11
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
