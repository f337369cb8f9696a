"""What binds a run (issue 46, item 2): each resource's load from the run's records, the one nearest
its limit named with its headroom, in the summary, the run's printout and the capacity table."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import simpy

from wispsim.analysis.binding import BINDING_COLUMNS, describe, verdict
from wispsim.analysis.metrics import SUMMARY_COLUMNS, summarize
from wispsim.model.host_cpu import host_cpu
from wispsim.sim.front import _Front
from wispsim.sim.records import Holdings, SimResult
from wispsim.sim.scenarios import load_scenario, resolve_server
from wispsim.sim.simulation import simulate

SHORT = {"workload": {"warmup_s": 10.0, "duration_s": 40.0}}


def _run(policy: str, devices: int, classes: list[float], **server: Any) -> SimResult:
    over: dict[str, Any] = {"policy": policy, "devices": {"count": devices, "classes": classes}, **SHORT}
    if server:
        over["server"] = server
    return simulate(resolve_server(load_scenario(overrides=over)))


def _row(res: SimResult) -> dict[str, Any]:
    return summarize(res).iloc[-1].to_dict()


def test_the_verdict_names_the_largest_load_and_what_is_left_of_it() -> None:
    loads = {"device_load": 0.3, "gpu_load": 0.4, "gpu_backlog": 0.7, "kv_load": 0.5}
    assert verdict(loads) == {"binds": "gpu", "headroom": pytest.approx(0.3)}  # the GPU's larger load
    loads |= {"api_server_load": 1.2, "engine_cpu_load": float("nan")}
    assert verdict(loads) == {"binds": "api_server", "headroom": pytest.approx(-0.2)}
    assert verdict({"kv_load": float("nan")})["binds"] == "none"


def test_an_api_server_counts_its_busy_time_inside_the_window_only() -> None:
    env = simpy.Environment()
    front = _Front(env, host_cpu(1.0, 2), since=10.0)

    def client(t: float, session: int, seconds: float) -> Any:
        yield env.timeout(t)
        front._serve(session, seconds)

    # process 0: 8-12 (half before the window), then 13-14 and 14-16 back to back (one span);
    # process 1: 30-40 (half after a window that ends at 35)
    for t, sess, sec in ((8, 0, 4), (13, 0, 1), (13.5, 0, 2), (30, 1, 10)):
        env.process(client(t, sess, sec))
    env.run()
    assert list(front.spans[0]) == [10.0, 12.0, 13.0, 16.0]
    assert front.busy((10.0, 35.0)) == pytest.approx([5.0, 5.0])
    assert front.busy((14.0, 15.0)) == pytest.approx([1.0, 0.0])


def test_holdings_average_the_passes_begun_inside_the_window() -> None:
    h = Holdings()
    h.log(5.0, 2.0, 0.1, 0.5, True)  # begins before the window: only its backlog second inside counts
    h.log(7.0, 1.0, 0.8, 0.2, False)
    h.log(8.0, 4.0, 0.6, 0.4, True)  # two of its four seconds inside
    kv, seqs, backlog = h.shares((6.0, 10.0))
    assert (kv, seqs) == (pytest.approx(0.7), pytest.approx(0.3))
    assert backlog == pytest.approx(1.0 + 2.0)
    assert np.isnan(h.shares((20.0, 30.0))[0])


def test_light_load_leaves_every_resource_headroom() -> None:
    row = _row(_run("wisp", 8, [8.0]))
    assert set(BINDING_COLUMNS) <= set(SUMMARY_COLUMNS)
    assert row["gpu_utilization"] > 0.9  # busy, as a GPU that batches whatever is queued always is
    assert row["headroom"] > 0.6
    assert row["gpu_backlog"] < 0.05 and row["kv_load"] < 0.3 and row["api_server_load"] < 0.2


def test_past_the_knee_the_kv_reservations_bind_wisp_on_an_a100() -> None:
    """The default scenario (Qwen3-32B on an A100, KV admission control): past its capacity at
    8 tok/s (84 devices) the reservations fill the cache and the rest wait; the GPU still has room."""
    row = _row(_run("wisp", 140, [8.0]))
    assert row["violation_rate"] > 0.2
    assert row["binds"] == "kv" and 0 <= row["headroom"] < 0.03
    assert row["gpu_load"] < 0.7 and row["api_server_load"] < 0.8


@pytest.mark.slow  # 4-8 s on a slow host: the full suite runs it, the quick lane keeps its kin
def test_one_api_server_binds_wisp_on_an_h100_at_the_rate_the_slo_needs() -> None:
    """Qwen3-14B on an H100 behind a stock vLLM server (every round re-submitted over HTTP through
    one API-server process) on a host 4.36x the measuring VM: 260 devices at 8 tok/s need more
    rounds a second than it can take (most responses miss); a second process halves its load, and
    the GPU binds next."""
    stock = {"profile": "h100-qwen3-14b", "build": "stock-vllm"}
    row = _row(_run("wisp", 260, [8.0], **stock, host={"cpu_speed": 4.36}))
    assert row["violation_rate"] > 0.3
    assert row["binds"] == "api_server" and row["api_server_load"] > 1.0 and row["headroom"] < 0
    two = _row(_run("wisp", 260, [8.0], **stock, host={"api_server_count": 2, "cpu_speed": 4.36}))
    assert two["violation_rate"] < 0.1
    assert two["api_server_load"] == pytest.approx(row["api_server_load"] / 2, rel=0.15)
    assert two["binds"] == "gpu" and two["headroom"] > 0


def test_closed_loop_devices_keep_a_cpu_busy_that_the_slo_does_not_need() -> None:
    """500 devices at 2 tok/s keep one API-server process busy all the time (each device sends its
    next round as soon as it can), yet each makes about twice its SLO: the load is the busy share
    at the rate the SLO needs, about half (a host 4.36x the measuring VM)."""
    res = _run("wisp-lru", 500, [2.0], profile="h100-qwen3-14b", host={"cpu_speed": 4.36})  # stock-vllm
    row = _row(res)
    busy = res.info["api_server_busy_s"][0][0] / (res.window[1] - res.window[0])
    assert busy > 0.97 and row["violation_rate"] < 0.01
    assert row["api_server_load"] == pytest.approx(busy * 500 * 2.0 / row["goodput_tps"])
    assert row["api_server_load"] < 0.6


def test_centralized_serving_reads_its_gpu_load_from_the_decode() -> None:
    res = _run("centralized", 60, [8.0])
    row = _row(res)
    assert np.isnan(row["device_load"])
    r = res.responses
    done = r[r.measured & ~r.censored & (r.output_len > 1)]
    tpot = (done.t_end - done.t_first).sum() / (done.output_len - 1).sum()
    assert row["gpu_load"] == pytest.approx(tpot * 8.0)
    assert row["seqs_load"] <= 1.0 and 0 < row["kv_load"] <= 1.0


def test_the_printed_line_names_the_binding_resource_first() -> None:
    row = {"binds": "kv", "headroom": 0.01, "gpu_utilization": 1.0, **dict.fromkeys(BINDING_COLUMNS[:7], 0.2)}
    row["kv_load"] = 0.99
    line = describe(row)
    assert line.startswith("binds: KV memory (load 0.99, 1% headroom)")
    assert "GPU 0.20 (busy 1.00)" in line
    assert describe({**row, "headroom": -0.5}).split(";")[0].endswith("past its limit)")


def test_a_resident_build_holds_an_engine_slot_per_admitted_session_and_the_stock_build_does_not() -> None:
    """Issue 46: a resident session is a paused vLLM request, so at most ``max_num_seqs`` are admitted
    (the real server's cap, now the simulator's); a re-submitted round holds a slot only while it is
    verified. With 4 slots and 12 devices the resident build queues for slots, the stock one does not."""
    engine = {"max_num_seqs": 4}
    resident = _run("wisp", 12, [8.0], build="wisp-grpc", engine=engine)
    stock = _run("wisp", 12, [8.0], build="stock-vllm", engine=engine)
    r, s = _row(resident), _row(stock)
    assert r["binds"] == "max_num_seqs" and r["seqs_load"] == pytest.approx(1.0, abs=0.02)
    assert s["seqs_load"] < 0.9
    assert r["violation_rate"] > s["violation_rate"] + 0.2  # waiting for a slot eats the budget
