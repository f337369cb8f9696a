"""A profile's sections hold only the fields the package reads: a typo is refused by name, never
read as an absent field (``noise: {sigm: 0.1}`` had turned the noise off)."""

from __future__ import annotations

import pytest

from wispsim.errors import ConfigError
from wispsim.model.archs import load_arch, load_gpu
from wispsim.model.physical import physical_profile
from wispsim.model.profiles import parse_profile


def test_a_typo_in_a_profiles_hardware_model_or_noise_is_refused() -> None:
    data = physical_profile(load_arch("qwen3-32b"), load_gpu("h100-80gb"))
    parse_profile(data, "p.yaml")
    for sec, typo in (("noise", "sigm"), ("hardware", "bf16_tflop"), ("model", "layer")):
        bad = {**data, sec: {**(data.get(sec) or {}), typo: 1}}
        with pytest.raises(ConfigError, match=f"{sec}.{typo}: unknown field; allowed: "):
            parse_profile(bad, "p.yaml")


def test_derive_refuses_the_other_forms_options_and_records_its_own(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from tests.support import run_wispsim as wispsim

    out = str(tmp_path / "d.yaml")
    r = wispsim(
        "profile", "derive", "--source", "a100-qwen3-32b-paper", "--arch", "llama-3.1-70b", "--out", out
    )
    assert r.returncode == 2 and "--source: source: is --form additive's" in r.stderr
    r = wispsim(
        "profile", "derive", "--form", "additive", "--kv-dtype", "fp8", "--arch", "qwen3-14b", "--out", out
    )
    assert r.returncode == 2 and "is --form roofline's" in r.stderr
    args = ["profile", "derive", "--form", "additive", "--arch", "qwen3-14b", "--out", out]
    assert wispsim(*args).returncode == 0
    command = yaml.safe_load((tmp_path / "d.yaml").read_text())["provenance"]["command"]
    assert command.startswith("wispsim profile derive --form additive")  # rerunning it gives the same form
