"""Time the roofline form's shapes on a real GPU with random weights (torch only, no wispsim).

What a forward pass of the cost model is made of, measured one kind at a time:

- ``gemm``: each linear layer of a decoder layer (q/k/v, o, gate+up, down) of a named
  architecture, split ``tp`` ways as vLLM's tensor parallelism splits it (columns of qkv and
  gate+up, rows of o and down), at every pass size ``n`` (tokens in the pass) from 1 to 8,192.
  Each row has the time, the bytes of weights read and the FLOPs, so a row gives the achieved
  fraction of the datasheet's HBM bandwidth and dense peak: the ``efficiency`` of the roofline.
- ``decode_attention``: one query per sequence over ``context`` cached tokens (PyTorch's fused
  scaled-dot-product attention, GQA), ``batch`` sequences: KV bytes read per second.
- ``prefill_attention``: causal attention over ``length`` new tokens: FLOPs per second.
- ``copy``: a device-to-device copy (the HBM bandwidth a kernel can reach at all).

Every timing is CUDA events around ``iters`` back-to-back launches after warm-ups, the median of
``reps`` such groups; rows are written as they finish (CSV), and the run stops cleanly when its
time budget is spent. Usage::

    python benchmarks/gpu/kernels.py --out DIR [--budget-s 240]

Provenance (GPU, driver, torch, CUDA, date, command) goes to DIR/kernels_meta.json.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import functools
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

# decoder-layer shapes (config.json facts, as wispsim/data/archs gives them):
# hidden, heads, kv_heads, head_dim, intermediate
ARCHS = {
    "llama-2-7b": (4096, 32, 32, 128, 11008),
    "qwen3-14b": (5120, 40, 8, 128, 17408),
    "qwen3-32b": (5120, 64, 8, 128, 25600),
    "llama-3.1-70b": (8192, 64, 8, 128, 28672),
}
TPS = {"llama-2-7b": (1,), "qwen3-14b": (1,), "qwen3-32b": (1, 2), "llama-3.1-70b": (2, 4)}
SIZES = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 4096, 8192)
DECODE = [(b, c) for b in (1, 8, 32, 128) for c in (256, 1024, 4096, 16384)]
PREFILL = (128, 512, 1024, 2048, 4096, 8192)


def timed(fn, iters: int, reps: int = 5, warmup: int = 3) -> float:
    """Median seconds per call of ``fn`` over ``reps`` groups of ``iters`` launches."""
    for _ in range(warmup):
        fn()
    out = []
    if not torch.cuda.is_available():  # a dry run on a CPU (checks the script, times nothing real)
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            out.append((time.perf_counter() - t0) / iters)
        return sorted(out)[len(out) // 2]
    torch.cuda.synchronize()
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3 / iters)
    out.sort()
    return out[len(out) // 2]


def device_facts(dev: torch.device) -> dict[str, object]:
    """Provenance of a timing run: the GPU (nvidia-smi's view too), torch, CUDA, date, command."""
    props = torch.cuda.get_device_properties(0) if dev.type == "cuda" else None
    query = "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem"
    smi = (
        ""
        if props is None
        else subprocess.run(["nvidia-smi", query, "--format=csv"], capture_output=True, text=True).stdout
    )
    return {
        "gpu": props.name if props else "cpu (dry run)",
        "multiprocessors": props.multi_processor_count if props else 0,
        "memory_bytes": props.total_memory if props else 0,
        "nvidia_smi": smi,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "weights": "random (torch.randn), activations random",
        "timing": "CUDA events around back-to-back launches after warm-ups; median of 5 groups",
    }


class Rows:
    """A results CSV written row by row (flushed, so a run cut short keeps what it timed), and the
    run's time budget."""

    def __init__(self, path: Path, header: list[str], budget_s: float) -> None:
        self.file = path.open("w", newline="")
        self.writer = csv.writer(self.file)
        self.writer.writerow(header)
        self.start, self.budget_s = time.monotonic(), budget_s

    def __call__(self, *row: object) -> None:
        self.writer.writerow(row)
        self.file.flush()

    def over(self) -> bool:
        return time.monotonic() - self.start > self.budget_s


def iters_for(seconds: float) -> int:
    return max(3, min(200, int(0.02 / max(seconds, 1e-6))))


def layer_gemms(arch: str, tp: int) -> list[tuple[str, int, int]]:
    """(name, K, N) of each matmul of one decoder layer on one of ``tp`` GPUs."""
    h, heads, kv, d, inter = ARCHS[arch]
    return [
        ("qkv", h, (heads + 2 * kv) * d // tp),
        ("o", heads * d // tp, h),
        ("gate_up", h, 2 * inter // tp),
        ("down", inter // tp, h),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (checks the script)")
    args = ap.parse_args()
    if not torch.cuda.is_available() and not args.dry_run:
        print("kernels.py: no CUDA device (use --dry-run to check the script on a CPU)", file=sys.stderr)
        return 2
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.dry_run:
        global ARCHS, SIZES, DECODE, PREFILL, TPS
        ARCHS = {k: tuple(max(v // 64, 2) for v in dims) for k, dims in ARCHS.items()}
        SIZES, DECODE, PREFILL = (1, 16), [(2, 64)], (64,)
    meta = {**device_facts(dev), "dtype": "bfloat16"}
    (args.out / "kernels_meta.json").write_text(json.dumps(meta, indent=1))
    print(json.dumps(meta, indent=1), flush=True)
    row = Rows(
        args.out / "kernels.csv",
        ["kind", "arch", "tp", "name", "n", "k", "m", "batch", "context", "seconds", "bytes", "flops"],
        args.budget_s,
    )
    over = row.over

    bf = torch.bfloat16
    # the HBM a copy reaches (bytes read + written)
    big = 2 * 1024**3 if dev.type == "cuda" else 1024**2
    x = torch.empty(big, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    s = timed(functools.partial(y.copy_, x), 10)
    row("copy", "", 1, "d2d", 0, 0, 0, 0, 0, s, 2 * x.numel(), 0)
    print(f"copy: {2 * x.numel() / s / 1e12:.2f} TB/s", flush=True)
    del x, y
    # peak dense bf16 (a large square product)
    sq = 8192 if dev.type == "cuda" else 256
    a = torch.randn(sq, sq, dtype=bf, device=dev)
    s = timed(functools.partial(torch.matmul, a, a), 10)
    row("gemm", "square", 1, f"{sq}^3", sq, sq, sq, 0, 0, s, 3 * sq * sq * 2, 2 * sq**3)
    print(f"square gemm: {2 * sq**3 / s / 1e12:.2f} TFLOP/s", flush=True)
    del a
    # decoder-layer GEMMs at every pass size
    for arch, tps in TPS.items():
        for tp in tps:
            for name, k, m in layer_gemms(arch, tp):
                wgt = torch.randn(m, k, dtype=bf, device=dev)
                for n in SIZES:
                    if over():
                        break
                    inp = torch.randn(n, k, dtype=bf, device=dev)
                    fn = functools.partial(torch.nn.functional.linear, inp, wgt)
                    s0 = timed(fn, 3, reps=1, warmup=2)
                    s = timed(fn, iters_for(s0))
                    row("gemm", arch, tp, name, n, k, m, 0, 0, s, 2 * (m * k + n * k + n * m), 2 * n * k * m)
                del wgt
            print(f"gemm {arch} tp{tp}: done at {time.monotonic() - start:.0f} s", flush=True)
    # decode attention: one query per sequence over its cache (GQA), batched
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for arch in ("llama-2-7b", "qwen3-32b"):
        _, heads, kv, d, _ = ARCHS[arch]
        for b, c in DECODE:
            if over() or b * c * kv * d * 2 * 2 > 24 * 1024**3:
                continue
            q = torch.randn(b, heads, 1, d, dtype=bf, device=dev)
            kk = torch.randn(b, kv, c, d, dtype=bf, device=dev)
            vv = torch.randn(b, kv, c, d, dtype=bf, device=dev)
            fn = functools.partial(sdpa, q, kk, vv, enable_gqa=kv != heads)
            s0 = timed(fn, 3, reps=1, warmup=2)
            s = timed(fn, iters_for(s0))
            byts = 2 * b * kv * c * d * 2
            row("decode_attention", arch, 1, "sdpa", b, 0, 0, b, c, s, byts, 4 * b * heads * c * d)
            del q, kk, vv
        print(f"decode attention {arch}: done at {time.monotonic() - start:.0f} s", flush=True)
    # prefill attention: causal over new tokens
    for arch in ("llama-2-7b", "qwen3-32b"):
        _, heads, kv, d, _ = ARCHS[arch]
        for length in PREFILL:
            if over():
                continue
            q = torch.randn(1, heads, length, d, dtype=bf, device=dev)
            kk = torch.randn(1, kv, length, d, dtype=bf, device=dev)
            vv = torch.randn(1, kv, length, d, dtype=bf, device=dev)
            fn = functools.partial(sdpa, q, kk, vv, is_causal=True, enable_gqa=kv != heads)
            s0 = timed(fn, 3, reps=1, warmup=2)
            s = timed(fn, iters_for(s0))
            pairs = length * (length + 1) // 2
            row("prefill_attention", arch, 1, "sdpa", length, 0, 0, 1, length, s, 0, 4 * heads * d * pairs)
        print(f"prefill attention {arch}: done at {time.monotonic() - start:.0f} s", flush=True)
    row.file.close()
    print(f"kernels.py: {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
