"""Which device is which: SLO class, draft-speed distribution and link type per device index.

A scenario describes its fleet either as ``devices.count`` devices spread round-robin over
``devices.classes`` (device i belongs to ``classes[i % len(classes)]``), or as ``devices.groups``
(devices per class, optionally per device type and link type). Groups are interleaved smoothly
(device i goes to the group that is furthest behind its share), so any prefix of the device list
has the fleet's mix: a concurrency trace that activates the first 40 devices activates a
representative 40. Asked for N devices other than the groups' total (a capacity search), the
groups are scaled to N by largest remainders.
"""

from __future__ import annotations

from dataclasses import dataclass

from wispsim.config import Dist, Scenario


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    slo: float
    draft_speed: Dist
    link: str | None  # None: drawn from network.links shares
    group: str


def fleet_size(scenario: Scenario) -> int:
    """The scenario's own number of devices (groups' total, else ``devices.count``)."""
    groups = scenario.devices.groups
    return sum(g.count for g in groups) if groups else scenario.devices.count


def _scaled_counts(counts: list[int], n: int) -> list[int]:
    total = sum(counts)
    if total == n:
        return counts
    exact = [c * n / total for c in counts]
    out = [int(x) for x in exact]
    order = sorted(range(len(counts)), key=lambda i: (out[i] - exact[i], i))
    for i in order[: n - sum(out)]:
        out[i] += 1
    return out


def device_specs(scenario: Scenario, n: int) -> list[DeviceSpec]:
    """Specs of devices 0..n-1."""
    dev = scenario.devices
    if not dev.groups:
        return [DeviceSpec(dev.classes[i % len(dev.classes)], dev.draft_speed, None, "") for i in range(n)]
    groups = dev.groups
    counts = _scaled_counts([g.count for g in groups], n)
    specs = [
        DeviceSpec(
            g.slo,
            g.draft_speed if g.draft_speed is not None else dev.draft_speed,
            g.link,
            g.name or f"group{j}",
        )
        for j, g in enumerate(groups)
    ]
    out: list[DeviceSpec] = []
    given = [0] * len(groups)
    for i in range(n):
        # the group furthest behind its share of the first i + 1 devices (ties: list order)
        j = max(
            (j for j in range(len(groups)) if given[j] < counts[j]),
            key=lambda j: (counts[j] * (i + 1) / n - given[j], -j),
        )
        given[j] += 1
        out.append(specs[j])
    return out


def fleet_classes(scenario: Scenario) -> tuple[float, ...]:
    """The SLO classes present in the fleet, in first-appearance order."""
    if not scenario.devices.groups:
        return scenario.devices.classes
    seen: dict[float, None] = {}
    for g in scenario.devices.groups:
        if g.count > 0:
            seen.setdefault(g.slo, None)
    return tuple(seen)
