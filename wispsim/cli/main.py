"""The ``wispsim`` command line: the root app, every command group mounted, and error handling.

Commands: ``run`` (one simulation), ``replay`` (a recorded per-round log under a policy), ``plan``
(replicas for a fleet), ``sweep`` (capacity search for one policy), ``compare`` (capacity of
several policies side by side), ``scenario show|validate``, ``profile ...``, ``estimator
compare``, ``trace ...``, ``predictor ...``, ``arrivals generate|show``, ``experiment ...``,
``plot ...``, ``ablate ...``, ``serve`` / ``swarm`` / ``validate`` (a real deployment on vLLM);
each lives in its own module beside this one. Every command that
writes results puts them in one folder with the resolved scenario, so each number can be traced
back to the config and seed that produced it. Bad input is reported in one line with exit code 2.
"""

from __future__ import annotations

import atexit
import gc
import sys
from typing import Annotated

import typer
from rich.markup import escape

from wispsim.cli import bench, plan, profile_info, run, serve, sweep
from wispsim.cli.arrivals import arrivals_app
from wispsim.cli.common import err_console
from wispsim.cli.estimator import estimator_app
from wispsim.cli.experiment import experiment_app
from wispsim.cli.plot import plot_app
from wispsim.cli.predictor import predictor_app
from wispsim.cli.profile import profile_app
from wispsim.cli.scenario import scenario_app
from wispsim.cli.trace import trace_app
from wispsim.config import FieldError
from wispsim.errors import WispsimError
from wispsim.version import __version__

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
serve.register(app)  # serve, swarm, validate
bench.register(app)  # bench: vllm bench serve against a simulated vllm serve
app.add_typer(scenario_app, name="scenario")
profile_info.register(profile_app)
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
        from wispsim.native import used

        how, why = used()  # the numbers are the same either way; the time per round is not
        hot = f"hot path compiled, {why}" if how == "compiled" else f"hot path pure Python: {why}"
        typer.echo(f"wispsim {__version__} ({hot})")
        raise typer.Exit()


def main() -> None:
    """Console entry point: one-line errors with exit code 2 instead of tracebacks."""
    # at exit the interpreter's last collections walk every object a command made (after a sweep
    # ~0.2 s of its ~9); frozen, they are not walked: what reference counts free is freed, and
    # objects in reference cycles are left to the process's end without their finalizers, which
    # nothing here relies on (every file is closed where it is written; Python does not promise a
    # collection at exit either)
    atexit.register(gc.freeze)
    try:
        code = app(standalone_mode=False)
        if code == 130:  # typer turns Ctrl-C into Exit(130), which standalone_mode=False returns
            raise KeyboardInterrupt
        if isinstance(code, int) and code:
            sys.exit(code)
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
    except FieldError as e:  # a schema check on a value a command built (its call site names none)
        err_console.print("[red]error:[/red] " + escape(f"{e.field}: {e.problem}"), highlight=False)
        sys.exit(2)
    except OSError as e:  # a write the command's own checks did not wrap (disk full, ...)
        where = f" {e.filename}" if e.filename else ""
        err_console.print(
            "[red]error:[/red] " + escape(f"cannot write{where}: {e.strerror or e}"),
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(2)
    except Exception as e:  # usage errors, from click or from typer's vendored copy of it
        if not isinstance(e, _click_exceptions()):
            raise
        if _kind(e) == "NoArgsIsHelpError":  # `wispsim` or a group alone: the help, as always
            e.show()  # type: ignore[attr-defined]
        else:
            err_console.print("[red]error:[/red] " + escape(usage_line(e)), highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)  # type: ignore[attr-defined]


def _kind(e: BaseException) -> str:
    """The click exception class of ``e`` by name (click's own or typer's vendored copy)."""
    names = {k.__name__ for k in type(e).__mro__}
    for kind in ("NoArgsIsHelpError", "MissingParameter", "BadParameter", "NoSuchOption", "UsageError"):
        if kind in names:
            return kind
    return "ClickException"


def _command(ctx: object) -> str:
    """``wispsim run``: the command path with the program named wispsim however it was started."""
    names = []
    while ctx is not None:
        names.append(str(getattr(ctx, "info_name", "") or ""))
        ctx = getattr(ctx, "parent", None)
    names.reverse()
    return " ".join(["wispsim", *[n for n in names[1:] if n]])


def _param_name(param: object) -> str:
    """An option by its long name (``--devices``), an argument by its metavar (``SCENARIO``)."""
    opts = [o for o in getattr(param, "opts", []) if isinstance(o, str)]
    if getattr(param, "param_type_name", "") == "option" and opts:
        return max(opts, key=len)
    return str(getattr(param, "name", "") or "argument").upper()


def usage_line(e: BaseException) -> str:
    """A click usage error as one line: ``--devices: 'abc' is not a valid integer``,
    ``wispsim run: no such option --foo``, ``wispsim arrivals generate: missing option --out``."""
    kind = _kind(e)
    cmd = _command(getattr(e, "ctx", None))
    param = getattr(e, "param", None)
    message = " ".join(str(getattr(e, "message", "") or e).split())
    if kind == "MissingParameter":
        what = getattr(param, "param_type_name", None) or "parameter"
        name = _param_name(param) if param is not None else ""
        return f"{cmd}: missing {what} {name}".rstrip()
    if kind == "BadParameter" and param is not None:
        message = message.removeprefix("Value error, ")
        if message.startswith("Input should be a valid"):  # typer's pydantic-based coercion
            raw = _raw_value(e)
            kind_of = message.removeprefix("Input should be a valid ").split(",")[0]
            message = (
                f"{raw!r} is not a valid {kind_of}" if raw is not None else f"expected a valid {kind_of}"
            )
        return f"{_param_name(param)}: {message}"
    if kind == "NoSuchOption":
        opt = getattr(e, "option_name", "")
        near = sorted(getattr(e, "possibilities", None) or [])
        hint = f" (did you mean {' or '.join(near)}?)" if near else ""
        return f"{cmd}: no such option {opt}{hint}"
    fmt = getattr(e, "format_message", None)
    text = " ".join((fmt() if callable(fmt) else message).split())
    text = text[:1].lower() + text[1:]
    return f"{cmd}: {text.rstrip('.')}" if kind == "UsageError" else text.rstrip(".")


def _raw_value(e: BaseException) -> str | None:
    """The text the user gave for the bad parameter, when the exception still holds it."""
    cause = e.__cause__
    errors = getattr(cause, "errors", None)
    if callable(errors):
        try:
            value = errors()[0].get("input")
        except (IndexError, AttributeError, TypeError):
            return None
        return value if isinstance(value, str) else None
    return None


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
