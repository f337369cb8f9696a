"""Training and exporting rejection predictors (SPEC 6), on the synthetic fixture trace.

Labels are checked exactly on hand-made accept sequences; splits never share a sample; every
exported model evaluated with NumPy alone reproduces its library's ``predict_proba``; and an
exported model drives the ``predictor`` drafting controller inside a short simulation. Models are
tiny (``fast=True``) so the module runs in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("xgboost")
pytest.importorskip("lightgbm")

from typer.testing import CliRunner

from wispsim.cli.predictor import predictor_app
from wispsim.config import PredictorConfig
from wispsim.errors import ConfigError, WispsimError
from wispsim.measure.predictor.evaluate import Trained, classification_metrics, operating_threshold, proba
from wispsim.measure.predictor.export import require_ml
from wispsim.measure.predictor.labels import label_trace, label_traces, split_groups, split_set, window_labels
from wispsim.measure.predictor.train import MODEL_KINDS, train
from wispsim.model.acceptance import FEATURES, find_trace, load_trace
from wispsim.model.predictor import NpzPredictor, load_exported, make_predictor
from wispsim.sim.scenarios import load_scenario, resolve_server
from wispsim.sim.simulation import simulate

FIXTURE = "fixture-synthetic"


# --------------------------------------------------------------------------------------------
# labels
# --------------------------------------------------------------------------------------------


def test_window_labels_by_hand() -> None:
    # K = 3. Windows: [0,1,2] rejects at 2 -> next starts at 3; [3,4,5] all accepted -> 6;
    # [6,7,(8)] rejects at 7 -> 8 is not verified in this window, the next window starts at 8;
    # [8,(9)] rejects at 8 -> 9; [9] accepted (end of sample).
    acc = np.array([1, 1, 0, 1, 1, 1, 1, 0, 0, 1], dtype=bool)
    pos, y, off = window_labels(acc, 3)
    assert pos.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert y.tolist() == [1, 1, 0, 1, 1, 1, 1, 0, 0, 1]
    assert off.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 0, 0]


def test_window_labels_k1_and_all_accepted() -> None:
    pos, y, off = window_labels(np.array([1, 0, 1], dtype=bool), 1)
    assert (pos.tolist(), y.tolist(), off.tolist()) == ([0, 1, 2], [1, 0, 1], [0, 0, 0])
    pos, y, off = window_labels(np.ones(5, dtype=bool), 2)
    assert (pos.tolist(), off.tolist()) == ([0, 1, 2, 3, 4], [0, 1, 0, 1, 0])
    assert window_labels(np.zeros(0, dtype=bool), 4)[0].tolist() == []


def test_window_labels_cover_each_position_once() -> None:
    # Because the next window starts right after the first rejection (the target commits its own
    # token there), positions "dropped" from one window are the start of the next: along the
    # committed text every position is verified exactly once, with its own accept flag.
    acc = np.random.default_rng(3).random(500) < 0.7
    for k in (1, 2, 5, 8):
        pos, y, off = window_labels(acc, k)
        assert pos.tolist() == list(range(500))
        assert np.array_equal(y, acc.astype(np.int8))
        assert off.max() < k
        # a window's first rejection ends it: after a 0 label the next offset is 0
        assert np.all(off[1:][y[:-1] == 0] == 0)


def test_label_trace_features_and_window_position() -> None:
    tr = load_trace(str(find_trace(FIXTURE)))
    data = label_trace(tr, k=8, label_from="accept", window_position=True)
    assert data.features == (*FEATURES, "window_position")
    assert np.array_equal(data.x[:, :4], tr.features[data.row])
    assert np.array_equal(data.x[:, 4], data.offset)
    assert np.array_equal(data.y, tr.flag[data.row])
    greedy = label_trace(tr, label_from="greedy")
    assert np.array_equal(greedy.y, tr.greedy[greedy.row])
    b1, b2 = label_trace(tr, label_from="beta", seed=1), label_trace(tr, label_from="beta", seed=1)
    assert np.array_equal(b1.y, b2.y)
    assert abs(b1.y.mean() - tr.beta.mean()) < 0.03
    with pytest.raises(WispsimError, match="label-from"):
        label_trace(tr, label_from="nope")


def test_split_is_by_sample() -> None:
    data, _ = label_traces([FIXTURE], 8, "accept", 0, False)
    test = split_groups(data.group, 0.2, seed=0)
    assert not set(data.group[test]) & set(data.group[~test])
    assert len(set(data.group[test])) == 8  # 20 % of 40 samples
    sp = split_set(data, seed=0)
    parts = [set(p.group) for p in (sp.fit, sp.val, sp.test)]
    assert not (parts[0] & parts[1]) and not (parts[0] & parts[2]) and not (parts[1] & parts[2])
    assert len(sp.fit.y) + len(sp.val.y) + len(sp.test.y) == len(data.y)
    assert not np.array_equal(split_groups(data.group, 0.2, seed=1), test)


# --------------------------------------------------------------------------------------------
# operating point and metrics
# --------------------------------------------------------------------------------------------


def test_operating_threshold_maximizes_rec1_under_fpr() -> None:
    p = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
    y = np.array([0, 0, 1, 0, 1, 0, 1, 1, 1, 1])
    # rejected scores 0.1, 0.2, 0.4, 0.6: FPR <= 0.25 allows one of them above the threshold
    thr = operating_threshold(p, y, 0.25)
    assert 0.4 < thr <= 0.5
    m = classification_metrics(y, p, thr)
    assert m["fpr"] == 0.25 and m["rec1"] == pytest.approx(5 / 6)  # 0.3 (accepted) is below
    assert operating_threshold(p, y, 0.0) > 0.6
    assert operating_threshold(p, y, 1.0) == 0.1


def test_metrics_by_hand() -> None:
    y = np.array([1, 1, 1, 0, 0])
    p = np.array([0.9, 0.8, 0.3, 0.7, 0.1])
    m = classification_metrics(y, p, 0.5)
    assert m["rec1"] == pytest.approx(2 / 3)
    assert m["specificity"] == 0.5 and m["fpr"] == 0.5
    assert m["accuracy"] == pytest.approx(3 / 5)
    assert m["balanced_accuracy"] == pytest.approx((2 / 3 + 0.5) / 2)
    assert m["confusion"] == [[0.5, 0.5], [pytest.approx(1 / 3), pytest.approx(2 / 3)]]
    assert m["auc"] == pytest.approx(5 / 6)


# --------------------------------------------------------------------------------------------
# export: NumPy reproduces the libraries
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> list[Trained]:
    out = tmp_path_factory.mktemp("predictors") / "fx.npz"
    results, _ = train([FIXTURE], list(MODEL_KINDS), out, fast=True)
    return results


def test_every_export_matches_its_library(trained: list[Trained]) -> None:
    tr = load_trace(str(find_trace(FIXTURE)))
    rng = np.random.default_rng(0)
    random_x = rng.uniform([0, 0, 0, 0], [1, 6, 1, 8], size=(3000, 4))
    assert {t.kind for t in trained} == set(MODEL_KINDS)
    for t in trained:
        assert t.npz is not None and t.npz.name == f"fx-{t.kind}.npz"
        exp = load_exported(str(t.npz))
        assert exp.kind == t.kind and exp.features == FEATURES and exp.k == 8
        assert exp.threshold == t.threshold
        for x in (random_x, tr.features):
            np.testing.assert_allclose(exp.proba(x), proba(t.model, x), rtol=0, atol=1e-6, err_msg=t.kind)
        p = proba(t.model, tr.features)
        decided = np.abs(p - exp.threshold) > 1e-6
        assert np.array_equal(exp.predict_accept(tr.features)[decided], (p >= exp.threshold)[decided])
        meta = exp.meta
        assert meta["metrics"]["n"] > 0 and meta["provenance"]["traces"][0]["metadata"]
        assert set(meta["provenance"]["versions"]) >= {"numpy", "scikit-learn", "xgboost", "lightgbm"}


def test_npz_predictor_in_a_short_simulation(trained: list[Trained]) -> None:
    npz = next(t.npz for t in trained if t.kind == "lightgbm")
    sc = load_scenario(
        overrides={
            "policy": "wisp",
            "devices": {"count": 6},
            "drafting": {"predictor": {"name": "npz", "path": str(npz)}},
            "acceptance": {"model": "trace", "trace": FIXTURE, "accept_from": "flag"},
            "workload": {"warmup_s": 2, "duration_s": 5},
        }
    )
    assert sc.drafting.controller == "predictor"
    res = simulate(resolve_server(sc))
    r = res.rounds
    assert len(r) > 50 and r.predictor_calls.sum() > 0
    assert (r.k <= sc.drafting.k_max).all() and (r.accepted <= r.k).all()
    assert (r.k < sc.drafting.k_max).any()  # the predictor stopped some windows early
    again = simulate(resolve_server(sc))
    assert again.rounds.equals(r)


def test_npz_predictor_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs a path"):
        make_predictor(PredictorConfig(name="npz"))
    with pytest.raises(ConfigError, match="no predictor file"):
        make_predictor(PredictorConfig(name="npz", path=str(tmp_path / "missing.npz")))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(WispsimError, match="not a readable predictor"):
        make_predictor(PredictorConfig(name="npz", path=str(tmp_path / "junk.npz")))
    out = tmp_path / "pos.npz"
    train([FIXTURE], ["xgboost"], out, window_position=True, fast=True)
    assert load_exported(str(out)).features[-1] == "window_position"
    with pytest.raises(ConfigError, match="window-position"):
        NpzPredictor(PredictorConfig(name="npz", path=str(out)))


def test_missing_ml_extra_is_one_line() -> None:
    with pytest.raises(WispsimError, match=r"pip install 'wispsim\[ml\]'"):
        require_ml("wispsim_no_such_module")


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------


def test_cli_train_bench_eval(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "p" / "fx.npz"
    res = runner.invoke(
        predictor_app,
        ["train", "--trace", FIXTURE, "--model", "mlp,rf", "--out", str(out), "--fast", "--max-fpr", "0.2"],
    )
    assert res.exit_code == 0, res.output
    assert "held-out test metrics" in res.output
    for name in ("fx-mlp.npz", "fx-rf.npz", "fx-mlp.native.joblib", "fx.report.json", "fx.report.md"):
        assert (out.parent / name).is_file(), name
    report = json.loads((out.parent / "fx.report.json").read_text())
    assert set(report["models"]) == {"mlp", "rf"} and report["max_fpr"] == 0.2
    assert "SYNTHETIC" in (out.parent / "fx.report.md").read_text()

    csv = tmp_path / "bench.csv"
    res = runner.invoke(
        predictor_app,
        ["bench", "--predictor", str(out.parent / "fx-rf.npz"), "--calls", "20", "--out", str(csv)],
    )
    assert res.exit_code == 0, res.output
    assert csv.read_text().count("fx-rf.npz") == 2  # numpy and native

    res = runner.invoke(
        predictor_app,
        ["eval", "--train", FIXTURE, "--test", FIXTURE, "--model", "lightgbm", "--fast", "--out", str(csv)],
    )
    assert res.exit_code == 0, res.output
    assert "fixture-synthetic (held out)" in csv.read_text()

    res = runner.invoke(predictor_app, ["train", "--trace", FIXTURE, "--model", "svm", "--out", str(out)])
    assert isinstance(res.exception, ConfigError) and "allowed: mlp" in str(res.exception)


def test_param_goes_to_the_models_that_take_it_and_is_checked_before_any_work() -> None:
    from wispsim.measure.predictor.train import own_params

    own = own_params(["mlp", "rf"], 0, True, {"max_depth": 6})  # the help's example, --model all
    assert own == {"mlp": {}, "rf": {"max_depth": 6}}
    with pytest.raises(WispsimError, match="--param: max_dept: no model of mlp, rf takes it; allowed: "):
        own_params(["mlp", "rf"], 0, True, {"max_dept": 6})
    with pytest.raises(WispsimError, match="--param: max_iter=-5 not accepted by the mlp model"):
        own_params(["mlp"], 0, True, {"max_iter": -5})
