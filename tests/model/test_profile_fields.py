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


def test_a_measurement_table_that_contradicts_itself_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """latency_s in ms beside runs_s in s, an aggregate that is not its members' sum, a config
    twice: refused by name; a configuration the recording could not time is left out and counted."""
    from pathlib import Path

    import pandas as pd

    from wispsim.model.measured import read_measurements

    src = Path(__file__).parents[2] / "profiles" / "data" / "cpu-qwen2.5-0.5b.csv"
    base = pd.read_csv(src)
    f = tmp_path / "m.csv"
    oom = base.copy()
    oom.loc[3, "status"] = "OOM"
    oom.to_csv(f, index=False)
    assert read_measurements(f).attrs["not_timed"] == {"OOM": 1}
    for change, field in (
        (lambda d: d.assign(latency_s=d.latency_s * 1000), "latency_s"),
        (lambda d: d.assign(n_linear=d.n_linear * 10), "n_linear"),
        (lambda d: pd.concat([d, d.iloc[[0]]]), "config_id"),
    ):
        change(base).to_csv(f, index=False)
        with pytest.raises(ConfigError) as e:
            read_measurements(f)
        assert e.value.field == field
