"""Time the shapes issue 45 adds to the cost model on a real GPU, with random weights (torch only).

The prepared device check for the first GPU a session is lent (``benchmarks/gpu/run_device.sh``
runs it after ``kernels.py``); on a CPU ``--dry-run`` checks the script with tiny shapes. Kinds:

- ``expert_gemm``: one MoE layer's routed experts (gate+up, then down) for the tokens of a pass
  routed top-k at random among E experts, as a grouped GEMM (``torch._grouped_mm`` where the
  build has it: name ``grouped``) and as one GEMM per active expert (``loop``: the launch-bound
  bound), for gpt-oss-20b/120b, Qwen3-30B-A3B and DeepSeek-V3 split 8 ways; ``routing``: the
  router GEMM, softmax and top-k of the same pass. bf16 weights: MXFP4 and fp8 block-scaled
  expert kernels are vLLM's and are not timed here (the bytes a quantized pass reads are the
  cost model's, not this script's);
- ``fp8_gemm``: each matmul of one qwen3-32b decoder layer (``kernels.py``'s shapes) with fp8 e4m3
  weights and activations and per-tensor scales (``torch._scaled_mm``, what vLLM's fp8 linear
  method calls), beside the same matmul in bf16 (``bf16``): half the weight bytes, twice the
  datasheet's dense rate;
- ``lm_head``: the vocabulary projection for the sampled positions only (1 per sequence), for
  the 129k-201k vocabularies of DeepSeek, Qwen and gpt-oss;
- ``sampling``: over fp32 logits [batch, vocab]: greedy (argmax), a plain draw (softmax +
  multinomial) and top-p (sort, cumulative sum, mask, draw), as vLLM's torch sampler does them;
- ``mla_decode``: DeepSeek's absorbed latent-attention decode (queries against the cached
  512 + 64-wide latent, then the values from it), heads split 8 ways, batch x context;
- ``mla_prefill``: the same heads' expanded prefill form (vLLM's MLA prefill path): the cached
  context's latents projected up to every head's key and value (kv_b_proj, 512 -> 16 x 256),
  then multi-head attention (SDPA, key width 192, value width 128, causal over the new tokens),
  for one prompt chunk (n new over c cached) and for batches of verification rounds (5 new tokens
  over c cached): the kernels the roofline's ``F_pre``, ``F_up`` and ``U_bytes`` stand for;
- ``layer_graph``: one dense decoder layer at decode (RMSNorm, qkv, a rotary-like elementwise
  pass, GQA attention over 1,024 cached tokens, o, residual, RMSNorm, gate+up, SiLU-and-multiply,
  down, residual) at batch 1-64, run eagerly (``eager``) and replayed from a CUDA graph
  (``graph``): what the per-layer fixed costs are when vLLM runs a step as a graph.

Rows go to DIR/shapes_2026.csv as they finish (kind, arch, name, n, batch, context, seconds,
bytes, flops, note) and stop cleanly when ``--budget-s`` is spent; provenance (GPU, driver, torch,
CUDA, date, command) to DIR/shapes_2026_meta.json. Usage::

    python benchmarks/gpu/shapes_2026.py --out DIR [--budget-s 180] [--dry-run]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch
from kernels import (
    Rows,
    device_facts,
    iters_for,
    layer_gemms,
    timed,
)  # the sibling script (benchmarks/gpu/kernels.py)

# MoE layers (config.json facts, wispsim/data/archs): hidden, expert width, experts, top-k, tp
MOE = {
    "gpt-oss-20b": (2880, 2880, 32, 4, 1),
    "gpt-oss-120b": (2880, 2880, 128, 4, 1),
    "qwen3-30b-a3b": (2048, 768, 128, 8, 1),
    "deepseek-v3-tp8": (7168, 2048 // 8, 256, 8, 8),
    # larger experts (the grouped kernel's efficiency against the size of one expert's matrices)
    "mixtral-8x7b": (4096, 14336, 8, 2, 1),
    "mixtral-8x7b-tp2": (4096, 14336 // 2, 8, 2, 2),
    "gpt-oss-120b-tp2": (2880, 2880 // 2, 128, 4, 2),
    "qwen3-235b-a22b-tp4": (4096, 1536 // 4, 128, 8, 4),
}
TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 8192)
HEADS = {"deepseek-v3": (7168, 129280), "qwen3-32b": (5120, 151936), "gpt-oss-120b": (2880, 201088)}
BATCHES = (1, 8, 64, 256, 1024)
MLA = [(b, c) for b in (1, 16, 64, 256) for c in (512, 2048, 8192)]  # batch, context
# MLA's prefill form: (batch, new tokens, cached): prompt chunks, then verification rounds
MLA_PREFILL = [(1, 2048, 0), (1, 8192, 0), (1, 8192, 24576)]
MLA_PREFILL += [(b, 5, c) for b in (8, 32, 128) for c in (1000, 4000)]
# dense decoder layers for eager against CUDA-graph timing: hidden, heads, kv heads, head dim, MLP
LAYERS = {"llama-2-7b": (4096, 32, 32, 128, 11008), "qwen3-32b": (5120, 64, 8, 128, 25600)}


GRAPH = False  # --graph: every call is captured once in a CUDA graph and replayed (vLLM's decode)


def captured(fn, warmups: int):  # type: ignore[no-untyped-def]
    """``fn`` captured once in a CUDA graph after ``warmups`` calls on a side stream: its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def measure(fn) -> float:  # type: ignore[no-untyped-def]
    if GRAPH and torch.cuda.is_available():
        try:
            fn = captured(fn, 2)
        except RuntimeError as e:  # an op that cannot be captured: no row rather than an eager one
            print(f"capture failed: {e}"[:200], flush=True)
            return float("nan")
    s0 = timed(fn, 2, reps=1, warmup=1)
    return timed(fn, iters_for(s0))


