"""Test helpers: tiny profiles with hand-friendly numbers, scripted acceptance, scenario builders,
the CLI in process, and results folders made by the real CLI (shared by the plots and notebook tests).

Every test imports them the one way, ``from tests.support import ...``, from any folder.

Tests build scenarios through the real loader (:func:`wispsim.config.schema.load_scenario` with
overrides), so what they exercise is what a user's YAML file would produce. Importing this module
registers the scripted acceptance models ``test-all`` and ``test-none``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from wispsim.cli.main import main
from wispsim.config import AcceptanceConfig, Scenario
from wispsim.model.acceptance import ACCEPTANCE, FEATURES, ResponseStream, accept_runs
from wispsim.model.batch import Shape
from wispsim.model.cost import AggregateCost
from wispsim.sim.scenarios import load_scenario

ROOT = Path(__file__).resolve().parents[1]  # the checkout: README, docs, scenarios, wispsim/
GIB = 1024**3

# Coefficients of the test profile: round numbers so expected times can be worked out by hand.
A, B_COMPUTE, B_READ, C = 1.0e-4, 1.0e-6, 1.0e-5, 0.01


def profile_dict(capacity_tokens: int | None = None, **coefficients: float) -> dict[str, Any]:
    """A profile for a 1-layer toy model with 2 bytes of KV per token on a 1 GiB GPU.

    With ``gpu_memory_utilization: 1`` and ``activation_reserve_gib: 0`` the KV capacity is
    exactly ``capacity_tokens`` (default: half a GiB of tokens, i.e. unconstrained).
    """
    kv_bytes = 2  # 2 (K and V) x 1 layer x 1 head x head_dim 1 x 1 byte
    weight = 0 if capacity_tokens is None else GIB - kv_bytes * capacity_tokens
    coefs = {"a": A, "b_compute": B_COMPUTE, "b_read": B_READ, "c": C, **coefficients}
    return {
        "name": "test-tiny",
        "hardware": {"gpu": "test", "count": 1, "memory_gib": 1},
        "engine": "test",
        "precision": "int8",
        "model": {
            "name": "toy",
            "parameters": 1,
            "layers": 1,
            "kv_heads": 1,
            "head_dim": 1,
            "kv_dtype_bytes": 1,
            "weight_bytes": weight,
            "vocab_size": 1000,
        },
        "coefficients": coefs,
        "provenance": {
            "kind": "derived",
            "rule": "hand-made test fixture",
            "inputs": {"coefficients": "round numbers"},
        },
    }


def write_profile(path: Path, capacity_tokens: int | None = None, **coefficients: float) -> Path:
    path.write_text(yaml.safe_dump(profile_dict(capacity_tokens, **coefficients)))
    return path


def const(value: float) -> dict[str, Any]:
    """A constant distribution as YAML would spell it (min/max pinned so merging is harmless)."""
    return {"dist": "constant", "value": value, "min": value, "max": value}


def deterministic_overrides(profile: str, **sections: dict[str, Any]) -> dict[str, Any]:
    """Overrides for a scenario without randomness in times: no noise, no jitter, fixed sizes.

    Defaults: fixed k=2 drafting at 50 tokens/s (tau_d = 20 ms), every drafted token accepted,
    one ``lan`` link of 5 ms and 8 Mbit/s (= 1e6 bytes/s) each way, prompt 16, output 7,
    FCFS with prefix caching and LRU eviction (no KV admission control), all devices start at t=0.
    """
    base: dict[str, Any] = {
        "policy": "custom",
        "devices": {
            "count": 2,
            "classes": [1.0],
            "draft_speed": const(50.0),
            "start_spread_s": 0.0,
        },
        "drafting": {"controller": "fixed", "k": 2},
        "acceptance": {"model": "test-all"},
        "network": {
            "payload": "ids",
            "header_bytes": 64,
            "links": {"lan": 1.0},
            "link_types": {"lan": {"latency_ms": 5.0, "up_mbps": 8.0, "down_mbps": 8.0, "jitter": 0.0}},
        },
        "server": {
            "profile": profile,
            "mode": "speculative",
            "scheduler": "fcfs",
            "prefix_cache": True,
            "kv_policy": "lru",
            "noise": False,
            "gpu_memory_utilization": 1.0,
            "activation_reserve_gib": 0.0,
        },
        "workload": {
            "prompt_tokens": const(16),
            "output_tokens": const(7),
            "think_time_s": const(0.0),
            "warmup_s": 0.0,
            "duration_s": 0.01,
        },
    }
    if sections.get("policy", "custom") != "custom":  # a preset sets these four itself
        del base["drafting"]["controller"]
        for name in ("mode", "scheduler", "prefix_cache", "kv_policy"):
            base["server"].pop(name, None)
    return _merge(base, sections)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def small_scenario(**sections: dict[str, Any]) -> Scenario:
    """The default scenario, shortened for property tests (5 s measured after 1 s of warm-up)."""
    over = _merge(
        {
            "workload": {
                "warmup_s": 1.0,
                "duration_s": 5.0,
                "prompt_tokens": {"mean": 96, "max": 512},
                "output_tokens": {"mean": 48, "min": 4, "max": 160},
            }
        },
        sections,
    )
    return load_scenario(overrides=over)


# --------------------------------------------------------------------------------------------
# Scripted acceptance plug-ins (registered the way a user's plug-in would be)
# --------------------------------------------------------------------------------------------


class _Scripted:
    """Accept every drafted token (``test-all``) or none (``test-none``); features say so."""

    accept_value = True

    def __init__(self, cfg: AcceptanceConfig) -> None:
        self.cfg = cfg

    def nominal_rate(self) -> float:
        return 1.0 if self.accept_value else 0.0

    def new_response(
        self, rng: np.random.Generator, prompt_len: int, output_len: int, pad: int
    ) -> ResponseStream:
        accept = np.r_[np.full(output_len, self.accept_value), np.zeros(pad, dtype=bool)]
        feats = np.zeros((len(accept), len(FEATURES)))
        feats[:output_len, 0] = 1.0 if self.accept_value else 0.0
        return ResponseStream(prompt_len, output_len, accept, feats, accept_runs(accept))


class _AcceptNone(_Scripted):
    accept_value = False


if "test-all" not in ACCEPTANCE:
    ACCEPTANCE.register("test-all")(_Scripted)
if "test-none" not in ACCEPTANCE:
    ACCEPTANCE.register("test-none")(_AcceptNone)


def cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str
) -> tuple[int, str, str]:
    """Run ``wispsim ARGS`` in-process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["wispsim", *args])
    capsys.readouterr()
    code = 0
    try:
        main()
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------------------------
# Results folders made by the real CLI (tests/plots/test_plots.py, tests/house/test_notebooks.py)
# --------------------------------------------------------------------------------------------

