"""A stored point's key: what it hashes, and the model changes it names only where they can change
the point's outcome (so a change does not throw away every stored point)."""

from __future__ import annotations

from wispsim.sim.scenarios import load_scenario
from wispsim.study.points import Point, key_dict


def test_a_new_field_at_its_neutral_default_leaves_keys_as_they_were() -> None:
    sc = load_scenario(None, {"policy": "centralized"})
    assert "batching" not in key_dict(sc)["server"]["engine"]
    static = load_scenario(None, {"policy": "centralized", "server": {"engine": {"batching": "static"}}})
    assert key_dict(static)["server"]["engine"]["batching"] == "static"
    assert Point(sc, 10, (0,)).key != Point(static, 10, (0,)).key


def test_resident_slots_re_key_only_points_where_the_slots_can_bind() -> None:
    wisp = load_scenario(None, {}).with_policy("wisp")  # wisp-grpc: resident sessions
    stock = load_scenario(None, {"server": {"build": "stock-vllm"}}).with_policy("wisp")
    slots = wisp.server.engine.max_num_seqs

    def salted(sc, n):  # type: ignore[no-untyped-def]
        from wispsim.study.points import model_revisions

        return bool(model_revisions(sc, n))

    assert not salted(wisp, slots) and salted(wisp, slots + 1)
    assert not salted(stock, slots + 1)  # a re-submitted round holds a slot only while verified
    assert not salted(load_scenario(None, {}).with_policy("centralized"), 10 * slots)
    poisson = load_scenario(None, {"arrivals": {"process": "poisson"}}).with_policy("wisp")
    assert salted(poisson, 1)
