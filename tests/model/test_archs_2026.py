"""Architectures of 2026 from their config.json (issue 45 item 1): mixtures of experts with shared
experts and dense layers, multi-head latent attention, sliding windows, quantized weights, the
architectures that are refused by name, and vLLM's tensor-parallel and fit checks."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from wispsim.errors import ConfigError
from wispsim.model.arch_config import QUANT_METHODS
from wispsim.model.archs import arch_from_dict, check_parallel, find_arch, load_arch, load_gpu, parallel_sizes
from wispsim.model.batch import Window
from wispsim.model.physical import physical_profile
from wispsim.model.profiles import parse_profile
from wispsim.model.roofline import Roofline
from wispsim.model.weight_only import padded_experts

# published totals and active parameters per token (billions); OpenAI counts active parameters
# without the embedding (its model card: 116.83B / 5.13B and 20.91B / 3.61B)
PUBLISHED = [
    ("qwen3-30b-a3b", 30.5, 3.3, True),  # Qwen3 technical report, model card
    ("qwen3-235b-a22b", 235.0, 22.0, True),
    ("mixtral-8x7b", 46.7, 12.9, True),  # Mistral's announcement
    ("deepseek-v3", 671.0, 37.0, True),  # DeepSeek-V3 technical report (MTP module excluded)
    ("gpt-oss-120b", 116.83, 5.13, False),  # gpt-oss model card, table 1
    ("gpt-oss-20b", 20.91, 3.61, False),
]


@pytest.mark.parametrize(("name", "total", "active", "with_embedding"), PUBLISHED)
def test_parameters_match_the_published_totals(
    name: str, total: float, active: float, with_embedding: bool
) -> None:
    a = load_arch(name)
    counted = a.active_parameters - (0 if with_embedding else a.vocab_size * a.hidden_size)
    assert a.parameters / 1e9 == pytest.approx(total, rel=0.02)
    assert counted / 1e9 == pytest.approx(active, rel=0.02)
    assert a.hf_name in a.source and a.source.startswith("https://huggingface.co/")


def _config(name: str, **change: Any) -> dict[str, Any]:
    """A shipped architecture's values as the full config.json gives them (lists, nested maps,
    keys the model does not use), with ``change`` applied (None deletes a key)."""
    data = {k: v for k, v in _shipped(name).items() if k not in ("name", "hf_name", "description", "source")}
    data |= {"architectures": ["SomethingForCausalLM"], "torch_dtype": "bfloat16", "use_cache": True}
    for k, v in change.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    return data


def _shipped(name: str) -> dict[str, Any]:
    from wispsim.paths import data_dir

    data: dict[str, Any] = yaml.safe_load((data_dir() / "archs" / f"{name}.yaml").read_text())
    return data


def test_a_qwen3_moe_config_is_a_mixture_not_a_small_dense_model() -> None:
    a = arch_from_dict(_config("qwen3-30b-a3b"), "config.json")
    assert (a.experts, a.experts_per_token, a.moe_layers, a.dense_layers) == (128, 8, 48, 0)
    assert a.weight_bytes(2) / 1e9 == pytest.approx(61.1, rel=0.01)  # not 6.7 GB
    assert a.parameters == load_arch("qwen3-30b-a3b").parameters
    # dense layers: mlp_only_layers, and decoder_sparse_step (every 2nd layer sparse)
    b = arch_from_dict(_config("qwen3-30b-a3b", mlp_only_layers=[0, 1]), "config.json")
    assert (b.moe_layers, b.dense_layers) == (46, 2)
    assert b.parameters - a.parameters == 2 * 3 * 2048 * (6144 - 128 * 768) - 2 * 2048 * 128
    c = arch_from_dict(_config("qwen3-30b-a3b", decoder_sparse_step=2), "config.json")
    assert c.moe_layers == 24


def test_shared_experts_are_always_read() -> None:
    """Qwen1.5-MoE-A2.7B (Qwen2-MoE: a shared expert of its own width and a gate): 14.3B in all,
    2.7B activated (its model card). DeepSeek's shared experts are n_shared_experts experts."""
    cfg = {
        "model_type": "qwen2_moe",
        "hidden_size": 2048,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "intermediate_size": 5632,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "vocab_size": 151936,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }
    a = arch_from_dict(cfg, "config.json")
    assert a.parameters / 1e9 == pytest.approx(14.3, rel=0.01)
    assert a.active_parameters / 1e9 == pytest.approx(2.7, rel=0.02)
    solo = arch_from_dict({**cfg, "shared_expert_intermediate_size": 0}, "config.json")
    shared = 24 * (3 * 2048 * 5632 + 2048)
    assert a.matmul_weights_read(1) - solo.matmul_weights_read(1) == pytest.approx(shared)
    ds = load_arch("deepseek-v3")
    assert (ds.shared_intermediate_size, ds.moe_layers, ds.dense_layers) == (2048, 58, 3)


