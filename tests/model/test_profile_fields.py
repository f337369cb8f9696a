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
