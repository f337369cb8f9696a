"""MLA's two forms (wispsim.model.archs.Arch.prefill_attention): vLLM's MLA backends decode in the
absorbed form and run prefills -- members with more new tokens than the backend's
``reorder_batch_threshold`` -- in the expanded form, after projecting the cached context's latents
up to every head's key and value. The batch shape carries both; other attention is untouched."""

from __future__ import annotations

import dataclasses

import pytest

from wispsim.model.archs import load_arch, load_gpu
from wispsim.model.batch import Batch, Limits, Shape
from wispsim.model.physical import physical_profile
from wispsim.model.profiles import parse_profile
from wispsim.model.roofline import Roofline
from wispsim.model.schedulers.base import Pending


def _roofline(arch: str, gpu: str, count: int) -> Roofline:
    est = parse_profile(physical_profile(load_arch(arch), load_gpu(gpu), count=count), "t").estimator
    assert isinstance(est, Roofline)
    return est


def test_deepseeks_prefill_form_in_vllms_dimensions() -> None:
    a = load_arch("deepseek-v3")
    pair, up_flops, up_values = a.prefill_attention
    # multi-head attention at key width 128 + 64 and value width 128, 128 heads, 61 layers
    assert pair == 2 * 61 * 128 * (192 + 128)
    assert a.attention_flops_per_interaction / pair == pytest.approx(2 * (2 * 512 + 64) / (2 * 320))
    # kv_b_proj over a cached token: 512 -> 128 heads x (128 + 128); the keys and values it makes
    assert up_flops == 2 * 61 * 512 * 128 * 256
    assert up_values == 61 * 128 * 320
    dense = load_arch("qwen3-32b")
    assert dense.prefill_attention == (dense.attention_flops_per_interaction, 0, 0)


def test_the_shape_sums_the_backends_prefills_apart() -> None:
    s = Shape(prefill_above=1)
    s.add(1, 100)  # a decode
    s.add(5, 400)  # a verification round: a prefill to a backend that decodes one token
    s.add_alike(3, 1, 300, arriving=False)  # decodes
    assert (s.n_interactions, s.n_cached) == (101 + 405 * 5 + 303, 100 + 400 + 300)
    assert (s.n_prefill_interactions, s.n_prefill_cached) == (405 * 5, 400)
    wide = Shape(prefill_above=512)  # FlashAttention's MLA decodes up to 512 tokens
    wide.add(5, 400)
    wide.add(600, 0)
    assert (wide.n_prefill_interactions, wide.n_prefill_cached) == (600 * 600, 0)
    # a batch takes the replica's threshold
    b: Batch[Pending] = Batch(Limits(100, 16, prefill_above=8))
    b.add(Pending(0, 0.0, l_new=5, l_cached=400))
    assert b.shape.n_prefill_interactions == 0


def test_vllms_default_backend_by_generation() -> None:
    # FlashAttention-3's MLA on Hopper decodes up to 512 tokens; FlashInfer's MLA on Blackwell one
    assert _roofline("deepseek-v3", "h200", 8).prefill_above == 512
    assert _roofline("deepseek-v3", "b200", 8).prefill_above == 1
    assert _roofline("qwen3-32b", "h100-80gb", 1).prefill_above == 1  # no MLA: nothing to split


def test_a_long_prompt_costs_its_expanded_form_and_a_round_its_context() -> None:
    hopper = _roofline("deepseek-v3", "h200", 8)
    one = dataclasses.replace(hopper, reorder_batch_threshold=1)  # FlashMLA's, vLLM 0.10-0.11
    # an 8k chunk of a prompt (a prefill on both backends): the expanded form, 3.4x fewer FLOPs a
    # pair, and the 8k tokens of context before it projected up
    chunk = [(8192, 8192)]
    absorbed = hopper.batch(8192, 16384 * 8192, 8192, 1, 1, 1)
    assert hopper.of(chunk) < absorbed
    # a verification round of 5 tokens over 4,000 cached: Hopper decodes it; a backend that decodes
    # one token projects the 4,000 tokens' latents up, at least their FLOPs at the peak
    rnd = [(5, 4000)]
    _, up_flops, _ = hopper.arch.prefill_attention
    assert one.of(rnd) - hopper.of(rnd) > up_flops * 4000 / 8 / (hopper.peak_flops * hopper.quant_rate)
    assert one.of(rnd) >= one.floor(5, 5 * 4005, 4000, None, 5 * 4005, 4000)


def test_other_attention_prices_exactly_as_before() -> None:
    r = _roofline("qwen3-32b", "h100-80gb", 1)
    for members in ([(5, 4000)], [(8192, 0), (1, 300)], [(3, 10), (3, 20), (1, 5)]):
        s = Shape.of(members)
        plain = r.batch(s.n_linear, s.n_interactions, s.n_cached, s.n_requests, s.n_arrivals, s.n_logits)
        assert r.price(s) == plain  # the same float: the split adds exactly nothing