def test_a_pass_reads_the_experts_its_tokens_route_to() -> None:
    a = load_arch("qwen3-30b-a3b")
    one, many = a.matmul_weights_read(1), a.matmul_weights_read(10_000)
    assert one == pytest.approx(a.matmul_params_per_token())
    body, routed, rest = a._weights(a.experts)
    assert many == pytest.approx(body + routed + rest)
    e, k = 128, 8
    touched = e * (1 - (1 - k / e) ** 16)
    assert a.matmul_weights_read(16) - one == pytest.approx(48 * (touched - k) * a.expert_params)


def test_latent_attention_caches_the_compressed_latent() -> None:
    """DeepSeek-V3: 61 layers x (512 + 64) x 2 bytes per token, on every GPU; attention FLOPs in
    vLLM's absorbed decode form."""
    a = load_arch("deepseek-v3")
    assert a.kv_bytes_per_token(2) == 61 * 576 * 2 == 70272
    assert a.kv_bytes_per_gpu(2, 8) == 70272  # the latent is not split over GPUs
    assert a.attention_flops_per_interaction == 2 * 61 * 128 * (2 * 512 + 64)
    mla = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    assert a._attention_matmul() == mla
    facts = a.model_facts("bf16", tp=8)  # what the memory model multiplies out: all 8 GPUs' KV
    assert 2 * facts["layers"] * facts["kv_heads"] * facts["head_dim"] * 2 == 8 * 70272
    r = _roofline("deepseek-v3", "h200", 8)
    assert r.kv_bytes == 70272


def test_kv_heads_replicated_over_more_gpus_than_there_are() -> None:
    a = load_arch("qwen3-235b-a22b")  # 4 KV heads
    assert a.kv_bytes_per_gpu(2, 4) == a.kv_bytes_per_token(2) // 4
    assert a.kv_bytes_per_gpu(2, 8) == a.kv_bytes_per_token(2) // 4  # one head on each of 8 GPUs
    facts = a.model_facts("bf16", tp=8)
    assert facts["kv_heads"] == 8 and facts["head_dim"] == 128


def test_sliding_windows_from_each_spelling() -> None:
    a = load_arch("gpt-oss-120b")
    assert (a.sliding_window, a.windowed_layers) == (128, 18)
    per = a.kv_bytes_per_token(2)
    assert per == 2 * 36 * 8 * 64 * 2
    w = Window(a.sliding_window, a.layers, a.windowed_layers)
    assert w.cached(100) == 100  # within the window every layer holds every token
    assert w.cached(4096) == (18 * 4096 + 18 * 128) / 36
    dense = {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "sliding_window": 4096,
    }
    on = arch_from_dict({**dense, "use_sliding_window": True, "max_window_layers": 20}, "c.json")
    assert (on.sliding_window, on.windowed_layers) == (4096, 8)
    off = arch_from_dict({**dense, "use_sliding_window": False, "max_window_layers": 20}, "c.json")
    assert off.windowed_layers == 0
    mistral = arch_from_dict({**dense, "model_type": "mistral"}, "c.json")  # Mistral-7B-v0.1: all
    assert mistral.windowed_layers == 28
    gemma = arch_from_dict({**dense, "sliding_window_pattern": 7}, "c.json")
    assert gemma.windowed_layers == 24
    wide = arch_from_dict({**dense, "model_type": "mistral", "sliding_window": 262144}, "c.json")
    assert wide.windowed_layers == 0  # a window past the longest context
    with pytest.raises(ConfigError, match=r"layer_types: a layer of type 'linear_attention' is not modelled"):
        arch_from_dict({**dense, "layer_types": ["linear_attention"] * 28}, "c.json")


