"""The serving stack's invariants, numbered (issue 43; after BLIS's numbered contracts).

I1. The same centralized workload gives the same records through ``run`` and ``bench``: a run's
    responses (their start times and lengths, no network) replayed by the benchmark client give
    every response the same first-token and end times.
I2. The same speculative log gives the same records through ``run`` and ``replay``: replaying a
    run's per-round log under its own policy and seed reproduces its rounds, for every policy
    and verifier kind.
I3. Every policy and verifier kind replays any speculative log (centralized ones generate the
    recorded responses; ``centralized-sd`` has the recorded acceptance drafted on the server).
I4. Every server field a run honours, replay and bench honour too: changing it changes their
    records as it changes the run's.
I5. One server factory: run, replay and bench build their servers through it (a server built
    elsewhere would not be counted by its batches' ``gpu_s`` / ``cpu_s`` parts, which only the
    factory's pricing writes).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from wispsim.config import POLICY_NAMES, parse_set
from wispsim.sim.scenarios import check, load_scenario
from wispsim.sim.simulation import simulate
from wispsim.study.bench import BenchRun, bench
from wispsim.study.replay import log_scenario, read_log, replay, write_log

QUICK = {"workload": {"warmup_s": 2.0, "duration_s": 12.0}}
# a link that takes no time: the network drops out of the comparison with the benchmark client
NO_NETWORK = {"wifi": {"latency_ms": 0.0, "up_mbps": 1e9, "down_mbps": 1e9, "jitter": 0.0}}


def _scenario(policy: str, devices: int, *sets: str, **sections: Any) -> Any:
    over = {"policy": policy, "devices": {"count": devices, "classes": [4.0]}, **QUICK}
    for key, value in sections.items():
        over[key] = {**over.get(key, {}), **value}
    for item in sets:
        from wispsim.config import deep_merge

        over = deep_merge(over, parse_set([item]))
    return load_scenario(overrides=over)


def _run(sc: Any, seed: int = 1) -> Any:
    return simulate(check(sc), seed=seed)


def _log(tmp_path: Path, policy: str = "wisp", *sets: str) -> tuple[Any, Path]:
    res = _run(_scenario(policy, 12, *sets))
    return res, write_log(res, tmp_path / f"{policy}.parquet")


def test_i1_run_and_bench_give_a_centralized_workload_the_same_records(tmp_path: Path) -> None:
    """The same requests (a request trace: when each arrives, its prompt and output) through
    ``run --arrivals requests:`` with no network and through ``bench --dataset-path``: every
    response's first token and last token at the same time."""
    from wispsim.model.profiles import load_profile
    from wispsim.sim.arrivals import driven_by_trace

    rng = np.random.default_rng(3)
    n = 40
    trace = pd.DataFrame(
        {
            "time_s": np.sort(rng.uniform(0, 8, n)).round(4),
            "prompt_tokens": rng.integers(50, 1500, n),
            "output_tokens": rng.integers(5, 120, n),
        }
    )
    path = tmp_path / "requests.csv"
    trace.to_csv(path, index=False)
    sc = _scenario("centralized", 1, "server.host.frontend=true", "server.noise=false")
    sc = sc.replace(network=dataclasses.replace(sc.network, links={"wifi": 1.0}, link_types=_links()))
    sc = driven_by_trace(sc, "requests", str(path), "concurrency", 600.0, "--arrivals")
    res = _run(sc)
    run_r = res.responses.sort_values("t_start", kind="stable").reset_index(drop=True)
    assert len(run_r) == n and not run_r.censored.any()
    eng = sc.server.engine
    bench_run = BenchRun(
        num_prompts=n,
        input_lens=trace.prompt_tokens.tolist(),
        output_lens=trace.output_tokens.tolist(),
        arrival_times=trace.time_s.tolist(),
        max_num_seqs=eng.max_num_seqs,
        max_num_batched_tokens=eng.max_num_batched_tokens,
        kv_tokens=res.kv_blocks * res.block_size,
        block_size=res.block_size,
        prefix_caching=eng.enable_prefix_caching,
        async_scheduling=eng.async_scheduling,
        seed=res.seed,
    )
    b = bench(load_profile(sc.server.profile), bench_run).responses
    t0 = trace.time_s.min()  # the benchmark's clock starts at its first request
    assert np.allclose(b.t_start + t0, run_r.t_start, atol=1e-9)
    assert np.allclose(b.t_first + t0, run_r.t_first, atol=1e-9)
    assert np.allclose(b.t_end + t0, run_r.t_end, atol=1e-9)


def _links() -> Any:
    from wispsim.config.network import LinkType

    return {name: LinkType(**value) for name, value in NO_NETWORK.items()}


