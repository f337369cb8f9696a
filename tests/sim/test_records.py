"""Streaming records (issue 16): records kept as column chunks, or spilled to Parquet row groups,
give the same records and the same summaries, byte for byte, as records held in memory."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wispsim import native
from wispsim.analysis.metrics import device_counts, replica_summary, summarize
from wispsim.analysis.timeseries import compliance_series, server_series
from wispsim.sim.records import BatchRecord, RecordTable, RoundRecord, frame
from wispsim.sim.scenarios import load_scenario, resolve_server
from wispsim.sim.simulation import simulate

CLASSES = (2.0, 4.0, 6.0, 8.0)


def _outputs(res) -> bytes:  # type: ignore[no-untyped-def]
    """Everything a user reads from a run, as bytes: summary, per replica, per device."""
    return "".join(
        df.to_csv(index=False) for df in (summarize(res), replica_summary(res), device_counts(res))
    ).encode()


@pytest.mark.parametrize(
    "over, devices",
    [
        ({"policy": "wisp"}, 24),
        ({"policy": "sled", "server": {"replicas": 2}}, 24),
        ({"policy": "wisp-lru", "server": {"replicas": 3, "router": "least-work"}}, 30),
        ({"policy": "centralized"}, 12),
    ],
    ids=["wisp", "sled-2-replicas", "least-work-3-replicas", "centralized"],
)
def test_spilled_records_give_the_same_records_and_summaries(over: dict, devices: int) -> None:
    # the paper's profile: loads sized for its speeds (a record test, not a profile test)
    server = {"profile": "a100-qwen3-32b-paper", **over.get("server", {})}
    sc = load_scenario(
        overrides={**over, "server": server, "workload": {"warmup_s": 5, "duration_s": 20}}
    ).with_devices(devices, CLASSES)
    kept = simulate(resolve_server(sc))
    spilled = simulate(resolve_server(sc), memory_rows=500)  # chunks of 500 rows, on disk past the first 500
    if len(kept.round_records):
        assert not kept.round_records.spilled and spilled.round_records.spilled
        assert spilled.round_records.path is not None and spilled.round_records.path.exists()
        assert len(kept.round_records) > 2_000  # several row groups
    assert _outputs(spilled) == _outputs(kept)
    pd.testing.assert_frame_equal(spilled.rounds, kept.rounds)
    pd.testing.assert_frame_equal(spilled.batches, kept.batches)
    pd.testing.assert_frame_equal(spilled.responses, kept.responses)


@pytest.mark.slow
def test_records_match_tuples_converted_at_once() -> None:
    """Chunked column arrays are the records the simulator appended, in order, with the schema's
    dtypes (what a single conversion of every tuple gives)."""
    rows = [
        (
            *(i, 2.0, i // 3, i % 3, 5 * i, 0.5 * i, 0.03, 0.1, 3, 1, 4, 2, 3, 0.01, 1.0 + i, 0.4, 1.4 + i),
            *(3.0, 1.1 + i, 0.02, i, 7, 8 * i, i % 2 == 0, 0.01, 2.0 + i, i % 5 != 0),
        )
        for i in range(2_345)
    ]
    for memory_rows in (10**9, 1_000, 1):  # in memory; spilled after 1,000; spilled row by row
        table = RecordTable(RoundRecord, memory_rows)
        for r in rows[:7]:
            table.append(r)
        assert table.packed  # numbers and flags only: rows are packed
        buf, pack = table.buf, table.pack
        for r in rows[7:]:
            buf += pack(*r)  # the hot path's way: pack into the open chunk, flush when full
            if len(buf) >= table.chunk_bytes:
                table.flush()
        assert len(table) == len(rows)
        stored = table.close()
        assert stored.spilled == (memory_rows < len(rows))
        pd.testing.assert_frame_equal(stored.frame().reset_index(drop=True), frame(rows, RoundRecord))
        got = stored.frame(["device", "t_end"], [("measured", "==", True), ("t_end", ">=", 100.0)])
        want = frame(rows, RoundRecord)
        want = want.loc[want.measured & (want.t_end >= 100.0), ["device", "t_end"]]
        assert np.array_equal(got.to_numpy(), want.to_numpy()) and list(got.columns) == ["device", "t_end"]


def test_a_spill_file_goes_when_its_records_do() -> None:
    table = RecordTable(BatchRecord, memory_rows=2)
    for b in range(5):
        table.append(
            (b, 0, "verify", 0.1 * b, 0.1 * b + 0.05, 3, 4, 30, 900, 12, 0.05, 0.05, 10, 0, 0.05, 0.0)
        )
    stored = table.close()
    path = stored.path
    assert path is not None and path.exists()
    assert stored.frame()["kind"].tolist() == ["verify"] * 5
    del stored
    gc.collect()
    assert not Path(path).exists() and not Path(path).parent.exists()


def test_a_spilled_run_writes_the_same_files(tmp_path: Path) -> None:
    sc = load_scenario(overrides={"workload": {"warmup_s": 5, "duration_s": 10}}).with_devices(12, CLASSES)
    kept, spilled = simulate(resolve_server(sc)), simulate(resolve_server(sc), memory_rows=300)
    kept.round_records.to_parquet(tmp_path / "a.parquet")
    spilled.round_records.to_parquet(tmp_path / "b.parquet")
    a, b = (pd.read_parquet(tmp_path / f"{x}.parquet") for x in "ab")
    pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(compliance_series(kept, 1.0, 5.0), compliance_series(spilled, 1.0, 5.0))
    pd.testing.assert_frame_equal(server_series(kept, 1.0), server_series(spilled, 1.0))


def test_records_all_stores_a_spilled_runs_rounds_and_they_travel_by_pickle(tmp_path: Path) -> None:
    """``--records all`` stores every round of a spilled run (the file is copied), and a result
    sent to another process (a Ray worker's) carries the records themselves."""
    import pickle

    from wispsim.study.points import Point, compute_point, store_point

    sc = load_scenario(overrides={"workload": {"warmup_s": 5, "duration_s": 10}}).with_devices(12, CLASSES)
    kept = simulate(resolve_server(sc))
    spilled = simulate(resolve_server(sc), memory_rows=300)
    again = pickle.loads(pickle.dumps(spilled.round_records))
    assert not again.spilled and len(again) == len(kept.round_records)
    pd.testing.assert_frame_equal(again.frame(), kept.rounds)
    out = compute_point(Point(sc, 12, sc.seed), "all")
    store_point(out, tmp_path)
    (stored,) = (tmp_path / "points").iterdir()
    pd.testing.assert_frame_equal(pd.read_parquet(stored / "rounds.parquet"), kept.rounds)


def test_a_value_of_the_wrong_type_is_named() -> None:
    """Packing is strict where a numpy conversion would have cast silently: the error names the
    record type, the field and the value."""
    from wispsim.sim.records import ResponseRecord

    table = RecordTable(ResponseRecord)
    good = (0, 2.0, 1, 0.0, 3.0, 0.5, 100, 50, 20, 1, 16.7, False, True, False, 0.1, 0.1, 0.2)
    table.append(good)
    with pytest.raises(TypeError, match=r"ResponseRecord\.prompt_len: expected int, got float 100\.5"):
        table.append((0, 2.0, 1, 0.0, 3.0, 0.5, 100.5, *good[7:]))
    assert len(table) == 1


def test_record_round_packs_the_fields_it_names_on_error() -> None:
    """The hot path's packed row and the row its error message is built from are the same, and
    each field of the device's side and of the request lands in the column of its name."""
    import simpy

    from wispsim.model.profiles import load_profile
    from wispsim.sim.context import DeviceRound, RunContext
    from wispsim.sim.recorder import _round_row
    from wispsim.sim.verifier import Request

    sc = load_scenario()
    env = simpy.Environment()
    ctx = RunContext(env, sc, 0, load_profile(sc.server.profile))
    req = Request(1, 4, 2.0, 2.3, 2.2, 3, 300, 303, env.event())
    side = DeviceRound(5, 4.0, 0.03)
    side.round, side.position, side.t_start = 2, 10, 1.5
    side.draft_time, side.forward_passes, side.predictor_calls = 0.09, 3, 1
    side.accepted, side.committed, side.uplink_time, side.budget = 2, 3, 0.02, 0.25
    side.downlink_time, side.t_end, side.measured = 0.01, 2.6, True
    ctx.recorder.record_round(side, req)
    assert bytes(ctx.recorder.rounds.buf) == ctx.recorder.rounds.pack(*_round_row(side, req))  # type: ignore[misc]
    row = RoundRecord(*_round_row(side, req))
    assert (row.device, row.response, row.round, row.k, row.arrival, row.budget) == (5, 4, 2, 3, 2.0, 0.25)
    assert (row.tau_d, row.deadline, row.l_new, row.t_end, row.measured) == (0.03, 2.3, 303, 2.6, True)
    if native.used()[0] == "compiled":  # the compiled DeviceRound refuses the float itself
        with pytest.raises(TypeError, match="int object expected"):
            side.round = 2.0  # type: ignore[assignment]
        return
    side.round = 2.0  # type: ignore[assignment]  # a float round index
    with pytest.raises(TypeError, match=r"RoundRecord\.round: expected int, got float 2\.0"):
        ctx.recorder.record_round(side, req)
