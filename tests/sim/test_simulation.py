"""Whole simulations of tiny scenarios with times worked out by hand.

The scenarios (see ``support.deterministic_overrides``) have no randomness in their times: the
test profile's estimator (a = 1e-4 s/token, b_compute = 1e-6 s/interaction, b_read = 1e-5 s per
cached token, c = 10 ms) without noise, links of 5 ms and 1e6 bytes/s each way without jitter,
drafting at 20 ms per token, k = 2, every drafted token accepted, prompt 16 and output 7 tokens.

Payloads (``ids``): uplink = 64 B header + 8 B per drafted token (+ 4 B per prompt token in a
response's first round); downlink = 64 B + 4 B per committed token.

Each response takes three rounds: at position 0 (k = 2, commits 3), at 3 (k = 2, commits 3) and
at 6 (one token left: k = 1, accepted 1, commits 1).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.support import deterministic_overrides, write_profile
from wispsim.sim.scenarios import load_scenario, resolve_server
from wispsim.sim.simulation import simulate

A, BC, BR, C = 1e-4, 1e-6, 1e-5, 0.01
approx = pytest.approx


def t_hat(*reqs: tuple[int, int]) -> float:
    """The test profile's estimator over (L_new, L_cached) pairs."""
    return C + sum(A * n + BC * (n + c) * n + BR * c for n, c in reqs)


# times shared by the scenarios below
DRAFT2 = 2 * 0.02  # two draft passes
UP0 = 0.005 + (64 + 2 * 8 + 16 * 4) / 1e6  # first round: 144 B -> 0.005144
UP_K2 = 0.005 + (64 + 2 * 8) / 1e6  # 80 B -> 0.00508
UP_K1 = 0.005 + (64 + 8) / 1e6  # 72 B -> 0.005072
DOWN3 = 0.005 + (64 + 3 * 4) / 1e6  # 76 B -> 0.005076
DOWN1 = 0.005 + (64 + 4) / 1e6  # 68 B -> 0.005068


def first_response_rounds(rounds: pd.DataFrame, device: int) -> pd.DataFrame:
    r = rounds[rounds.device == device]
    return r[r.response == r.response.min()].sort_values("round").reset_index(drop=True)


def test_fcfs_two_devices_share_one_batch(det_scenario) -> None:
    res = simulate(resolve_server(det_scenario()))
    # Round 0: both devices draft 40 ms, send 144 B: arrive together at 0.045144 and go in one
    # cold batch: L_new = 16 + 2 = 18 each, nothing cached:
    #   T = 10 ms + 2 x (18e-4 + 18*18e-6) = 0.01 + 0.0036 + 0.000648 = 0.014248 -> ends 0.059392
    arrive0 = DRAFT2 + UP0
    assert arrive0 == approx(0.045144)
    assert t_hat((18, 0), (18, 0)) == approx(0.014248)
    b = res.batches.iloc[0]
    assert (b["t_dispatch"], b["size"], b["n_linear"], b["n_interactions"], b["n_cached"]) == (
        approx(0.045144),
        2,
        36,
        648,
        0,
    )
    assert b["t_end"] == approx(0.059392)
    # Round 1: verdict back at 0.059392 + 0.005076 = 0.064468; draft 40 ms, send 80 B:
    # arrive 0.109548. Warm: L_new = 2 on L_cached = 16 + 3 = 19:
    #   T = 0.01 + 2 x (2e-4 + 21*2e-6 + 19e-5) = 0.010864 -> ends 0.120412
    # Round 2: back at 0.125488; one token left: draft 20 ms, 72 B: arrive 0.15056;
    #   L_new = 1 on 22 cached: T = 0.01 + 2 x (1e-4 + 23e-6 + 22e-5) = 0.010686 -> 0.161246;
    #   verdict (1 token, 68 B) back at 0.166314.
    expect = pd.DataFrame(
        {
            "position": [0, 3, 6],
            "k": [2, 2, 1],
            "accepted": [2, 2, 1],
            "committed": [3, 3, 1],
            "t_start": [0.0, 0.064468, 0.125488],
            "arrival": [0.045144, 0.109548, 0.15056],
            "dispatch": [0.045144, 0.109548, 0.15056],
            "verify_time": [0.014248, 0.010864, 0.010686],
            "l_new": [18, 2, 1],
            "l_cached": [0, 19, 22],
            "cold": [True, False, False],
            "t_end": [0.064468, 0.125488, 0.166314],
        }
    )
    for dev in (0, 1):
        got = first_response_rounds(res.rounds, dev)[list(expect.columns)]
        pd.testing.assert_frame_equal(got, expect, check_dtype=False, atol=1e-12, rtol=0)
    # the same numbers from the formulas, not just the literals above
    assert arrive0 + t_hat((18, 0), (18, 0)) + DOWN3 == approx(0.064468)
    assert 0.15056 + t_hat((1, 22), (1, 22)) + DOWN1 == approx(0.166314)
    resp = res.responses[res.responses.measured]
    assert len(resp) == 2
    assert resp.t_end.tolist() == approx([0.166314, 0.166314])
    assert resp.speed.tolist() == approx([7 / 0.166314] * 2)
    assert resp.rounds.tolist() == [3, 3] and resp.cold_rounds.tolist() == [1, 1]
    assert not resp.violated.any()


