"""``profile fit`` of a deployment: its logged batches as a measurement recording.

A results folder of ``wispsim swarm`` or ``wispsim validate`` holds the server's batch logs and
the scenario it served; fitting a profile to them needs them as a measurement CSV beside the new
profile, with the model and host facts of the profile the server ran with.
"""

from __future__ import annotations

import json
from pathlib import Path

from wispsim.errors import ConfigError
from wispsim.provenance import command_line
from wispsim.results import check_output_file, writing


def deployment_recording(folder: Path, out: Path, seed: int, kind: str) -> tuple[Path, int, str]:
    """Write the batch logs (``kind`` verify or step) under ``folder`` as ``profiles/data/NAME.csv``
    beside the profile ``out``; return (that CSV, how many logs, the served profile's name)."""
    from wispsim.measure.profile.deployment import find_batch_logs, write_deployment_data
    from wispsim.model.profiles import load_profile
    from wispsim.runs.resolve import load

    logs = find_batch_logs(folder, kind)
    scen = logs[0] / "scenario.yaml"
    if not scen.is_file():
        raise ConfigError(str(logs[0]), "scenario.yaml", "missing: the server's scenario names its profile")
    served = load_profile(load(scen).server.profile)
    base = served.data_path
    meta_file = Path(str(base) + ".meta.json") if base is not None else None
    if meta_file is None or not meta_file.is_file():
        raise ConfigError(
            str(scen),
            "server.profile",
            f"profile {served.name} has no recording sidecar to take the model facts from",
        )
    csv = out.parent / "data" / f"{out.stem}.csv"
    check_output_file(csv, "--out", (".csv",))
    with writing("--out", csv):
        write_deployment_data([folder], csv, json.loads(meta_file.read_text()), command_line(), seed, kind)
    return csv, len(logs), served.name
