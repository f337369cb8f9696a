"""vLLM's start-up memory profile (wispsim/model/startup.py): what the KV cache cannot use."""

from __future__ import annotations

import pytest

from wispsim.config.server import EngineConfig, ServerConfig
from wispsim.measure.profile.text import default_kv_line
from wispsim.model.archs import load_arch
from wispsim.model.memory import kv_capacity, reserve_gib
from wispsim.model.profiles import GIB, load_profile
from wispsim.model.startup import (
    NON_TORCH_GIB,
    SAMPLER_BYTES_PER_LOGIT,
    arch_startup,
    profile_startup,
)


def test_the_sampler_warm_up_holds_38_bytes_per_logit() -> None:
    """bf16 logits 2, fp32 copy 4, sorted values 4, int64 indices 8, reverse indices 8, CUB's
    alternate keys 4 and values 8."""
    assert SAMPLER_BYTES_PER_LOGIT == 38
    a = load_arch("qwen3-32b")
    m = arch_startup(a, 1, max_num_seqs=256, max_num_batched_tokens=2048)
    assert m.sampler == 256 * 151_936 * 38 + 2048 * 5120 * 2  # the forward's hidden states still held


def test_a_dense_forward_holds_the_residual_and_the_mlp() -> None:
    a = load_arch("qwen3-32b")  # hidden 5120, MLP 25600: the MLP's 3 x 25600 is wider than attention
    one = arch_startup(a, 1, 1, 8192)
    assert one.forward == 8192 * 2 * (2 * 5120 + 3 * 25600)
    two = arch_startup(a, 2, 1, 8192)
    assert two.forward == 8192 * 2 * (2 * 5120 + 3 * 25600 / 2)  # the MLP is split over the GPUs
    assert one.sampler == two.sampler  # every GPU holds the all-gathered logits
    assert one.reserve == max(one.forward, one.sampler) + NON_TORCH_GIB * GIB


def test_a_moe_forward_holds_the_fused_moe_caches() -> None:
    a = load_arch("qwen3-30b-a3b")  # 128 experts, 8 per token, expert width 768, no dense layer
    assert a.experts == 128 and a.experts_per_token == 8 and a.dense_layers == 0
    t = 4096
    m = arch_startup(a, 1, 1, t)
    width = a.moe_intermediate_size
    moe = t * 2 * (2 * a.hidden_size + 8 * (3 * width + a.hidden_size)) + t * 128 * 4
    attention = t * 2 * (2 * a.hidden_size + (2 * a.heads + 2 * a.kv_heads) * a.head_dim)
    assert m.forward == max(moe, attention)


def test_the_reserve_grows_with_max_num_seqs_and_is_honoured_where_set() -> None:
    prof = load_profile("h100-qwen3-32b")
    small = ServerConfig(profile="h100-qwen3-32b", engine=EngineConfig(max_num_seqs=64))
    large = ServerConfig(profile="h100-qwen3-32b", engine=EngineConfig(max_num_seqs=1024))
    assert reserve_gib(small, prof) < reserve_gib(large, prof)
    assert kv_capacity(small, prof) > kv_capacity(large, prof)
    gib = (reserve_gib(large, prof) - reserve_gib(small, prof)) * GIB
    assert kv_capacity(small, prof) - kv_capacity(large, prof) == pytest.approx(gib / 262_144, abs=2)
    fixed = ServerConfig(profile="h100-qwen3-32b", engine=EngineConfig(activation_reserve_gib=1.5))
    assert reserve_gib(fixed, prof) == 1.5
    assert kv_capacity(fixed, prof) == prof.kv_capacity_tokens(0.9, 1.5)


def test_a_profile_without_an_architecture_prices_its_model_facts() -> None:
    """A measured profile names its model's shape; where the architecture is not one the package
    reads, the dense formula runs on the profile's facts."""
    prof = load_profile("a100-qwen3-32b-paper")
    from dataclasses import replace

    bare = replace(prof, model=replace(prof.model, arch=None), forms={})
    assert profile_startup(bare, 256, 2048).reserve == pytest.approx(
        profile_startup(prof, 256, 2048).reserve, rel=1e-9
    )
    no_shape = replace(bare, model=replace(bare.model, hidden_size=None, intermediate_size=None))
    m = profile_startup(no_shape, 256, 2048)
    assert m.forward == 0 and m.sampler == 256 * 151_936 * 38


def test_the_kv_sizes_public_vllm_logs_report() -> None:
    """Every public deployment whose log gives its KV cache in bytes and tokens: wispsim's KV tokens
    within 10% of the logged (measured: +0.2% to +8.4%; the flat 1.5 GiB on 80 GiB gave +28.5% on
    Qwen3-32B at max_num_seqs 1,024)."""
    import pandas as pd

    from wispsim.study.public import memory_check

    m = memory_check("experiments/data/public")
    m = m[pd.notna(m["KV B/token/GPU logged"])]
    assert len(m) >= 7
    err = m["KV tokens wispsim"] / m["KV tokens logged"] - 1
    assert (err.abs() < 0.10).all(), m[["group", "KV tokens logged", "KV tokens wispsim"]]


def test_profile_show_says_the_default_kv_and_its_reserve() -> None:
    line = default_kv_line(load_profile("a100-qwen3-32b"))
    assert "max_num_seqs 256" in line and "35,285 tokens" in line and "sampler 1.40" in line
