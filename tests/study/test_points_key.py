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


def test_a_re_fit_or_a_new_measurement_of_the_models_data_re_keys_every_point(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The data the model prices with (wispsim/data: the public calibration, the host CPU's
    measured costs, GPUs...) is an input of every point: a point stored before it changed is
    computed again. Its scenario presets are not (a scenario's fields are hashed themselves)."""
    import shutil

    import wispsim.paths
    from wispsim.paths import data_dir

    copy = tmp_path / "data"
    shutil.copytree(data_dir(), copy)
    monkeypatch.setattr(wispsim.paths, "data_dir", lambda: copy)
    sc = load_scenario(None, {})
    before = Point(sc, 10, (0,)).key
    (copy / "scenarios" / "extra.yaml").write_text("name: extra\n")
    assert Point(sc, 10, (0,)).key == before
    host = copy / "host_cpu.yaml"
    host.write_text(host.read_text().replace("chunk:", "chunk: 0.2 #"))
    assert Point(sc, 10, (0,)).key != before
