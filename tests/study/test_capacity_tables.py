"""A capacity study's figures at N = capacity when the search did not evaluate that N (issue 44)."""

from __future__ import annotations

import pandas as pd
import pytest

from wispsim.study.experiments.sweeps import rows_at as _rows_at
from wispsim.study.experiments.sweeps import rows_of as _part


def _curve() -> pd.DataFrame:
    rows = []
    for n, good in ((100, 800.0), (110, 900.0), (130, 1000.0)):
        for seed, shift in ((0, -10.0), (1, 10.0)):
            rows.append({"policy": "wisp", "devices": n, "seed": seed, "goodput_tps": good + shift})
    return pd.DataFrame(rows)


def test_an_evaluated_n_gives_its_rows_one_per_seed() -> None:
    at = _rows_at(_curve(), 110)
    assert list(at.seed) == [0, 1] and at.goodput_tps.mean() == 900.0


def test_between_evaluated_n_the_seed_means_are_interpolated() -> None:
    at = _rows_at(_curve(), 120)
    assert len(at) == 1 and at.goodput_tps.iloc[0] == pytest.approx(950.0)


def test_off_the_curve_there_is_nothing_to_read() -> None:
    assert _rows_at(_curve(), 140).empty and _rows_at(_curve(), 90).empty


def test_a_combined_sweeps_rows_go_back_to_their_sweep_with_their_policy_names() -> None:
    joined = pd.DataFrame({"policy": ["0|wisp", "1|wisp", "0|sled", "10|wisp"], "capacity": [1, 2, 3, 4]})
    assert _part(joined, 0).to_dict("list") == {"policy": ["wisp", "sled"], "capacity": [1, 3]}
    assert _part(joined, 1).policy.tolist() == ["wisp"]
    assert _part(joined, 10).capacity.tolist() == [4]
