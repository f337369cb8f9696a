#!/usr/bin/env python
"""Build experiments/data/public/{runs,memory}.csv and lengths/*.csv from public vLLM measurements.

    python scripts/extract_public.py RUIZ_GIT_DIR ISIM_GIT_DIR [--out experiments/data/public]

RUIZ_GIT_DIR: bare snapshot of github.com/tomasruizt/vllm-scripts; ISIM_GIT_DIR: of
github.com/inference-sim/training (what the `fetch` tool returns). Files are read at the pinned
commits below with `git show`, so the output does not depend on the snapshot's HEAD.
See experiments/data/public/README.md for what every column means and how it was derived.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd

RUIZ = "d94d714fa4e451591f628542a57bbc7f9c2d2619"  # tomasruizt/vllm-scripts "Regenerate dataset"
ISIM = "ed5c1d26900e6909758d5e1641a18edaf56a1caf"  # inference-sim/training main: default_args/
ISIM_REPLAY = "c4f03409b4489891482bcd63797cfe3a92fc262d"  # initial commit: replay_data/ (deleted later)

COLUMNS = [
    "run_id",
    "source",
    "commit",
    "file",
    "group",
    "model",
    "arch",
    "gpu",
    "tp",
    "dtype",
    "kv_dtype",
    "engine",
    "engine_version",
    "max_num_batched_tokens",
    "max_num_seqs",
    "chunked_prefill",
    "prefix_caching",
    "gpu_memory_utilization",
    "block_size",
    "max_model_len",
    "dataset",
    "concurrency",
    "request_rate",
    "num_prompts",
    "input_len_mean",
    "output_len_mean",
    "input_len_p50",
    "output_len_p50",
    "input_len_cv",
    "output_len_cv",
    "spec_method",
    "draft_model",
    "draft_arch",
    "num_spec_tokens",
    "acceptance_length",
    "ttft_mean_ms",
    "ttft_median_ms",
    "ttft_p99_ms",
    "tpot_mean_ms",
    "tpot_median_ms",
    "tpot_p99_ms",
    "itl_mean_ms",
    "itl_median_ms",
    "itl_p99_ms",
    "e2e_mean_ms",
    "e2e_median_ms",
    "e2e_p99_ms",
    "output_throughput_tok_s",
    "request_throughput",
    "duration_s",
    "per_token_note",
    "num_failed",
    "notes",
    "shared_prefix_tokens",
    "prompt_groups",
    "prompts_per_group",
]

ARCH = {  # HF name -> wispsim/data/archs key
    "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-1.7B": "qwen3-1.7b",
    "Qwen/Qwen3-4B": "qwen3-4b",
    "meta-llama/Llama-3.3-70B-Instruct": "llama-3.1-70b",  # same config.json shapes as Llama-3.1-70B
    "meta-llama/Llama-3.2-1B": "llama-3.2-1b",
    "meta-llama/Llama-2-7b-hf": "llama-2-7b",
    "meta-llama/Llama-2-70b-hf": "llama-2-70b",
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "codellama/CodeLlama-34b-Instruct-hf": "codellama-34b",
}
SHORT = {
    "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-1.7B": "qwen3-1.7b",
    "Qwen/Qwen3-4B": "qwen3-4b",
    "meta-llama/Llama-3.3-70B-Instruct": "llama-3.3-70b",
    "meta-llama/Llama-3.2-1B": "llama-3.2-1b",
}

RESULT = {  # `vllm bench serve` result block label -> column
    "Successful requests": "n_ok",
    "Failed requests": "num_failed",
    "Benchmark duration (s)": "duration_s",
    "Total input tokens": "in_tok",
    "Total generated tokens": "out_tok",
    "Request throughput (req/s)": "request_throughput",
    "Output token throughput (tok/s)": "output_throughput_tok_s",
    "Acceptance length": "acceptance_length",
    **{
        f"{s} {m} (ms)": f"{m.lower()}_{c}_ms"
        for m in ("TTFT", "TPOT", "ITL")
        for s, c in (("Mean", "mean"), ("Median", "median"), ("P99", "p99"))
    },
}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def git(gd: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", gd, *args], capture_output=True, check=True).stdout


def show(gd: str, commit: str, path: str) -> str:
    return git(gd, "show", f"{commit}:{path}").decode("utf-8", "replace")


def ls(gd: str, commit: str, under: str) -> list[str]:
    return git(gd, "ls-tree", "-r", "--name-only", commit, under).decode().split("\n")[:-1]


def first(pattern: str, text: str, cast=str):
    m = re.search(pattern, text)
    return cast(m.group(1).replace(",", "")) if m else None


# ---------------------------------------------------------------- tomasruizt/vllm-scripts


def server_facts(log: str) -> dict:
    """What one `vllm serve` log says about the deployment."""
    args = {}
    m = re.search(r"non-default args: (\{.*\})", log)
    if m:
        try:
            args = ast.literal_eval(m.group(1))
        except (ValueError, SyntaxError):  # a ProfilerConfig(...) object in it: read keys by regex
            args = {
                k: ast.literal_eval(v)
                for k, v in re.findall(r"'(max_num_seqs|tensor_parallel_size)': (\d+)", m.group(1))
            }
    return dict(
        engine_version=first(r"vLLM API server version (\S+)", log),
        dtype=first(r"dtype=torch\.(\w+)", log),
        kv_dtype=first(r"kv_cache_dtype=(\w+)", log),
        max_model_len=first(r"max_seq_len=(\d+)", log, int),
        prefix_caching=first(r"enable_prefix_caching=(\w+)", log),
        chunked_prefill=first(r"enable_chunked_prefill=(\w+)", log),
        max_num_batched_tokens=first(r"max_num_batched_tokens=(\d+)", log, int),
        max_num_seqs=args.get("max_num_seqs"),
        tp=args.get("tensor_parallel_size", 1),
        cudagraph_mode=first(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)", log),
        async_scheduling="Asynchronous scheduling is enabled" in log
        and "Async scheduling not supported" not in log,
        weights_gib=first(r"Model loading took ([\d.]+) GiB", log, float),
        kv_cache_gib=first(r"Available KV cache memory: ([\d.]+) GiB", log, float),
        kv_tokens=first(r"GPU KV cache size: ([\d,]+) tokens", log, int),
        source_line="; ".join(
            re.findall(
                r"(Model loading took [\d.]+ GiB|Available KV cache memory: [\d.]+ GiB"
                r"|GPU KV cache size: [\d,]+ tokens)",
                log,
            )
        ),
    )


def bench_runs(log: str, k: int) -> list[dict]:
    """Every `vllm bench serve` run in a log: its arguments, result block and, from the server's
    SpecDecoding metrics lines while it ran, the mean acceptance length 1 + k * accepted / drafted."""
    runs = []
    for chunk in log.split("Namespace(subparser='bench'")[1:]:
        r = dict(
            num_prompts=first(r"num_prompts=(\d+)", chunk, int),
            concurrency=first(r"max_concurrency=(\d+)", chunk, int),
            request_rate=first(r"request_rate=([\d.]+|inf)", chunk, float),
            dataset=first(r"dataset_path='([^']+)'", chunk),
        )
        if "Serving Benchmark Result" not in chunk:
            continue
        for label, value in re.findall(
            r"^([A-Za-z0-9 ()/%]+?):\s+([\d.]+)\s*$", chunk.split("Serving Benchmark Result")[1], re.M
        ):
            if label in RESULT:
                r[RESULT[label]] = float(value)
        acc = sum(map(int, re.findall(r"Accepted: (\d+) tokens", chunk)))
        drafted = sum(map(int, re.findall(r"Drafted: (\d+) tokens", chunk)))
        if drafted and "acceptance_length" not in r:
            r["acceptance_length"] = round(1 + k * acc / drafted, 2)
        running = [int(x) for x in re.findall(r"Running: (\d+) reqs", chunk)]
        if running:  # the engine's 10 s stats lines, where the server logs into the same file
            waiting = max(int(x) for x in re.findall(r"Waiting: (\d+) reqs", chunk))
            kv = max(float(x) for x in re.findall(r"KV cache usage: ([\d.]+)%", chunk))
            r["engine_stats"] = (
                f"engine stats during run: max running {max(running)}, "
                f"max waiting {waiting}, max KV cache usage {kv:g}%"
            )
        runs.append(r)
    return runs


def ruiz_rows(gd: str) -> tuple[list[dict], list[dict]]:
    rows, mem = [], []

    def add(
        group,
        model,
        draft,
        method,
        k,
        gpu,
        serve_file,
        serve_log,
        bench_file,
        bench_log,
        extra=None,
        memory=True,
    ):
        s = server_facts(serve_log)
        for r in bench_runs(bench_log, k):
            ds = {"likaixin/InstructCoder": "InstructCoder", "philschmid/mt-bench": "mt-bench"}.get(
                r["dataset"], r["dataset"]
            )
            suffix = "" if ds == "InstructCoder" else "-mtbench"
            tag = f"{group}{f'-k{k}' if k else ''}{suffix}-c{r['concurrency']}"
            rows.append(
                dict(
                    run_id=tag,
                    source="tomasruizt/vllm-scripts",
                    commit=RUIZ,
                    file=bench_file,
                    group=group + ("" if ds == "InstructCoder" else "-mtbench"),
                    model=model,
                    arch=ARCH[model],
                    gpu=gpu,
                    engine="vllm (V1)",
                    spec_method=method,
                    draft_model=draft,
                    draft_arch=ARCH.get(draft),
                    num_spec_tokens=k or None,
                    gpu_memory_utilization=0.9,
                    block_size=16,
                    input_len_mean=r["in_tok"] / r["n_ok"],
                    output_len_mean=r["out_tok"] / r["n_ok"],
                    dataset=ds,
                    **{
                        c: s[c]
                        for c in (
                            "tp",
                            "dtype",
                            "kv_dtype",
                            "engine_version",
                            "max_num_batched_tokens",
                            "chunked_prefill",
                            "prefix_caching",
                            "max_model_len",
                        )
                    },
                    max_num_seqs=s["max_num_seqs"]
                    or 1024,  # not set: vLLM's default on >= 70 GiB non-A100 GPUs
                    **{
                        c: v
                        for c, v in r.items()
                        if c not in ("n_ok", "in_tok", "out_tok", "dataset", "engine_stats")
                    },
                    notes=f"cudagraph_mode={s['cudagraph_mode']}; async_scheduling={s['async_scheduling']}"
                    + (
                        ""
                        if s["max_num_seqs"]
                        else "; max_num_seqs not set: 1024 is vLLM's default for this GPU"
                    )
                    + (f"; {r['engine_stats']}" if "engine_stats" in r else "")
                    + (f"; {extra}" if extra else ""),
                )
            )
        if memory and s["weights_gib"] is not None and serve_file not in {m["file"] for m in mem}:
            mem.append(
                dict(
                    group=group,
                    gpu=gpu,
                    tp=s["tp"],
                    model=model + (f" + {draft} (k={k})" if draft else ""),
                    dtype=s["dtype"],
                    **{
                        c: s[c]
                        for c in ("weights_gib", "kv_cache_gib", "kv_tokens", "max_model_len", "source_line")
                    },
                    gpu_memory_utilization=0.9,
                    file=serve_file,
                    num_spec_tokens=k or None,
                )
            )

    # Qwen3-32B on one H100 SXM5 94GB
    # (LRZ lrz-hgx-h100-94x4): one SLURM job = one server + a concurrency sweep.
    for path in ls(gd, RUIZ, "results/logs-2026-01-23"):
        if not path.endswith("0_out.logs"):
            continue
        name = path.split("/")[-2]
        m = re.match(
            r"vllm-throughput-(InstructCoder|mt-bench)-(nosd|sd-(draft_model|eagle3)-(.+)-k(\d+))-t0\.0-tp1",
            name,
        )
        method = {None: "none", "draft_model": "draft", "eagle3": "eagle3"}[m.group(3)]
        k = int(m.group(5) or 0)
        draft = {
            "Qwen3-1.7B": "Qwen/Qwen3-1.7B",
            "Qwen3-4B": "Qwen/Qwen3-4B",
            "Qwen3-32B-speculator.eagle3": "RedHatAI/Qwen3-32B-speculator.eagle3",
        }.get(m.group(4))
        group = (
            "ruiz-qwen3-32b-"
            + {"none": "nospec", "draft": f"sd-{SHORT.get(draft)}", "eagle3": "eagle3"}[method]
        )
        log = ANSI.sub("", show(gd, RUIZ, path))
        # (the mt-bench servers repeat the InstructCoder servers' configuration: one memory row each)
        add(
            group,
            "Qwen/Qwen3-32B",
            draft,
            method,
            k,
            "h100-94gb-sxm",
            path,
            log,
            path,
            log,
            memory=m.group(1) != "mt-bench",
        )

    # Llama-3.3-70B-Instruct, TP=2, on two 80 GB-class GPUs of a Shadeform cloud VM (part not recorded).
    base = "online-throughput"
    for path in ls(gd, RUIZ, base):
        m = re.match(
            rf"{base}/(?:k(\d+)/)?tp-results-(nosd|draft-model|eagle3)/bench-[a-z0-9-]+?-c(\d+)\.log$", path
        )
        if not m:
            continue
        k, kind = int(m.group(1) or 0), m.group(2)
        draft = {
            "nosd": None,
            "draft-model": "meta-llama/Llama-3.2-1B",
            "eagle3": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
        }[kind]
        method = {"nosd": "none", "draft-model": "draft", "eagle3": "eagle3"}[kind]
        serve = (
            path.rsplit("/", 1)[0]
            + "/"
            + {"nosd": "nosd", "draft-model": "draft-model", "eagle3": "eagle3"}[kind]
            + "-serve.log"
        )
        group = (
            "ruiz-llama-3.3-70b-tp2-"
            + {"none": "nospec", "draft": "sd-llama-3.2-1b", "eagle3": "eagle3"}[method]
        )
        add(
            group,
            "meta-llama/Llama-3.3-70B-Instruct",
            draft,
            method,
            k,
            None,
            serve,
            ANSI.sub("", show(gd, RUIZ, serve)),
            path,
            ANSI.sub("", show(gd, RUIZ, path)),
            extra=(
                "GPU part not recorded: 80 GB class by memory arithmetic; custom all-reduce off (no GPU P2P)"
            ),
        )

    # Single-request runs on one H100 80GB HBM3 (Brev/Shadeform; device name in the profiler traces).
    base = "profiling/results2"
    pairs = [
        ("serve-32B.log", "bench-nosd-32b.log", "Qwen/Qwen3-32B", None, 0),
        ("serve-1.7B.log", "bench-nosd-1.7b.log", "Qwen/Qwen3-1.7B", None, 0),
    ]
    pairs += [
        (f"serve-sd-32b-1.7b-k{k}.log", f"bench-sd-32b-1.7b-k{k}.log", "Qwen/Qwen3-32B", "Qwen/Qwen3-1.7B", k)
        for k in range(1, 9)
    ]
    for serve, bench, model, draft, k in pairs:
        group = f"ruiz-{SHORT[model]}-h100-80gb-" + ("sd-qwen3-1.7b" if draft else "nospec")
        add(
            group,
            model,
            draft,
            "draft" if draft else "none",
            k,
            "h100-80gb",
            f"{base}/{serve}",
            ANSI.sub("", show(gd, RUIZ, f"{base}/{serve}")),
            f"{base}/{bench}",
            ANSI.sub("", show(gd, RUIZ, f"{base}/{bench}")),
            extra=(
                "one request, --output-len 1000 (ran to EOS), "
                "server started with --max-num-seqs 1 and the torch profiler configured (not running)"
            ),
        )
    for r in rows:
        if "profiling" in r["file"]:
            r["run_id"] = r["run_id"].replace("-c1", "-single")
    return rows, mem


def check_against_parquet(gd: str, rows: list[dict]) -> None:
    """The repository's own parsed table must agree with what was read from the logs."""
    pq = pd.read_parquet(io.BytesIO(git(gd, "show", f"{RUIZ}:results/full-bench-data.parquet")))
    pq["method"] = pq.sd_method.map({"None": "none", "draft_model": "draft", "eagle3": "eagle3"}).fillna(
        "none"
    )
    pq["model"] = pq.analysis.map({"qwen": "Qwen/Qwen3-32B", "llama70b": "meta-llama/Llama-3.3-70B-Instruct"})
    pq["k"] = pq.num_spec_toks.where(pq.num_spec_toks > 0)
    df = pd.DataFrame(rows)
    df = df[(df.dataset == "InstructCoder") & ~df.file.str.startswith("profiling")]
    df["draft"], pq["draft"] = df.draft_model.fillna(""), pq.draft_model.replace("None", None).fillna("")
    m = df.merge(
        pq,
        left_on=["model", "draft", "num_spec_tokens", "concurrency"],
        right_on=["model", "draft", "k", "concurrency"],
        how="outer",
        indicator=True,
    )
    assert (m._merge == "both").all(), m[m._merge != "both"][
        ["run_id", "model", "method", "k", "concurrency"]
    ]
    for ours, theirs in [
        ("tpot_median_ms", "median_tpot"),
        ("ttft_mean_ms", "mean_ttft"),
        ("itl_p99_ms", "p99_itl"),
        ("output_throughput_tok_s", "output_token_throughput"),
        ("duration_s", "benchmark_duration_s"),
    ]:
        assert np.allclose(m[ours], m[theirs]), ours
    al = m.dropna(subset=["acceptance_length_y"])
    print(
        f"parquet: {len(m)} rows agree; acceptance length |ours - theirs| max "
        f"{(al.acceptance_length_x - al.acceptance_length_y).abs().max():.3f}"
    )


