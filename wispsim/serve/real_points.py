"""A validation's real side: ``wispsim serve`` per regime and policy, the swarm per N.

:func:`served` starts ``wispsim serve`` for one regime and policy (a child process,
:class:`~wispsim.serve.process.ServerProcess`) and stops it, with everything it started, whatever
happens; :func:`real_point` runs the swarm of one N against a server
(:func:`wispsim.serve.swarm.run_swarm`) for the scenario's window and drain and stores what it
did (:func:`store_real`): the swarm's records, the server's batch log, the replay log and
``real.json``. The simulated side of the same points is :mod:`wispsim.study.validate`;
:func:`wispsim.runs.serve.validate` runs both, point by point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from wispsim.config import Scenario
from wispsim.results import Results
from wispsim.serve.backend import ModelSource
from wispsim.serve.process import ServerProcess
from wispsim.serve.swarm import Server, SwarmRun, run_swarm
from wispsim.sim.scenarios import Resolved
from wispsim.study.validate import real_summary, write_json


@contextmanager
def served(
    out: Results, regime: str, sc: Scenario, source: ModelSource, port: int
) -> Iterator[ServerProcess]:
    """``wispsim serve`` for ``sc`` (one regime and policy), ready; stopped on leaving. Its
    scenario goes to ``scenarios/REGIME-POLICY.yaml`` and its output to
    ``logs/serve-REGIME-POLICY.log`` in ``out``."""
    name = f"{regime}-{sc.policy}"
    scenario_file = out.text(f"scenarios/{name}.yaml", sc.to_yaml())
    server = ServerProcess(scenario_file, sc.policy, source, port, out / f"logs/serve-{name}.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def real_point(
    folder: Results,
    resolved: Resolved,
    server: str | Server,
    progress: Callable[[float, float], None] | None = None,
) -> dict[str, Any]:
    """The swarm of ``resolved`` (one point's scenario) against ``server`` (not reset here), stored
    in ``folder`` (:func:`store_real`); returns ``real.json``'s document."""
    real = run_swarm(resolved, server, reset=False, progress=progress)
    return store_real(folder, resolved.scenario, real)


def store_real(folder: Results, sc: Scenario, real: SwarmRun) -> dict[str, Any]:
    """Write one point's real side: the swarm's records, the server's log, the replay log, and
    ``real.json`` (its figures and the server's facts)."""
    doc = real_summary(real.result, real.facts, real.offset)
    with folder.writing():
        folder.text("scenario.yaml", sc.to_yaml())
        real.write_records(folder, "real_")
        with folder.file("real_log.parquet") as path:
            real.write_log(path)
        write_json(folder, "real.json", doc)
    return doc
