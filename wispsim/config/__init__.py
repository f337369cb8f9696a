"""Scenario configuration: YAML -> frozen dataclasses. Knows plug-in names, never implementations.

``dist`` holds field checks and distributions, ``schema`` the sections and policy presets,
``parse`` the YAML reading and coercion. Loading a scenario *for a run* (with its plug-in names
checked) is :func:`wispsim.sim.scenarios.load_scenario`, re-exported as ``wispsim.load_scenario``.
"""

from wispsim.config.dist import Dist, FieldError
from wispsim.config.network import LinkType, NetworkConfig
from wispsim.config.parse import build, deep_merge, default_scenario_dict, parse_set, read_yaml
from wispsim.config.schema import (
    POLICIES,
    POLICY_NAMES,
    AcceptanceConfig,
    ArrivalsConfig,
    DeviceGroup,
    DevicesConfig,
    DraftingConfig,
    PredictorConfig,
    Scenario,
    ServerConfig,
    WorkloadConfig,
)

__all__ = [
    "POLICIES",
    "POLICY_NAMES",
    "AcceptanceConfig",
    "ArrivalsConfig",
    "DeviceGroup",
    "DevicesConfig",
    "Dist",
    "DraftingConfig",
    "FieldError",
    "LinkType",
    "NetworkConfig",
    "PredictorConfig",
    "Scenario",
    "ServerConfig",
    "WorkloadConfig",
    "build",
    "deep_merge",
    "default_scenario_dict",
    "parse_set",
    "read_yaml",
]
