"""Weight-only quantized GEMMs (issue 45 item 1, "quantized weights ... as bytes and dequantization
cost"): the kernel vLLM picks per GPU generation, its measured compute-bound ratio where it was
measured (MARLIN on Ampere and Ada), nothing where the weights have a tensor-core path of their own
or the kernel was not measured, and the profile saying which."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from wispsim.errors import ConfigError
from wispsim.model.archs import Arch, arch_from_dict, load_arch, load_gpu
from wispsim.model.physical import physical_profile
from wispsim.model.profiles import parse_profile
from wispsim.model.roofline import Roofline
from wispsim.model.startup import arch_startup
from wispsim.model.weight_only import INT8_RATE, Conversion, conversion, padded_experts, quantized_rate
from wispsim.paths import data_dir

AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}


def _w8a8(kind: str) -> dict[str, Any]:
    """A compressed-tensors W8A8 config (RedHat's FP8-dynamic / quantized.w8a8 layout): 8-bit
    ``kind`` ("float" or "int") weights and dynamic activations, the LM head left out."""
    eight = {"num_bits": 8, "type": kind}
    group = {"weights": eight, "input_activations": {**eight, "dynamic": True}, "targets": ["Linear"]}
    return {"quant_method": "compressed-tensors", "config_groups": {"g": group}, "ignore": ["lm_head"]}


FP8_W8A8, INT8_W8A8 = _w8a8("float"), _w8a8("int")


def _qwen(q: dict[str, Any] | None) -> Arch:
    data = yaml.safe_load((data_dir() / "archs" / "qwen3-32b.yaml").read_text())
    data = {k: v for k, v in data.items() if k not in ("name", "hf_name", "description", "source")}
    if q is not None:
        data["quantization_config"] = q
    return arch_from_dict(data, "config.json")


def _roofline(arch: Arch, gpu: str) -> Roofline:
    prof = parse_profile(physical_profile(arch, load_gpu(gpu), noise_sigma=0.0), "test")
    assert isinstance(prof.estimator, Roofline)
    return prof.estimator


def test_which_quantized_weights_are_converted_inside_the_gemm() -> None:
    assert not _qwen(AWQ).quant_act and _qwen(FP8_W8A8).quant_act
    assert load_arch("deepseek-v3").quant_act and not load_arch("gpt-oss-20b").quant_act
    marlin = Conversion("marlin", 0.9, True)
    cases = [
        (_qwen(AWQ), "a100-80gb", False, marlin),  # MARLIN, measured on Ampere
        (_qwen(AWQ), "l4", False, marlin),  # Ada runs the same mma.sync kernel
        (_qwen(AWQ), "h100-80gb", False, Conversion("machete", 1.0, True)),  # matches FP16
        (_qwen(AWQ), "b200", False, Conversion("marlin")),  # not measured on Blackwell
        (_qwen(FP8_W8A8), "h100-80gb", False, Conversion()),  # fp8 tensor cores
        (_qwen(None), "a100-80gb", False, Conversion()),
        (load_arch("deepseek-v3"), "a100-80gb", True, marlin),  # fp8 below Ada: FP8 Marlin
        (load_arch("deepseek-v3"), "h200", True, Conversion()),
        (load_arch("gpt-oss-20b"), "a100-80gb", True, marlin),  # mxfp4 below Hopper: Marlin
        (load_arch("gpt-oss-20b"), "a100-80gb", False, Conversion()),  # its attention is bf16
        (load_arch("gpt-oss-20b"), "h100-80gb", True, Conversion("triton")),  # OpenAI's, not measured
        (load_arch("gpt-oss-20b"), "b200", True, Conversion()),  # Blackwell's fp4 path
    ]
    for arch, gpu, experts, want in cases:
        assert conversion(arch, load_gpu(gpu), experts) == want, (arch.name, gpu, experts)


def test_a_conversion_costs_compute_bound_passes_only() -> None:
    """AWQ Qwen3-32B on an A100: a long prefill's linear layers at 1 / 0.9 of the time the same
    bytes would take unconverted; a decode step, bound by reading the 4-bit weights, barely moves."""
    awq = _roofline(_qwen(AWQ), "a100-80gb")
    assert awq.dequant_eff == pytest.approx(0.9) and awq.expert_dequant_eff == 1.0
    free = dataclasses.replace(awq, dequant_eff=1.0)
    head = awq.head_flops / (awq.peak_flops * awq.compute_eff)
    assert (awq._token_s - head) == pytest.approx((free._token_s - head) / 0.9, rel=1e-12)
    assert awq._head_s == pytest.approx(free._head_s)  # the LM head stays bf16 (AWQ keeps it)
    long, one = (8192, 8192 * 1024, 0, 8, 8, 8), (8, 8 * 1024, 8 * 1024, 8, 0, 8)
    assert awq.batch(*long) / free.batch(*long) > 1.05
    assert awq.batch(*one) / free.batch(*one) == pytest.approx(1.0, abs=0.01)
    assert awq.batch(*long) >= awq.floor(8192, 8192 * 1024, 0, 8)  # physics still holds
    h100 = _roofline(_qwen(AWQ), "h100-80gb")
    assert h100.dequant_eff == 1.0  # Machete: as fast as FP16 compute-bound


def test_experts_convert_where_vllm_runs_marlin() -> None:
    oss = _roofline(load_arch("gpt-oss-20b"), "a100-80gb")
    assert oss.expert_dequant_eff == pytest.approx(0.9) and oss.dequant_eff == 1.0
    free = dataclasses.replace(oss, expert_dequant_eff=1.0)
    assert oss._xtoken_s == pytest.approx(free._xtoken_s / 0.9)
    assert oss.routed_experts(8192) > free.routed_experts(8192) * 1.05
    assert oss._token_s == pytest.approx(free._token_s)  # attention projections stay bf16
    # a mixture still reads its non-routed weights apart from the experts it reaches
    assert oss._weights_s == 0.0 and oss._dense_w_s > 0.0


def test_the_profile_says_which_kernel_and_whether_it_was_measured() -> None:
    a100 = physical_profile(load_arch("gpt-oss-20b"), load_gpu("a100-80gb"))
    assert a100["roofline"]["efficiency"]["expert_dequant"] == pytest.approx(0.9)
    assert (
        "weight-only experts: marlin, compute-bound at 0.9 of a dense GEMM"
        in a100["roofline"]["kernel_basis"]
    )
    h100 = physical_profile(load_arch("gpt-oss-20b"), load_gpu("h100-80gb"))
    assert "expert_dequant" not in h100["roofline"]["efficiency"]
    assert (
        "experts: triton, not measured on hopper (its conversion is not priced)"
        in h100["roofline"]["kernel_basis"]
    )
    plain = physical_profile(load_arch("qwen3-32b"), load_gpu("a100-80gb"))
    assert "weight-only" not in plain["roofline"]["kernel_basis"]
    bad = dict(
        a100, roofline={**a100["roofline"], "efficiency": {**a100["roofline"]["efficiency"], "dequant": 2}}
    )
    with pytest.raises(ConfigError, match=r"roofline\.efficiency\.dequant"):
        parse_profile(bad, "p.yaml")


def test_w8a8_layers_multiply_on_their_own_tensor_cores() -> None:
    """An fp8 W8A8 checkpoint on an H100 runs its linear layers at the fp8 peak, twice the bf16
    one; below Ada FP8 Marlin converts it instead; int8 W8A8 runs at twice the 16-bit rate on
    every generation; weight-only formats and an fp8 profile are not sped up."""
    fp8, int8, awq = _qwen(FP8_W8A8), _qwen(INT8_W8A8), _qwen(AWQ)
    assert fp8.quant_float and not int8.quant_float and not awq.quant_float
    h100, a100 = load_gpu("h100-80gb"), load_gpu("a100-80gb")
    assert quantized_rate(fp8, h100.bf16_tflops, h100.fp8_tflops) == pytest.approx(1979 / 989)
    assert quantized_rate(fp8, a100.bf16_tflops, a100.fp8_tflops) == 1.0
    assert conversion(fp8, a100) == Conversion("marlin", 0.9, True)
    assert quantized_rate(int8, a100.bf16_tflops, None) == INT8_RATE
    assert conversion(int8, a100) == Conversion()
    assert quantized_rate(awq, h100.bf16_tflops, h100.fp8_tflops) == 1.0
    roof = _roofline(fp8, "h100-80gb")
    # by the profile's bytes, not the spelling of its precision; an fp8 profile is at the fp8 peak
    mapping = physical_profile(fp8, h100, noise_sigma=0.0)
    spelled = parse_profile({**mapping, "precision": "bfloat16"}, "test").estimator
    assert isinstance(spelled, Roofline) and spelled.quant_rate == roof.quant_rate > 1.0
    with pytest.raises(ConfigError, match="quantized with compressed-tensors already"):
        physical_profile(fp8, h100, precision="fp8")  # vLLM quantizes a 16-bit checkpoint only
    plain = dataclasses.replace(roof, quant_rate=1.0)
    head = roof.head_flops / (roof.peak_flops * roof.compute_eff)  # the LM head stays bf16
    assert roof._token_s - head == pytest.approx((plain._token_s - head) * 989 / 1979, rel=1e-9)
    long = (8192, 8192 * 1024, 0, 8, 8, 8)
    assert roof.batch(*long) < 0.75 * plain.batch(*long)
    # the floor counts those FLOPs at the fp8 peak, and no pass costs less than it
    for n in (1, 64, 512, 8192):
        assert roof.batch(n, n * 1024, 0, 1, 0, 1) >= roof.floor(n, n * 1024, 0, 1)
    assert roof.floor(*long[:3], 8) < plain.floor(*long[:3], 8)


def test_no_gemm_beats_the_cards_max_achievable_flops(tmp_path: Any) -> None:
    """Where a vendor publishes max-achievable FLOPs (the best GEMM at the clock the card holds
    under it: the MI300X's 708 of 1,307 bf16 TFLOPs), the generation's compute figures are capped
    at that share; a card without one keeps them; the field is checked like the others."""
    mi = physical_profile(load_arch("llama-3.1-70b"), load_gpu("mi300x"))
    eff = mi["roofline"]["efficiency"]
    assert eff["compute"] == pytest.approx(708 / 1307.4, rel=1e-5)
    assert eff["attention"] <= eff["compute"]
    assert "max-achievable 708 of 1307.4 TFLOPs" in mi["roofline"]["kernel_basis"]
    fp8 = parse_profile(
        physical_profile(load_arch("llama-3.1-70b"), load_gpu("mi300x"), precision="fp8"), "t"
    )
    roof = fp8.estimator  # its fp8 linear layers at most the fp8 max-achievable 1,273 TFLOPs too
    assert isinstance(roof, Roofline) and roof.compute_eff == pytest.approx(708 / 1307.4, rel=1e-5)
    assert roof.compute_eff * roof.quant_rate * roof.peak_flops == pytest.approx(1273e12, rel=1e-5)
    h100 = physical_profile(load_arch("llama-3.1-70b"), load_gpu("h100-80gb"), count=2)
    assert h100["roofline"]["efficiency"]["compute"] == pytest.approx(0.7185)
    entry = {"name": "Mine", "memory_gib": 44, "hbm_bandwidth_gbs": 900, "bf16_tflops": 360}
    entry |= {"generation": "ada", "interconnect": "pcie4", "bf16_maf_tflops": -1}
    p = tmp_path / "cards.yaml"
    p.write_text(yaml.safe_dump({"mine": entry}))
    with pytest.raises(ConfigError) as err:
        load_gpu(str(p))
    assert err.value.field == "mine.bf16_maf_tflops" and "allowed: a positive number" in err.value.problem


def test_mxfp4_experts_are_stored_padded_to_the_kernels_tiles() -> None:
    """vLLM pads mxfp4 experts to its MoE kernel's tiles when it creates them
    (``mxfp4_round_up_hidden_size_and_intermediate_size``): Marlin (Ampere, Ada) rounds the hidden
    size to 256 and each GPU's share of the width to 128; OpenAI's Triton kernels on Hopper the share
    to 64; ROCm both to 256. gpt-oss-120b (hidden and width 2,880) on one A100 stores 3,072 x 2,944
    experts, ~5 GiB more than its checkpoint; on one H100 nothing; on four H100s 720 -> 768 a GPU."""
    oss = load_arch("gpt-oss-120b")
    a100 = padded_experts(oss, "ampere", 1)
    assert (a100.expert_hidden_pad, a100.expert_width_pad) == (3072, 2944)
    assert padded_experts(oss, "hopper", 1) is oss
    h4 = padded_experts(oss, "hopper", 4)
    assert (h4.expert_hidden_pad, h4.expert_width_pad) == (0, 4 * 768)
    assert padded_experts(oss, "cdna3", 1).expert_width == 3072
    a100x2 = padded_experts(oss, "ampere", 2)  # each GPU's share: 1,440 -> 1,536
    assert (a100x2.expert_hidden_pad, a100x2.expert_width) == (3072, 2 * 1536)
    # consumer Blackwell runs Marlin, datacenter Blackwell TRT-LLM: the same tiles in 0.32
    assert padded_experts(oss, "blackwell", 8).expert_width == 8 * 384
    assert padded_experts(a100, "ampere", 1) == a100  # idempotent
    # padded again for another GPU: from the checkpoint's shapes, not the padded ones
    assert padded_experts(a100, "hopper", 1) == oss and padded_experts(h4, "hopper", 1) == oss
    assert padded_experts(h4, "ampere", 1) == a100
    # other mxfp4 mixtures take vLLM's other MXFP4 method: Marlin on Hopper, AITER (SiLU) on ROCm
    other = dataclasses.replace(oss, model_type="other_moe")
    assert padded_experts(other, "hopper", 1).expert_hidden_pad == 3072
    assert padded_experts(other, "cdna3", 1).expert_width == 2944
    # the bytes: only the routed experts grow, by the padded over the checkpoint's area
    extra = a100.weight_bytes(2) - oss.weight_bytes(2)
    routed = oss.moe_layers * oss.experts * oss.expert_params * oss.quant_bits / 8
    assert extra == pytest.approx(routed * (3072 * 2944 / 2880**2 - 1), rel=0.01)
    assert 4.5 < extra / 2**30 < 5.5
    # what vLLM logged loading gpt-oss-120b on Marlin ("Model loading took 65.9651 GiB": vLLM issue
    # 23278, 0.10.1 on one H100 without OpenAI's Triton kernels; 65.9650 GiB in ovg-project/kvcached
    # issue 187): the padded experts within 0.2%, the checkpoint's shapes 8% short
    assert a100.weight_bytes(2) / 2**30 == pytest.approx(65.965, rel=0.002)
    assert oss.weight_bytes(2) / 2**30 < 0.93 * 65.965
    # a pass reads the padded experts it routes to, and multiplies them
    assert a100.routed_bytes_read(1, 2) > oss.routed_bytes_read(1, 2)
    assert a100.linear_flops_per_token > oss.linear_flops_per_token
    # other formats keep the checkpoint's shapes
    for name in ("qwen3-30b-a3b", "mixtral-8x7b", "qwen3-32b"):
        assert padded_experts(load_arch(name), "ampere", 1) is load_arch(name)


def test_a_profile_prices_and_holds_the_padded_experts() -> None:
    """physical_profile writes the padded weights (and says so in kernel_basis); the roofline
    parsed back prices them (and the memory model holds ``model.weight_bytes``); on one H100 the
    Triton kernels take the checkpoint's shapes."""
    oss = load_arch("gpt-oss-120b")
    a100, h100 = load_gpu("a100-80gb"), load_gpu("h100-80gb")
    data = physical_profile(oss, a100)
    assert data["model"]["weight_bytes"] == padded_experts(oss, "ampere", 1).weight_bytes(2)
    assert "hidden 2,880 -> 3,072, width 2,880 -> 2,944" in data["roofline"]["kernel_basis"]
    prof = parse_profile(data, "p")
    assert isinstance(prof.estimator, Roofline) and prof.estimator.arch.expert_hidden_pad == 3072
    plain = physical_profile(oss, h100)
    assert plain["model"]["weight_bytes"] == oss.weight_bytes(2)
    assert "padded" not in plain["roofline"]["kernel_basis"]
    # the start-up profile's MoE transients are as wide as the stored experts
    assert arch_startup(prof.estimator.arch, 1, 256, 8192).forward > arch_startup(oss, 1, 256, 8192).forward
    # a profile's generation picks the tiles: a wrong one, or none for mxfp4 experts, is refused
    for gen, problem in (("Hopper", "got 'Hopper'; allowed: ampere"), (None, "is missing")):
        hw = {k: v for k, v in data["hardware"].items() if k not in ("generation", "gpu_key")}
        bad = {**data, "hardware": {**hw, **({"generation": gen} if gen else {})}}
        with pytest.raises(ConfigError) as err:
            parse_profile(bad, "p.yaml")
        assert err.value.field == "hardware.generation" and problem in err.value.problem
    # an older profile without a generation takes its gpu_key's
    older = {**data, "hardware": {k: v for k, v in data["hardware"].items() if k != "generation"}}
    assert parse_profile(older, "p").estimator.arch == prof.estimator.arch


def test_the_weights_must_fit_as_they_are_stored() -> None:
    """gpt-oss-120b on two A100-40GBs: 30.4 GiB a GPU as the checkpoint stores it would fit under
    34 GiB; as Marlin stores it, 34.3 GiB does not, and the refusal names the size that fits."""
    oss, a40 = load_arch("gpt-oss-120b"), load_gpu("a100-40gb")
    with pytest.raises(ConfigError) as err:
        physical_profile(oss, a40, count=2)
    assert "use --tensor-parallel-size >= 4" in err.value.problem
    assert physical_profile(oss, a40, count=4)["hardware"]["count"] == 4


def test_a_profile_without_the_roofline_form_holds_its_experts_as_stored() -> None:
    """The start-up memory of a profile that names its architecture but prices with another form
    (a measured or derived profile) reads the experts as its GPU's kernel stores them."""
    from wispsim.model.startup import profile_startup

    oss = load_arch("gpt-oss-120b")
    prof = parse_profile(physical_profile(oss, load_gpu("a100-80gb")), "p")
    other = dataclasses.replace(prof, forms={})
    assert profile_startup(other, 256, 8192) == profile_startup(prof, 256, 8192)
    unknown = dataclasses.replace(other, generation=None)
    assert profile_startup(unknown, 256, 8192).forward < profile_startup(other, 256, 8192).forward


def test_an_fp8_profile_is_vllms_online_fp8_of_the_16_bit_checkpoint() -> None:
    """``--dtype fp8`` / a profile at precision fp8 is ``vllm serve --quantization fp8``: the linear
    layers at 8 bits and on fp8 tensor cores, the embeddings, LM head and norms 16-bit (Qwen3-32B: 1.56 GB
    more than every weight at 8 bits), the same as ``-q fp8``; refused for a quantized checkpoint."""
    from wispsim.runs.bench_profile import physical_of

    arch, h100 = load_arch("qwen3-32b"), load_gpu("h100-80gb")
    prof = physical_profile(arch, h100, precision="fp8")
    head_and_embeddings = 2 * arch.vocab_size * arch.hidden_size
    # (and the norms, 0.7M weights)
    assert prof["model"]["weight_bytes"] == pytest.approx(arch.parameters + head_and_embeddings, rel=1e-4)
    assert prof["precision"] == "fp8" and "fp8 linear layers, the rest bf16" in prof["description"]
    q = physical_of("qwen3-32b", "h100-80gb", 1, "auto", quantization="fp8")
    assert q["model"]["weight_bytes"] == prof["model"]["weight_bytes"]
    roof = parse_profile(prof, "t").estimator
    assert isinstance(roof, Roofline) and roof.quant_rate == pytest.approx(1979 / 989)
    with pytest.raises(ConfigError, match="--dtype: precision: fp8: gpt-oss-20b's checkpoint is quantized"):
        physical_of("gpt-oss-20b", "h100-80gb", 1, "fp8")
