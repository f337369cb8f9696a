"""``profile fit`` of a deployment: its logged batches as a measurement recording.

A results folder of ``wispsim swarm`` or ``wispsim validate`` holds the server's batch logs and
the scenario it served; fitting a profile to them needs them as a measurement CSV beside the new
profile, with the model and host facts of the profile the server ran with.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def calibrate_profile(
    results: list[Path],
    out: Path,
    model: str,
    gpu: str,
    tp: int,
    dtype: str,
    server: dict[str, Any],
    max_prompts: int | None,
    name: str | None,
    progress: Callable[[int], None] | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """``wispsim profile calibrate``: the physical profile of ``model`` on ``tp`` x ``gpu`` with its
    engine overheads fitted on the result files, written to ``out``; returns the overheads and the
    leave-one-run-out errors."""
    import yaml

    from wispsim.measure.profile.derive import render
    from wispsim.model.profiles import parse_profile
    from wispsim.runs.bench_profile import physical_of
    from wispsim.study.bench import vllm_defaults
    from wispsim.study.calibrate import calibrate

    check_output_file(out, "--out", (".yaml", ".yml"))  # before any work
    base = physical_of(model, gpu, tp, dtype, name=name or out.stem, command=command_line())
    memory, card = base["hardware"]["memory_gib"], base["hardware"]["gpu"]
    tokens, seqs = vllm_defaults(memory, card)  # as wispsim bench takes them for this GPU
    server = {
        **server,
        "max_num_seqs": server.get("max_num_seqs") or seqs,
        "max_num_batched_tokens": server.get("max_num_batched_tokens") or tokens,
    }
    data, over, loo = calibrate(results, base, server, max_prompts, progress)
    text = render(data)
    parse_profile(yaml.safe_load(text), str(out))
    with writing("--out", out):
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return over, loo
