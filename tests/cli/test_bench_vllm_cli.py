"""``wispsim bench`` takes ``vllm bench serve``'s whole command line: every flag of vLLM 0.32's
parser is accepted (honoured, a client-side no-op, or refused by name), the reporting flags shape
the table and the JSON as vLLM's do, the datasets read local files as vLLM samples them, the
help is whole at 80 columns, and ``--compare`` sets a real result file beside its re-creation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_cli import wispsim
from wispsim.errors import ConfigError
from wispsim.runs.bench_flags import extras_of, parse_extra

SERVER = ["--model", "llama-2-7b", "--gpu", "h100-80gb"]
SMALL = ["--num-prompts", "30", "--random-input-len", "200", "--random-output-len", "30"]


def test_a_pasted_vllm_bench_serve_line_runs(tmp_path: Path) -> None:
    pasted = [
        "--backend",
        "vllm",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--endpoint",
        "/v1/completions",
        "--dataset-name",
        "random",
        "--request-rate",
        "6",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--goodput",
        "ttft:200",
        "tpot:30",
        "--save-result",
        "--save-detailed",
        "--label",
        "mine",
        "--metadata",
        "gpu=h100",
        "run=1",
        "--ignore-eos",
        "--num-warmups",
        "2",
        "--tokenizer",
        "meta-llama/Llama-2-7b-hf",
        "--served-model-name",
        "m",
        "--temperature",
        "0",
        "--trust-remote-code",
        "--disable-tqdm",
        "--header",
        "X-A=1",
        "--top-p=0.9",
        "--request-id-prefix",
        "b-",
    ]
    rdir = tmp_path / "results" / "deeper"  # created, as vLLM creates --result-dir
    p = wispsim("bench", *SERVER, *SMALL, *pasted, "--result-dir", str(rdir))
    assert p.returncode == 0, p.stderr
    for row in ("Request rate configured (RPS):", "Request goodput (req/s):", "Peak output token throughput"):
        assert row in p.stdout
    assert "Peak concurrent requests:" in p.stdout and "P90 ITL (ms):" in p.stdout
    (path,) = rdir.glob("mine-6.0qps-llama-2-7b-*.json")  # vLLM's LABEL-RATEqps-MODEL-DATE.json
    r = json.loads(path.read_text())
    assert r["label"] == "mine" and r["backend"] == "vllm" and r["gpu"] == "h100" and r["run"] == "1"
    for k in ("p50_ttft_ms", "p90_itl_ms", "p99_e2el_ms", "std_tpot_ms", "max_concurrent_requests"):
        assert k in r, k
    assert 0 <= r["request_goodput"] <= r["request_throughput"]
    assert r["max_output_tokens_per_s"] >= r["output_throughput"]  # a peak second is at least the mean
    assert len(r["itls"]) == 30 and all(
        len(g) == o - 1 for g, o in zip(r["itls"], r["output_lens"], strict=True)
    )
    assert sorted(r["ignored_client_flags"])[0] == "--disable-tqdm"


def test_reporting_flags_follow_vllm(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = wispsim(
        "bench", *SERVER, *SMALL, "--percentile-metrics", "ttft,client_queue_time",
        "--metric-percentiles", "0,95", "--save-result", "--result-filename", str(out), "--no-stream",
        "--max-concurrency", "4",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert "p95_ttft_ms" in r and "p0_ttft_ms" in r and "mean_itl_ms" not in r and "P95 TTFT" in p.stdout
    assert r["mean_client_queue_time_ms"] > 0  # 30 requests through 4 slots wait for them
    assert "ttfts" not in r and "latencies" in r  # vLLM keeps latencies without --save-detailed
    assert r["request_goodput"] is None
    # --no-stream is vLLM's dataset-loading switch, not a change of what is measured
    assert "--no-stream" in r["ignored_client_flags"]
    assert r["mean_ttft_ms"] < 0.5 * sum(r["latencies"]) / len(r["latencies"]) * 1e3


def test_metadata_cannot_overwrite_results_or_move_the_file(tmp_path: Path) -> None:
    rdir = tmp_path / "res"
    p = wispsim(
        "bench", *SERVER, *SMALL, "--save-result", "--result-dir", str(rdir),
        "--metadata", "date=../../evil", "completed=abc", "duration=abc", "site=lab",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    (path,) = rdir.glob("*.json")  # named with the run's own date, inside --result-dir
    r = json.loads(path.read_text())
    assert r["completed"] == 30 and isinstance(r["duration"], float) and r["site"] == "lab"
    assert r["date"] == "../../evil"  # vLLM's order: metadata may restate a setup key, not a result
    assert not (tmp_path / "evil.json").exists()


@pytest.mark.slow  # 4-8 s on a slow host: the full suite runs it, the quick lane keeps its kin
def test_ramp_up_and_a_rate_are_refused_together_and_name_the_file(tmp_path: Path) -> None:
    ramp = ["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "4"]
    p = wispsim("bench", *SERVER, *SMALL, "--request-rate", "5", *ramp)
    assert p.returncode == 2 and "--ramp-up-strategy" in p.stderr
    p = wispsim("bench", *SERVER, *SMALL, *ramp, "--save-result", "--result-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert len(list(tmp_path.glob("openai-ramp-up-linear-1qps-4qps-llama-2-7b-*.json"))) == 1
    p = wispsim(
        "bench", *SERVER, *SMALL, "--request-rate", "10", "--save-result", "--result-dir", str(tmp_path)
    )
    assert len(list(tmp_path.glob("openai-10.0qps-llama-2-7b-*.json"))) == 1  # the rate as vLLM's float


def test_a_bare_profile_switch_is_vllms_and_ignored() -> None:
    p = wispsim("bench", *SERVER, *SMALL, "--profile", "--disable-tqdm")
    assert p.returncode == 0, p.stderr
    p = wispsim("bench", *SERVER, *SMALL, "--profile")
    assert p.returncode == 0, p.stderr


@pytest.mark.slow  # a subprocess importing vLLM or transformers
def test_every_flag_of_vllms_own_parser_is_accepted() -> None:
    serve = pytest.importorskip("vllm.benchmarks.serve")
    import argparse

    parser = argparse.ArgumentParser()
    serve.add_cli_args(parser)
    help_text = subprocess.run(
        [sys.executable, "-m", "wispsim.cli", "bench", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    ).stdout
    import typer.main

    from wispsim.cli.main import app
    from wispsim.runs.bench_flags import arity

    bench = typer.main.get_command(app).commands["bench"]  # type: ignore[attr-defined]
    declared = {o: p for p in bench.params for o in (*p.opts, *p.secondary_opts)}
    for action in parser._actions:
        for flag in action.option_strings:
            if flag in ("-h", "--help") or not flag.startswith("--"):
                continue
            want: int | str = 0 if action.nargs == 0 else (action.nargs if action.nargs in ("*", "+") else 1)
            if flag in declared:  # a typer option: a switch, or one value (a bare --profile too)
                p = declared[flag]
                got: int | str = 0 if getattr(p, "is_flag", False) else 1
                assert got == want or flag == "--profile", (flag, got, want)
            else:
                assert arity(flag) == want, (flag, arity(flag), want)
            assert flag in help_text, flag  # the help says what becomes of it
    assert max(len(line) for line in help_text.splitlines()) <= 80  # nothing cut at 80 columns


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--bogus-flag", "1"], "--bogus-flag"),
        (["--use-beam-search"], "--use-beam-search"),
        (["--lora-modules", "a=b"], "--lora-modules"),
        (["--probe-request-rate", "2"], "--probe-request-rate"),
        (["--goodput", "latency:3"], "--goodput"),
        (["--percentile-metrics", "ttft,speed"], "--percentile-metrics"),
        (["--metric-percentiles", "101"], "--metric-percentiles"),
        (["--backend", "openai-embeddings"], "--backend"),
        (["--ramp-up-strategy", "linear"], "--ramp-up-start-rps"),
        (["--metadata", "novalue"], "--metadata"),
        (["--dataset-name", "hf"], "--dataset-name"),
        (["--dataset-name", "sharegpt"], "--dataset-path"),
    ],
)
def test_refused_flags_are_one_line_exit_2(args: list[str], flag: str) -> None:
    p = wispsim("bench", *SERVER, *SMALL, *args)
    assert p.returncode == 2, p.stderr
    assert flag in p.stderr and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_the_extra_flags_parse_as_argparse_would() -> None:
    f = parse_extra(["--goodput", "ttft:5", "tpot:1", "--top-k=3", "--disable-tqdm", "--metadata"])
    assert f == {"--goodput": ["ttft:5", "tpot:1"], "--top-k": "3", "--disable-tqdm": True, "--metadata": []}
    ex = extras_of(
        ["--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "8"]
    )
    assert ex.ramp_up == ("exponential", 1.0, 8.0)
    assert extras_of(["--probe-request-rate", "0"]).backend == "openai"  # the default is allowed
    with pytest.raises(ConfigError, match="takes no value"):
        parse_extra(["--disable-tqdm=1"])


def test_a_ramp_up_sends_faster_as_it_goes(tmp_path: Path) -> None:
    import numpy as np

    from wispsim.study.bench import BenchRun, send_times

    run = BenchRun(200, [10], [10], ramp_up=("linear", 1.0, 20.0))
    t = send_times(run, 200, np.random.default_rng(0))
    gaps = np.diff(t)
    assert gaps[:50].mean() > 3 * gaps[-50:].mean()
    out = tmp_path / "r.json"
    p = wispsim(
        "bench", *SERVER, *SMALL, "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "2",
        "--ramp-up-end-rps", "10", "--save-result", "--result-filename", str(out),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["ramp_up_strategy"] == "linear"


def test_result_files_are_checked_before_work_and_folders_made(tmp_path: Path) -> None:
    (tmp_path / "taken.json").mkdir()
    p = wispsim("bench", *SERVER, *SMALL, "--save-result", "--result-filename", str(tmp_path / "taken.json"))
    assert p.returncode == 2 and "existing folder" in p.stderr
    deep = tmp_path / "a" / "b" / "r.json"
    p = wispsim("bench", *SERVER, *SMALL, "--save-result", "--result-filename", str(deep))
    assert p.returncode == 0, p.stderr
    assert json.loads(deep.read_text())["completed"] == 30


def test_a_dataset_with_times_and_a_rate_is_refused_unless_told(tmp_path: Path) -> None:
    csv = tmp_path / "trace.csv"
    csv.write_text("time_s,prompt_tokens,output_tokens\n" + "".join(f"{i * 0.5},100,20\n" for i in range(20)))
    p = wispsim("bench", *SERVER, "--dataset-path", str(csv), "--request-rate", "4")
    assert p.returncode == 2 and "--no-self-timed" in p.stderr
    out = tmp_path / "r.json"
    p = wispsim(
        "bench", *SERVER, "--dataset-path", str(csv), "--request-rate", "4", "--no-self-timed",
        "--save-result", "--result-filename", str(out),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["request_rate"] == 4.0


def test_compare_recreates_a_real_run_from_its_result_file(tmp_path: Path) -> None:
    """A simulated run's own result file, compared: the re-created run is the same run."""
    first = tmp_path / "real.json"
    p = wispsim(
        "bench", *SERVER, *SMALL, "--request-rate", "5", "--random-range-ratio", "0.5", "--save-result",
        "--save-detailed", "--result-filename", str(first),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    p = wispsim("bench", *SERVER, "--compare", str(first))
    assert p.returncode == 0, p.stderr
    assert "vs simulated" in p.stdout
    rows = [line.split() for line in p.stdout.splitlines() if line.startswith(("mean_", "duration"))]
    assert rows and all(r[-1] in ("+0.0%", "-0.0%") for r in rows), rows
    bad = tmp_path / "bad.json"
    bad.write_text('{"completed": 0}')
    p = wispsim("bench", *SERVER, "--compare", str(bad))
    assert p.returncode == 2 and "completed" in p.stderr


def test_a_gpu_priced_with_another_generations_kernels_says_so(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = wispsim(
        "bench",
        "--model",
        "llama-2-7b",
        "--gpu",
        "b200",
        *SMALL,
        "--save-result",
        "--result-filename",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    assert "no kernel measurements of blackwell GPUs" in p.stdout
    assert json.loads(out.read_text())["kernel_basis"].startswith("blackwell: inherited from hopper")
    p = wispsim("bench", *SERVER, *SMALL)
    assert "no kernel measurements" not in p.stdout


def test_the_chat_endpoint_is_honoured_and_a_stray_one_refused() -> None:
    """``--backend openai-chat`` or ``--endpoint /v1/chat/completions`` puts the chat template's
    cost in the API server (server.host.endpoint); an endpoint vLLM's generation has not is refused
    by name."""
    assert extras_of([]).endpoint == "completions"
    assert extras_of(["--backend", "openai-chat"]).endpoint == "chat"
    assert extras_of(["--endpoint", "/v1/chat/completions"]).endpoint == "chat"
    assert extras_of(["--endpoint", "chat/completions"]).endpoint == "chat"
    assert extras_of(["--endpoint", "http://h:8000/v1/chat/completions/"]).endpoint == "chat"
    assert extras_of(["--backend", "openai-chat", "--endpoint", "/v1/completions"]).endpoint == "completions"
    with pytest.raises(ConfigError, match="--endpoint: endpoint: got '/v1/embeddings'"):
        extras_of(["--endpoint", "/v1/embeddings"])


def test_the_chat_endpoint_costs_its_template_in_the_api_server() -> None:
    from wispsim.runs.bench import Client, Server, run_bench
    from wispsim.runs.bench_profile import profile_of

    prof = profile_of("llama-2-7b", "h100-80gb", 1, "bfloat16", None, 0.9)
    client = Client(num_prompts=4, random_input_len=200, random_output_len=8, max_concurrency=1)
    ttft = {}
    for endpoint in ("completions", "chat"):
        result, _ = run_bench(prof, client, Server(endpoint=endpoint))
        assert result["server"]["endpoint"] == endpoint
        ttft[endpoint] = result["mean_ttft_ms"]
    assert ttft["chat"] > ttft["completions"]
    # a --set wins over the flags, and the result says what ran
    result, _ = run_bench(prof, client, Server(), ["server.host.endpoint=chat"])
    assert result["server"]["endpoint"] == "chat" and result["mean_ttft_ms"] == pytest.approx(ttft["chat"])


@pytest.mark.parametrize(
    "field", ["server.build=wisp-grpc", "server.verifier.kind=resident", "server.host.transport=grpc"]
)
def test_the_verifier_build_is_refused_by_name(field: str) -> None:
    """``vllm bench serve`` measures vLLM's own serving: a verifier's build (issue 46) would change
    nothing there, so bench refuses it in one line instead of dropping it."""
    p = wispsim("bench", "--model", "llama-2-7b", "--gpu", "h100-80gb", "--num-prompts", "2", "--set", field)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 2 and last.startswith(f"error: --set: {field.split('=')[0]}: wispsim bench")


def test_static_batching_is_refused_by_name_and_continuous_accepted() -> None:
    """vLLM batches continuously: bench under ``server.engine.batching: static`` (a Hugging Face
    ``generate`` server, simulated only) would price a server that is not vLLM, so it is refused."""
    p = wispsim(
        "bench", "--model", "llama-2-7b", "--gpu", "h100-80gb", "--num-prompts", "2",
        "--set", "server.engine.batching=static",
    )  # fmt: skip
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 2 and last.startswith(
        "error: --set: server.engine.batching: wispsim bench simulates"
    )
    ok = wispsim(
        "bench", "--model", "llama-2-7b", "--gpu", "h100-80gb", "--num-prompts", "2",
        "--set", "server.engine.batching=continuous",
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
