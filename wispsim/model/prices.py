"""What a GPU hour costs: the shipped table of dated public on-demand prices
(``wispsim/data/gpu_prices.yaml``) and a planner's own.

A price is per GPU and hour; a replica of ``count`` GPUs costs ``count`` times it. The decision study
turns a capacity into GPU-hours per device-hour (``count / devices``) and per million committed
tokens (``count / (goodput x 3600) x 1e6``), and each into dollars at the price used.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from wispsim.errors import ConfigError
from wispsim.paths import data_dir as package_data


@dataclass(frozen=True)
class Price:
    """One GPU's price per hour and where it comes from (a shipped row, or the planner's)."""

    gpu: str
    usd_per_gpu_hour: float
    source: str  # "tier low-high (url, date)" or "given"


@cache
def price_table() -> dict[str, Any]:
    """The shipped table, as written (checked: every row names a known source and a range)."""
    path = package_data() / "gpu_prices.yaml"
    data = yaml.safe_load(path.read_text())
    sources = data.get("sources") or {}
    for gpu, rows in (data.get("prices") or {}).items():
        for row in rows:
            if row.get("source") not in sources or not 0 < row["low"] <= row["high"]:
                raise ConfigError(str(path), f"prices.{gpu}", f"bad row {row}")
    return data


def tiers() -> list[str]:
    return sorted({r["tier"] for rows in price_table()["prices"].values() for r in rows})


def shipped_price(
    gpu: str, tier: str | None = None, source: str = "gpu_prices", where: str = "price_tier"
) -> Price:
    """The middle of ``gpu``'s ``tier`` range (the table's default tier when None); a GPU or tier
    the table lacks is refused by name, never priced as another."""
    data = price_table()
    tier = tier or str(data["default_tier"])
    rows = data["prices"].get(gpu)
    if not rows:
        known = ", ".join(sorted(data["prices"]))
        raise ConfigError(
            source, "prices", f"no public price for GPU {gpu!r}; priced: {known} (give one in `prices:`)"
        )
    mine = [r for r in rows if r["tier"] == tier]
    if not mine:
        have = ", ".join(r["tier"] for r in rows)
        raise ConfigError(source, where, f"{gpu!r} has no {tier!r} price; its tiers: {have}")
    r = mine[0]
    src = data["sources"][r["source"]]
    mid = (float(r["low"]) + float(r["high"])) / 2
    return Price(gpu, mid, f"{tier} {r['low']:g}-{r['high']:g} $/GPU-h ({src['url']}, {src['date']})")


def price_for(gpu: str, given: dict[str, Any] | None, tier: str | None, source: str) -> Price:
    """The planner's price for ``gpu`` where ``given`` names it (USD per GPU-hour, > 0), else the
    shipped one."""
    if given and gpu in given:
        v = given[gpu]
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise ConfigError(source, f"prices.{gpu}", f"must be a price in USD per GPU-hour > 0, got {v!r}")
        return Price(gpu, float(v), "given")
    return shipped_price(gpu, tier, source)


def gpu_hours_per_device_hour(gpus: int, devices: float) -> float:
    return gpus / devices if devices > 0 else float("nan")


def gpu_hours_per_million_tokens(gpus: int, goodput_tps: float) -> float:
    """GPU-hours one million committed tokens take at ``goodput_tps`` (the system's, committed
    tokens per second)."""
    return gpus * 1e6 / (goodput_tps * 3600) if goodput_tps > 0 else float("nan")