def test_style_guide_example_with_the_published_profile(det_scenario) -> None:
    # STYLE.md's example: "two devices, fixed times: the batch dispatches at t=0.045 and both
    # rounds finish at t=0.0612". Same scenario on the shipped Qwen3-32B/A100 profile:
    #   T = 36 x 3.314e-5 + 648 x 3.45e-8 + 0 + 1.486e-2 = 0.00119304 + 0.000022356 + 0.01486
    #     = 0.016075396 -> the batch ends at 0.045144 + 0.016075396 = 0.061219396
    res = simulate(resolve_server(det_scenario(server={"profile": "a100-qwen3-32b-paper"})))
    b = res.batches.iloc[0]
    assert b["size"] == 2
    assert b["t_dispatch"] == approx(0.045144)
    assert b["latency"] == approx(0.016075396)
    assert b["t_end"] == approx(0.061219396)
    first = res.rounds[res.rounds["round"] == 0].iloc[:2]
    assert (first.dispatch + first.verify_time).tolist() == approx([0.061219396] * 2)


def test_fcfs_one_request_per_batch_queues_the_second_device(det_scenario) -> None:
    res = simulate(resolve_server(det_scenario(server={"max_batch_requests": 1})))
    # Both arrive at 0.045144; device 0 submitted first and goes alone:
    #   T = 0.01 + 18e-4 + 18*18e-6 = 0.012124 -> ends 0.057268
    # device 1 waits in the queue for exactly that long, then runs 0.057268 -> 0.069392.
    assert t_hat((18, 0)) == approx(0.012124)
    d0 = first_response_rounds(res.rounds, 0)
    d1 = first_response_rounds(res.rounds, 1)
    assert d0.loc[0, ["arrival", "dispatch"]].tolist() == approx([0.045144, 0.045144])
    assert d1.loc[0, ["arrival", "dispatch"]].tolist() == approx([0.045144, 0.057268])
    assert (d1.loc[0, "dispatch"] - d1.loc[0, "arrival"]) == approx(0.012124)
    assert d1.loc[0, "t_end"] == approx(0.069392 + DOWN3)
    # device 0's round 1: back at 0.057268 + 0.005076 = 0.062344, + 40 ms + 0.00508
    #   = arrives 0.107424; the GPU is idle (device 1's batch ended at 0.069392): no wait;
    #   T = 0.01 + 2e-4 + 21*2e-6 + 19e-5 = 0.010432
    assert d0.loc[1, ["arrival", "dispatch", "verify_time"]].tolist() == approx(
        [0.107424, 0.107424, 0.010432]
    )
    # device 1's round 1 arrives 0.069392 + 0.005076 + 0.04 + 0.00508 = 0.119548, after device
    # 0's batch ended at 0.117856: no wait either
    assert d1.loc[1, ["arrival", "dispatch"]].tolist() == approx([0.119548, 0.119548])
    assert (res.batches["size"] == 1).all()