def routed(n: int, experts: int, k: int, dev: torch.device) -> torch.Tensor:
    """Tokens per expert when ``n`` tokens pick ``k`` of ``experts`` at random (top-k of noise)."""
    idx = torch.randn(n, experts, device=dev).topk(k, dim=-1).indices.flatten()
    return torch.bincount(idx, minlength=experts)


def expert_pass(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, counts: list[int]) -> None:
    """One GEMM pair per active expert over its rows of ``x`` (tokens sorted by expert)."""
    start = 0
    for e, c in enumerate(counts):
        if c:
            h = x[start : start + c] @ w13[e]
            torch.nn.functional.silu(h[:, : h.shape[1] // 2]) * h[:, h.shape[1] // 2 :] @ w2[e]
            start += c


def grouped_pass(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, offs: torch.Tensor) -> None:
    h = torch._grouped_mm(x, w13, offs=offs)
    a = torch.nn.functional.silu(h[:, : h.shape[1] // 2]) * h[:, h.shape[1] // 2 :]
    torch._grouped_mm(a, w2, offs=offs)


def fp8_grouped_pass(x8, w13, w2, offs, sa, sb13, sb2) -> None:  # type: ignore[no-untyped-def]
    """The same grouped pair in fp8 e4m3 (rowwise activation scales, per-expert column scales, as
    vLLM's fp8 MoE kernels take them), the activation re-quantized between the two."""
    h = torch._scaled_grouped_mm(x8, w13, sa, sb13, offs=offs, out_dtype=torch.bfloat16)
    a = (torch.nn.functional.silu(h[:, : h.shape[1] // 2]) * h[:, h.shape[1] // 2 :]).to(torch.float8_e4m3fn)
    torch._scaled_grouped_mm(a, w2, sa, sb2, offs=offs, out_dtype=torch.bfloat16)


def decoder_layer(x: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, w: tuple[torch.Tensor, ...],
                  dims: tuple[int, ...]) -> torch.Tensor:  # fmt: skip
    """One dense decoder layer at decode: ``x`` [batch, hidden] over a cache of ``kc``/``vc``."""
    wq, wo, wgu, wd = w
    h, heads, kv, d, inter = dims
    b = x.shape[0]
    fn = torch.nn.functional
    qkv = fn.linear(fn.rms_norm(x, (h,)), wq)
    q = qkv[:, : heads * d] * 1.0001  # stands for the rotary embedding's elementwise pass
    a = fn.scaled_dot_product_attention(q.reshape(b, heads, 1, d), kc, vc, enable_gqa=kv != heads)
    y = x + fn.linear(a.reshape(b, heads * d), wo)
    gu = fn.linear(fn.rms_norm(y, (h,)), wgu)
    return y + fn.linear(fn.silu(gu[:, :inter]) * gu[:, inter:], wd)


def fp8_gemms(dev: torch.device, row, over) -> None:  # type: ignore[no-untyped-def]
    """qwen3-32b's layer matmuls at every pass size, fp8 e4m3 (per-tensor scales) against bf16."""
    one = torch.ones((), device=dev)
    for name, k, n_out in layer_gemms("qwen3-32b", 1):
        w = torch.randn(n_out, k, dtype=torch.bfloat16, device=dev) * 0.02
        w8 = w.to(torch.float8_e4m3fn)
        for n in TOKENS:
            if over():
                return
            x = torch.randn(n, k, dtype=torch.bfloat16, device=dev)
            x8 = x.to(torch.float8_e4m3fn)
            flops = 2 * n * k * n_out
            s = measure(functools.partial(torch.nn.functional.linear, x, w))
            row("fp8_gemm", "qwen3-32b", f"{name} bf16", n, 0, 0, s, k * n_out * 2, flops, "")
            try:
                fn = functools.partial(torch._scaled_mm, x8, w8.t(), scale_a=one, scale_b=one,
                                       out_dtype=torch.bfloat16)  # fmt: skip
                s = measure(fn)
                row("fp8_gemm", "qwen3-32b", f"{name} fp8", n, 0, 0, s, k * n_out, flops, "per-tensor scales")
            except RuntimeError as e:  # a shape cuBLASLt's fp8 path refuses
                row(
                    "fp8_gemm",
                    "qwen3-32b",
                    f"{name} fp8",
                    n,
                    0,
                    0,
                    "",
                    k * n_out,
                    flops,
                    f"unavailable: {e}"[:120],
                )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=180.0)
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (checks the script)")
    ap.add_argument("--experts-only", action="store_true", help="time the expert GEMMs and routing alone")
    ap.add_argument(
        "--graph", action="store_true", help="replay each call from a CUDA graph (shapes_2026_graph.csv)"
    )
    args = ap.parse_args()
    if not torch.cuda.is_available() and not args.dry_run:
        print("shapes_2026.py: no CUDA device (use --dry-run to check the script on a CPU)", file=sys.stderr)
        return 2
    global MOE, TOKENS, HEADS, BATCHES, MLA, MLA_PREFILL, LAYERS, GRAPH
    GRAPH, stem = args.graph, "shapes_2026_graph" if args.graph else "shapes_2026"
    stem += "_experts" if args.experts_only else ""
    if args.graph:  # the eager-against-graph layer rows are the eager run's
        LAYERS = {}
    if args.dry_run:
        MOE = {k: (64, 32, e, kk, tp) for k, (_, _, e, kk, tp) in list(MOE.items())[:2]}
        TOKENS, BATCHES, MLA = (1, 16), (1, 4), [(2, 64)]
        HEADS = {k: (64, 1000) for k in list(HEADS)[:1]}
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    meta = {
        **device_facts(dev),
        "dtype": "bfloat16 weights and activations; fp32 logits",
        "grouped_mm": hasattr(torch, "_grouped_mm"),
        "launch": "each call replayed from a CUDA graph" if args.graph else "eager (back-to-back launches)",
    }
    (args.out / f"{stem}_meta.json").write_text(json.dumps(meta, indent=1))
    print(json.dumps(meta, indent=1), flush=True)
    header = ["kind", "arch", "name", "n", "batch", "context", "seconds", "bytes", "flops", "note"]
    row = Rows(args.out / f"{stem}.csv", header, args.budget_s)
    over = row.over

    bf = torch.bfloat16
    for arch, (h, inter, experts, k, tp) in MOE.items():
        w13 = torch.randn(experts, h, 2 * inter, dtype=bf, device=dev) * 0.02
        w2 = torch.randn(experts, inter, h, dtype=bf, device=dev) * 0.02
        router = torch.randn(experts, h, dtype=bf, device=dev)
        for n in TOKENS:
            if over():
                break
            x = torch.randn(n * k, h, dtype=bf, device=dev)
            counts = routed(n, experts, k, dev)
            active = int((counts > 0).sum())
            byts = active * (3 * h * inter) * 2
            flops = 2 * n * k * 3 * h * inter
            s = measure(functools.partial(expert_pass, x, w13, w2, counts.tolist()))
            row("expert_gemm", arch, "loop", n, 0, 0, s, byts, flops, f"{active} experts active, tp {tp}")
            if meta["grouped_mm"] and dev.type == "cuda":
                offs = torch.cumsum(counts, 0).to(torch.int32)
                try:
                    s = measure(functools.partial(grouped_pass, x, w13, w2, offs))
                    row("expert_gemm", arch, "grouped", n, 0, 0, s, byts, flops, f"{active} experts active")
                except RuntimeError as e:  # a build or GPU without the grouped kernel
                    row("expert_gemm", arch, "grouped", n, 0, 0, "", byts, flops, f"unavailable: {e}"[:120])
            if dev.type == "cuda" and hasattr(torch, "_scaled_grouped_mm"):
                # each expert's rows padded to 16 (fp8 kernels take whole tiles; vLLM pads too)
                padded = ((counts + 15) // 16 * 16) * (counts > 0)
                m = int(padded.sum())
                f8 = torch.float8_e4m3fn
                x8 = torch.randn(m, h, device=dev).to(f8)
                w13_8 = w13.transpose(1, 2).contiguous().to(f8).transpose(1, 2)  # column-major per expert
                w2_8 = w2.transpose(1, 2).contiguous().to(f8).transpose(1, 2)
                sa = torch.ones(m, device=dev)
                sb13 = torch.ones(experts, 2 * inter, device=dev)
                sb2 = torch.ones(experts, h, device=dev)
                offs8 = torch.cumsum(padded, 0).to(torch.int32)
                args8 = (x8, w13_8, w2_8, offs8, sa, sb13, sb2)
                try:
                    s = measure(functools.partial(fp8_grouped_pass, *args8))
                    row(
                        "expert_gemm",
                        arch,
                        "grouped fp8",
                        n,
                        0,
                        0,
                        s,
                        byts // 2,
                        flops,
                        f"{active} experts active, rows padded to {m}",
                    )
                except RuntimeError as e:  # a build or GPU without fp8 grouped kernels
                    row(
                        "expert_gemm",
                        arch,
                        "grouped fp8",
                        n,
                        0,
                        0,
                        "",
                        byts // 2,
                        flops,
                        f"unavailable: {e}"[:120],
                    )
                del x8, w13_8, w2_8, args8
            xr = torch.randn(n, h, dtype=bf, device=dev)

            def route(xr: torch.Tensor = xr, r: torch.Tensor = router, k: int = k) -> None:
                torch.softmax((xr @ r.T).float(), dim=-1).topk(k, dim=-1)

            s = measure(route)
            row("routing", arch, "router+softmax+topk", n, 0, 0, s, experts * h * 2, 2 * n * h * experts, "")
        del w13, w2, router
        print(f"experts {arch}: done at {time.monotonic() - start:.0f} s", flush=True)
    if args.experts_only:
        HEADS, MLA, MLA_PREFILL, LAYERS = {}, [], [], {}
    if dev.type == "cuda" and hasattr(torch, "_scaled_mm") and not args.experts_only:
        fp8_gemms(dev, row, over)
        print(f"fp8 gemms: done at {time.monotonic() - start:.0f} s", flush=True)
    for arch, (h, vocab) in HEADS.items():
        head = torch.randn(vocab, h, dtype=bf, device=dev) * 0.02
        for b in BATCHES:
            if over():
                break
            x = torch.randn(b, h, dtype=bf, device=dev)
            s = measure(functools.partial(torch.nn.functional.linear, x, head))
            row("lm_head", arch, "sampled positions", b, b, 0, s, vocab * h * 2, 2 * b * h * vocab, "")
            logits = torch.randn(b, vocab, device=dev)

            def greedy(lg: torch.Tensor = logits) -> None:
                lg.argmax(dim=-1)

            def draw(lg: torch.Tensor = logits) -> None:
                torch.multinomial(torch.softmax(lg, dim=-1), 1)

            def top_p(lg: torch.Tensor = logits, p: float = 0.95) -> None:
                srt, idx = lg.sort(dim=-1, descending=True)
                probs = torch.softmax(srt, dim=-1)
                keep = probs.cumsum(dim=-1) - probs <= p
                probs = probs * keep
                idx.gather(-1, torch.multinomial(probs, 1))

            for name, fn in (("greedy", greedy), ("softmax+multinomial", draw), ("top-p 0.95 (sort)", top_p)):
                if over():
                    break
                s = measure(fn)
                row("sampling", arch, name, b, b, vocab, s, b * vocab * 4, 0, "fp32 logits")
        del head
        print(f"lm head and sampling {arch}: done at {time.monotonic() - start:.0f} s", flush=True)
    heads, latent, rope = (16, 512, 64) if not args.dry_run else (2, 16, 4)  # DeepSeek-V3 split 8 ways
    for b, c in MLA:
        if over():
            break
        q = torch.randn(b, heads, latent + rope, dtype=bf, device=dev)
        cache = torch.randn(b, c, latent + rope, dtype=bf, device=dev)

        def mla(q: torch.Tensor = q, cache: torch.Tensor = cache) -> None:
            scores = torch.softmax(torch.bmm(q, cache.transpose(1, 2)).float(), dim=-1).to(q.dtype)
            torch.bmm(scores, cache[..., :latent])

        s = measure(mla)
        byts = b * c * (latent + rope) * 2
        flops = 2 * b * heads * c * (2 * latent + rope)
        row(
            "mla_decode", "deepseek-v3-tp8", "absorbed (bmm)", b, b, c, s, byts, flops, "latent 512 + rope 64"
        )
    print(f"mla decode: done at {time.monotonic() - start:.0f} s", flush=True)
    nope, vd = (128, 128) if not args.dry_run else (8, 8)
    w_kvb = torch.randn(latent, heads * (nope + vd), dtype=bf, device=dev) * 0.02
    for b, n, c in MLA_PREFILL if not args.dry_run or not MLA_PREFILL else ((1, 8, 16), (2, 2, 16)):
        if over():
            break
        q = torch.randn(b, heads, n, nope + rope, dtype=bf, device=dev)
        lat = torch.randn(b * (c + n), latent, dtype=bf, device=dev)
        pe = torch.randn(b, 1, c + n, rope, dtype=bf, device=dev)

        def prefill(q=q, lat=lat, pe=pe, b=b, n=n, c=c, w=w_kvb) -> None:  # type: ignore[no-untyped-def]
            kv = (lat @ w).view(b, c + n, heads, nope + vd).transpose(1, 2)
            k = torch.cat([kv[..., :nope], pe.expand(b, heads, c + n, rope)], dim=-1)
            mask = torch.ones(n, c + n, dtype=torch.bool, device=dev).tril(c)
            torch.nn.functional.scaled_dot_product_attention(q, k, kv[..., nope:], attn_mask=mask)

        s = measure(prefill)
        pairs = b * n * (c + n)
        flops = 2 * b * (c + n) * latent * heads * (nope + vd) + 2 * pairs * heads * (nope + rope + vd)
        byts = b * (c + n) * (latent + rope + 2 * heads * (nope + rope + vd)) * 2
        name = "expanded (kv_b + sdpa)"
        row("mla_prefill", "deepseek-v3-tp8", name, n, b, c, s, byts, flops, "n new over c cached")
    del w_kvb
    print(f"mla prefill: done at {time.monotonic() - start:.0f} s", flush=True)
    for arch, (h, heads, kv, d, inter) in LAYERS.items():
        if args.dry_run:
            h, heads, kv, d, inter = 64, 4, 2, 16, 128
        wq = torch.randn((heads + 2 * kv) * d, h, dtype=bf, device=dev) * 0.02
        wo = torch.randn(h, heads * d, dtype=bf, device=dev) * 0.02
        wgu = torch.randn(2 * inter, h, dtype=bf, device=dev) * 0.02
        wd = torch.randn(h, inter, dtype=bf, device=dev) * 0.02
        ctx_len = 1024 if not args.dry_run else 32
        for b in (1, 8, 64) if not args.dry_run else (1, 2):
            if over():
                break
            x = torch.randn(b, h, dtype=bf, device=dev)
            kc = torch.randn(b, kv, ctx_len, d, dtype=bf, device=dev)
            vc = torch.randn(b, kv, ctx_len, d, dtype=bf, device=dev)

            layer = functools.partial(decoder_layer, x, kc, vc, (wq, wo, wgu, wd), (h, heads, kv, d, inter))
            s_eager = measure(layer)
            row("layer_graph", arch, "eager", b, b, ctx_len, s_eager, 0, 0, "one decoder layer, decode")
            if dev.type == "cuda":
                s = measure(captured(layer, 3))
                row("layer_graph", arch, "graph", b, b, ctx_len, s, 0, 0, "one decoder layer, decode")
        del wq, wo, wgu, wd
        print(f"layer eager/graph {arch}: done at {time.monotonic() - start:.0f} s", flush=True)
    row.file.close()
    print(f"shapes_2026.py: {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
