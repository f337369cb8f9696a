"""Kernel efficiencies per GPU generation, fitted on public and recorded kernel timings.

The roofline form (:mod:`wispsim.model.roofline`) prices a decoder layer's matmuls as
``W(n) / (B e_bw) (+) F(n) / (P e_flop)`` with ``(+)`` the p-norm of ``overlap``. The three
numbers are properties of a GPU generation's kernels, not of an engine: this module fits them on
timings of real layers' matmuls at pass sizes from 1 to 4,096-8,192 tokens:

- ``experiments/data/gpu/vidur/gemm.csv``: Vidur's public profiles (microsoft/vidur, MIT) of
  Llama-2 7B/70B, Llama-3 8B/70B, CodeLlama-34B, InternLM-20B, Qwen-72B and Phi-2 on A100, A40 and
  H100, at TP 1-8 (vLLM's kernels through Sarathi-Serve's profiler);
- ``experiments/data/gpu/h200/kernels.csv``: recorded here on an H200 (PyTorch 2.11 / cuBLAS).

Besides the matmuls, Vidur times each layer's elementwise kernels (RMSNorm, rotary embedding,
SiLU-and-multiply, residual adds). They stream activations, so they are bandwidth-bound: per layer
``elementwise = floor + act x 2 (hidden + intermediate / tp) x n x 2 bytes / (B e_bw)``, with a
floor (the kernels' launch-to-finish minimum) and ``act`` (activation passes per element) fitted.

Each generation's figures are fitted on all of its GPUs; :func:`leave_one_gpu_out` refits without
each GPU and reports the error on that GPU, so a generation's figures are known to carry to a card
they were not fitted on. ``python -m wispsim.study.gpu_kernels`` prints both and writes
``wispsim/data/efficiency.yaml``.
"""

from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

from wispsim.model.archs import load_gpu
from wispsim.model.roofline import combine
from wispsim.paths import data_dir as package_data

# the GPU keys (wispsim/data/gpus.yaml) the kernel sources name
GPU_OF = {"a100": "a100-80gb", "h100": "h100-80gb", "a40": "a40", "h200": "h200"}
MATMULS = 4  # per decoder layer: qkv, o, gate+up, down
# decoder-layer dims of the architectures benchmarks/gpu/kernels.py times (wispsim/data/archs)
H200_ARCHS = {
    "llama-2-7b": (4096, 32, 32, 128, 11008),
    "qwen3-14b": (5120, 40, 8, 128, 17408),
    "qwen3-32b": (5120, 64, 8, 128, 25600),
    "llama-3.1-70b": (8192, 64, 8, 128, 28672),
}


def experiments_gpu_dir(root: Path | None = None) -> Path:
    from wispsim.study.experiments.spec import experiments_dir

    return (root or experiments_dir()) / "data" / "gpu"