def test_round_budget_and_deadline_follow_the_slo(det_scenario) -> None:
    # tau_c = N_hat / s_c - T_draft - T_network with N_hat = alpha_hat * k + 1. Every token is
    # accepted, so alpha_hat starts (expected ratio at rate 1) and stays at 1.
    res = simulate(resolve_server(det_scenario(devices={"classes": [2.0]})))
    r = first_response_rounds(res.rounds, 0)
    # round 0: N_hat = 3, s = 2 tok/s: 1.5 - 0.04 - 0.005144 = 1.454856
    # round 2: N_hat = 2 (k = 1): 1.0 - 0.02 - 0.005072 = 0.974928
    assert r.n_hat.tolist() == approx([3.0, 3.0, 2.0])
    assert r.budget.tolist() == approx([1.454856, 1.5 - DRAFT2 - UP_K2, 0.974928])
    assert (r.deadline - r.arrival).tolist() == approx(r.budget.tolist())


def test_no_acceptance_commits_one_token_per_round(det_scenario) -> None:
    # Nothing accepted: every round commits the target's one token, so 7 rounds per response,
    # each sending k = 2 drafts (k stays 2 until fewer than 3 tokens are left).
    res = simulate(resolve_server(det_scenario(acceptance={"model": "test-none"})))
    r = first_response_rounds(res.rounds, 0)
    assert r.position.tolist() == list(range(7))
    assert r.accepted.tolist() == [0] * 7
    assert r.committed.tolist() == [1] * 7
    assert r.k.tolist() == [2, 2, 2, 2, 2, 1, 1]
    # warm rounds forward k new tokens on the committed prefix
    assert r.l_cached.tolist() == [0, 17, 18, 19, 20, 21, 22]


# ---------------------------------------------------------------------------------------------
# Prefix cache: eviction makes the next round cold
# ---------------------------------------------------------------------------------------------


def test_evicted_prefix_makes_the_next_round_cold(tmp_path: Path) -> None:
    # KV memory of 48 tokens = 3 blocks of 16. Prompt 20, k = 2: a first round holds
    # ceil(22/16) = 2 blocks, so two devices' rounds cannot share a batch (4 > 3 blocks).
    # t = 0.04516: both arrive (uplink 64 + 16 + 80 = 160 B). FCFS takes device 0 alone
    #   (T = 0.01 + 22e-4 + 22*22e-6 = 0.012684); its 23-token prefix (2 blocks) stays cached.
    # t = 0.057844: device 1's batch needs 2 blocks, 2 + 2 > 3: device 0's idle prefix is
    #   evicted (the batch record counts 1 eviction).
    # t = 0.10800: device 0's round 1 arrives (0.057844 + 0.005076 + 0.04 + 0.00508): its
    #   prefix is gone, so the round is cold: L_cached = 0, L_new = prefix 23 + k 2 = 25.
    small = str(write_profile(tmp_path / "small.yaml", capacity_tokens=48))
    over = deterministic_overrides(
        small,
        workload={
            "prompt_tokens": {"value": 20, "min": 20, "max": 20},
            "output_tokens": {"value": 12, "min": 12, "max": 12},
        },
    )
    res = simulate(resolve_server(load_scenario(overrides=over)))
    assert res.kv_blocks == 3
    b = res.batches
    assert b.loc[0, ["size", "n_linear", "evictions"]].tolist() == [1, 22, 0]
    assert b.loc[1, ["t_dispatch", "size", "evictions"]].tolist() == [approx(0.057844), 1, 1]
    r0 = first_response_rounds(res.rounds, 0)
    assert r0.loc[1, "arrival"] == approx(0.057844 + DOWN3 + DRAFT2 + UP_K2)
    assert bool(r0.loc[1, "cold"]) is True
    assert r0.loc[1, ["l_new", "l_cached"]].tolist() == [25, 0]
    assert (b.blocks_used <= 3).all()
    assert b.evictions.sum() > 0

    # Control: with room for both prefixes the same round is warm (2 new on 23 cached).
    roomy = str(write_profile(tmp_path / "roomy.yaml", capacity_tokens=4096))
    res2 = simulate(
        resolve_server(load_scenario(overrides=deterministic_overrides(roomy, workload=over["workload"])))
    )
    r0 = first_response_rounds(res2.rounds, 0)
    assert bool(r0.loc[1, "cold"]) is False
    assert r0.loc[1, ["l_new", "l_cached"]].tolist() == [2, 23]
    assert res2.batches.evictions.sum() == 0