def test_quantized_weights_are_priced_at_their_bits() -> None:
    oss = load_arch("gpt-oss-120b")
    _, routed, _ = oss._weights(oss.experts)
    assert oss.weight_bytes(2) == pytest.approx(routed * 4.25 / 8 + (oss.parameters - routed) * 2, rel=1e-9)
    assert oss.weight_bytes(2) / 1e9 == pytest.approx(65.2, rel=0.01)  # the checkpoint: ~65 GB
    assert load_arch("gpt-oss-20b").weight_bytes(2) / 1e9 == pytest.approx(13.8, rel=0.02)
    ds = load_arch("deepseek-v3")
    head = ds.vocab_size * ds.hidden_size
    assert ds.weight_bytes(2) == pytest.approx(ds.parameters + 2 * head, rel=0.003)  # fp8, bf16 ends
    base = _config("qwen3-32b")
    plain = arch_from_dict(base, "c.json")
    body, routed, rest = plain._weights(1)
    for q, bits in (
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, 4 + 20 / 128),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True}, 4 + 16 / 128),
        ({"quant_method": "gptq", "bits": 8, "group_size": -1, "sym": True}, 8.0),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {"weights": {"num_bits": 8, "type": "float"}, "targets": ["Linear"]}
                },
                "ignore": ["lm_head"],
            },
            8.0,
        ),
    ):
        a = arch_from_dict({**base, "quantization_config": q}, "c.json")
        assert a.quant_bits == pytest.approx(bits)
        expect = body * bits / 8 + (plain.parameters - body) * 2
        assert a.weight_bytes(2) == pytest.approx(expect, rel=1e-9)
        assert a.matmul_bytes_read(1, 2) == pytest.approx(body * bits / 8 + (routed + rest) * 2)
    with pytest.raises(ConfigError) as err:
        arch_from_dict({**base, "quantization_config": {"quant_method": "bitsandbytes"}}, "c.json")
    assert "quant_method: 'bitsandbytes' is not modelled; known: " + ", ".join(QUANT_METHODS) in str(
        err.value
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"model_type": "mamba", "num_attention_heads": None},
            "config.json: model_type: mamba (a state-space model has no KV cache) is not modelled; "
            "modelled: decoder-only transformers (dense, MoE, MLA, sliding window)",
        ),
        (
            {"model_type": "jamba", "layers_block_type": ["mamba", "attention"]},
            "config.json: model_type: jamba",
        ),
        ({"model_type": "x", "hybrid_override_pattern": "M-M*"}, "config.json: hybrid_override_pattern: "),
        ({"model_type": "rwkv"}, "a recurrent model has no KV cache"),
        ({"model_type": "t5"}, "an encoder-decoder model"),
        ({"model_type": "x", "is_encoder_decoder": True}, "config.json: is_encoder_decoder: "),
        ({"model_type": "bert"}, "an encoder-only model generates no tokens"),
    ],
)
def test_what_is_not_modelled_is_refused_by_name(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        arch_from_dict(_config("qwen3-32b", **change), "config.json")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_multimodal_wrappers_and_non_decoders_are_refused_by_name() -> None:
    """A vision-language model (its tower and image tokens) is refused naming its model_type, as
    are vision encoders and configs without a decoder's keys; its text_config alone is a decoder."""
    text = _config("qwen3-32b")
    wrapped = {"model_type": "llava", "text_config": text, "vision_config": {"hidden_size": 1024}}
    with pytest.raises(ConfigError, match=r"vision_config: model_type llava \(a vision-language model"):
        arch_from_dict(wrapped, "config.json")
    assert arch_from_dict(text, "config.json").parameters == load_arch("qwen3-32b").parameters
    for bad, says in (
        ({"model_type": "clip", "text_config": text}, "model_type: clip (a vision encoder"),
        ({"model_type": "gpt2", "n_embd": 768}, "hidden_size: is missing: model_type gpt2"),
        ({**text, "model_type": 5}, "model_type: must be a string"),
        ({**text, "tie_word_embeddings": "yes"}, "tie_word_embeddings: must be true or false"),
        ({**text, "max_position_embeddings": "128k"}, "max_position_embeddings: must be an integer"),
    ):
        with pytest.raises(ConfigError, match=re.escape(says)):
            arch_from_dict(bad, "config.json")


def test_vllms_quantization_and_node_checks_of_the_tensor_parallel_size() -> None:
    """Block-fp8 gate/up widths per GPU in whole blocks, grouped int4 inputs in whole groups (vLLM's
    start-up refusals: Qwen3-235B-A22B-FP8 at TP 8, 1,536 / 8 = 192), and no more GPUs than one
    node's domain of the interconnect; DeepSeek-V3's dense layers start a DeepSeek config beyond
    its layers refused; a config.json with a key twice is refused."""
    q = _config("qwen3-235b-a22b")
    block = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    fp8 = arch_from_dict({**q, "quantization_config": block}, "c")
    with pytest.raises(ConfigError, match="output_size of gate's and up's weight = 192 is not divisible"):
        check_parallel(fp8, 8)
    assert parallel_sizes(fp8) == [1, 2, 4]
    with pytest.raises(ConfigError, match=r"beyond one nvlink4 domain \(8 GPUs"):
        physical_profile(load_arch("llama-3.1-70b"), load_gpu("h100-80gb"), count=16)
    ds = {**_config("deepseek-v3"), "first_k_dense_replace": 100}
    with pytest.raises(ConfigError, match="first_k_dense_replace: must be <= num_hidden_layers"):
        arch_from_dict(ds, "c")


def test_a_config_json_with_a_key_twice_is_refused(tmp_path: Any) -> None:
    p = tmp_path / "config.json"
    p.write_text('{"model_type": "qwen3", "hidden_size": 5120, "hidden_size": 4096}')
    with pytest.raises(ConfigError, match="hidden_size: appears twice"):
        find_arch(str(p))


def test_vllms_tensor_parallel_checks() -> None:
    a = load_arch("qwen3-32b")  # 64 heads, 8 KV heads
    heads = r"Total number of attention heads \(64\) must be divisible by tensor parallel size \(3\)"
    with pytest.raises(ConfigError, match=heads + "; allowed for qwen3-32b: 1, 2, 4, 8, 16, 32, 64"):
        check_parallel(a, 3)
    check_parallel(a, 16)  # 8 KV heads replicated over 16 GPUs
    odd = arch_from_dict({**_config("qwen3-32b"), "num_attention_heads": 12, "num_key_value_heads": 3}, "c")
    with pytest.raises(ConfigError, match=r"Total number of KV heads \(3\) must be divisible"):
        check_parallel(odd, 4)
    oss = load_arch("gpt-oss-20b")  # 32 experts
    check_parallel(oss, 64)
    with pytest.raises(ConfigError, match=r"Number of experts \(32\) must be divisible"):
        check_parallel(oss, 64, expert_parallel=True)
    # MLA: no KV-head rule; its fp8 blocks of 128 end the list at 2,048 / 16 (vLLM: "The
    # output_size of gate's and up's weight = 64 is not divisible by weight quantization block_n")
    assert parallel_sizes(load_arch("deepseek-v3"))[-1] == 16
    with pytest.raises(ConfigError, match="tensor parallel size"):
        physical_profile(a, load_gpu("h100-80gb"), count=3)


def test_weights_that_do_not_fit_are_refused_with_the_size_that_fits() -> None:
    with pytest.raises(ConfigError) as err:
        physical_profile(load_arch("qwen3-235b-a22b"), load_gpu("h100-80gb"))
    text = str(err.value)
    assert "Qwen/Qwen3-235B-A22B needs 470 GB of weights (bf16); 1 x NVIDIA H100 80GB SXM holds 77 GB" in text
    assert text.endswith("use --tensor-parallel-size >= 8")
    with pytest.raises(ConfigError, match=r"\(fp8 linear layers, the rest bf16\).*>= 16$"):
        physical_profile(load_arch("deepseek-v3"), load_gpu("h100-80gb"), count=8)
    physical_profile(load_arch("deepseek-v3"), load_gpu("h200"), count=8)
    physical_profile(load_arch("gpt-oss-120b"), load_gpu("h100-80gb"))  # mxfp4: one H100 holds it


def _roofline(arch: str, gpu: str, count: int) -> Roofline:
    est = parse_profile(physical_profile(load_arch(arch), load_gpu(gpu), count=count), "test").estimator
    assert isinstance(est, Roofline)
    return est


def test_the_kv_cache_is_what_the_total_weights_leave() -> None:
    """Qwen3-30B-A3B on one H100: all 128 experts' 61 GB are resident; the KV cache gets the rest."""
    prof = parse_profile(physical_profile(load_arch("qwen3-30b-a3b"), load_gpu("h100-80gb")), "test")
    a = load_arch("qwen3-30b-a3b")
    assert prof.model.weight_bytes == a.weight_bytes(2)
    free = 79.22 * 2**30 * 0.9 - a.weight_bytes(2) - 1.5 * 2**30  # what torch sees of an H100 80GB
    assert prof.kv_capacity_tokens(0.9, 1.5) == int(free // a.kv_bytes_per_token(2))
    r = _roofline("qwen3-30b-a3b", "h100-80gb", 1)
    assert r.weight_bytes_read(1) == pytest.approx(a.matmul_params_per_token() * 2)  # a decode reads ~3B


def test_a_users_config_json_round_trips_through_its_profile(tmp_path: Path) -> None:
    """A config.json the package does not ship (nested quantization_config, layer_types list):
    its profile carries it, and parsing the profile gives the same weights."""
    cfg = {**_config("gpt-oss-20b"), "name": "my-oss"}
    a = arch_from_dict(cfg, "config.json")
    data = physical_profile(a, load_gpu("l40s"))
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(data))
    prof = parse_profile(yaml.safe_load(p.read_text()), str(p))
    assert isinstance(prof.estimator, Roofline)
    stored = padded_experts(a, "ada", 1)  # the L40S runs Marlin: its experts padded to Marlin's tiles
    assert stored != a and dataclasses.replace(prof.estimator.arch, source=a.source) == stored
    assert prof.model.weight_bytes == stored.weight_bytes(2)


def test_a_users_gpu_file_must_name_generation_and_interconnect(tmp_path: Path) -> None:
    entry = {"name": "Mine", "memory_gib": 44, "hbm_bandwidth_gbs": 900, "bf16_tflops": 360}
    for missing in ("generation", "interconnect"):
        full = {**entry, "generation": "ada", "interconnect": "pcie4"}
        del full[missing]
        p = tmp_path / "cards.yaml"
        p.write_text(yaml.safe_dump({"mine": full}))
        with pytest.raises(ConfigError) as err:
            load_gpu(str(p))
        assert err.value.field == f"mine.{missing}" and "is missing; allowed: " in err.value.problem
    from wispsim.paths import data_dir

    for key, d in yaml.safe_load((data_dir() / "gpus.yaml").read_text()).items():
        assert "generation" in d and "interconnect" in d, key
