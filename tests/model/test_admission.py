"""KV admission control (server.verifier.kv_policy: admission): exact small cases, pure and simulated."""

from __future__ import annotations

import pandas as pd
import pytest

from wispsim.config import POLICIES
from wispsim.errors import ConfigError
from wispsim.model.admission import Admission
from wispsim.sim.scenarios import load_scenario, resolve_server
from wispsim.sim.simulation import simulate


def gate(total_blocks: int = 4, order: str = "fcfs", headroom: float = 0.0) -> Admission[str]:
    # blocks of 16 tokens; 7 output tokens expected; a round adds k_max + 1 = 3
    return Admission(total_blocks, 16, growth_tokens=7, round_tokens=3, headroom=headroom, order=order)


def test_a_response_waits_for_room_and_is_admitted_when_another_ends() -> None:
    g = gate(total_blocks=4)
    # prompt 16 + growth 7 + round 3 = 26 tokens = 2 blocks each: two fit in 4 blocks
    assert g.reservation(16) == 2
    assert g.offer(1, 16, 0.0, 1.0, "a") and g.offer(2, 16, 0.1, 1.1, "b")
    assert not g.offer(3, 16, 0.2, 1.2, "c")  # no room: it waits
    assert not g.offer(4, 16, 0.3, 1.3, "d")
    assert g.used == 4 and [w.session for w in g.waiting] == [3, 4]
    assert g.offer(1, 16, 0.5, 1.5, "a2")  # a later round of an admitted response passes
    assert g.release(1) == ["c"]  # one ends: the head of the line takes its room
    assert g.admitted(3) and not g.admitted(4) and g.used == 4
    assert g.release(2) == ["d"] and g.release(3) == [] and g.release(4) == []
    assert g.used == 0 and not g.reserved and not g.waiting


def test_fcfs_never_lets_a_later_response_jump_the_line() -> None:
    g = gate(total_blocks=5)
    assert g.offer(1, 16, 0.0, 9.0, "a") and g.offer(2, 16, 0.0, 9.0, "b")  # 4 of 5 blocks
    assert not g.offer(3, 40, 0.1, 9.0, "big")  # 40 + 10 = 50 tokens = 4 blocks: waits
    assert not g.offer(4, 1, 0.2, 9.0, "small")  # 1 block would fit, but the line is not empty
    assert g.release(1) == []  # 3 free: the head (4 blocks) still does not fit, nor may "small"
    assert g.release(2) == ["big", "small"]


def test_deadline_order_admits_the_earliest_deadline_first() -> None:
    g = gate(total_blocks=2, order="deadline")
    assert g.offer(1, 16, 0.0, 1.0, "a")
    assert not g.offer(2, 16, 0.1, 5.0, "loose")
    assert not g.offer(3, 16, 0.2, 2.0, "tight")
    assert g.release(1) == ["tight"]
    assert g.release(3) == ["loose"]


def test_a_response_longer_than_expected_grows_its_reservation_and_headroom_is_kept() -> None:
    g = gate(total_blocks=10, headroom=0.2)
    assert g.limit == 8
    assert g.offer(1, 16, 0.0, 1.0, "a") and g.used == 2
    g.grow(1, 20)  # still inside prompt + growth
    assert g.used == 2
    g.grow(1, 40)  # 40 + 3 = 43 tokens = 3 blocks
    assert g.used == 3 and g.reserved[1] == 3
    assert g.offer(2, 16, 0.0, 1.0, "b") and g.offer(3, 16, 0.0, 1.0, "c")  # 7 of 8
    assert not g.offer(4, 16, 0.0, 1.0, "d")  # 9 > 8 (the headroom's 2 blocks stay free)
    # an empty server admits anything, so a response larger than the limit never deadlocks
    lone = gate(total_blocks=2)
    assert lone.offer(1, 100, 0.0, 1.0, "huge")


def test_a_response_that_ends_while_waiting_leaves_the_line() -> None:
    g = gate(total_blocks=2)
    assert g.offer(1, 16, 0.0, 1.0, "a") and not g.offer(2, 16, 0.0, 1.0, "b")
    assert g.release(2) == [] and not g.waiting
    assert g.release(1) == []