@pytest.mark.parametrize(
    ("policy", "kind"),
    [("wisp", "resubmit"), ("wisp", "resident"), ("fcfs", "resubmit"), ("sled", "resubmit"),
     ("wisp-lru", "resubmit"), ("wisp-fixed", "resident")],
)  # fmt: skip
def test_i2_replaying_a_log_under_its_own_policy_reproduces_the_run(
    tmp_path: Path, policy: str, kind: str
) -> None:
    res, path = _log(tmp_path, policy, f"server.verifier.kind={kind}")
    log, meta = read_log(path)
    again = replay(log_scenario(meta, str(path)), log, meta)
    cols = ["response", "round", "k", "accepted", "arrival", "dispatch", "verify_time", "l_new", "l_cached"]
    a = res.rounds[cols].sort_values(["response", "round"]).reset_index(drop=True)
    b = again.rounds[cols].sort_values(["response", "round"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_exact=False, atol=1e-9, rtol=0)


def _replayable() -> list[tuple[str, str]]:
    """Every preset under the kinds it admits (resident: speculative presets with KV admission)."""
    from wispsim.config import POLICIES

    pairs = []
    for policy in POLICY_NAMES:
        if policy == "custom":  # no preset: its fields are the scenario's own
            continue
        preset = POLICIES[policy]
        pairs.append((policy, "resubmit"))
        if preset["mode"] == "speculative" and preset["kv"] == "admission":
            pairs.append((policy, "resident"))
    return pairs


@pytest.mark.parametrize(("policy", "kind"), _replayable())
def test_i3_every_policy_and_verifier_kind_replays_a_log(tmp_path: Path, policy: str, kind: str) -> None:
    from wispsim.config import POLICIES

    preset = POLICIES[policy]
    _, path = _log(tmp_path)
    log, meta = read_log(path)
    sc = log_scenario(meta, str(path), parse_set([f"policy={policy}", f"server.verifier.kind={kind}"]))
    out = replay(sc, log, meta)
    done = out.responses[~out.responses.censored]
    assert (done.t_end > done.t_start).all()
    if preset["mode"] == "centralized":
        assert len(out.rounds) == 0 and (out.batches.kind == "step").all() and len(done) > 5
    else:  # SLED, recomputing every prefix, may not get a response done in the window
        assert len(out.rounds) > 20 and (out.batches.kind == "verify").all()


# a server field and two values of it that make a centralized server behave differently on the
# small workloads here (the API servers only matter where requests contend for them: a slow host)
FIELDS = [
    ("server.engine.max_num_seqs", 256, 2, ()),
    ("server.engine.max_num_batched_tokens", 2048, 64, ()),
    ("server.engine.async_scheduling", False, True, ()),
    ("server.engine.kv_capacity_tokens", 38000, 4096, ()),
    ("server.host.frontend", False, True, ()),
    ("server.host.cpu", "off", "on", ()),
    ("server.host.api_server_count", 8, 1, ("server.host.cpu=on", "server.host.cpu_speed=0.05")),
    ("server.noise", False, True, ()),
]


def _value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


@pytest.mark.parametrize(("field", "a", "b", "base"), FIELDS)
def test_i4_a_server_field_a_run_honours_replay_and_bench_honour(
    tmp_path: Path, field: str, a: Any, b: Any, base: tuple[str, ...]
) -> None:
    one, two = [*base, f"{field}={_value(a)}"], [*base, f"{field}={_value(b)}"]
    ran = [_run(_scenario("centralized", 16, *sets)).responses for sets in (one, two)]
    assert not _same(*ran), f"run does not honour {field}"
    _, path = _log(tmp_path)
    log, meta = read_log(path)

    def replayed(sets: list[str]) -> Any:
        return replay(log_scenario(meta, str(path), parse_set(["policy=centralized", *sets])), log, meta)

    assert not _same(replayed(one).responses, replayed(two).responses), f"replay ignores {field}"
    tiny = BenchRun(num_prompts=40, input_lens=[300, 800], output_lens=[40, 90], request_rate=20.0, seed=1)
    from wispsim.model.profiles import load_profile

    prof = load_profile("a100-qwen3-32b")
    x = bench(prof, dataclasses.replace(tiny, overrides=_nested(one)))
    y = bench(prof, dataclasses.replace(tiny, overrides=_nested(two)))
    assert not _same(x.responses, y.responses), f"bench ignores {field}"


def _nested(sets: list[str]) -> dict[str, Any]:
    from wispsim.config import deep_merge

    out: dict[str, Any] = {}
    for item in sets:
        out = deep_merge(out, parse_set([item]))
    return out


def _same(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    cols = ["t_start", "t_first", "t_end"]
    return len(a) == len(b) and np.allclose(a[cols].to_numpy(float), b[cols].to_numpy(float), equal_nan=True)


def test_i5_every_path_builds_its_server_through_the_factory(tmp_path: Path) -> None:
    res, path = _log(tmp_path)
    log, meta = read_log(path)
    again = replay(log_scenario(meta, str(path), parse_set(["policy=centralized"])), log, meta)
    b = bench(__import__("wispsim.model.profiles", fromlist=["x"]).load_profile("a100-qwen3-32b"),
              BenchRun(num_prompts=10, input_lens=[200], output_lens=[20]))  # fmt: skip
    for batches in (res.batches, again.batches):
        assert {"gpu_s", "cpu_s"} <= set(batches.columns) and (batches.gpu_s > 0).all()
    assert b.steps > 0
