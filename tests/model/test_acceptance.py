"""Acceptance models (SPEC 1 and 5): statistical checks with fixed seeds and honest tolerances.

Tolerances are a few binomial standard errors of the quantity checked; with fixed seeds the
outcome is deterministic, so a failure means the model changed, not bad luck.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wispsim.config import AcceptanceConfig
from wispsim.errors import ConfigError, TraceError
from wispsim.model.acceptance import (
    FEATURES,
    TRACE_COLUMNS,
    BernoulliAcceptance,
    LatentAcceptance,
    TraceAcceptance,
    accept_runs,
    expected_accept_ratio,
    find_trace,
    load_trace,
    make_acceptance,
)

FIXTURE = "fixture-synthetic"


def rng(seed: int = 12345) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------------------------


def test_accept_runs_by_hand() -> None:
    acc = np.array([True, True, False, True, False, False, True])
    assert accept_runs(acc).tolist() == [2, 1, 0, 1, 0, 0, 1]


@given(st.lists(st.booleans(), max_size=60))
def test_accept_runs_counts_consecutive_accepts(flags: list[bool]) -> None:
    runs = accept_runs(np.array(flags, dtype=bool)).tolist()
    for t in range(len(flags)):
        n = 0
        while t + n < len(flags) and flags[t + n]:
            n += 1
        assert runs[t] == n


def test_expected_accept_ratio_by_hand() -> None:
    # i.i.d. acceptance 0.5, window 2: E[L] = 0.5 + 0.25 = 0.75, ratio 0.375
    assert expected_accept_ratio(0.5, 2) == pytest.approx(0.375)
    assert expected_accept_ratio(1.0, 5) == 1.0


@pytest.mark.parametrize("model", ["bernoulli", "latent"])
def test_stream_is_padded_and_reproducible(model: str) -> None:
    m = make_acceptance(AcceptanceConfig(model=model))
    s = m.new_response(rng(3), 100, 40, 10)
    assert (s.prompt_len, s.output_len) == (100, 40)
    assert s.accept.shape == (50,) and s.features.shape == (50, len(FEATURES))
    assert not s.accept[40:].any()  # nothing past the end is ever accepted
    assert s.run[39] <= 1
    again = m.new_response(rng(3), 100, 40, 10)
    assert np.array_equal(s.accept, again.accept) and np.array_equal(s.features, again.features)


def test_unknown_acceptance_model_lists_known() -> None:
    with pytest.raises(ConfigError) as e:
        make_acceptance(AcceptanceConfig(model="oracle"))
    for name in ("'oracle'", "bernoulli", "latent", "trace"):
        assert name in str(e.value)


# ---------------------------------------------------------------------------------------------
# bernoulli and latent reproduce their means
# ---------------------------------------------------------------------------------------------


def draw(model: BernoulliAcceptance | LatentAcceptance, responses: int, length: int, seed: int):
    g = rng(seed)
    streams = [model.new_response(g, 64, length, 0) for _ in range(responses)]
    return np.concatenate([s.accept for s in streams]), np.concatenate([s.features for s in streams])


def test_bernoulli_reproduces_its_mean() -> None:
    mean = 0.6
    acc, feats = draw(BernoulliAcceptance(AcceptanceConfig(model="bernoulli", mean=mean)), 400, 500, 1)
    se = math.sqrt(mean * (1 - mean) / acc.size)  # 200k positions: se = 0.0011
    assert abs(acc.mean() - mean) < 5 * se
    # its features carry no information about acceptance
    top1 = feats[:, 0]
    assert abs(top1[acc].mean() - top1[~acc].mean()) < 0.01


def test_bernoulli_accepted_length_matches_formula() -> None:
    # E[min(run, k)] = sum_{i=1..k} p^i for i.i.d. acceptance
    mean, k = 0.7, 5
    model = BernoulliAcceptance(AcceptanceConfig(model="bernoulli", mean=mean))
    g = rng(2)
    lengths = []
    for _ in range(300):
        s = model.new_response(g, 64, 400, 0)
        lengths.append(np.minimum(s.run[: 400 - k], k))
    got = np.concatenate(lengths).mean()
    expected = expected_accept_ratio(mean, k) * k  # 0.7+0.49+0.343+0.2401+0.16807 = 1.94117
    assert expected == pytest.approx(1.94117, abs=1e-5)
    # positions overlap, so the standard error is larger than i.i.d.; 0.03 is ~5 of them
    assert abs(got - expected) < 0.03


@pytest.mark.parametrize(("mean", "spread"), [(0.72, 0.3), (0.5, 0.2), (0.85, 0.0)])
def test_latent_reproduces_its_mean(mean: float, spread: float) -> None:
    cfg = AcceptanceConfig(model="latent", mean=mean, spread=spread)
    acc, _ = draw(LatentAcceptance(cfg), 400, 500, 4)
    se = math.sqrt(mean * (1 - mean) / acc.size)
    assert abs(acc.mean() - mean) < 5 * se


def test_latent_probabilities_have_the_configured_spread() -> None:
    # With feature_noise 0 the top-1 feature is the per-token acceptance probability itself,
    # so its mean and standard deviation are the Beta's: mean 0.72, std 0.3 (the spread).
    cfg = AcceptanceConfig(model="latent", mean=0.72, spread=0.3, feature_noise=0.0)
    _, feats = draw(LatentAcceptance(cfg), 100, 500, 6)
    p = feats[:, 0]
    assert abs(p.mean() - 0.72) < 0.005
    assert abs(p.std() - 0.3) < 0.005


def test_latent_features_are_informative() -> None:
    # With spread the per-token probability varies and the features track it: the draft's top-1
    # probability is clearly higher where the token was accepted.
    cfg = AcceptanceConfig(model="latent", mean=0.72, spread=0.3, feature_noise=0.5)
    acc, feats = draw(LatentAcceptance(cfg), 100, 500, 5)
    top1 = feats[:, 0]
    assert top1[acc].mean() - top1[~acc].mean() > 0.15
    entropy = feats[:, 1]
    assert entropy[acc].mean() < entropy[~acc].mean()


# ---------------------------------------------------------------------------------------------
# trace replay
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trace_model() -> TraceAcceptance:
    return TraceAcceptance(AcceptanceConfig(model="trace", trace=FIXTURE, accept_from="beta"))


def sample_of(tr, stream) -> int:
    """Which trace sample a replayed stream came from (features are copied verbatim)."""
    n = stream.output_len
    for i in range(tr.samples):
        s, length = int(tr.starts[i]), int(tr.lengths[i])
        if length == n and np.array_equal(tr.features[s : s + n], stream.features[:n]):
            return i
    raise AssertionError("replayed stream matches no trace sample")


def test_fixture_trace_is_in_the_recorded_format() -> None:
    path = find_trace(FIXTURE)
    table = pq.read_table(path)
    for col in (*TRACE_COLUMNS, "context_length", "target_top1_prob"):
        assert col in table.column_names
    tr = load_trace(str(path))
    assert tr.metadata["wispsim.trace.synthetic"] == "true"
    assert tr.metadata["wispsim.trace.generator"] == "scripts/make_fixture_trace.py"
    for key in ("seed", "date", "note"):
        assert tr.metadata[f"wispsim.trace.{key}"]
    assert "SYNTHETIC" in tr.metadata["wispsim.trace.note"]
    assert tr.samples == 40
    assert tr.lengths.min() >= 60 and tr.lengths.max() <= 200
    df = table.to_pandas()
    # beta is autocorrelated along positions; features are a monotone (noisy) function of it
    same = df["sample_id"].to_numpy()[1:] == df["sample_id"].to_numpy()[:-1]
    b = df["beta"].to_numpy()
    assert np.corrcoef(b[:-1][same], b[1:][same])[0, 1] > 0.5
    assert df["beta"].corr(df["top1_prob"], method="spearman") > 0.8
    assert df["beta"].corr(df["entropy"], method="spearman") < -0.8


def test_trace_sets_lengths_from_the_sample(trace_model: TraceAcceptance) -> None:
    tr = trace_model.trace
    df = pq.read_table(find_trace(FIXTURE)).to_pandas()
    first = df[df["position"] == 0].set_index("sample_id")["context_length"]
    s = trace_model.new_response(rng(9), 999, 999, 10)
    i = sample_of(tr, s)
    assert s.output_len == tr.lengths[i]
    assert s.prompt_len == first.iloc[i]  # prompt = context length at position 0
    assert len(s.accept) == s.output_len + 10


def test_trace_replay_reproduces_mean_beta(trace_model: TraceAcceptance) -> None:
    tr = trace_model.trace
    assert trace_model.nominal_rate() == pytest.approx(tr.beta.mean())
    g = rng(21)
    streams = [trace_model.new_response(g, 0, 0, 0) for _ in range(3000)]
    acc = np.concatenate([s.accept for s in streams])
    # samples are drawn uniformly and positions weighted by their count, so the expected
    # replayed rate is the row mean of beta; 3000 draws of 40 samples add selection noise
    # (a few 1e-3) on top of the Bernoulli noise (~1e-3)
    assert abs(acc.mean() - tr.beta.mean()) < 0.015


def test_trace_replay_reproduces_per_position_rates(trace_model: TraceAcceptance) -> None:
    tr = trace_model.trace
    g = rng(22)
    horizon = int(tr.lengths.min())  # positions every sample has
    hits = np.zeros(horizon)
    expect = np.zeros(horizon)
    var = np.zeros(horizon)
    brier = []
    reps = 3000
    for _ in range(reps):
        s = trace_model.new_response(g, 0, 0, 0)
        i = sample_of(tr, s)
        start = int(tr.starts[i])
        beta = tr.beta[start : start + s.output_len]
        hits += s.accept[:horizon]
        expect += beta[:horizon]
        var += beta[:horizon] * (1 - beta[:horizon])
        brier.append((s.accept[: s.output_len] - beta) ** 2 - beta * (1 - beta))
    # given the samples drawn, the accept count at each position is a sum of Bernoulli(beta)
    z = (hits - expect) / np.sqrt(var)
    assert np.abs(z).max() < 4.5
    # the realized flags line up with beta at the same position (a shifted or shuffled replay
    # would add E[(beta_t - beta_t')^2] ~ 0.02 to the Brier score)
    assert abs(np.concatenate(brier).mean()) < 0.003
    # and the per-position rate matches the trace's per-position mean beta over samples
    by_pos = np.array([tr.beta[tr.starts + t].mean() for t in range(horizon)])
    assert np.abs(hits / reps - by_pos).max() < 0.05


@pytest.mark.parametrize(("mode", "column"), [("flag", "flag"), ("greedy", "greedy")])
def test_trace_flag_and_greedy_modes_replay_recorded_values(mode: str, column: str) -> None:
    model = TraceAcceptance(AcceptanceConfig(model="trace", trace=FIXTURE, accept_from=mode))  # type: ignore[arg-type]
    tr = model.trace
    assert model.nominal_rate() == pytest.approx(getattr(tr, column).mean())
    g = rng(5)
    for _ in range(20):
        s = model.new_response(g, 0, 0, 4)
        i = sample_of(tr, s)
        start = int(tr.starts[i])
        assert np.array_equal(s.accept[: s.output_len], getattr(tr, column)[start : start + s.output_len])
        assert not s.accept[s.output_len :].any()


def test_trace_model_needs_a_trace() -> None:
    with pytest.raises(TraceError, match=r"acceptance\.trace"):
        TraceAcceptance(AcceptanceConfig(model="trace", trace=None))


def test_unknown_trace_name() -> None:
    with pytest.raises(TraceError, match="no trace"):
        find_trace("no-such-trace")


# ---------------------------------------------------------------------------------------------
# load_trace errors
# ---------------------------------------------------------------------------------------------


def good_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "sample_id": [0, 0, 0, 1, 1],
            "position": [0, 1, 2, 0, 1],
            "context_length": [10, 11, 12, 20, 21],
            "top1_prob": [0.9, 0.8, 0.2, 0.7, 0.6],
            "entropy": [0.3, 0.5, 2.0, 0.8, 1.0],
            "margin": [0.8, 0.6, 0.05, 0.5, 0.4],
            "logit_std": [4.0, 3.8, 2.0, 3.5, 3.4],
            "beta": [0.95, 0.85, 0.1, 0.7, 0.6],
            "greedy_agree": [True, True, False, True, True],
            "accept": [True, True, False, True, False],
        }
    )


def write_frame(tmp_path: Path, df: pd.DataFrame, name: str) -> str:
    p = tmp_path / name
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), p)
    return str(p)


def test_load_small_trace(tmp_path: Path) -> None:
    df = good_frame().iloc[[3, 0, 4, 2, 1]]  # rows out of order: the loader sorts them
    tr = load_trace(write_frame(tmp_path, df, "ok.parquet"))
    assert tr.samples == 2
    assert tr.lengths.tolist() == [3, 2]
    assert tr.prompt_lens.tolist() == [10, 20]
    assert tr.beta.tolist() == [0.95, 0.85, 0.1, 0.7, 0.6]
    assert tr.mean_rate("flag") == pytest.approx(3 / 5)


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (lambda df: df.drop(columns=["beta"]), "missing columns beta"),
        (lambda df: df.assign(beta=[0.5, 1.2, 0.1, 0.2, 0.3]), "beta must lie in [0, 1]"),
        (lambda df: df.assign(position=[0, 1, 3, 0, 1]), "consecutive"),
        (lambda df: df.assign(entropy=[0.1, np.nan, 0.1, 0.1, 0.1]), "NaN"),
        (lambda df: df.iloc[0:0], "no rows"),
    ],
    ids=["missing-column", "beta-range", "gap", "nan", "empty"],
)
def test_bad_traces_are_trace_errors(tmp_path: Path, mutate, words: str) -> None:
    path = write_frame(tmp_path, mutate(good_frame()), "bad.parquet")
    with pytest.raises(TraceError) as e:
        load_trace(path)
    assert path in str(e.value) and words in str(e.value)
    assert "\n" not in str(e.value)


def test_corrupt_file_is_a_trace_error(tmp_path: Path) -> None:
    p = tmp_path / "corrupt.parquet"
    p.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(TraceError, match="not a readable Parquet trace"):
        load_trace(str(p))


def test_trace_replay_with_workload_lengths_stitches_recorded_samples() -> None:
    from wispsim.model.acceptance import TraceAcceptance, find_trace, load_trace

    cfg = AcceptanceConfig(model="trace", trace="fixture-synthetic", lengths="workload", accept_from="flag")
    model = TraceAcceptance(cfg)
    tr = load_trace(str(find_trace("fixture-synthetic")))
    rng = np.random.default_rng(4)
    flags = []
    for _ in range(200):
        st = model.new_response(rng, 300, 700, 9)
        assert (st.prompt_len, st.output_len) == (300, 700)  # the workload's lengths, not the trace's
        assert len(st.accept) == 709 and not st.accept[700:].any()
        rows = st.rows[:700]
        assert (rows >= 0).all() and (st.rows[700:] == -1).all()
        assert (st.accept[:700] == tr.flag[rows]).all()  # every position replays a recorded row
        assert np.array_equal(st.features[:700], tr.features[rows])
        flags.append(st.accept[:700])
    allf = np.concatenate(flags)
    assert abs(allf.mean() - tr.flag.mean()) < 0.02


def test_predictor_decisions_precomputed_per_trace_equal_per_response() -> None:
    from wispsim.config import DraftingConfig, PredictorConfig
    from wispsim.model.acceptance import ResponseStream, TraceAcceptance
    from wispsim.model.drafting import PredictorController

    model = TraceAcceptance(AcceptanceConfig(model="trace", trace="fixture-synthetic", lengths="workload"))
    ctl = PredictorController(DraftingConfig(predictor=PredictorConfig(threshold=0.6)))
    rng = np.random.default_rng(0)
    for _ in range(20):
        st = model.new_response(rng, 100, 150, 10)
        # the features, gathered from the trace when read: its rows, then zeros for the padding
        assert st.rows is not None and (st.rows[150:] == -1).all() and (st.rows[:150] >= 0).all()
        assert np.array_equal(st.features[:150], model.trace.features[st.rows[:150]])
        assert not st.features[150:].any()
        fresh = ResponseStream(st.prompt_len, st.output_len, st.accept, st.features, st.run)
        assert ctl.prepare(st)[:150] == ctl.prepare(fresh)[:150]
