"""A policy preset against the settings a scenario gives explicitly (SPEC 3).

A named policy (``wisp``, ``centralized``, ...) sets a few fields (:data:`PRESET_FIELDS`, and
whether the server speculates). A file or ``--set`` that gives one of them a different value is
an error naming where it was given, never a setting silently dropped; ``policy: custom`` lets a
scenario choose them itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wispsim.config.schema import POLICIES, Scenario
from wispsim.errors import ConfigError

# the fields a policy preset sets (SPEC 3): their path in the scenario -> the preset key
PRESET_FIELDS = {
    ("drafting", "controller"): "controller",
    ("server", "mode"): "mode",
    ("server", "scheduler"): "scheduler",
    ("server", "engine", "enable_prefix_caching"): "cache",
    ("server", "verifier", "kv_policy"): "kv",
}

Layers = tuple[tuple[Mapping[str, Any], str], ...]  # (settings, where they were given), latest first


def check_preset(
    scenario: Scenario, written: Mapping[str, Any], overrides: Mapping[str, Any], source: str
) -> None:
    """An explicit setting the policy preset would override is an error, never silently dropped.
    A policy chosen on the command line (``--policy``, which the resolver passes here, or ``--set
    policy=``) overrides the file's preset fields; only ``--set`` is checked against it."""
    preset = POLICIES.get(scenario.policy)
    if preset is None:
        return  # an unknown policy: with_policy names it
    layers: Layers = ((overrides, "--set"),)
    if "policy" not in overrides:
        layers += ((written, source),)
    for path, key in PRESET_FIELDS.items():
        for layer, where in layers:
            if not _given(layer, path):
                continue
            value: Any = scenario
            for part in path:
                value = getattr(value, part)
            if value != preset[key]:
                want = str(preset[key]).lower() if isinstance(preset[key], bool) else preset[key]
                got = str(value).lower() if isinstance(value, bool) else value
                raise ConfigError(
                    where,
                    ".".join(path),
                    f"{got} conflicts with policy {scenario.policy}, which sets {want}; "
                    "set policy: custom to choose it yourself",
                )
            break  # the later layer wins; an agreeing value there is fine
    _check_spec_preset(scenario, preset, layers)


def _given(layer: Mapping[str, Any], path: tuple[str, ...]) -> bool:
    """Whether ``layer`` (a scenario mapping) sets the field at ``path``."""
    node: Any = layer
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _check_spec_preset(scenario: Scenario, preset: Mapping[str, Any], layers: Layers) -> None:
    """``server.speculation.method`` given explicitly must agree with the policy: centralized-sd
    speculates (any method but none), every other preset does not."""
    for layer, where in layers:
        spec = (
            (layer.get("server") or {}).get("speculation")
            if isinstance(layer.get("server"), Mapping)
            else None
        )
        if not isinstance(spec, Mapping) or "method" not in spec:
            continue
        method = scenario.server.speculation.method
        if bool(preset.get("spec")) != (method != "none"):
            want = "draft, eagle or ngram" if preset.get("spec") else "none"
            raise ConfigError(
                where,
                "server.speculation.method",
                f"{method} conflicts with policy {scenario.policy}, which sets {want}; "
                "set policy: custom to choose it yourself",
            )
        return