# -- in the simulator ------------------------------------------------------------------------


def scenario(det_scenario, kv_policy: str, devices: int = 5, **server):  # type: ignore[no-untyped-def]
    # prompt 16, output 7, k = 2 (deterministic_overrides); 64 tokens of KV = 4 blocks of 16.
    # Reservation (growth max = 7): 16 + 7 + 3 = 26 tokens = 2 blocks, so two responses fit.
    return det_scenario(
        server={
            "block_size": 16,
            "kv_capacity_tokens": 64,
            "kv_policy": kv_policy,
            "kv_growth": "max",
            **server,
        },
        workload={"warmup_s": 0.0, "duration_s": 1.0},
    ).with_devices(devices, (1.0,))


def held(rounds: pd.DataFrame) -> int:
    """The most responses holding KV at once: from a first round's dispatch to the end of its
    last round's batch (the server frees a response's KV as its last verdict leaves)."""
    done = rounds.assign(done=rounds.dispatch + rounds.verify_time)
    spans = done.groupby("response").agg(start=("dispatch", "min"), end=("done", "max"))
    events = sorted([(t, 1) for t in spans.start] + [(t, -1) for t in spans.end])
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def test_no_active_prefix_is_evicted_under_admission_control(det_scenario) -> None:
    res = simulate(resolve_server(scenario(det_scenario, "admission")))
    r = res.rounds
    assert int(res.batches.evictions.sum()) == 0
    later = r[r["round"] > 0]
    assert len(later) > 20 and not later.cold.any()  # every later round finds its prefix
    assert (later.l_new == later.k).all()
    assert held(r) <= 2
    # some responses waited for room: their first round queued while others ran, and the wait
    # ran against the deadline their device set on arrival
    first = r[r["round"] == 0]
    waited = first[first.dispatch - first.arrival > 0.05]
    assert len(waited) > 0
    assert list(waited.deadline - waited.arrival) == pytest.approx(list(waited.budget))


def test_lru_on_the_same_memory_evicts_running_prefixes(det_scenario) -> None:
    res = simulate(resolve_server(scenario(det_scenario, "lru")))
    later = res.rounds[res.rounds["round"] > 0]
    assert int(res.batches.evictions.sum()) > 0 and later.cold.any()
    assert held(res.rounds) > 2  # everyone runs at once and thrashes


def test_admission_order_and_headroom_come_from_the_scenario(det_scenario) -> None:
    sc = scenario(det_scenario, "admission", kv_admission_order="deadline", kv_headroom=0.5)
    res = simulate(resolve_server(sc))
    assert held(res.rounds) == 1  # half of 4 blocks: one 2-block reservation at a time
    assert int(res.batches.evictions.sum()) == 0


def test_presets_say_their_kv_policy() -> None:
    assert POLICIES["wisp"]["kv"] == "admission" and POLICIES["wisp-lru"]["kv"] == "lru"
    base = load_scenario()
    assert base.with_policy("wisp").server.verifier.kv_policy == "admission"
    assert base.with_policy("wisp-lru").server.verifier.kv_policy == "lru"
    assert base.with_policy("wisp-lru").server.scheduler == "wisp"


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("kv_policy", "fifo", "lru"),
        ("kv_headroom", 1.5, "[0, 1)"),
        ("kv_growth", "median", "mean"),
        ("kv_admission_order", "random", "deadline"),
    ],
)
def test_bad_admission_settings_name_the_field(field: str, value: object, allowed: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_scenario(overrides={"server": {field: value}})  # the earlier flat name: still taken
    msg = str(e.value)
    assert f"server.verifier.{field}" in msg and allowed in msg and "\n" not in msg


def test_a_kv_policy_that_conflicts_with_the_preset_is_an_error_not_dropped() -> None:
    with pytest.raises(
        ConfigError, match=r"server\.verifier\.kv_policy: lru conflicts with policy wisp"
    ) as e:
        load_scenario(overrides={"server": {"verifier": {"kv_policy": "lru"}}})
    assert "\n" not in str(e.value)
    custom = load_scenario(overrides={"policy": "custom", "server": {"kv_policy": "lru"}})
    assert custom.server.verifier.kv_policy == "lru" and custom.server.scheduler == "wisp"
