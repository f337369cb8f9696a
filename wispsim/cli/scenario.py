"""``wispsim scenario list|show|validate``: the shipped scenarios, a scenario as a run would see
it, and a check without a run. A scenario is a file, or a shipped scenario by name (``fleet-2000``).

``show`` prints the resolved YAML (defaults filled in, policy preset and ``--set`` applied), the
same text every results folder keeps as ``scenario.yaml``; ``validate`` also loads the profile
and the acceptance model, so a bad file fails here in one line instead of minutes into a sweep.
"""

from __future__ import annotations

import re
import shutil
import textwrap

import typer

from wispsim.cli.options import ScenarioArg, SetOpt
from wispsim.runs.resolve import resolve

scenario_app = typer.Typer(help="List, show or check a scenario.", no_args_is_help=True)


def _about(text: str) -> str:
    """The first sentence of a scenario file's leading comment (its lines joined)."""
    lines = []
    for ln in text.splitlines():
        if not ln.startswith("#") or ln.startswith("#  "):  # the block ends, or a command example
            break
        lines.append(ln.lstrip("#").strip())
    about = " ".join(lines)
    end = re.search(r"\.(\s|$)", about)
    return about[: end.start() + 1] if end else about


@scenario_app.command("list")
def scenario_list() -> None:
    """List the shipped scenarios (give one by name to any command: `wispsim run fleet-2000`)."""
    from wispsim.sim.scenarios import available_scenarios, find_scenario

    width = max(60, shutil.get_terminal_size((100, 24)).columns)
    for name in available_scenarios():
        about = _about(find_scenario(name).read_text())
        typer.echo(
            textwrap.fill(
                f"{name:<16} {about}",
                width,
                subsequent_indent=" " * 17,
                break_long_words=False,
                break_on_hyphens=False,
            )
        )


@scenario_app.command("show")
def scenario_show(scenario: ScenarioArg = None, set_: SetOpt = None) -> None:
    """Print the resolved scenario (defaults filled in, policy preset applied)."""
    typer.echo(resolve(scenario, set_).scenario.to_yaml(), nl=False)


@scenario_app.command("validate")
def scenario_validate(scenario: ScenarioArg = None, set_: SetOpt = None) -> None:
    """Check a scenario and its profile; exit 2 with a one-line error if something is wrong."""
    from wispsim.model.acceptance import make_acceptance

    resolved = resolve(scenario, set_)
    sc, prof = resolved.scenario, resolved.profiles[0]
    make_acceptance(sc.acceptance)
    typer.echo(
        f"ok: {scenario or 'default scenario'} (policy {sc.policy}, profile {prof.name}, "
        f"KV cache {resolved.capacities[0]} tokens)"
    )