def test_without_prefix_cache_every_round_recomputes_the_prefix(det_scenario) -> None:
    # SLED: no prefix cache, so L_new = prompt + position + k and L_cached = 0 in every round.
    res = simulate(resolve_server(det_scenario(server={"prefix_cache": False})))
    r = res.rounds
    assert r.cold.all()
    assert (r.l_cached == 0).all()
    assert (r.l_new == 16 + r.position + r.k).all()
    assert first_response_rounds(r, 0).l_new.tolist() == [18, 21, 23]


# ---------------------------------------------------------------------------------------------
# Other policies end to end
# ---------------------------------------------------------------------------------------------


def test_wisp_policy_runs_the_deterministic_scenario(det_scenario) -> None:
    # Uncongested: WISP batches exactly like FCFS here (both requests fit and meet deadlines).
    fc = simulate(resolve_server(det_scenario()))
    ws = simulate(resolve_server(det_scenario(server={"scheduler": "wisp"})))
    cols = ["device", "round", "arrival", "dispatch", "verify_time", "t_end"]
    pd.testing.assert_frame_equal(fc.rounds[cols], ws.rounds[cols])


def test_centralized_policy_end_to_end(det_scenario) -> None:
    # Prompt sent up (64 + 16*4 = 128 B: 0.005128), then steps of the continuous batcher:
    # both prompts arrive together; step 1 prefills both (N_linear 32, 2 x 16^2 interactions):
    #   T = 0.01 + 32e-4 + 512e-6 = 0.013712; then 6 decode steps on contexts 16..21:
    #   T_j = 0.01 + 2 x (1e-4 + (c+1)*1e-6 + c*1e-5) for c = 16..21.
    res = simulate(resolve_server(det_scenario(policy="centralized")))
    steps = res.batches.iloc[:7]
    assert (steps.kind == "step").all()
    assert steps.n_linear.tolist() == [32, 2, 2, 2, 2, 2, 2]
    expected = [t_hat((16, 0), (16, 0))] + [t_hat((1, c), (1, c)) for c in range(16, 22)]
    assert steps.latency.tolist() == approx(expected)
    up = 0.005 + (64 + 16 * 4) / 1e6
    assert steps.t_dispatch.iloc[0] == approx(up)
    done = up + sum(expected)
    first = res.responses[res.responses.response < 2]
    assert first.t_end.tolist() == approx([done + DOWN1] * 2)
    assert first.speed.tolist() == approx([7 / (done + DOWN1)] * 2)


def test_evictions_in_the_batch_records_explain_every_cold_round(tmp_path: Path) -> None:
    # A round after the first is cold only if its session's prefix was evicted since its last
    # round, and every eviction is recorded on the batch that caused it.
    small = str(write_profile(tmp_path / "small.yaml", capacity_tokens=48))
    over = deterministic_overrides(
        small,
        workload={
            "prompt_tokens": {"value": 20, "min": 20, "max": 20},
            "output_tokens": {"value": 12, "min": 12, "max": 12},
        },
    )
    res = simulate(resolve_server(load_scenario(overrides=over)))
    later_cold = int((res.rounds.cold & (res.rounds["round"] > 0)).sum())
    assert later_cold > 0
    assert res.batches.evictions.sum() >= later_cold


def test_measured_window_and_run_end(det_scenario) -> None:
    # Only responses starting in [warmup, warmup + duration) = [0, 0.01) are measured: the
    # first one of each device. The run ends once they are decided (the watchdog checks every
    # 0.5 s after the window closes at 0.01 s: at 0.51 s).
    res = simulate(resolve_server(det_scenario()))
    resp = res.responses
    assert resp[resp.measured].response.tolist() == [0, 1]
    assert res.window == (0.0, 0.01)
    assert res.sim_end == approx(0.51)
    assert not resp.censored.any()


