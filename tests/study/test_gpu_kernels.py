"""Kernel efficiencies per GPU generation: the shipped figures are what the fit on the shipped
kernel data gives, and they carry to a GPU (and a source) the fit never saw."""

from __future__ import annotations

import pytest
import yaml

from wispsim.paths import data_dir
from wispsim.study import gpu_kernels as gk


@pytest.fixture(scope="module")
def rows():  # type: ignore[no-untyped-def]
    return gk.layers()


def test_the_shipped_efficiencies_are_the_fit_of_the_shipped_data(rows) -> None:  # type: ignore[no-untyped-def]
    shipped = yaml.safe_load((data_dir() / "efficiency.yaml").read_text())
    for gen, d in rows.groupby("generation"):
        f = gk.fit(d)
        assert shipped[gen]["bandwidth"] == pytest.approx(f.bandwidth, abs=2e-3)
        assert shipped[gen]["compute"] == pytest.approx(f.compute, abs=2e-3)
        assert shipped[gen]["kernel_us"] == pytest.approx(f.kernel_us, abs=0.05)
        assert f.bandwidth <= 1 and f.compute <= 1  # no efficiency above what the data shows


def test_each_gpu_is_predicted_from_the_others_of_its_generation(rows) -> None:  # type: ignore[no-untyped-def]
    loo = gk.leave_one_gpu_out(rows).set_index("gpu")
    assert {"a100-80gb", "a40", "h100-80gb", "h200"} <= set(loo.index)
    assert (loo.held_out_median_ape_pct <= 10).all(), loo
    los = gk.leave_one_source_out(rows)
    assert (los.median_ape_pct <= 10).all(), los


def test_the_roofline_prices_a_decode_layer_as_a_cuda_graph_replays_it() -> None:
    """Held out (no fit saw these rows): one decoder layer at decode on the H200, eager and
    replayed from a CUDA graph; the roofline with the shipped Hopper figures is near the replay
    and well under the eager launches at batch 1, where the host's launches dominate."""
    from wispsim.study.gpu_kernels import layer_graph_check

    res = layer_graph_check()
    assert len(res) == 6
    assert (res.vs_graph_pct.abs() < 20).all()
    one = res[res.batch == 1]
    assert (one.roofline_us < 0.9 * one.eager_us).all()
