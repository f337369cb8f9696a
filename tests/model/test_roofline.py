"""The physical cost model (wispsim.model.roofline): never below the hardware's floor, its parts
where physics puts them, and roofline profiles checked like every other profile."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from wispsim.errors import ConfigError
from wispsim.model.archs import available_archs, load_arch, load_gpu
from wispsim.model.physical import physical_profile
from wispsim.model.profiles import parse_profile
from wispsim.model.roofline import SAMPLER_BYTES_PER_LOGIT, Roofline
from wispsim.model.schedulers.base import GpuState, Pending
from wispsim.model.schedulers.wisp import WispScheduler
from wispsim.model.weight_only import padded_experts
from wispsim.paths import data_dir

GPUS = sorted(yaml.safe_load((data_dir() / "gpus.yaml").read_text()))  # every GPU datasheet shipped
ARCHS = available_archs()


def roofline(arch: str, gpu: str, tp: int = 1, **kw: float) -> Roofline:
    g = load_gpu(gpu)
    return Roofline(
        arch=load_arch(arch),
        tp=tp,
        weight_dtype_bytes=2,
        kv_dtype_bytes=2,
        bandwidth=g.hbm_bandwidth_gbs * 1e9,
        peak_flops=g.bf16_tflops * 1e12,
        link_bandwidth=(g.link_gbs or 64.0) * 1e9,
        **kw,
    )


batches = st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 32768)), min_size=1, max_size=64)
efficiency = st.floats(0.01, 1.0)
overhead = st.floats(0.0, 0.05)


@settings(max_examples=300, deadline=None)
@given(
    arch=st.sampled_from(ARCHS),
    gpu=st.sampled_from(GPUS),
    tp=st.sampled_from([1, 2, 4, 8]),
    batch=batches,
    bw=efficiency,
    fl=efficiency,
    att=efficiency,
    step=overhead,
    req=overhead,
    arr=overhead,
    ov=st.one_of(st.just(math.inf), st.floats(1.0, 64.0)),
    xbw=efficiency,
    xfl=efficiency,
)
def test_never_below_the_physical_floor(
    arch: str,
    gpu: str,
    tp: int,
    batch: list[tuple[int, int]],
    bw: float,
    fl: float,
    att: float,
    step: float,
    req: float,
    arr: float,
    ov: float,
    xbw: float,
    xfl: float,
) -> None:
    """Any batch, any shipped GPU and architecture, any allowed parameters (a mixture's grouped
    experts' too): T >= max(bytes at peak bandwidth, FLOPs at peak), and T grows with every
    request added."""
    r = roofline(
        arch,
        gpu,
        tp,
        bandwidth_eff=bw,
        compute_eff=fl,
        attention_eff=att,
        overlap=ov,
        step=step,
        request=req,
        arrival=arr,
        expert_bandwidth_eff=xbw,
        expert_compute_eff=xfl,
    )
    n_lin = sum(n for n, _ in batch)
    n_int = sum((n + c) * n for n, c in batch)
    n_cac = sum(c for _, c in batch)
    # the members the attention backend runs as prefills (more than one new token): MLA's own form
    pre = (sum((n + c) * n for n, c in batch if n > 1), sum(c for n, c in batch if n > 1))
    t = r.batch(n_lin, n_int, n_cac, len(batch), len(batch), None, *pre)
    assert t >= r.floor(n_lin, n_int, n_cac, None, *pre) * (1 - 1e-12)
    assert r.of(batch) == pytest.approx(t)
    assert r.of(batch[:-1]) <= t or len(batch) == 1
    # a generation step: one logit row per request (vLLM's logits_indices), never below its floor
    # either, and never dearer than the same tokens with logits at every one
    rows = len(batch)
    g = r.batch(n_lin, n_int, n_cac, rows, rows, rows, *pre)
    assert g >= r.floor(n_lin, n_int, n_cac, rows, *pre) * (1 - 1e-12)
    assert g <= t * (1 + 1e-12)
    # every member decoding (a backend that decodes them all): never below its floor either
    d = r.batch(n_lin, n_int, n_cac, len(batch), len(batch))
    assert d >= r.floor(n_lin, n_int, n_cac) * (1 - 1e-12)


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("arch", ARCHS)
def test_shipped_calibration_respects_the_floor(arch: str, gpu: str) -> None:
    """The calibrated parameters on every shipped GPU x architecture: a decode step and a
    verification batch cost at least their floor."""
    a, g = load_arch(arch), load_gpu(gpu)
    count = 1
    while padded_experts(a, g.generation, count).weight_bytes(2) > 0.8 * g.memory_gib * 2**30 * count:
        count *= 2
    if count > 1 and g.link_gbs is None:
        pytest.skip(f"{gpu} has no NVLink figure for tensor parallelism")
    if count > 8:  # beyond one node (or its fp8 blocks), refused: over the network is not modelled
        with pytest.raises(ConfigError, match=r"beyond one|is not divisible by weight quantization"):
            physical_profile(a, g, count=count)
        return
    prof = parse_profile(physical_profile(a, g, count=count), "test")
    est = prof.estimator
    assert isinstance(est, Roofline)
    for batch in ([(1, 250)], [(1, 250)] * 64, [(6, 300)] * 40, [(2048, 0)], [(177, 0)] * 8):
        n_lin = sum(n for n, _ in batch)
        n_int = sum((n + c) * n for n, c in batch)
        n_cac = sum(c for _, c in batch)
        assert est.batch(n_lin, n_int, n_cac, len(batch), 0) >= est.floor(n_lin, n_int, n_cac)
        rows = len(batch)  # as a generation step: a logit row per request
        assert est.batch(n_lin, n_int, n_cac, rows, 0, rows) >= est.floor(n_lin, n_int, n_cac, rows)


def test_the_floors_of_the_issue() -> None:
    """Qwen3-32B in bf16 reads ~64 GB of matmul weights per pass: >= 31 ms on an A100 80GB,
    >= 19 ms on an H100 SXM; its KV is 256 KiB per token."""
    a100 = roofline("qwen3-32b", "a100-80gb")
    h100 = roofline("qwen3-32b", "h100-80gb")
    assert a100.kv_bytes == 256 * 1024
    assert a100.floor(1, 251, 250) == pytest.approx(63.97e9 / 2039e9 + 251 * 262144 / 2039e9, rel=1e-3)
    assert 0.0313 < a100.floor(1, 251, 250) < 0.0320
    assert 0.0190 < h100.floor(1, 251, 250) < 0.0195
    # a prefill of 8192 tokens is compute-bound: 2 x 32B x 8192 FLOPs at 989 TFLOP/s is > 0.5 s
    assert h100.floor(8192, 8192 * 8192, 0) > 0.5


def test_tensor_parallelism_splits_the_work_and_pays_all_reduces() -> None:
    one = roofline("llama-3.1-70b", "a100-80gb", 1, step=0.0)
    two = roofline("llama-3.1-70b", "a100-80gb", 2, step=0.0)
    decode = (64, 64 * 300, 64 * 299)
    assert two.floor(*decode) == pytest.approx(one.floor(*decode) / 2, rel=1e-9)
    # two all-reduces per layer, each at least its latency
    assert two.allreduce_time(64) >= 2 * 80 * two.allreduce
    assert two.batch(*decode) > one.batch(*decode) / 2


def test_a_mixture_reads_the_experts_its_tokens_are_routed_to() -> None:
    if "mixtral-8x7b" not in ARCHS:
        pytest.skip("no mixtral architecture shipped")
    moe = load_arch("mixtral-8x7b")
    one, many = moe.matmul_weights_read(1), moe.matmul_weights_read(512)
    assert one < many <= moe.matmul_params_per_token() * 4  # 2 of 8 experts per token
    assert many == pytest.approx(moe.parameters - moe.vocab_size * moe.hidden_size, rel=0.01)


def test_routed_experts_are_priced_as_grouped_gemms_and_dense_models_are_not() -> None:
    """A mixture's routed experts run the faster of grouped kernels (slower per byte than a dense
    GEMM, as measured on an H200) and one dense GEMM pair per expert reached; its attention and
    shared weights keep the dense figures, and a dense model ignores the expert figures."""
    dense_kw = dict(bandwidth_eff=0.9, compute_eff=0.7, matmul_kernel=5e-6)
    grouped_kw = dict(expert_bandwidth_eff=0.55, expert_compute_eff=0.5, expert_kernel=17e-6)
    bw = load_gpu("h200").hbm_bandwidth_gbs * 1e9
    for name in ("qwen3-30b-a3b", "gpt-oss-120b"):
        plain, grouped = roofline(name, "h200", **dense_kw), roofline(name, "h200", **dense_kw, **grouped_kw)
        for n in (16, 256, 4096):
            assert grouped.batch(n, n * 500, n * 500, n) > plain.batch(n, n * 500, n * 500, n)
        moe = load_arch(name)
        routed = grouped.routed_bytes_read(16)
        assert 0 < routed < grouped.weight_bytes_read(16)
        assert routed == pytest.approx(moe.routed_bytes_read(16, 2))
        assert grouped.routed_experts(16) >= routed / bw  # never below the bytes at peak
        # the experts' own kernels replace the dense MLP's two GEMMs in the fixed latencies
        k_plain = moe.kernel_latency(5e-6, 0.0)
        assert k_plain - moe.kernel_latency(5e-6, 0.0, True) == pytest.approx(moe.moe_layers * 2 * 5e-6)
    # a few large experts (Mixtral) run one by one at the dense figures; many small ones grouped
    mixtral = roofline("mixtral-8x7b", "h200", **dense_kw, **grouped_kw)
    by_one = 3 * 32 * 8 * 5e-6 + mixtral.routed_bytes_read(64) / (bw * 0.9)
    assert mixtral.routed_experts(64) == pytest.approx(by_one, rel=0.05)
    small = roofline("qwen3-30b-a3b", "h200", **dense_kw, **grouped_kw)
    grouped_way = 2 * 48 * 17e-6 + small.routed_bytes_read(256) / (bw * 0.55)
    assert small.routed_experts(256) == pytest.approx(grouped_way, rel=0.05)
    dense = roofline("qwen3-32b", "h200", **dense_kw)
    same = roofline("qwen3-32b", "h200", **dense_kw, **grouped_kw)
    assert dense.batch(64, 64_000, 64_000, 64) == same.batch(64, 64_000, 64_000, 64)
    assert dense.routed_bytes_read(64) == 0.0


def test_physical_profiles_carry_expert_figures_for_mixtures_only() -> None:
    moe = physical_profile(load_arch("qwen3-30b-a3b"), load_gpu("h100-80gb"))
    dense = physical_profile(load_arch("qwen3-32b"), load_gpu("h100-80gb"))
    eff = moe["roofline"]["efficiency"]
    assert eff["expert_bandwidth"] < eff["bandwidth"] and eff["expert_compute"] < eff["compute"]
    assert moe["roofline"]["kernels"]["expert_kernel_us"] > moe["roofline"]["kernels"]["kernel_us"]
    assert not any(k.startswith("expert") for k in dense["roofline"]["efficiency"])
    assert "expert_kernel_us" not in dense["roofline"]["kernels"]
    prof = parse_profile(yaml.safe_load(yaml.safe_dump(moe)), "moe.yaml")
    assert prof.estimator.expert_bandwidth_eff == pytest.approx(eff["expert_bandwidth"])  # type: ignore[attr-defined]
    moe["roofline"]["efficiency"]["expert_bandwidth"] = 1.5
    with pytest.raises(ConfigError) as err:
        parse_profile(yaml.safe_load(yaml.safe_dump(moe)), "moe.yaml")
    assert err.value.field == "roofline.efficiency.expert_bandwidth"


def test_weight_read_is_once_per_pass_not_per_token() -> None:
    r = roofline("qwen3-32b", "h100-80gb", 1, bandwidth_eff=0.6, compute_eff=0.6)
    one = r.batch(1, 251, 250, 1, 0)
    many = r.batch(32, 32 * 251, 32 * 250, 32, 0)
    assert many < 2 * one  # weight-bound: 32 decodes cost far less than 32 x one


def _profile(tmp: Path, **changes: object) -> dict[str, object]:
    data = physical_profile(load_arch("qwen3-32b"), load_gpu("h100-80gb"))
    for path, value in changes.items():
        node = data
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[k]  # type: ignore[index]
        node[keys[-1]] = value  # type: ignore[index]
    return data


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"roofline__efficiency__bandwidth": 1.5}, "roofline.efficiency.bandwidth"),
        ({"roofline__efficiency__compute": 0}, "roofline.efficiency.compute"),
        ({"roofline__overhead_ms__step": -1}, "roofline.overhead_ms.step"),
        ({"roofline__overhead_ms__warp": 1}, "roofline.overhead_ms.warp"),
        ({"model__weight_bytes": 30e9}, "model.weight_bytes"),
        ({"model__arch": "no-such-model"}, "model.arch"),
        ({"estimator": "additive"}, "estimator"),
        ({"hardware__count": 2, "hardware__link_gbs": None}, "hardware.link_gbs"),
        ({"roofline__kernels__kernel_us": -1}, "roofline.kernels.kernel_us"),
        ({"roofline__kernels__warp_us": 1}, "roofline.kernels.warp_us"),
    ],
)
def test_roofline_profile_errors_name_the_field(
    tmp_path: Path, change: dict[str, object], field: str
) -> None:
    data = _profile(tmp_path, **change)
    if data["hardware"].get("link_gbs", 0) is None:  # type: ignore[union-attr]
        del data["hardware"]["link_gbs"]  # type: ignore[union-attr]
    with pytest.raises(ConfigError) as err:
        parse_profile(yaml.safe_load(yaml.safe_dump(data)), "p.yaml")
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_wisp_scheduler_prices_the_batch_as_a_whole() -> None:
    """With the roofline, FeasibleAdd prices B + {i} from its aggregates: the weight read is paid
    once, so many small rounds fit where their per-request sum would not."""
    prof = parse_profile(physical_profile(load_arch("qwen3-32b"), load_gpu("h100-80gb")), "t")
    est = prof.estimator
    gpu = GpuState(estimator=est, total_blocks=100_000, block_size=16)
    alone = est.alone(6, 300)
    # every deadline allows about 3 lone passes: the sum of lone costs would fit only 3
    queue = [Pending(i, 0.0, deadline=3 * alone + 0.01, n_hat=4.0, l_new=6, l_cached=300) for i in range(40)]
    batch = WispScheduler().select(queue, 0.0, gpu).members
    assert len(batch) > 3
    n = len(batch)
    t = est.batch(6 * n, 306 * 6 * n, 300 * n, n, n)
    assert t <= 3 * alone + 0.01
    assert math.isfinite(t)


@settings(max_examples=200, deadline=None)
@given(
    memory=st.floats(0.0, 1.0),
    math_=st.floats(0.0, 1.0),
    p=st.floats(1.0, 64.0),
)
def test_overlap_lies_between_the_max_and_the_sum(memory: float, math_: float, p: float) -> None:
    """``x (+) y`` with p in [1, 64]: at least the slower of the two (the roofline), at most their
    sum (no overlap at all); p = 1 is the sum, p = inf the max."""
    from wispsim.model.roofline import combine

    t = combine(memory, math_, p)
    assert max(memory, math_) * (1 - 1e-12) <= t <= (memory + math_) * (1 + 1e-12)
    assert combine(memory, math_, 1.0) == pytest.approx(memory + math_)
    assert combine(memory, math_, math.inf) == max(memory, math_)


def test_overlap_out_of_range_is_one_line() -> None:
    data = physical_profile(load_arch("qwen3-32b"), load_gpu("h100-80gb"))
    data["roofline"]["overlap"] = 0.5
    with pytest.raises(ConfigError) as err:
        parse_profile(data, "p.yaml")
    assert err.value.field == "roofline.overlap" and "must be >= 1" in str(err.value)


def test_profile_derive_prices_any_architecture_on_any_gpu(tmp_path: Path) -> None:
    """`wispsim profile derive` writes a physical profile that loads, prints its parameters and
    its floor; fp8 of a quantized checkpoint, or weights that do not fit, is one line and exit 2."""
    from typer.testing import CliRunner

    from wispsim.cli.main import app
    from wispsim.model.profiles import load_profile

    out = tmp_path / "mixtral.yaml"
    r = CliRunner().invoke(
        app,
        [
            "profile",
            "derive",
            "--arch",
            "mixtral-8x7b",
            "--gpu",
            "h100-80gb",
            "--count",
            "2",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "roofline" in r.output and "physical floor" in r.output
    prof = load_profile(str(out))
    assert isinstance(prof.estimator, Roofline) and prof.gpu_count == 2
    assert prof.provenance["inputs"]["gpu"] == "h100-80gb"
    import subprocess
    import sys

    args = ["profile", "derive", "--arch", "gpt-oss-20b", "--gpu", "h100-80gb", "--dtype", "fp8"]
    bad = subprocess.run(
        [sys.executable, "-m", "wispsim.cli", *args, "--out", str(out)], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--dtype" in bad.stderr and "quantized with mxfp4 already" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    args = ["profile", "derive", "--arch", "llama-3.1-70b", "--gpu", "a100-80gb", "--count", "1"]
    big = subprocess.run(
        [sys.executable, "-m", "wispsim.cli", *args, "--out", str(out)], capture_output=True, text=True
    )  # derive's own option is named, not bench's
    assert big.returncode == 2 and big.stderr.startswith("error: --count")
    assert "use --count >= 2" in big.stderr


def test_the_lm_head_runs_only_over_the_rows_vllm_samples() -> None:
    """vLLM computes logits at ``logits_indices`` only: a prefill chunk's prompt tokens skip the
    LM head (2 x vocabulary x hidden FLOPs each), a verification round's every new token needs it.
    Qwen3-1.7B (151,936 x 2,048 head, a fifth of its matmul FLOPs) on an H100: a 2,048-token
    prefill chunk saves the head over 2,047 tokens in its compute-bound part, and their sampling;
    a verification batch has logits unsaid or at every new token, the same price."""
    r = roofline("qwen3-1.7b", "h100-80gb", 1, overlap=math.inf)
    assert r.head_flops == 2 * 151936 * 2048
    assert r.head_flops / r.linear_flops == pytest.approx(0.18, abs=0.03)
    n, n_int = 2048, 2048 * 2048
    every = r.batch(n, n_int, 0, 1, 1)
    assert r.batch(n, n_int, 0, 1, 1, n_logits=n) == every  # the same float
    one = r.batch(n, n_int, 0, 1, 1, n_logits=1)
    head = r.head_flops / (r.peak_flops * r.compute_eff)
    # vLLM's greedy sampler: 12 bytes per logit (bf16 out of the head, cast to fp32, the argmax)
    sample = SAMPLER_BYTES_PER_LOGIT * 151936 / (r.bandwidth * r.bandwidth_eff)
    assert SAMPLER_BYTES_PER_LOGIT == 12
    assert every - one == pytest.approx(2047 * (head + sample), rel=1e-9)  # compute-bound: the head
    # a decode step: one row per request is every new token there; 256 rows of Qwen3's 151,936
    # logits take 0.47 GB through the sampler, ~0.2 ms on an H100 beside a ~1.5 ms weight read
    assert r.batch(64, 64 * 500, 64 * 499, 64, 0, n_logits=64) == r.batch(64, 64 * 500, 64 * 499, 64, 0)
    assert 256 * sample == pytest.approx(256 * 12 * 151936 / (3.35e12 * r.bandwidth_eff), rel=1e-2)