def _shapes(h: int, heads: int, kv: int, d: int, inter: int, tp: int) -> dict[str, tuple[int, int]]:
    """(K, M) of each matmul of one decoder layer on one of ``tp`` GPUs."""
    return {
        "qkv": (h, (heads + 2 * kv) * d // tp),
        "o": (heads * d // tp, h),
        "gate_up": (h, 2 * inter // tp),
        "down": (inter // tp, h),
    }


def layers(root: Path | None = None) -> pd.DataFrame:
    """One row per (GPU, model, tp, n): the layer's four matmuls' measured seconds, the weight
    bytes they read (bf16) and their FLOPs, and the source."""
    folder = experiments_gpu_dir(root)
    rows = []
    v = pd.read_csv(folder / "vidur" / "gemm.csv")
    for (gpu, model, tp, n), d in v.groupby(["gpu", "model", "tp", "num_tokens"]):
        r = d.iloc[0]
        h, heads, kv, inter = int(r.n_embd), int(r.n_head), int(r.n_kv_head), int(r.n_expanded_embd)
        shapes = _shapes(h, heads, kv, h // heads, inter, int(tp))
        if set(d.op) != set(shapes):
            continue
        km = sum(k * m for k, m in shapes.values())
        rows.append(
            dict(
                gpu=GPU_OF[str(gpu)],
                source="vidur",
                model=model,
                tp=int(tp),
                n=int(n),
                seconds=float(d.median_ms.sum()) / 1e3,
                weight_bytes=2.0 * km,
                flops=2.0 * int(n) * km,
            )
        )
    k = pd.read_csv(folder / "h200" / "kernels.csv")
    k = k[(k.kind == "gemm") & (k.arch != "square")]
    for (arch, tp, n), d in k.groupby(["arch", "tp", "n"]):
        km = float((d.k * d.m).sum())
        rows.append(
            dict(
                gpu="h200",
                source="h200-recorded",
                model=arch,
                tp=int(tp),
                n=int(n),
                seconds=float(d.seconds.sum()),
                weight_bytes=2.0 * km,
                flops=2.0 * int(n) * km,
            )
        )
    out = pd.DataFrame(rows)
    out["generation"] = [load_gpu(g).generation for g in out.gpu]
    return out


def elementwise(root: Path | None = None) -> pd.DataFrame:
    """Vidur's elementwise kernels per layer: seconds and the activation elements 2 (h + I/tp)."""
    folder = experiments_gpu_dir(root) / "vidur"
    e = pd.read_csv(folder / "elementwise.csv")
    e["gpu"] = e.gpu.map(GPU_OF)
    e["act_elems"] = 2.0 * (e.n_embd + e.n_expanded_embd / e.tp)
    return e


def _peaks(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    gpus = {g: load_gpu(g) for g in set(rows.gpu)}
    b = rows.gpu.map({g: x.hbm_bandwidth_gbs * 1e9 for g, x in gpus.items()}).to_numpy(float)
    f = rows.gpu.map({g: x.bf16_tflops * 1e12 for g, x in gpus.items()}).to_numpy(float)
    return b, f


def predict(rows: pd.DataFrame, e_bw: float, e_c: float, p: float, kernel_s: float = 0.0) -> np.ndarray:
    """The roofline's matmul time of each row at these efficiencies (its GPU's datasheet), plus
    ``kernel_s`` per matmul (a kernel's fixed latency: launch, ramp-up and tail)."""
    b, f = _peaks(rows)
    w = rows.weight_bytes.to_numpy() / (b * e_bw)
    c = rows.flops.to_numpy() / (f * e_c)
    hi = np.maximum(w, c)
    lo = np.minimum(w, c)
    return MATMULS * kernel_s + hi * (1.0 + (lo / hi) ** p) ** (1.0 / p)


@dataclass(frozen=True)
class Fit:
    bandwidth: float
    compute: float
    overlap: float
    kernel_us: float
    rows: int
    median_ape_pct: float


def fit(rows: pd.DataFrame) -> Fit:
    """Least squares on log time: every pass size counts alike."""
    y = np.log(rows.seconds.to_numpy())

    def resid(x: np.ndarray) -> np.ndarray:
        return np.log(predict(rows, x[0], x[1], x[2], x[3] * 1e-6)) - y

    r = least_squares(resid, x0=[0.75, 0.7, 3.0, 2.0], bounds=([0.2, 0.1, 1.0, 0.0], [1.0, 1.0, 64.0, 50.0]))
    err = np.abs(np.exp(resid(r.x)) - 1.0) * 100
    return Fit(float(r.x[0]), float(r.x[1]), float(r.x[2]), float(r.x[3]), len(rows), float(np.median(err)))


def ape(rows: pd.DataFrame, f: Fit) -> pd.Series:
    t = predict(rows, f.bandwidth, f.compute, f.overlap, f.kernel_us * 1e-6)
    return pd.Series(np.abs(t / rows.seconds.to_numpy() - 1) * 100, index=rows.index)


def fit_elementwise(e: pd.DataFrame, e_bw: dict[str, float]) -> tuple[float, float, float]:
    """(floor seconds per layer, activation passes, median APE %) over every GPU's rows."""
    b = np.array([load_gpu(g).hbm_bandwidth_gbs * 1e9 * e_bw[load_gpu(g).generation] for g in e.gpu])
    y = np.log(e.seconds.to_numpy())

    def model(x: np.ndarray) -> np.ndarray:
        return x[0] * 1e-6 + x[1] * e.act_elems.to_numpy() * e.n.to_numpy() * 2.0 / b

    r = least_squares(lambda x: np.log(model(x)) - y, x0=[20.0, 4.0], bounds=([0.0, 0.0], [200.0, 100.0]))
    err = np.abs(model(r.x) / e.seconds.to_numpy() - 1) * 100
    return float(r.x[0]) * 1e-6, float(r.x[1]), float(np.median(err))


def leave_one_gpu_out(rows: pd.DataFrame) -> pd.DataFrame:
    """For each GPU: its error under its own generation's fit (in-sample) and under the fit of its
    generation's other GPUs (held out); a GPU alone in its generation is held out against the
    other generations' pooled fit."""
    out = []
    for gpu, mine in rows.groupby("gpu"):
        gen = mine.generation.iloc[0]
        own = fit(rows[rows.generation == gen])
        others = rows[(rows.generation == gen) & (rows.gpu != gpu)]
        basis = f"{gen} without {gpu}"
        if others.empty:
            others, basis = rows[rows.gpu != gpu], f"all other GPUs ({gen} has no other)"
        held = fit(others)
        out.append(
            dict(
                gpu=gpu,
                generation=gen,
                rows=len(mine),
                sources=",".join(sorted(set(mine.source))),
                in_sample_median_ape_pct=round(float(ape(mine, own).median()), 1),
                held_out_median_ape_pct=round(float(ape(mine, held).median()), 1),
                held_out_p90_ape_pct=round(float(ape(mine, held).quantile(0.9)), 1),
                held_out_fit=basis,
            )
        )
    return pd.DataFrame(out)


def leave_one_source_out(rows: pd.DataFrame) -> pd.DataFrame:
    """Hopper fitted on one source's GPU, checked on the other's (Vidur's H100 vs the H200 here)."""
    hop = rows[rows.generation == "hopper"]
    out = []
    for src, mine in hop.groupby("source"):
        f = fit(hop[hop.source != src])
        out.append(
            dict(
                held_out_source=src,
                fitted_on=",".join(sorted(set(hop[hop.source != src].source))),
                median_ape_pct=round(float(ape(mine, f).median()), 1),
                p90_ape_pct=round(float(ape(mine, f).quantile(0.9)), 1),
            )
        )
    return pd.DataFrame(out)


def layer_graph_check(root: Path | None = None) -> pd.DataFrame:
    """A held-out check no fit saw: one dense decoder layer at decode (batch 1-64, 1,024 cached
    tokens each) timed on the H200 eagerly and replayed from a CUDA graph
    (``shapes_2026.csv``'s ``layer_graph`` rows), beside the roofline's price of one layer with the
    shipped Hopper figures: 4 matmul kernels, the elementwise floor and passes, the weights (+)
    their FLOPs, the KV read (+) the attention FLOPs."""
    table = yaml.safe_load((package_data() / "efficiency.yaml").read_text())
    hop, ew = table["hopper"], table["elementwise"]
    gpu = load_gpu("h200")
    bw, peak, p = gpu.hbm_bandwidth_gbs * 1e9, gpu.bf16_tflops * 1e12, float(hop["overlap"])
    d = pd.read_csv(experiments_gpu_dir(root) / "h200" / "shapes_2026.csv")
    d = d[d.kind == "layer_graph"].pivot_table(
        index=["arch", "batch", "context"], columns="name", values="seconds"
    )
    out = []
    for (arch, b, ctx), r in d.iterrows():
        h, heads, kv, hd, inter = H200_ARCHS[str(arch)]
        km = sum(k * m for k, m in _shapes(h, heads, kv, hd, inter, 1).values())
        lin = combine(2.0 * km / (bw * hop["bandwidth"]), 2.0 * b * km / (peak * hop["compute"]), p)
        att = combine(
            b * ctx * 2 * kv * hd * 2 / (bw * hop["bandwidth"]),
            b * ctx * 4 * heads * hd / (peak * hop["attention"]),
            p,
        )
        act = ew["activation_passes"] * 2 * (h + inter) * 2 * b / (bw * hop["bandwidth"])
        model = MATMULS * hop["kernel_us"] * 1e-6 + ew["floor_us"] * 1e-6 + act + lin + att
        out.append(
            dict(
                arch=arch,
                batch=int(b),
                eager_us=r["eager"] * 1e6,
                graph_us=r["graph"] * 1e6,
                roofline_us=model * 1e6,
            )
        )
    res = pd.DataFrame(out).round(1)
    res["vs_graph_pct"] = (100 * (res.roofline_us / res.graph_us - 1)).round(1)
    return res


def main(argv: list[str] | None = None) -> int:
    rows = layers()
    gens: dict[str, Fit] = {g: fit(d) for g, d in rows.groupby("generation")}
    e = elementwise()
    floor, act, e_err = fit_elementwise(e, {g: f.bandwidth for g, f in gens.items()})
    loo = leave_one_gpu_out(rows)
    los = leave_one_source_out(rows)
    print(pd.DataFrame({g: vars(f) for g, f in gens.items()}).T.to_string())
    print(loo.to_string(index=False))
    print(los.to_string(index=False))
    print(
        f"elementwise: floor {floor * 1e6:.1f} us per layer, {act:.2f} activation passes, "
        f"median APE {e_err:.1f}%"
    )
    print("one decoder layer at decode on the H200, eager and CUDA-graph replay, against the roofline:")
    print(layer_graph_check().to_string(index=False))
    if argv and "--write" in argv:
        write(gens, floor, act, e_err, loo, los)
    return 0


def write(
    gens: dict[str, Fit], floor: float, act: float, e_err: float, loo: pd.DataFrame, los: pd.DataFrame
) -> None:
    path = package_data() / "efficiency.yaml"
    old = yaml.safe_load(path.read_text()) if path.exists() else {}
    table = {}
    for gen, f in gens.items():
        mine = loo[loo.generation == gen]
        table[gen] = {
            "bandwidth": round(f.bandwidth, 4),
            "compute": round(f.compute, 4),
            "overlap": round(f.overlap, 3),
            "kernel_us": round(f.kernel_us, 2),
            "measured_on": sorted(mine.gpu),
            "fit_median_ape_pct": round(f.median_ape_pct, 1),
            "held_out_median_ape_pct": {r.gpu: r.held_out_median_ape_pct for r in mine.itertuples()},
        }
    for gen, entry in (old or {}).items():
        if gen not in table and isinstance(entry, dict) and "inherits" in entry:
            table[gen] = entry  # written by hand: a generation with no data, and why it inherits
    for gen, entry in (old or {}).items():
        if gen in table and isinstance(entry, dict) and "attention" in entry:
            table[gen]["attention"] = entry["attention"]
            table[gen]["attention_basis"] = entry.get("attention_basis", "")
    table["elementwise"] = {
        "floor_us": round(floor * 1e6, 2),
        "activation_passes": round(act, 3),
        "fit_median_ape_pct": round(e_err, 1),
        "measured_on": "Vidur's A100, A40 and H100 layers (elementwise.csv)",
    }
    for section in ("experts", "weight_only"):  # wispsim.study.expert_kernels writes the first,
        if isinstance((old or {}).get(section), dict):  # the second is published figures, by hand
            table[section] = old[section]
    header = (
        "# Kernel efficiencies per GPU generation (the roofline's bandwidth, compute, overlap), fitted by\n"
        "# `python -m wispsim.study.gpu_kernels --write` on experiments/data/gpu (Vidur's public A100, A40\n"
        "# and H100 profiles, MIT; an H200 recorded here). Generations with no data inherit, and say so.\n"
        f"# Written {dt.date.today().isoformat()}; attention figures and `inherits` entries are kept\n"
        "# from the previous file (their basis is written beside them).\n"
    )
    path.write_text(header + yaml.safe_dump(table, sort_keys=False, width=100))
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
