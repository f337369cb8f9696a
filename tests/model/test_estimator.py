"""The verification-time estimator (SPEC 4) and the shipped profile it comes from."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import profile_dict
from wispsim.errors import ConfigError
from wispsim.model.estimator import Estimator, aggregates
from wispsim.model.profiles import load_profile

# Qwen3-32B on one A100 80GB, vLLM (SPEC 4 table)
QWEN = Estimator(a=3.314e-5, b_compute=3.450e-8, b_read=4.620e-6, c=1.486e-2)


def test_aggregates_by_hand() -> None:
    # (L_new, L_cached) = (5, 1000) and (100, 0):
    # N_linear = 5 + 100 = 105
    # N_interactions = 1005*5 + 100*100 = 5025 + 10000 = 15025
    # N_cached = 1000
    assert aggregates([(5, 1000), (100, 0)]) == (105, 15025, 1000)
    assert aggregates([]) == (0, 0, 0)


def test_memory_bound_request_by_hand() -> None:
    # One follow-up round: 5 new tokens on a 1000-token cached prefix.
    # a*5 = 1.657e-4; b_compute*1005*5 = 3.45e-8*5025 = 1.733625e-4;
    # b_read*1000 = 4.62e-3; c = 1.486e-2  ->  T = 0.0198190625 s
    assert QWEN.of([(5, 1000)]) == pytest.approx(0.0198190625, rel=1e-12)
    assert QWEN.batch(5, 5025, 1000) == pytest.approx(0.0198190625, rel=1e-12)
    # marginal cost v_i leaves out the batch constant c
    assert QWEN.marginal(5, 1000) == pytest.approx(0.0198190625 - 1.486e-2, rel=1e-12)


def test_compute_bound_request_by_hand() -> None:
    # 1600 new tokens, nothing cached: a*1600 = 0.053024; b_compute*1600^2 = 0.08832; c
    assert QWEN.of([(1600, 0)]) == pytest.approx(0.053024 + 0.08832 + 0.01486, rel=1e-12)


def test_batch_constant_is_paid_once() -> None:
    one = QWEN.of([(5, 500)])
    two = QWEN.of([(5, 500), (5, 500)])
    assert two - one == pytest.approx(one - QWEN.c, rel=1e-12)
    assert QWEN.of([]) == QWEN.c


pairs = st.lists(st.tuples(st.integers(1, 4000), st.integers(0, 8000)), max_size=20)


@settings(max_examples=200, deadline=None)
@given(pairs)
def test_per_request_sum_equals_aggregate_formula(reqs: list[tuple[int, int]]) -> None:
    assert QWEN.of(reqs) == pytest.approx(QWEN.batch(*aggregates(reqs)), rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(pairs, st.integers(1, 100), st.integers(0, 1000))
def test_adding_a_request_never_makes_a_batch_faster(
    reqs: list[tuple[int, int]], l_new: int, l_cached: int
) -> None:
    assert QWEN.of([*reqs, (l_new, l_cached)]) > QWEN.of(reqs)


# ---------------------------------------------------------------------------------------------
# The shipped profile
# ---------------------------------------------------------------------------------------------


def test_shipped_profile_has_the_published_coefficients() -> None:
    p = load_profile("a100-qwen3-32b-paper")
    assert p.estimator == QWEN
    assert p.ci95["a"] == pytest.approx((3.12e-5, 3.49e-5))
    assert p.ci95["c"] == pytest.approx((1.30e-2, 1.69e-2))
    assert p.provenance["kind"] == "published"


def test_shipped_profile_kv_capacity_by_hand() -> None:
    p = load_profile("a100-qwen3-32b-paper")
    # bytes per token: 2 x 64 layers x 8 KV heads x 128 head dim x 2 bytes = 262144
    assert p.model.kv_bytes_per_token == 262_144
    # 79.15 GiB (what torch sees of an A100 80GB) x 0.9 = 76487998832 B; - 65.6e9 B weights
    # = 10887998832; - 1.5 GiB (1610612736) = 9277386096 B; / 262144 = 35390.4 -> 35390 tokens
    assert p.kv_capacity_tokens(0.9, 1.5) == 35_390


def test_profile_with_negative_coefficient_names_profile_and_field(tmp_path: Path) -> None:
    data = profile_dict()
    data["coefficients"]["b_read"] = -1.0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_profile(str(path))
    msg = str(e.value)
    assert "\n" not in msg
    assert "bad.yaml" in msg and "coefficients.b_read" in msg and ">= 0" in msg


def test_unknown_profile_lists_shipped_ones() -> None:
    with pytest.raises(ConfigError, match="a100-qwen3-32b-paper"):
        load_profile("h100-nonexistent")
