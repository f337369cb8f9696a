"""What a GPU hour costs (issue 46): the shipped table of dated public prices and a planner's own."""

from __future__ import annotations

import pytest

from wispsim.errors import ConfigError
from wispsim.model.prices import (
    gpu_hours_per_device_hour,
    gpu_hours_per_million_tokens,
    price_for,
    price_table,
    shipped_price,
    tiers,
)


def test_every_shipped_row_names_its_source_and_date() -> None:
    data = price_table()
    assert data["default_tier"] in tiers()
    for rows in data["prices"].values():
        for r in rows:
            src = data["sources"][r["source"]]
            assert src["url"].startswith("https://") and src["date"]


def test_the_default_is_the_middle_of_the_default_tier_and_says_where_it_comes_from() -> None:
    p = shipped_price("a100-80gb")
    assert p.usd_per_gpu_hour == pytest.approx((1.10 + 1.50) / 2)
    assert "specialty" in p.source and "mercatus" in p.source and "2026-05" in p.source
    assert shipped_price("h100-80gb", "hyperscaler").usd_per_gpu_hour == pytest.approx(4.25)


def test_a_gpu_or_tier_without_a_price_is_refused_by_name_never_priced_as_another() -> None:
    with pytest.raises(ConfigError, match="no public price for GPU 'mi300x'; priced: a100-80gb"):
        shipped_price("mi300x", source="experiments/decision.yaml")
    with pytest.raises(ConfigError, match="'h200' has no 'aws-list' price"):
        shipped_price("h200", "aws-list")


def test_a_given_price_wins_and_a_bad_one_is_one_line() -> None:
    assert price_for("mi300x", {"mi300x": 2.0}, None, "s").usd_per_gpu_hour == 2.0
    assert price_for("mi300x", {"mi300x": 2.0}, None, "s").source == "given"
    assert price_for("a100-80gb", {"mi300x": 2.0}, None, "s").source.startswith("specialty")
    for bad in (0, -1, "1.2", True, None):
        with pytest.raises(ConfigError, match=r"prices\.a100-80gb: must be a price in USD per GPU-hour > 0"):
            price_for("a100-80gb", {"a100-80gb": bad}, None, "s")


def test_gpu_hours_follow_capacity_and_goodput() -> None:
    # two GPUs serving 100 devices: 0.02 GPU-hours per device-hour
    assert gpu_hours_per_device_hour(2, 100) == pytest.approx(0.02)
    # one GPU at 1,000 committed tokens/s: a million tokens take 1,000 s = 0.2778 GPU-hours
    assert gpu_hours_per_million_tokens(1, 1000.0) == pytest.approx(1e6 / 1000 / 3600)
    assert gpu_hours_per_device_hour(1, 0) != gpu_hours_per_device_hour(1, 0)  # NaN: nothing served
