"""GPUs of 2026 (wispsim/data/gpus.yaml), a user's own card (--gpu FILE), kernel efficiencies per
GPU generation (efficiency.yaml) and all-reduces priced by the interconnect they run over."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from wispsim.errors import ConfigError
from wispsim.model.archs import GENERATIONS, INTERCONNECTS, available_gpus, load_arch, load_gpu
from wispsim.model.interconnects import allreduce_ms
from wispsim.model.physical import generation_efficiency, physical_profile
from wispsim.model.profiles import parse_profile
from wispsim.paths import data_dir

ASKED = [
    "a100-40gb",
    "a100-80gb",
    "h100-pcie",
    "h100-80gb",
    "h100-nvl",
    "h100-94gb-sxm",
    "h200",
    "b200",
    "l4",
    "l40s",
    "rtx-pro-6000",
    "mi300x",
    "mi325x",
]


def test_every_gpu_planners_buy_is_listed_with_its_datasheet_and_interconnect() -> None:
    assert set(ASKED) <= set(available_gpus())
    for key in available_gpus():
        g = load_gpu(key)
        assert g.generation in GENERATIONS and g.interconnect in INTERCONNECTS
        assert g.link_gbs and g.link_gbs > 0 and len(g.source) > 40, key
        assert g.fp8_tflops is None or g.fp8_tflops >= g.bf16_tflops
    assert load_gpu("h100-pcie").interconnect == "pcie5" and load_gpu("l40s").interconnect == "pcie4"
    assert load_gpu("a100-80gb").interconnect == "nvlink3" and load_gpu("b200").interconnect == "nvlink5"


def test_a_generation_without_data_inherits_and_says_so() -> None:
    table = yaml.safe_load((data_dir() / "efficiency.yaml").read_text())
    for gen in GENERATIONS:
        e = generation_efficiency(gen)
        assert 0 < e["bandwidth"] <= 1 and 0 < e["compute"] <= 1 and 0 < e["attention"] <= 1
        if "inherits" in table[gen]:
            assert e["basis"].startswith(f"inherited from {table[gen]['inherits']}")
        else:
            assert "measured on" in e["basis"]
    assert generation_efficiency("ampere")["compute"] != generation_efficiency("hopper")["compute"]


def test_the_all_reduce_is_priced_by_its_interconnect() -> None:
    assert allreduce_ms("pcie4") > allreduce_ms("nvlink4")
    arch = load_arch("llama-3.1-70b")
    cost = {}
    for gpu in ("h100-80gb", "h100-pcie"):
        p = parse_profile(physical_profile(arch, load_gpu(gpu), count=4), gpu).estimator
        cost[gpu] = p.allreduce_time(256)  # type: ignore[attr-defined]
    assert cost["h100-pcie"] > 2 * cost["h100-80gb"]  # a PCIe-only card pays PCIe, not NVLink


def test_an_all_reduce_is_priced_by_its_message_size_and_gpu_count() -> None:
    """vLLM's own all-reduce takes a message up to its size limit (8 MB on an A100, 32 MB at four
    H100s), NCCL a larger one, at its fitted latency; either moves the ring's bytes at the fitted
    fraction of the link (Vidur's measurements: wispsim.study.allreduce_fit)."""
    arch = load_arch("llama-3.1-70b")
    per_token = arch.hidden_size * 2  # bf16 activations
    for gpu, fast_mb in (("a100-80gb", 8), ("h100-80gb", 32)):
        p = parse_profile(physical_profile(arch, load_gpu(gpu), count=4), gpu).estimator
        last = int(fast_mb * 2**20 / per_token)  # the largest pass the fast path takes
        jump = p.allreduce_time(last + 1) - p.allreduce_time(last)  # type: ignore[attr-defined]
        assert jump == pytest.approx(2 * 80 * (p.allreduce_nccl - p.allreduce) + p._ar_token_s, rel=1e-9)  # type: ignore[attr-defined]
        assert p.allreduce_nccl > 3 * p.allreduce  # type: ignore[attr-defined]
        assert 0.5 < p.link_eff < 1.0  # type: ignore[attr-defined]
        # the bytes: 2 x layers x 2 (n - 1) / n x a token's activations at the link's reach
        ring = 2 * 80 * per_token * 1.5 / (load_gpu(gpu).link_gbs * 1e9 * p.link_eff)  # type: ignore[attr-defined,operator]
        assert p._ar_token_s == pytest.approx(ring, rel=1e-9)  # type: ignore[attr-defined]
    one = parse_profile(physical_profile(arch, load_gpu("h100-80gb"), count=2), "h").estimator
    assert one.allreduce_fast_bytes == 64 * 2**20  # type: ignore[attr-defined]
    # vLLM's own all-reduce runs at 2, 4, 6 or 8 GPUs only: elsewhere every message takes NCCL
    from wispsim.model.interconnects import allreduce_facts

    assert allreduce_facts("nvlink4", 3)["allreduce_fast_mb"] == 0.0
    assert allreduce_facts("nvlink3", 6)["allreduce_fast_mb"] == 8.0
    # a kind with no measurement keeps one latency at any size, the link at its datasheet
    pcie = parse_profile(physical_profile(arch, load_gpu("h100-pcie"), count=4), "p").estimator
    assert pcie.allreduce_nccl is None and pcie.link_eff == 1.0  # type: ignore[attr-defined]


def test_the_all_reduce_fit_reads_vidurs_measurements() -> None:
    from wispsim.study.allreduce_fit import fit

    table = fit()
    assert set(table["interconnect"]) == {"nvlink3", "nvlink4"}
    assert set(table["gpus"]) == {2, 4, 8}
    assert (table["efficiency"].between(0.4, 1.0)).all() and (table["latency_us"] > 10).all()
    assert (table["max_error"] < 0.35).all()


def test_the_same_model_is_priced_by_each_generations_kernels() -> None:
    arch = load_arch("qwen3-32b")
    a100 = parse_profile(physical_profile(arch, load_gpu("a100-80gb")), "a").estimator
    h100 = parse_profile(physical_profile(arch, load_gpu("h100-80gb")), "h").estimator
    eff = {g: generation_efficiency(load_gpu(g).generation)["compute"] for g in ("a100-80gb", "h100-80gb")}
    # a 4,096-token prefill is compute-bound: the ratio of times is the ratio of achieved FLOP/s
    ratio = a100.batch(4096, 0, 0, 1, 1) / h100.batch(4096, 0, 0, 1, 1)
    expect = (989 * eff["h100-80gb"]) / (312 * eff["a100-80gb"])
    assert ratio == pytest.approx(expect, rel=0.15)


def _card(tmp_path: Path, **change: object) -> Path:
    entry = {
        "name": "Mine",
        "generation": "ada",
        "memory_gib": 44,
        "hbm_bandwidth_gbs": 900,
        "bf16_tflops": 360,
        "fp8_tflops": None,
        "interconnect": "pcie4",
        "link_gbs": 32,
    }
    entry.update(change)
    p = tmp_path / "cards.yaml"
    p.write_text(yaml.safe_dump({"mine": entry}))
    return p


def test_a_users_gpu_file_loads_and_its_errors_name_the_field(tmp_path: Path) -> None:
    g = load_gpu(str(_card(tmp_path)))
    assert (g.key, g.generation, g.interconnect) == ("mine", "ada", "pcie4")
    assert load_gpu(f"{_card(tmp_path)}:mine") == g
    for change, field in (
        ({"generation": "kepler"}, "mine.generation"),
        ({"interconnect": "nvlink9"}, "mine.interconnect"),
        ({"hbm_bandwidth_gbs": -1}, "mine.hbm_bandwidth_gbs"),
        ({"bf16_tflops": None}, "mine.bf16_tflops"),
        ({"warp_drive": 1}, "mine.warp_drive"),
    ):
        with pytest.raises(ConfigError) as err:
            load_gpu(str(_card(tmp_path, **change)))
        assert err.value.field == field and "\n" not in str(err.value)
    with pytest.raises(ConfigError):
        load_gpu(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError):
        load_gpu(f"{_card(tmp_path)}:other")
