"""Running one study and writing what it found: its section of the report and its run.json.

A study is handed a :class:`Context` (where it writes, how it runs simulations, its resolved
spec) and hands back a :class:`Section` (markdown body and facts). :func:`run_experiment` adds
the header every section carries -- what ran, its cost, the versions and commit that computed it,
how to rerun it -- and the person-written discussion with a caution when the numbers changed
since it was written; :func:`write_report` joins the sections into ``REPORT.md``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from wispsim.config import Scenario, parse_set
from wispsim.errors import ConfigError
from wispsim.provenance import code_commit, distribution_versions
from wispsim.sim.scenarios import load_scenario
from wispsim.study.experiments.spec import STUDIES, experiments_dir, list_experiments, load_spec, resolve
from wispsim.version import __version__


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
    builds: dict[str, None] = field(default_factory=dict)  # the verifier builds its scenarios name

    def scenario(self, **overrides: Any) -> Scenario:
        """The study's scenario: its file, its ``set`` overrides, then ``overrides`` (its verifier
        build noted for the section's header)."""
        sc_path = self.spec.get("scenario")
        sets = {**self.spec.get("set", {}), **overrides}
        nested = parse_set([f"{k}={json.dumps(v)}" for k, v in sets.items()])
        sc = load_scenario(sc_path, nested)
        self.builds[sc.server.build] = None
        return sc

    def rel(self, path: Path) -> str:
        """``path`` relative to the report's folder, as markdown links it."""
        return path.relative_to(self.root).as_posix()


@dataclass
class Section:
    """What a study found: its title, markdown body, and facts for run.json."""

    title: str
    body: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


def md_table(df: pd.DataFrame, floatfmt: str = "{:.3g}") -> list[str]:
    """``df`` as the lines of a markdown table; floats with ``floatfmt``, NaN as ``-``."""
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
    cost = _cost(runners, ctx, wall, computed, loaded, total_sims, total_wall)
    header = [
        f"## {section.title}",
        "",
        f"*Study `{spec['name']}` ({spec['study']}), {'quick' if quick else 'full'} size; {cost}; "
        f"{_versions()}; {_dt.datetime.now(_dt.UTC):%Y-%m-%d}. Rerun: `wispsim experiment run {spec['name']}"
        f"{' --quick' if quick else ''}`. Data: `{ctx.rel(out)}/`.*",
        "",
    ]
    if ctx.builds:
        header += [_builds_line(list(ctx.builds)), ""]
    if spec.get("about"):
        header += [str(spec["about"]).strip(), ""]
    # The discussion is prose a person wrote for particular numbers: ``discussion_for`` holds the
    # hash of the section body it was written against, and a mismatch is printed, not hidden.
    results_hash = hashlib.sha256("\n".join(section.body).encode()).hexdigest()[:12]
    body = header + section.body + (_discussion(resolved, results_hash) if not quick else [])
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


BUILD_WORDS = {
    "auto": "each policy's own: WISP, FCFS and WISP-fixed on `wisp-grpc`, WISP-LRU and SLED on `stock-vllm`",
    "stock-vllm": "vLLM's OpenAI server, each round re-submitted over HTTP, whole-block prefix reuse",
    "vllm-sessions": "sessions resident in vLLM's engine behind an HTTP session API",
    "wisp-grpc": "the WISP paper's: resident sessions, token-granular reuse, gRPC",
    "custom": "re-submitted rounds whose whole prefix is reused token by token (SPEC 2.3)",
}


def _builds_line(builds: list[str]) -> str:
    """What the section's speculative verifiers are built like (``server.build``); centralized
    serving is vLLM's OpenAI server whatever the build says."""
    said = "; ".join(f"`{b}` ({BUILD_WORDS.get(b, b)})" for b in builds)
    return (
        f"*Verifier build{'s' if len(builds) > 1 else ''} (`server.build`, docs/model.md): {said}. "
        "Centralized serving generates on vLLM's OpenAI server.*"
    )


def _cost(
    runners: list[Any],
    ctx: Context,
    wall: float,
    computed: int,
    loaded: int,
    total_sims: int,
    total_wall: float,
) -> str:
    """What the results cost: points run or loaded, wall time, the commits that computed them."""
    if runners and computed == 0 and loaded:
        cost = f"{loaded} stored points (an N with all its seeds) loaded in {wall:.0f} s" + (
            f"; computing them took {total_wall:.0f} s wall on {_cores()}" if total_sims else ""
        )
    elif runners:
        cost = f"{wall:.0f} s wall on {_cores()} ({computed} points run, each an N with all its seeds" + (
            f", {loaded} loaded from earlier runs)" if loaded else ")"
        )
    else:
        cost = f"{wall:.0f} s wall on {_cores()}"
    commits: dict[str, int] = {}
    for r in runners:
        for c, n in getattr(r, "commits", {}).items():
            commits[c] = commits.get(c, 0) + n
    if commits:
        made = ", ".join(f"{c} ({n})" for c, n in sorted(commits.items(), key=lambda kv: -kv[1]))
        cost += f"; points computed by commit {made}"
    if ctx.simulated:
        cost += f" ({ctx.simulated} simulations run directly, not stored)"
    return cost


def _discussion(spec: dict[str, Any], results_hash: str) -> list[str]:
    """The spec's ``discussion`` under the tables, with a caution when it was written for other
    results than ``results_hash``."""
    if not spec.get("discussion"):
        return []
    lines = ["", "**What it shows.** " + str(spec["discussion"]).strip()]
    written_for = str(spec.get("discussion_for", ""))
    if written_for != results_hash:
        lines += [
            "",
            f"*Caution: this discussion was written for results `{written_for or 'unrecorded'}`; "
            f"the tables above are results `{results_hash}`. Check its numbers against them, then "
            f"set `discussion_for: {results_hash}` in experiments/{spec['name']}.yaml.*",
        ]
    return lines


def refresh_discussion(name: str) -> Path:
    """Re-render study ``name``'s discussion under its stored tables from ``experiments/NAME.yaml``
    (prose and its ``discussion_for`` need no rerun): the header, ``about``, tables and results
    hash are the stored run's. Returns the section's path; a study never run at full size is
    refused by name."""
    spec = load_spec(name)
    out = experiments_dir() / "data" / spec["name"]
    path, facts = out / "section.md", _read_json(out / "run.json")
    if not path.is_file() or "results_hash" not in facts:
        raise ConfigError(
            "experiment discuss", name, f"has no stored results: run `wispsim experiment run {name}` first"
        )
    text = path.read_text().rstrip("\n")
    cut = text.find("\n\n**What it shows.** ")
    head = text if cut < 0 else text[:cut]
    lines = [head, *_discussion(spec, str(facts["results_hash"]))]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_report(quick: bool) -> Path:
    """``REPORT.md`` from the sections present, in the studies' order; a study not run yet says so."""
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


def _cores() -> str:
    """The cores, and whether the simulator's hot path ran compiled (:mod:`wispsim.native`)."""
    from wispsim.native import used

    how = " (the hot path compiled: scripts/compile.py)" if used()[0] == "compiled" else ""
    return f"{os.cpu_count() or 1} cores{how}"
