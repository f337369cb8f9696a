"""Sliding-window layers as vLLM's engine keeps them (wispsim.model.batch.Window): the KV a
sequence holds, the reads and keys a step prices, and what the continuous batcher admits."""

from __future__ import annotations

from pathlib import Path

import pytest

from wispsim.config import ServerConfig
from wispsim.config.server import EngineConfig
from wispsim.errors import ConfigError
from wispsim.model.archs import load_arch, load_gpu
from wispsim.model.batch import Shape, Window
from wispsim.model.continuous import ContinuousBatcher, Sequence
from wispsim.model.memory import KVMemory, kv_window
from wispsim.model.physical import physical_profile
from wispsim.model.profiles import parse_profile

GPT_OSS = Window(128, 36, 18)  # gpt-oss: every other layer keeps the last 128 tokens


def test_groups_follow_the_hybrid_managers_split() -> None:
    assert (GPT_OSS.full_groups, GPT_OSS.groups) == (1, 2)  # 18 full layers, 18 windowed
    eagle = Window(128, 25, 12)  # gpt-oss-20b and an EAGLE layer: 13 full, 12 windowed, padded to 13
    assert (eagle.full_groups, eagle.groups) == (1, 2)
    gemma = Window(1024, 62, 52)  # 10 full layers: groups of 10, the windowed ones in 6 (padded)
    assert (gemma.full_groups, gemma.groups) == (1, 7)
    mistral = Window(4096, 32, 32)  # every layer windowed: one group
    assert (mistral.full_groups, mistral.groups) == (0, 1)
    with pytest.raises(ValueError):
        Window(128, 36, 37)


