"""The ``wispsim`` command line: the root app, every command group mounted, and error handling.

Commands: ``run`` (one simulation), ``replay`` (a recorded per-round log under a policy), ``plan``
(replicas for a fleet), ``sweep`` (capacity search for one policy), ``compare`` (capacity of
several policies side by side), ``scenario show|validate``, ``profile ...``, ``estimator
compare``, ``trace ...``, ``predictor ...``, ``arrivals generate|show``, ``experiment ...``,
``plot ...``, ``ablate ...``; each lives in its own module beside this one. Every command that
writes results puts them in one folder with the resolved scenario, so each number can be traced
back to the config and seed that produced it. Bad input is reported in one line with exit code 2.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape

from wispsim import __version__
from wispsim.cli import plan, run, sweep
from wispsim.cli.arrivals import arrivals_app
from wispsim.cli.common import err_console
from wispsim.cli.estimator import estimator_app
from wispsim.cli.experiment import experiment_app
from wispsim.cli.plot import plot_app
from wispsim.cli.predictor import predictor_app
from wispsim.cli.profile import profile_app
from wispsim.cli.scenario import scenario_app
from wispsim.cli.trace import trace_app
from wispsim.errors import WispsimError

app = typer.Typer(
    name="wispsim",
    help="Capacity planning for distributed speculative LLM serving at the edge.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# the order here is the order of `wispsim --help`: commands first, then the groups
run.register(app)  # run, replay
plan.register(app)  # plan
sweep.register(app)  # sweep, compare
app.add_typer(scenario_app, name="scenario")
app.add_typer(profile_app, name="profile")
app.add_typer(estimator_app, name="estimator")
app.add_typer(trace_app, name="trace")
app.add_typer(predictor_app, name="predictor")
app.add_typer(arrivals_app, name="arrivals")
app.add_typer(experiment_app, name="experiment")
app.add_typer(plot_app, name="plot")
app.add_typer(sweep.ablate_app, name="ablate")


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        typer.echo(f"wispsim {__version__}")
        raise typer.Exit()


def main() -> None:
    """Console entry point: one-line errors with exit code 2 instead of tracebacks."""
    try:
        app(standalone_mode=False)
    except WispsimError as e:
        err_console.print("[red]error:[/red] " + escape(str(e)), highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted: finished points are kept; run the same command to resume")
        sys.exit(130)
    except typer.Abort:
        sys.exit(1)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # usage errors, from click or from typer's vendored copy of it
        if isinstance(e, _click_exceptions()):
            e.show()  # type: ignore[attr-defined]
            sys.exit(e.exit_code)  # type: ignore[attr-defined]
        raise


def _click_exceptions() -> tuple[type[BaseException], ...]:
    kinds: list[type[BaseException]] = []
    try:
        import click

        kinds.append(click.exceptions.ClickException)
    except ImportError:  # pragma: no cover
        pass
    try:
        from typer._click import exceptions as vendored  # typer >= 0.20 vendors click

        kinds.append(vendored.ClickException)
    except ImportError:  # pragma: no cover
        pass
    return tuple(kinds)


if __name__ == "__main__":
    main()
