"""``wispsim.runs.serve``: the real deployment's command functions called directly, against a
server on a fake engine (the commands as a user runs them: tests/serve/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

for _module in ("fastapi", "uvicorn", "httpx", "psutil", "prometheus_client"):
    pytest.importorskip(_module, reason="the serve extra: pip install 'wispsim[serve]'")

from tests.serve.support import serve_in_thread  # noqa: E402
from tests.serve.test_serve import FACTS, SCENARIO, FakeBackend  # noqa: E402
from wispsim.errors import ConfigError, WispsimError  # noqa: E402
from wispsim.runs.resolve import Options  # noqa: E402
from wispsim.runs.serve import (  # noqa: E402
    SwarmRequest,
    ValidateRequest,
    model_source,
    openai_server,
    served_scenario,
    swarm,
    validate,
)
from wispsim.serve.limits import Limits  # noqa: E402

TOKEN = "runs-serve-admin-token-0123"


@pytest.fixture()
def server() -> Any:
    """``wispsim serve``'s app for WISP on the fake engine, in a thread; yields its URL."""
    from wispsim.serve.app import make_app
    from wispsim.sim.scenarios import load_scenario

    app = make_app(
        load_scenario(SCENARIO).with_policy("wisp"), FakeBackend(), FACTS, Limits(admin_token=TOKEN)
    )
    url, stop = serve_in_thread(app)
    yield url
    stop()


def test_the_engine_source_is_checked_in_one_line(tmp_path: Path) -> None:
    assert model_source(None, "tiny-vllm", "float32").describe() == "tiny-vllm (random weights)"
    for model, arch, dtype, words in (
        (None, None, "float32", "--model/--arch"),
        (str(tmp_path), "tiny-vllm", "float32", "--model/--arch"),
        (None, "nope", "float32", "unknown architecture"),
        (None, "tiny-vllm", "int3", "--dtype"),
        (str(tmp_path), None, "float32", "no config.json"),
    ):
        with pytest.raises(ConfigError, match=words):
            model_source(model, arch, dtype)


def test_an_openai_server_needs_its_url_and_a_served_scenario_one_replica() -> None:
    assert openai_server(None, None, None) is None
    with pytest.raises(ConfigError, match="only with --openai-url"):
        openai_server(None, "m", None)
    resolved = served_scenario(SCENARIO, None, Options(policy="wisp"))
    assert resolved.scenario.server.replicas == 1
    with pytest.raises(ConfigError, match=r"server\.replicas"):
        served_scenario(SCENARIO, ["server.replicas=2"], Options(policy="wisp"))
    with pytest.raises(ConfigError, match="--regime r"):
        served_scenario(SCENARIO, ["server.replicas=2"], Options(policy="wisp"), source="--regime r")
    # the chat endpoint is a simulated API server's cost: a real server is not one, so it refuses
    with pytest.raises(ConfigError, match=r"server\.host\.endpoint: chat: wispsim serve answers on its own"):
        served_scenario(SCENARIO, ["server.host.endpoint=chat"], Options(policy="centralized"))
    # static batching is a simulated server's (Hugging Face generate): vLLM batches continuously
    with pytest.raises(
        ConfigError, match=r"server\.engine\.batching: static: wispsim serve generates on vLLM"
    ):
        served_scenario(SCENARIO, ["server.engine.batching=static"], Options(policy="centralized"))


@pytest.mark.slow  # 4-8 s on a slow host: the full suite runs it, the quick lane keeps its kin
def test_swarm_runs_the_devices_and_writes_their_records(server: str, tmp_path: Path) -> None:
    sets = ["workload.warmup_s=0.5", "workload.duration_s=2"]
    req = SwarmRequest(
        SCENARIO, sets, "wisp", url=server, devices=2, admin_token=TOKEN, log=tmp_path / "l.csv"
    )
    out = swarm(req, tmp_path / "swarm")
    assert out.url == server and out.scenario.devices.count == 2
    for name in (
        "rounds.parquet",
        "responses.parquet",
        "server_batches.parquet",
        "summary.csv",
        "manifest.json",
    ):
        assert (out.folder / name).is_file(), name
    assert len(pd.read_csv(tmp_path / "l.csv")) > 3 and len(out.summary)


