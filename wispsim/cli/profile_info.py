"""``wispsim profile archs|gpus|show``: what the cost model knows (architectures, GPUs) and what a
profile holds. Registered on the ``profile`` group by :func:`register` (wispsim/cli/main.py)."""

from __future__ import annotations

from typing import Annotated

import pandas as pd
import typer

from wispsim.cli.common import make_console, table

console = make_console()


def register(app: typer.Typer) -> None:
    app.command("archs")(archs_cmd)
    app.command("gpus")(gpus_cmd)
    app.command("show")(profile_show)


def archs_cmd() -> None:
    """List the named architectures with the facts profiles use."""
    from wispsim.model.archs import available_archs, load_arch

    rows = []
    for n in available_archs():
        a = load_arch(n)
        rows.append(
            (
                n,
                f"{a.parameters / 1e9:.3f}",
                str(a.layers),
                f"{a.heads}/{a.kv_heads}",
                str(a.head_dim),
                str(a.kv_bytes_per_token(2)),
            )
        )
    columns = ["name", "params (B)", "layers", "heads/kv", "head dim", "KV B/token bf16"]
    console.print(table(pd.DataFrame(rows, columns=columns), "architectures (wispsim/data/archs)"))


def gpus_cmd() -> None:
    """List the GPUs the cost model prices (wispsim/data/gpus.yaml) with their datasheet facts."""
    from wispsim.model.archs import available_gpus, load_gpu

    rows = []
    for key in available_gpus():
        g = load_gpu(key)
        rows.append(
            (key, g.name, g.generation, g.interconnect, f"{g.memory_gib:g}", f"{g.hbm_bandwidth_gbs:g}",
             f"{g.bf16_tflops:g}", "-" if g.fp8_tflops is None else f"{g.fp8_tflops:g}")
        )  # fmt: skip
    columns = ["gpu", "name", "generation", "interconnect", "GiB", "GB/s", "bf16 TFLOP/s", "fp8 TFLOP/s"]
    console.print(table(pd.DataFrame(rows, columns=columns), "GPUs (wispsim/data/gpus.yaml)"))


def profile_show(
    name: Annotated[str, typer.Argument(help="Profile name or path.")] = "a100-qwen3-32b",
) -> None:
    """Print a profile's coefficients, memory facts and provenance."""
    from wispsim.measure.profile.text import (
        coefficient_table,
        default_kv_line,
        estimator_line,
        provenance_line,
    )
    from wispsim.model.estimator import LINEAR_FORMS
    from wispsim.model.profiles import load_profile

    p = load_profile(name, "wispsim profile show", "NAME")
    title = f"profile {p.name} ({p.provenance.get('kind')}, {p.estimator.form} form)"
    if p.estimator.form in LINEAR_FORMS:
        coef = {k: getattr(p.estimator, k) for k in ("a", "b_compute", "b_read", "c")}
        console.print(table(coefficient_table(coef, p.ci95), title, left=("coefficient",)))
    else:
        console.print(f"{title}: {estimator_line(p)}")
    m = p.model
    window = (f" ({m.windowed_layers} of {m.layers} layers keep a {m.sliding_window:,}-token window)"
              if m.windowed_layers else "")  # fmt: skip
    console.print(
        f"hardware: {p.gpu_count}x {p.gpu} ({p.gpu_memory_gib:g} GiB), engine {p.engine}, {p.precision}\n"
        f"model: {m.name}, {m.parameters / 1e9:.1f}B params, KV {m.kv_bytes_per_token} bytes/token{window}, "
        f"weights {m.weight_bytes / 1e9:.1f} GB\n"
        f"{default_kv_line(p)}\n"
        f"noise sigma: {p.noise_sigma:g}\nprovenance: {p.provenance.get('kind')}: "
        f"{provenance_line(p.provenance)}"
    )
