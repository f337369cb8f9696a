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


KINDS = ("verify", "step")


def find_batch_logs(root: Path, kind: str = "verify") -> list[Path]:
    """Folders under ``root`` (or ``root`` itself) holding a batch log of ``kind``: verification
    batches (with their members) or centralized engine steps."""
    if not root.exists():
        raise WispsimError(f"{root}: not found")
    if kind == "verify":
        found = sorted({p.parent for p in root.rglob(MEMBERS)}) if root.is_dir() else []
        what = f"verification batch log ({BATCHES} with {MEMBERS})"
        hint = "a speculative policy"
    else:
        found = sorted(
            p.parent
            for p in (root.rglob(BATCHES) if root.is_dir() else [])
            if not (p.parent / MEMBERS).is_file()
        )
        what = f"centralized step log ({BATCHES} without {MEMBERS})"
        hint = "centralized serving"
    if not found:
        raise WispsimError(
            f"{root}: no {what} under it; give a wispsim swarm or wispsim validate results folder of {hint}"
        )
    return found


def _joined(values: pd.Series) -> str:
    return ";".join(str(int(v)) for v in values)


def deployment_measurements(
    roots: list[Path], test_share: float = 0.3, seed: int = 0, kind: str = "verify"
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """One measurement row per logged verification batch (``kind`` verify) or centralized
    engine step (``step``: decodes and finished prefills, which the step log gives only in
    aggregate) under ``roots``, and the sidecar's facts (the servers' engine facts and where
    the rows came from)."""
    rows: list[dict[str, Any]] = []
    sources = []
    facts: dict[str, Any] = {}
    for root in roots:
        for folder in find_batch_logs(root, kind):
            try:
                b = pd.read_parquet(folder / BATCHES)
                m = pd.read_parquet(folder / MEMBERS) if kind == "verify" else None
            except (OSError, ValueError) as e:
                raise WispsimError(f"{folder}: unreadable batch log: {str(e).splitlines()[0]}") from None
            # the server's facts: a validation point's done.json, or a swarm folder's manifest
            for doc in (folder / "done.json", folder / "manifest.json"):
                if doc.is_file() and not facts:
                    facts = dict(json.loads(doc.read_text()).get("server") or {})
            sources.append(str(folder))
            if m is None:
                rows += _step_rows(b, len(sources) - 1, folder)
                continue
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
        raise WispsimError(f"{', '.join(map(str, roots))}: the batch logs hold no {kind} batch")
    df = pd.DataFrame(rows)
    rng = np.random.default_rng(seed)
    df.insert(1, "split", np.where(rng.random(len(df)) < test_share, "test", "train"))
    return df, {"server": facts, "sources": sources}


def _step_rows(b: pd.DataFrame, source: int, folder: Path) -> list[dict[str, Any]]:
    """Centralized engine steps that ran tokens, as measurement rows (aggregates only)."""
    out = []
    for row in b[(b.kind == "step") & (b.n_linear > 0)].itertuples(index=False):
        out.append(
            {
                "config_id": f"{source}-{int(row.batch)}",
                "category": "deployment-step",
                "batch_size": int(row.size),
                "l_new": str(int(row.n_linear)),
                "l_cached": str(int(row.n_cached)),
                "n_linear": int(row.n_linear),
                "n_interactions": int(row.n_interactions),
                "n_cached": int(row.n_cached),
                "max_l_total": int(row.n_linear + row.n_cached),
                "status": "ok",
                "latency_s": float(row.latency),
                "runs_s": f"{float(row.latency):.6g}",
                "source": str(folder),
            }
        )
    return out


def write_deployment_data(
    roots: list[Path],
    out_csv: Path,
    base_meta: dict[str, Any],
    command: str,
    seed: int = 0,
    kind: str = "verify",
) -> Path:
    """Write the measurement CSV of :func:`deployment_measurements` and its sidecar, which keeps
    ``base_meta``'s model facts (the recording of the profile the server ran with) and the host
    facts of the server where it reported them (else ``base_meta``'s)."""
    df, info = deployment_measurements(roots, seed=seed, kind=kind)
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
            **{
                k: server[k]
                for k in ("block_size", "kv_capacity_tokens", "device", "engine_in_process")
                if k in server
            },
        },
        # the server's host (it timed the batches); older folders: the recording's
        "host": {**(base_meta.get("host") or {}), **(server.get("host") or {})},
        "command": command,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "deployment": {"batch_logs": info["sources"], "batches": len(df), "kind": kind, "split_seed": seed},
    }
    Path(str(out_csv) + ".meta.json").write_text(json.dumps(meta, indent=1))
    return out_csv