_QUICK = ["--set", "workload.warmup_s=2", "--set", "workload.duration_s=8"]
_BUILT: dict[str, object] = {}  # one set of folders per session, for the plots and the notebooks


def run_wispsim(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``wispsim ARGS`` in a new process (python -m wispsim.cli), output captured."""
    return subprocess.run(
        [sys.executable, "-m", "wispsim.cli", *args], capture_output=True, text=True, timeout=600
    )


_TRACE = "--duration 120 --low 10 --high 30 --period 120 --peaks 40:140 --hold 10 --decay 30"
_RUN = "run --tail 30 --arrivals"
_COMPARE = "compare --policies wisp,fcfs --classes 4,8 --seeds 1 --devices 40,80,120 --jobs 1"


def build_results(factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """(compare folder, {policy: bursty run folder}), built on first use."""
    if "results" not in _BUILT:
        root = factory.mktemp("plot-results")
        trace = root / "mini.csv"
        gen = run_wispsim("arrivals", "generate", "--out", str(trace), *_TRACE.split())
        assert gen.returncode == 0, gen.stderr
        runs = {p: root / f"bursty-{p}" for p in ("wisp", "fcfs")}
        # the two runs go in the background while the compare uses the other core
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "wispsim.cli",
                    *_RUN.split(),
                    str(trace),
                    "--policy",
                    p,
                    "--out",
                    str(f),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for p, f in runs.items()
        ]
        cmp = root / "compare"
        c = run_wispsim(*_COMPARE.split(), "--out", str(cmp), *_QUICK)
        assert c.returncode == 0, c.stderr
        for proc in procs:
            _, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err
        _BUILT["results"] = (cmp, runs)
    return _BUILT["results"]  # type: ignore[return-value]


def is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _StepCost(AggregateCost):
    """10 ms per pass plus 1 ms per new token, nothing else (for :class:`FakeLatency`)."""

    __slots__ = ()
    form = "fake"

    def batch(self, n_linear, n_interactions, n_cached, n_requests=0, n_arrivals=0, n_logits=None, *_):  # type: ignore[no-untyped-def]
        return 0.010 + 0.001 * n_linear

    def marginal(self, l_new: int, l_cached: int) -> float:
        return 0.001 * l_new

    @property
    def fastest(self) -> float:
        return 0.011


class FakeLatency:
    """A latency model whose passes take exactly their estimate, 10 ms + 1 ms per new token; it
    logs each pass's (N_linear, N_interactions, N_cached)."""

    def __init__(self) -> None:
        self.cost = _StepCost()
        self.calls: list[tuple[int, int, int]] = []

    def time(self, shape: Shape, t_hat: float) -> float:
        self.calls.append((shape.n_linear, shape.n_interactions, shape.n_cached))
        return t_hat


def scheduler_cases(
    estimators: list[Any], queue: int = 12, blocks: int = 200, requests: int = 8, new_tokens: int = 1500
) -> Any:
    """A hypothesis strategy of (queue, now, GPU state) for scheduler properties: up to ``queue``
    pending rounds at now = 1 s (deadlines from 50 ms ago to 250 ms ahead, prefixes cold to
    1,500 cached tokens), a replica of up to ``blocks`` blocks, ``requests`` requests and
    ``new_tokens`` new tokens a batch, planning with one of ``estimators``."""
    from hypothesis import strategies as st

    from wispsim.model.schedulers import GpuState, Pending

    @st.composite
    def cases(draw: st.DrawFn) -> tuple[list[Pending], float, GpuState]:
        n = draw(st.integers(0, queue))
        now = 1.0
        arrivals = sorted(draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n)))
        q = [
            Pending(
                rid=i,
                arrival=arrivals[i],
                deadline=now + draw(st.floats(-0.05, 0.25)),
                n_hat=draw(st.floats(1.0, 9.0)),
                l_new=draw(st.integers(1, 400)),
                l_cached=draw(st.sampled_from([0, 0, 1, 50, 300, 1500])),
            )
            for i in range(n)
        ]
        g = GpuState(
            estimator=draw(st.sampled_from(estimators)),
            total_blocks=draw(st.integers(1, blocks)),
            block_size=draw(st.sampled_from([1, 16])),
            max_requests=draw(st.integers(1, requests)),
            max_new_tokens=draw(st.integers(1, new_tokens)),
            delta=draw(st.sampled_from([0.0, 0.005])),
        )
        return q, now, g

    return cases()


def context_model(folder: Path, seed: int = 0) -> Path:
    """A tiny Qwen2-shaped model (tiny-vllm's shape) whose next token depends on its whole
    context, saved with random weights in ``folder`` (``save_pretrained``; needs torch and
    transformers).

    vLLM's dummy weights and transformers' default init (0.02) give a model whose next token
    depends only on its last token: a test comparing tokens cannot see a corrupted KV cache with
    them. Here attention is nearly uniform over the context (small query and key weights), the
    token embeddings are small beside what attention adds, and the other weights are large, so
    the output depends on every earlier position's KV: changing one token 2-150 positions back
    changes the next token about a third of the time, and its log-probability always."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if (folder / "config.json").is_file():
        return folder
    cfg = Qwen2Config(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        intermediate_size=256, vocab_size=512, tie_word_embeddings=False, max_position_embeddings=8192,
        rms_norm_eps=1e-6, rope_theta=1e6, initializer_range=0.5,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 0.01)
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(0.05)
            layer.self_attn.k_proj.weight.mul_(0.05)
    model.save_pretrained(folder)
    return folder