def test_swarm_refuses_what_it_cannot_do_before_any_work(server: str, tmp_path: Path) -> None:
    base = {"scenario": SCENARIO, "sets": None, "policy": "wisp", "devices": 1}
    for changes, words in (
        ({"url": server}, "--admin-token"),
        ({"url": server, "openai_url": "http://127.0.0.1:9/v1", "admin_token": TOKEN}, "--url/--openai-url"),
        ({"url": server, "admin_token": TOKEN, "policy": "fcfs"}, "runs wisp"),
    ):
        with pytest.raises(WispsimError, match=words):
            swarm(SwarmRequest(**{**base, **changes}), tmp_path / "never")  # type: ignore[arg-type]
    assert not (tmp_path / "never").exists()


def test_validate_checks_its_real_side_before_any_work(tmp_path: Path) -> None:
    from wispsim.study.validate import Regime

    def req(**kw: Any) -> ValidateRequest:
        return ValidateRequest(SCENARIO, [], ["wisp"], [2], [Regime("compute", ())], **kw)

    for kwargs, words in (
        ({}, "--model/--arch"),
        ({"arch": "tiny-vllm", "openai_url": "http://127.0.0.1:9/v1"}, "--openai-url"),
        ({"real_from": tmp_path}, "not a wispsim validate folder"),
    ):
        with pytest.raises(ConfigError, match=words):
            validate(req(**kwargs), tmp_path / "v")
    dup = ValidateRequest(SCENARIO, [], ["wisp"], [2], [Regime("a", ()), Regime("a", ())], arch="tiny-vllm")
    with pytest.raises(ConfigError, match="unique"):
        validate(dup, tmp_path / "v2")


def test_serve_honours_the_build_and_serves_grpc_where_its_devices_speak_it(monkeypatch: Any) -> None:
    """``--set server.build=...`` on serve (issue 46): the served scenario is the build's, and the
    gRPC service starts beside HTTP (PORT + 1 unless ``--grpc-port`` says) where the build's devices
    speak gRPC; a centralized policy has no verification service to serve over gRPC."""
    import wispsim.serve.app as app_module
    from wispsim.runs.serve import serve

    seen: dict[str, Any] = {}

    def fake(
        sc: Any, source: Any, host: str, port: int, ready: Any, limits: Any = None, grpc_port: Any = None
    ):
        seen.update(sc=sc, grpc_port=grpc_port)

    monkeypatch.setattr(app_module, "serve", fake)
    source = model_source(None, "tiny-vllm", "float32")

    def served(sets: list[str], policy: str = "wisp", grpc_port: int | None = None) -> dict[str, Any]:
        seen.clear()
        serve(SCENARIO, sets, policy, source, "127.0.0.1", 8011, lambda *a: None, grpc_port=grpc_port)
        return dict(seen)

    grpc = served(["server.build=wisp-grpc"])
    srv = grpc["sc"].server
    assert (srv.build, srv.verifier.kind, srv.host.transport, grpc["grpc_port"]) == (
        "wisp-grpc",
        "resident",
        "grpc",
        8012,
    )
    assert served(["server.build=wisp-grpc"], grpc_port=9000)["grpc_port"] == 9000
    http = served(["server.build=vllm-sessions"])
    assert (http["sc"].server.verifier.kind, http["grpc_port"]) == ("resident", None)
    assert served(["server.build=stock-vllm"])["sc"].server.verifier.kind == "resubmit"
    with pytest.raises(ConfigError, match="the gRPC service verifies rounds"):
        served([], policy="centralized", grpc_port=9000)