def test_a_run_paces_the_collector_and_gives_it_back(det_scenario) -> None:
    """While a run runs, young collections come every YOUNG_THRESHOLD objects and what existed
    before is frozen out of them; a nested run changes nothing, and the outermost one gives both
    back, when it raises too."""
    import gc

    from wispsim.sim.simulation import YOUNG_THRESHOLD, paced_for_runs

    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with paced_for_runs():
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD and gc.get_freeze_count() > frozen
        with paced_for_runs():
            pass
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen
    with pytest.raises(RuntimeError), paced_for_runs():
        raise RuntimeError("a run that fails")
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen
    simulate(resolve_server(det_scenario()))
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen
    # a caller that froze objects itself (before a fork, say) keeps them frozen (a few of them
    # may be freed meanwhile: a setting threadpoolctl replaces; gc.unfreeze would drop them all)
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        with paced_for_runs():
            assert gc.get_threshold()[0] == YOUNG_THRESHOLD and gc.get_freeze_count() > mine - 100
        assert gc.get_threshold() == before and gc.get_freeze_count() > mine - 100 > 0
    finally:
        gc.unfreeze()


def test_a_run_holds_blas_to_one_thread_and_gives_it_back(det_scenario) -> None:
    """While a run runs, BLAS runs on the calling thread (its products are tiny); the caller's
    setting comes back when the outermost run returns, when it raises too."""
    import threading

    import threadpoolctl

    from wispsim.sim.simulation import _blas, paced_for_runs

    # the BLAS libraries loaded when the process first ran: numpy's, where a run's products run (a
    # library loaded later, torch's say, is not the simulator's and is left as it is)
    mine = {lib["filepath"] for lib in _blas().info() if lib["user_api"] == "blas"}

    def blas() -> list[int]:
        return [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["filepath"] in mine]

    if not blas():
        pytest.skip("no BLAS library loaded")
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        assert set(blas()) == {2}
        with paced_for_runs():
            assert set(blas()) == {1}
            with paced_for_runs():
                assert set(blas()) == {1}
            assert set(blas()) == {1}
        assert set(blas()) == {2}
        with pytest.raises(RuntimeError), paced_for_runs():
            raise RuntimeError("a run that fails")
        assert set(blas()) == {2}
        # runs on two threads that overlap, the first to start ending first: the last one gives
        # the setting back (threadpoolctl lets only the thread in control of OpenBLAS set it)
        a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
        seen: list[set[int]] = []

        def first() -> None:
            with paced_for_runs():
                a_in.set()
                b_in.wait()
            a_out.set()

        def second() -> None:
            a_in.wait()
            with paced_for_runs():
                b_in.set()
                a_out.wait()
                seen.append(set(blas()))

        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == [{1}] and set(blas()) == {2}
        # and a run on another thread still sets it, after one on this thread
        on_worker: list[set[int]] = []

        def worker() -> None:
            with paced_for_runs():
                on_worker.append(set(blas()))

        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert on_worker == [{1}] and set(blas()) == {2}


@pytest.mark.parametrize("process", ["closed", "poisson"])
def test_a_device_run_from_callbacks_takes_the_steps_a_process_takes(
    monkeypatch: pytest.MonkeyPatch, process: str
) -> None:
    """Under edge drafting a device's loop runs from its verdicts' callbacks (Device.start); the
    same run with every device a SimPy process (as under an arrival process that gates) gives the
    same records, to the bit."""
    from wispsim.sim import arrivals
    from wispsim.sim.device import Device

    sc = load_scenario(
        overrides={
            "devices": {"count": 24},
            "arrivals": {"process": process, "rate": 4.0},
            "workload": {"warmup_s": 5.0, "duration_s": 20.0},
        }
    )
    started: list[str] = []
    real_start = Device.start

    def spy(self: Device) -> None:
        started.append("process" if self.ctx.arrivals.gates else "callbacks")
        real_start(self)

    monkeypatch.setattr(Device, "start", spy)
    fast = simulate(resolve_server(sc))
    assert set(started) == {"callbacks"} and len(fast.responses) > 10
    started.clear()
    monkeypatch.setattr(arrivals.Arrivals, "gates", True)
    slow = simulate(resolve_server(sc))
    assert set(started) == {"process"}
    pd.testing.assert_frame_equal(fast.responses, slow.responses)
    pd.testing.assert_frame_equal(fast.rounds, slow.rounds)
