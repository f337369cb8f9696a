"""Drafting controllers (SPEC 2.1): how many tokens a round sends, and what drafting cost."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wispsim.config import DraftingConfig, PredictorConfig
from wispsim.errors import ConfigError
from wispsim.model.acceptance import FEATURES, ResponseStream, accept_runs
from wispsim.model.drafting import FixedController, PredictorController, make_controller
from wispsim.sim.scenarios import resolve_server


def stream_with_top1(top1: list[float], pad: int = 3) -> ResponseStream:
    n = len(top1)
    feats = np.zeros((n + pad, len(FEATURES)))
    feats[:n, 0] = top1
    accept = np.zeros(n + pad, dtype=bool)
    return ResponseStream(16, n, accept, feats, accept_runs(accept))


def test_fixed_sends_k_but_never_past_the_end() -> None:
    ctl = FixedController(DraftingConfig(controller="fixed", k=5))
    # a round commits up to k + 1 tokens, so with r tokens left it sends at most r - 1 (>= 1)
    assert ctl.plan(None, 0, 10) == (5, 5, 0)
    assert ctl.plan(None, 0, 6) == (5, 5, 0)
    assert ctl.plan(None, 0, 4) == (3, 3, 0)
    assert ctl.plan(None, 0, 1) == (1, 1, 0)


def test_predictor_stops_at_first_predicted_rejection() -> None:
    # threshold 0.5 on top-1: predicted accept at every position except 2
    top1 = [0.9, 0.9, 0.2, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]
    ctl = PredictorController(
        DraftingConfig(controller="predictor", k_min=1, k_max=4, predictor=PredictorConfig(threshold=0.5))
    )
    st_ = ctl.prepare(stream_with_top1(top1))
    # from 0: position 0 is sent unasked (k_min = 1); asks at 1 (accept) and 2 (reject):
    # 3 forward passes, 2 predictor calls, 2 tokens sent
    assert ctl.plan(st_, 0, 10) == (2, 3, 2)
    # from 1: sends 1, asks at 2 -> reject: the paid pass at 2 is wasted
    assert ctl.plan(st_, 1, 9) == (1, 2, 1)
    # from 3: every answer is "accept" until K_max = 4: asks at 4, 5, 6
    assert ctl.plan(st_, 3, 7) == (4, 4, 3)
    # near the end: 2 tokens left -> at most 1 sent
    assert ctl.plan(st_, 8, 2) == (1, 1, 0)


def test_predictor_is_not_asked_about_the_first_k_min_tokens() -> None:
    top1 = [0.9, 0.9, 0.2, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]
    ctl = PredictorController(DraftingConfig(controller="predictor", k_min=2, k_max=4))
    # from 1 with k_min = 2: positions 1, 2 are sent unasked (2's predicted rejection ignored)
    assert ctl.plan(ctl.prepare(stream_with_top1(top1)), 1, 9) == (4, 4, 2)


@settings(max_examples=200, deadline=None)
@given(
    top1=st.lists(st.floats(0, 1), min_size=1, max_size=40),
    k_min=st.integers(1, 4),
    extra=st.integers(0, 6),
    data=st.data(),
)
def test_predictor_plan_invariants(top1: list[float], k_min: int, extra: int, data: st.DataObject) -> None:
    k_max = k_min + extra
    ctl = PredictorController(DraftingConfig(controller="predictor", k_min=k_min, k_max=k_max))
    s = stream_with_top1(top1, pad=k_max + 2)
    state = ctl.prepare(s)
    pos = data.draw(st.integers(0, len(top1) - 1))
    remaining = len(top1) - pos
    k, passes, calls = ctl.plan(state, pos, remaining)
    limit = min(k_max, max(1, remaining - 1))
    assert min(k_min, limit) <= k <= limit
    assert passes in (k, k + 1)  # at most one wasted pass: the predicted rejection
    assert passes <= k_max
    assert calls == passes - min(k_min, limit)
    # the predictor said "accept" for every asked position that was sent ...
    assert all(top1[pos + i] >= 0.5 for i in range(min(k_min, limit), k))
    # ... and a wasted pass means it said "reject" at window offset k
    if passes == k + 1:
        assert top1[pos + k] < 0.5


def test_unknown_controller_lists_known() -> None:
    with pytest.raises(ConfigError, match=r"fixed.*predictor"):
        make_controller(DraftingConfig(controller="greedy"))


def test_predictor_threshold_null_is_the_files_own_and_a_number_overrides_it(det_scenario) -> None:
    """drafting.predictor.threshold: null keeps the npz file's low-FPR point; a number moves the
    operating point (lower: predicts accept more often, so drafts run longer)."""
    import numpy as np

    from wispsim.config.schema import PredictorConfig
    from wispsim.model.predictor import make_predictor

    shipped = make_predictor(PredictorConfig(name="npz", path="nl-t0-mlp.npz"))
    assert shipped.threshold == pytest.approx(0.834, abs=1e-3)
    low = make_predictor(PredictorConfig(name="npz", path="nl-t0-mlp.npz", threshold=0.3))
    assert low.threshold == 0.3
    rng = np.random.default_rng(0)
    x = np.column_stack(
        [rng.uniform(0, 1, 500), rng.uniform(0, 3, 500), rng.uniform(0, 1, 500), rng.uniform(0, 5, 500)]
    )
    a_low, a_shipped = low.predict_accept(x), shipped.predict_accept(x)
    assert (a_low >= a_shipped).all() and a_low.sum() > a_shipped.sum()
    assert make_predictor(PredictorConfig()).threshold == 0.5  # confidence: 0.5 unless set

    from wispsim.sim.scenarios import load_scenario
    from wispsim.sim.simulation import simulate

    def mean_k(threshold: float | None) -> float:
        over = {
            "drafting": {"predictor": {"threshold": threshold}},
            "workload": {"warmup_s": 1, "duration_s": 4},
        }
        return float(
            simulate(
                resolve_server(load_scenario(overrides=over).with_devices(8, (4.0,))), seed=0
            ).rounds.k.mean()
        )

    assert mean_k(0.3) > mean_k(None) > mean_k(0.95)
