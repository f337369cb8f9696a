"""Each real run simulated again with the engine's cost as it was during that run (issue 30).

The host's speed drifted between runs by up to ~20-30% (README.md), more than the study's targets,
so a profile fitted on one run prices another run's batches wrongly whatever the simulator does
with them. This variant separates the two: per real folder, regime and policy, it fits a profile
on that run's own batch log (verification batches; centralized engine steps), stores it under
``own/``, and re-simulates the folder with it (``FOLDER-own``). The batch cost is then in-sample;
everything the scheduler, the KV cache and the devices make of it (violations, queueing, batch
sizes, cold rounds, speeds, goodput) is not. The scheduler still plans with the profile the real
server planned with (``validate`` keeps it as ``server.planning_profile``).

    python experiments/data/validation-scale/own.py [FOLDER ...]   # default: every real folder
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
GPU = "CPU: AMD EPYC, AVX-512 (vLLM: 1 compute core of 2)"


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def own(folder: Path) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    out = HERE / f"{folder.name}-own"
    if (out / "manifest.json").is_file():
        return
    sets = []
    for regime in m["regimes"]:
        for policy in m["policies"]:
            logs = folder / "points" / regime / policy
            prof = HERE / "own" / f"{folder.name}-{regime}-{policy}.yaml"
            if not prof.is_file():
                kind = "step" if policy.startswith("centralized") else "verify"
                run(
                    [
                        "wispsim",
                        "profile",
                        "fit",
                        str(logs.relative_to(ROOT)),
                        "--batch-kind",
                        kind,
                        "--out",
                        str(prof.relative_to(ROOT)),
                        "--gpu",
                        GPU,
                        "--bootstrap",
                        "50",
                        "--no-plots",
                    ]
                )
            sets += ["--sim-set", f"{policy}:server.profile={prof.relative_to(ROOT)}"]
    cmd = m["command"].split()
    keep = []
    i = 0
    while i < len(cmd):  # the original command without its real-side options and --out
        if cmd[i] in ("--arch", "--out", "--model", "--dtype", "--port"):
            i += 2
            continue
        keep.append(cmd[i])
        i += 1
    run([*keep, "--real-from", str(folder.relative_to(ROOT)), *sets, "--out", str(out.relative_to(ROOT))])


def main() -> None:
    real = [p.name for p in sorted(HERE.iterdir()) if (p / "points").is_dir()]
    names = sys.argv[1:] or [n for n in real if "-" not in n.replace("pressure-", "")]
    for name in names:
        own(HERE / name)


if __name__ == "__main__":
    main()
