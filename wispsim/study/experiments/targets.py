"""A capacity study's targets: a shipped profile by name, or a variant of one.

A ``targets`` entry is a profile's name, or ``{name, profile, roofline, set}``: the profile with
some roofline parameters replaced (a sensitivity variant, written to the study's folder with its
provenance) and some scenario fields set (``server.verifier.kind``, ``server.host.api_server_count``, ...).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import yaml

from wispsim.config import Scenario
from wispsim.model.profiles import find_profile, parse_profile
from wispsim.study.experiments.run import Context


def study_target(ctx: Context, target: Any) -> tuple[str, str, dict[str, Any]]:
    """(name, profile, set) of a ``targets`` entry: a profile's name, or a variant
    ``{name, profile, roofline, set}`` whose roofline parameters (``efficiency``, ``overlap``,
    ``overhead_ms``) replace the profile's (the variant's profile is written to the study's
    folder, its provenance saying what changed, and checked like any other) and whose ``set``
    overrides the study's scenario (``server.verifier.kind``, ``server.host.api_server_count``, ...)."""
    if not isinstance(target, dict):
        return str(target), str(target), {}
    sets = dict(target.get("set") or {})
    if not target.get("roofline"):
        return str(target["name"]), str(target["profile"]), sets
    base = yaml.safe_load(find_profile(str(target["profile"])).read_text())
    roof = base.get("roofline") or {}
    for key, value in (target.get("roofline") or {}).items():
        roof[key] = {**roof.get(key, {}), **value} if isinstance(value, dict) else value
    name = str(target["name"])
    base.update(name=name, roofline=roof)
    base["provenance"] = {
        **base.get("provenance", {}),
        "kind": "derived",
        "rule": f"{target['profile']} with roofline {target.get('roofline')} (a sensitivity variant)",
        "inputs": {"profile": str(target["profile"]), "roofline": target.get("roofline") or {}},
    }
    path = ctx.out / "profiles" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    parse_profile(base, str(path))  # a bad variant fails here, in one line
    # named relative to the working folder where it can be: a point's key hashes the scenario, so an
    # absolute path would key the same simulation differently in every checkout
    return name, os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd()) else str(path), sets


def with_profile(sc: Scenario, profile: str) -> Scenario:
    """``sc`` with its verifier's latency profile set to ``profile`` (a name or a path)."""
    return sc.replace(server=dataclasses.replace(sc.server, profile=profile))