def test_a_long_sequence_holds_its_window_in_the_windowed_layers() -> None:
    # 32,001 tokens: 2,001 pages of 16 in the full layers' group, the window's 9 in the others'
    assert GPT_OSS.pages(32_001, 1, 16) == 2_001 + 9
    # a prefill chunk of 8,192 new tokens: from the page of token 32,000 - 8,192 - 127 = 23,681
    # (the first its first new token attends to) to the last, pages 1,480-1,999
    assert GPT_OSS.pages(32_000, 8_192, 16) == 2_000 + 520
    # within the window every layer holds every token: as if there were no window
    assert GPT_OSS.pages(100, 1, 16) == 2 * -(-100 // 16)
    assert Window(4096, 32, 32).pages(100_000, 1, 16) == 4096 // 16  # tokens 95,904-99,999
    assert Window(4096, 32, 32).pages(100_008, 1, 16) == 4096 // 16 + 1  # the window spans a page more
    # a memory of blocks counted over every layer holds layers / group size pages per block
    assert (GPT_OSS.pool(2_729), Window(1024, 62, 52).pool(100)) == (5_458, 620)


def test_a_step_reads_and_attends_to_the_window_only_in_windowed_layers() -> None:
    s = Shape(window=GPT_OSS)
    s.add(1, 32_000)  # a decode at 32k: half the layers read 32,000 tokens, half 128
    assert s.n_cached == (32_000 + 128) // 2
    assert abs(s.n_interactions - (32_001 + 128) / 2) <= 0.5  # to a whole interaction
    full = Shape()
    full.add(1, 32_000)
    assert (full.n_cached, full.n_interactions) == (32_000, 32_001)
    chunk = Shape(window=GPT_OSS)
    chunk.add(8_192, 0)  # a prefill chunk: each new token sees at most 128 keys in windowed layers
    assert chunk.n_interactions == (8_192 * 8_192 + 128 * 8_192) // 2
    short = Shape(window=GPT_OSS)
    short.add(10, 50)  # all inside the window: the sums of a model without one
    assert (short.n_cached, short.n_interactions) == (50, 600)


def test_decodes_added_at_once_sum_like_one_by_one() -> None:
    contexts = [300, 1_000, 4_096, 20_000]
    one = Shape(window=GPT_OSS)
    for c in contexts:
        one.add(1, c, arriving=False)
    alike = Shape(window=GPT_OSS)
    alike.add_alike(len(contexts), 1, sum(contexts), arriving=False, windowed_sum=128 * len(contexts))
    assert alike.n_cached == one.n_cached
    assert abs(alike.n_interactions - one.n_interactions) <= len(contexts)  # rounding
    assert (alike.n_linear, alike.n_requests, alike.n_logits) == (one.n_linear, one.n_requests, one.n_logits)


def test_a_step_of_decodes_sums_what_each_decode_adds_alone() -> None:
    """The batcher's own step: decodes at contexts below, at and past the window's end sum as
    one by one (to the keys a member crossing the end overcounts), and a windowed shape cannot be
    given decodes without their windowed sum."""
    b = ContinuousBatcher(KVMemory(100_000, 16, prefix_cache=False, window=GPT_OSS), 64, 8192)
    contexts = [40, 127, 128, 500, 9_000]
    for i, c in enumerate(contexts):
        s = Sequence(i, c, 10, 0, None)
        s.prefilled = c  # prompt processed: each decodes this step
        b.add(s)
    step = b.schedule(idle=True, now=0.0)
    assert step is not None
    one = Shape(window=GPT_OSS)
    for c in contexts:
        one.add(1, c, arriving=False)
    assert step.shape.n_cached == one.n_cached
    assert 0 <= step.shape.n_interactions - one.n_interactions <= len(contexts)
    # the drafter's sums, uncapped; and without a window the sums themselves
    assert step.shape.uncapped() == (sum(c + 1 for c in contexts), sum(contexts))
    plain = Shape()
    plain.add(1, 500)
    assert plain.uncapped() == (501, 500)
    with pytest.raises(ValueError, match="windowed_sum"):
        Shape(window=GPT_OSS).add_alike(2, 1, 1_000)


def _batcher(window: Window | None) -> ContinuousBatcher:
    # 43,664 tokens of KV (gpt-oss-120b on one H100 at 0.9): 2,729 blocks of 16
    return ContinuousBatcher(KVMemory(43_664 // 16, 16, prefix_cache=False, window=window), 1024, 8192)


def test_two_long_prompts_run_together_only_when_the_window_is_kept() -> None:
    for window, together in ((None, 1), (GPT_OSS, 2)):
        b = _batcher(window)
        for i in range(3):
            b.add(Sequence(i, 32_000, 100, 0, None))
        b.schedule(idle=True, now=0.0)
        assert len(b.running) == together
    b = _batcher(GPT_OSS)
    s = Sequence(0, 32_000, 100, 0, None)
    b.add(s)
    for t in range(4):  # four chunks of 8,192 prefill the prompt
        b.commit(b.schedule(idle=t == 0, now=float(t)), float(t) + 0.5)
    held = s.blocks
    b.schedule(idle=False, now=5.0)  # its first decode gives back the chunk's pages outside the window
    assert s.blocks < held == GPT_OSS.pages(32_001, 8_192, 16)
    assert s.blocks == GPT_OSS.pages(32_001, 1, 16)
    assert b.memory.used == s.blocks


def test_a_windowed_architecture_gives_its_profile_the_window() -> None:
    prof = parse_profile(
        physical_profile(load_arch("gpt-oss-120b"), load_gpu("h100-80gb"), count=1, noise_sigma=0.0), "t"
    )
    assert (prof.model.sliding_window, prof.model.windowed_layers) == (128, 18)
    v1, v0 = ServerConfig(), ServerConfig(engine=EngineConfig(use_v1=False))
    w = kv_window(v1, prof)
    assert w is not None and (w.tokens, w.share, w.groups) == (128, 0.5, 2)
    assert kv_window(v0, prof) is None  # V0 has no hybrid KV cache manager: every layer in full
    dense = parse_profile(
        physical_profile(load_arch("qwen3-32b"), load_gpu("h100-80gb"), count=1, noise_sigma=0.0), "t"
    )
    assert kv_window(v1, dense) is None


def test_window_facts_come_together_and_within_the_layers() -> None:
    data = physical_profile(load_arch("gpt-oss-120b"), load_gpu("h100-80gb"), count=1, noise_sigma=0.0)
    lone = {**data, "model": {k: v for k, v in data["model"].items() if k != "windowed_layers"}}
    with pytest.raises(ConfigError, match=r"model\.windowed_layers: is missing"):
        parse_profile(lone, "p.yaml")
    over = {**data, "model": {**data["model"], "windowed_layers": 37}}
    with pytest.raises(ConfigError, match=r"model\.windowed_layers: must be <= 36, got 37"):
        parse_profile(over, "p.yaml")


def test_a_benchmark_of_long_prompts_overlaps_them_as_vllm_does() -> None:
    """gpt-oss-120b on one H100 holds ~43k tokens of KV as vLLM reports it: counted in full a
    32k-token prompt runs alone, prefill then decode; with the window kept two run together, so a
    decode waits behind the next prompt's prefill chunks (the stalls vLLM's P99 ITL shows)."""
    from wispsim.study.bench import BenchRun, bench
    from wispsim.study.public import profile_for

    row = {"arch": "gpt-oss-120b", "gpu": "h100-80gb", "tp": 1, "dtype": "bfloat16", "run_id": "t"}
    run = BenchRun(num_prompts=4, input_lens=[32_000], output_lens=[20], max_num_seqs=1024)
    res = bench(profile_for(row), run)  # type: ignore[arg-type]
    assert res.mean_batch > 1.2
    gaps = [g for g in res.itls() for g in g]
    assert max(gaps) > 10 * sorted(gaps)[len(gaps) // 2]  # a decode stalled behind a prefill chunk


def test_profile_show_says_which_layers_keep_a_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    from tests.support import cli

    path = tmp_path / "h100-gpt-oss-20b.yaml"
    data = physical_profile(load_arch("gpt-oss-20b"), load_gpu("h100-80gb"), count=1)
    path.write_text(yaml.safe_dump(data))
    code, out, _ = cli(capsys, monkeypatch, "profile", "show", str(path))
    assert code == 0 and "(12 of 24 layers keep a 128-token window)" in " ".join(out.split())


def test_the_fluid_estimate_holds_a_windowed_responses_window_only(tmp_path: Path) -> None:
    """Where KV binds, the first guess of a windowed target serves more devices with the window
    kept than with the same profile's window taken away, and V0 (no hybrid manager) keeps none."""
    import dataclasses

    import yaml

    from wispsim.model.fluid import fluid_capacity
    from wispsim.sim.scenarios import load_scenario, resolve_server

    path = tmp_path / "h100-gpt-oss-20b.yaml"
    path.write_text(
        yaml.safe_dump(physical_profile(load_arch("gpt-oss-20b"), load_gpu("h100-80gb"), count=1))
    )

    def estimate(window: bool, **engine: object) -> int:
        sc = load_scenario(
            overrides={"policy": "centralized", "server": {"profile": str(path), "engine": engine}}
        )
        r = resolve_server(sc)
        prof = r.profiles[0]
        if not window:
            prof = dataclasses.replace(prof, model=dataclasses.replace(prof.model, windowed_layers=0))
        return fluid_capacity(sc, 2.0, prof, 20_000).devices  # KV for a few responses: it binds

    assert estimate(True) > estimate(False)
    v0 = {"use_v1": False, "enable_chunked_prefill": True}
    assert estimate(True, **v0) == estimate(False, **v0)


def test_a_run_holds_the_window_where_a_benchmark_does(tmp_path: Path) -> None:
    """``run`` (and ``sweep``, ``compare``: one simulator) and ``bench`` build the engine alike: a
    windowed profile's running responses hold less KV, so where KV binds more run at once than
    with the same profile's window taken away. (``replay`` replays speculative runs only, whose
    verifier counts every layer in full; ``serve`` serves a real engine, which keeps its own.)"""
    import yaml

    from wispsim.analysis.metrics import summarize
    from wispsim.runs.resolve import Options, resolve
    from wispsim.sim.simulation import simulate

    data = physical_profile(load_arch("gpt-oss-20b"), load_gpu("h100-80gb"), count=1)
    paths = {}
    for name in ("window", "full"):
        if name == "full":
            data["model"] = {
                k: v for k, v in data["model"].items() if k not in ("sliding_window", "windowed_layers")
            }
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(data))
    batch = {}
    for name, path in paths.items():
        sets = [f"server.profile={path}", "server.engine.kv_capacity_tokens=20000", "workload.duration_s=40"]
        res = simulate(resolve(None, sets, Options(policy="centralized", devices=60)))
        batch[name] = float(summarize(res).iloc[-1]["mean_batch_size"])
    assert batch["window"] > 1.2 * batch["full"], batch