# ---------------------------------------------------------------- inference-sim/training


def isim_rows(gd: str, out: Path) -> tuple[list[dict], list[dict]]:
    rows, mem, lengths = [], [], {}
    exps = sorted({p.split("/")[1] for p in ls(gd, ISIM, "default_args")})
    for exp in exps:
        d = f"default_args/{exp}"
        cfg = dict(re.findall(r"^(\w+): (\S+)$", show(gd, ISIM, f"{d}/exp-config.yaml"), re.M))
        profile = json.loads(show(gd, ISIM, f"{d}/profile.yaml"))
        replay = json.loads(show(gd, ISIM_REPLAY, f"replay_data/{exp}.json"))
        truth = pd.DataFrame(json.loads(show(gd, ISIM_REPLAY, f"replay_data/{exp}_ground_truth.json")))
        req = pd.DataFrame(replay["requests"]).merge(truth, on="index", suffixes=("", "_gt"))
        model, tp, wl = cfg["model"], int(cfg["tensor_parallelism"]), exp.split("-")[-1]
        group = f"isim-{ARCH[model]}-tp{tp}"
        stages = [
            json.loads(show(gd, ISIM, f"{d}/results/stage_{i}_lifecycle_metrics.json"))
            for i in range(len(profile["load"]["stages"]))
        ]
        # requests in arrival order, the first stage's count to stage 0, the next to stage 1
        req = req.sort_values("arrival_time_us", kind="stable")
        req["stage"] = np.repeat(np.arange(len(stages)), [js["load_summary"]["count"] for js in stages])
        for i, (st, js) in enumerate(zip(profile["load"]["stages"], stages, strict=False)):
            f = f"{d}/results/stage_{i}_lifecycle_metrics.json"
            ok = req[(req.stage == i) & ~req.has_error]
            lat, n_fail = js["successes"]["latency"], js["failures"]["count"]
            assert len(ok) == js["successes"]["count"], (exp, i, len(ok), js["successes"]["count"])
            # ignore_eos with max_tokens = output_len: the server generates output_len tokens; the
            # client's re-tokenized output_tokens is off by a few (for Llama-2-7B by up to all of them)
            n_out = profile["data"]["shared_prefix"]["output_len"]
            per_tok = (ok.e2e_s - ok.ttft_s) / (n_out - 1) * 1e3
            run_id = f"{group}-{wl}-r{st['rate']:g}"
            rows.append(
                dict(
                    run_id=run_id,
                    source="inference-sim/training",
                    commit=ISIM,
                    file=f"{f}; replay_data/{exp}.json @ {ISIM_REPLAY}",
                    group=group,
                    model=model,
                    arch=ARCH[model],
                    gpu="h100-80gb",
                    tp=tp,
                    dtype=None,
                    kv_dtype=None,
                    engine="vllm (instrumented, journey tracing)",
                    max_num_batched_tokens=int(cfg["max_num_batched_tokens"]),
                    max_num_seqs=int(cfg["max_num_seqs"]),
                    chunked_prefill=None,
                    # vLLM V1 caches prefixes by default; inference-perf's shared_prefix data is
                    # groups x users fixed prompts (a system prompt shared by the group's users,
                    # then the user's question), cycled through request after request
                    prefix_caching=True,
                    shared_prefix_tokens=profile["data"]["shared_prefix"]["system_prompt_len"],
                    prompt_groups=profile["data"]["shared_prefix"]["num_unique_system_prompts"],
                    prompts_per_group=profile["data"]["shared_prefix"]["num_users_per_system_prompt"],
                    block_size=replay["config"]["block_size"],
                    max_model_len=int(cfg["max_model_len"]),
                    dataset=f"inference-perf shared_prefix ({wl})",
                    request_rate=st["rate"],
                    num_prompts=js["load_summary"]["count"],
                    input_len_mean=ok.input_tokens.mean(),
                    output_len_mean=n_out,
                    input_len_p50=ok.input_tokens.median(),
                    output_len_p50=n_out,
                    input_len_cv=ok.input_tokens.std() / ok.input_tokens.mean(),
                    output_len_cv=0.0,
                    spec_method="none",
                    **{
                        f"ttft_{s}_ms": lat["time_to_first_token"][s] * 1e3 for s in ("mean", "median", "p99")
                    },
                    **{f"e2e_{s}_ms": lat["request_latency"][s] * 1e3 for s in ("mean", "median", "p99")},
                    tpot_mean_ms=per_tok.mean(),
                    tpot_median_ms=per_tok.median(),
                    tpot_p99_ms=per_tok.quantile(0.99),
                    output_throughput_tok_s=js["successes"]["throughput"]["output_tokens_per_sec"],
                    request_throughput=js["successes"]["throughput"]["requests_per_sec"],
                    duration_s=js["load_summary"]["send_duration"],
                    per_token_note="tpot_* = (e2e_s - ttft_s) / (output_len - 1) per successful request "
                    "(replay_data ground truth; "
                    "output_len = the profile's max tokens, generated in full "
                    "with ignore_eos), then mean/median/p99; "
                    "the source's time_per_output_token is not a per-token time",
                    num_failed=n_fail,
                    notes=f"open loop, Poisson arrivals at {st['rate']:g} req/s for {st['duration']} s; "
                    f"client-counted output tokens: mean {ok.output_tokens.mean():.1f}, "
                    f"median {ok.output_tokens.median():g}"
                    + (
                        "; OVERLOADED: excluded by the source (>10% failed)"
                        if n_fail > 0.1 * js["load_summary"]["count"]
                        else ""
                    ),
                )
            )
            lengths.setdefault(group, []).append(
                ok.assign(run_id=run_id, output_len=n_out)[
                    ["run_id", "input_tokens", "output_len", "output_tokens"]
                ]
            )
        if not any(m["group"] == group for m in mem):
            c = json.loads(show(gd, ISIM, f"model_configs/{model.split('/')[1]}/config.json"))
            head_dim = c["hidden_size"] // c["num_attention_heads"]
            kv_bytes = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * head_dim * 2 / tp
            blocks, bs = replay["config"]["kv_blocks_total_gpu"], replay["config"]["block_size"]
            mem.append(
                dict(
                    group=group,
                    gpu="h100-80gb",
                    tp=tp,
                    model=model,
                    dtype="float16/bfloat16 (2 bytes)",
                    weights_gib=None,
                    kv_cache_gib=round(blocks * bs * kv_bytes / 2**30, 2),
                    kv_tokens=blocks * bs,
                    gpu_memory_utilization=None,
                    max_model_len=int(cfg["max_model_len"]),
                    source_line=(
                        f'"kv_blocks_total_gpu": {blocks}, "block_size": {bs} '
                        f"(kv_cache_gib computed per GPU from model_configs/*/config.json, 2-byte KV)"
                    ),
                    file=f"replay_data/{exp}.json @ {ISIM_REPLAY}",
                )
            )
    (out / "lengths").mkdir(parents=True, exist_ok=True)
    for group, parts in lengths.items():
        df = pd.concat(parts).rename(
            columns={"input_tokens": "input_len", "output_tokens": "output_len_client"}
        )
        if len(df) > 2000:  # stratified by run, proportional to the run's size
            df = df.groupby("run_id", group_keys=False).sample(frac=2000 / len(df), random_state=0)
        df.sort_values(["run_id", "input_len", "output_len"]).to_csv(
            out / "lengths" / f"{group}.csv", index=False
        )
    return rows, mem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ruiz_git_dir")
    ap.add_argument("isim_git_dir")
    ap.add_argument("--out", default="experiments/data/public")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, mem = ruiz_rows(a.ruiz_git_dir)
    check_against_parquet(a.ruiz_git_dir, rows)
    for r in rows:
        r.setdefault(
            "per_token_note",
            "vllm bench serve: TPOT = (e2e - ttft) / (output_tokens - 1) per request, then "
            "mean/median/p99 over requests; ITL over all token gaps",
        )
    rows2, mem2 = isim_rows(a.isim_git_dir, out)
    runs = pd.DataFrame(rows + rows2).reindex(columns=COLUMNS)
    for col in ("shared_prefix_tokens", "prompt_groups", "prompts_per_group"):
        runs[col] = runs[col].fillna(0).astype(int)
    assert runs.run_id.is_unique, runs.run_id[runs.run_id.duplicated()].tolist()
    runs.sort_values(
        ["source", "group", "num_spec_tokens", "dataset", "concurrency", "request_rate", "run_id"],
        na_position="first",
    ).round(4).to_csv(out / "runs.csv", index=False)
    pd.DataFrame(mem + mem2).to_csv(out / "memory.csv", index=False)
    print(f"{len(runs)} runs, {len(mem) + len(mem2)} memory rows -> {out}")


if __name__ == "__main__":
    main()
