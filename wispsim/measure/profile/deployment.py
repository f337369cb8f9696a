"""Measurements from a deployment's batch log: what ``wispsim serve`` logged, as a recording.

``wispsim serve`` logs every verification batch it ran (``server_batches.parquet``) and every
member of it (``server_members.parquet``): the new and cached tokens of each request as vLLM
served them, and the batch's wall time. :func:`deployment_measurements` turns the logs under one
or more folders (a ``wispsim swarm`` or ``wispsim validate`` results folder) into the CSV that
``wispsim profile record`` writes, one row per batch, with a seeded train/test split, so ``wispsim
profile fit`` fits the estimator of the engine *as deployed* (under its real load, beside its
HTTP server and scheduler) the same way it fits a planned recording. Its sidecar copies the model
and host facts of the profile the server ran with, and says where the batches came from.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.errors import WispsimError

BATCHES, MEMBERS = "server_batches.parquet", "server_members.parquet"


def find_batch_logs(root: Path) -> list[Path]:
    """Folders under ``root`` (or ``root`` itself) holding a verification batch log."""
    if not root.exists():
        raise WispsimError(f"{root}: not found")
    found = sorted({p.parent for p in root.rglob(MEMBERS)}) if root.is_dir() else []
    if not found:
        raise WispsimError(
            f"{root}: no verification batch log ({BATCHES} with {MEMBERS}) under it; give a "
            "wispsim swarm or wispsim validate results folder of a speculative policy"
        )
    return found


def _joined(values: pd.Series) -> str:
    return ";".join(str(int(v)) for v in values)


def deployment_measurements(
    roots: list[Path], test_share: float = 0.3, seed: int = 0
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """One measurement row per logged verification batch under ``roots``, and the sidecar's
    facts (the servers' engine facts and where the rows came from)."""
    rows = []
    sources = []
    facts: dict[str, Any] = {}
    for root in roots:
        for folder in find_batch_logs(root):
            try:
                b = pd.read_parquet(folder / BATCHES)
                m = pd.read_parquet(folder / MEMBERS)
            except (OSError, ValueError) as e:
                raise WispsimError(f"{folder}: unreadable batch log: {str(e).splitlines()[0]}") from None
            done = folder / "done.json"
            if done.is_file() and not facts:
                facts = dict(json.loads(done.read_text()).get("server") or {})
            sources.append(str(folder))
            m = m.sort_values(["batch", "round"], kind="stable")
            members = m.groupby("batch", sort=True)
            for row in b[b.kind == "verify"].itertuples(index=False):
                if row.batch not in members.groups:
                    continue
                g = members.get_group(row.batch)
                total = g.l_new + g.l_cached
                rows.append(
                    {
                        "config_id": f"{len(sources) - 1}-{int(row.batch)}",
                        "category": "deployment",
                        "batch_size": len(g),
                        "l_new": _joined(g.l_new),
                        "l_cached": _joined(g.l_cached),
                        "n_linear": int(g.l_new.sum()),
                        "n_interactions": int((total * g.l_new).sum()),
                        "n_cached": int(g.l_cached.sum()),
                        "max_l_total": int(total.max()),
                        "status": "ok",
                        "latency_s": float(row.latency),
                        "runs_s": f"{float(row.latency):.6g}",
                        "l_new_plan": _joined(g.l_new_plan),
                        "l_cached_plan": _joined(g.l_cached_plan),
                        "source": str(folder),
                    }
                )
    if not rows:
        raise WispsimError(f"{', '.join(map(str, roots))}: the batch logs hold no verification batch")
    df = pd.DataFrame(rows)
    rng = np.random.default_rng(seed)
    df.insert(1, "split", np.where(rng.random(len(df)) < test_share, "test", "train"))
    return df, {"server": facts, "sources": sources}


def write_deployment_data(
    roots: list[Path], out_csv: Path, base_meta: dict[str, Any], command: str, seed: int = 0
) -> Path:
    """Write the measurement CSV of :func:`deployment_measurements` and its sidecar, which keeps
    ``base_meta``'s model and host facts (the recording of the profile the server ran with)."""
    df, info = deployment_measurements(roots, seed=seed)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_csv, index=False)
    server = info["server"]
    meta = {k: v for k, v in base_meta.items() if k not in ("plan", "plan_meta", "plan_sha256")}
    meta |= {
        "engine": server.get("engine", base_meta.get("engine", "vllm")),
        "dtype": server.get("dtype", base_meta.get("dtype")),
        "prefix_caching": server.get("prefix_caching", base_meta.get("prefix_caching", True)),
        "engine_facts": {
            **(base_meta.get("engine_facts") or {}),
            **{k: server[k] for k in ("block_size", "kv_capacity_tokens", "device") if k in server},
        },
        "command": command,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "deployment": {"batch_logs": info["sources"], "batches": len(df), "split_seed": seed},
    }
    Path(str(out_csv) + ".meta.json").write_text(json.dumps(meta, indent=1))
    return out_csv
