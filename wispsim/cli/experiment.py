"""``wispsim experiment list|run|discuss``: the studies under ``experiments/`` (wispsim.study.experiments)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from wispsim.cli.common import console, status
from wispsim.cli.options import JOBS
from wispsim.errors import ConfigError
from wispsim.results import check_output_dir
from wispsim.runs.resolve import check_backend

experiment_app = typer.Typer(
    help="Run the paper's evaluation studies (experiments/*.yaml).", no_args_is_help=True
)


@experiment_app.command("list")
def list_cmd() -> None:
    """The studies, in report order."""
    from wispsim.study.experiments import list_experiments, load_spec

    specs = [(name, load_spec(name)) for name in list_experiments()]
    w1 = max((len(n) for n, _ in specs), default=0)
    w2 = max((len(s["study"]) for _, s in specs), default=0)
    for name, spec in specs:
        console.print(f"{name:<{w1}} {spec['study']:<{w2}} {spec.get('title', '')}")


@experiment_app.command("run")
def run_cmd(
    names: Annotated[list[str] | None, typer.Argument(help="Studies to run (names in experiments/).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Run every study.")] = False,
    quick: Annotated[bool, typer.Option(help="Reduced size (CI): results in experiments/quick/.")] = False,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Parallel simulations.", parser=JOBS)] = 2,
    backend: Annotated[str, typer.Option(help="local or ray.")] = "local",
    address: Annotated[str | None, typer.Option(help="Ray cluster address (--backend ray).")] = None,
) -> None:
    """Run studies, write their data, figures and sections, and regenerate the report."""
    import time

    from wispsim.study.experiments import list_experiments, run_experiment, write_report
    from wispsim.study.experiments.spec import experiments_dir, load_spec
    from wispsim.study.runners import make_runner

    todo = list_experiments() if all_ else list(names or [])
    if not todo:
        raise ConfigError("experiment run", "", "name a study or give --all (see `wispsim experiment list`)")
    for name in todo:  # every study named exists and parses before any runs
        load_spec(name)
    check_backend(backend, address)
    make_runner(backend, jobs, None, "none", address)  # validate the options before running anything
    root = experiments_dir()  # where the studies write, checked before any work
    check_output_dir(root / "quick" if quick else root / "data", "experiment run")

    def runner(folder: Path) -> Any:
        return make_runner(backend, jobs, folder, "none", address)

    for i, name in enumerate(todo, 1):
        t0 = time.perf_counter()
        with status(f"[{i}/{len(todo)}] {name} ...") as shown:

            def say(msg: str, s: Any = shown, n: str = name, k: int = i) -> None:
                s.update(f"[{k}/{len(todo)}] {n}: {msg.removeprefix(n + ': ')}")  # named once

            out = run_experiment(name, quick, runner, say)
        console.print(f"[{i}/{len(todo)}] {name}: {time.perf_counter() - t0:.0f} s -> {out}")
    report = write_report(quick)
    console.print(f"report: {report}")


@experiment_app.command("discuss")
def discuss_cmd(
    names: Annotated[list[str] | None, typer.Argument(help="Studies (names in experiments/).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every study run so far.")] = False,
) -> None:
    """Re-render the studies' discussions from experiments/*.yaml under their stored tables (no
    rerun: prose and its discussion_for), and regenerate the report."""
    from wispsim.study.experiments import list_experiments, refresh_discussion, write_report
    from wispsim.study.experiments.spec import experiments_dir

    if all_:
        todo = [n for n in list_experiments() if (experiments_dir() / "data" / n / "run.json").is_file()]
    else:
        todo = list(names or [])
    if not todo:
        raise ConfigError(
            "experiment discuss", "", "name a study or give --all (see `wispsim experiment list`)"
        )
    paths = [refresh_discussion(name) for name in todo]
    for p in paths:
        console.print(f"discussion: {p}")
    console.print(f"report: {write_report(False)}")
