"""What an acceptance trace says: the figures of ``wispsim trace inspect``.

Acceptance along a trace is walked the way verification walks it: a window of K drafted positions
starts at t, its accepted length L is the run of accepted positions from t (at most K), and the
next window starts at t + L + 1 (the target commits its own token at the first rejection) or at
t + K + 1 when all K were accepted (the bonus token). All figures use the chosen verdict column:
``flag`` (the recorded realized verdict), ``greedy`` (argmax agreement) or ``beta`` (a seeded
Bernoulli(beta) draw). The figure of the report is drawn by :mod:`wispsim.plots.trace`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wispsim.model.acceptance import FEATURES, Trace, accept_runs


def verdicts(trace: Trace, accept_from: str = "flag", seed: int = 0) -> np.ndarray:
    if accept_from == "flag":
        return trace.flag
    if accept_from == "greedy":
        return trace.greedy
    return np.random.default_rng(seed).random(len(trace.beta)) < trace.beta


def window_lengths(trace: Trace, accept: np.ndarray, k: int) -> np.ndarray:
    """Accepted length L of every verification window of size k, walking each sample."""
    out: list[int] = []
    for s, n in zip(trace.starts.tolist(), trace.lengths.tolist(), strict=True):
        runs = accept_runs(accept[s : s + n]).tolist()
        t = 0
        while t < n:
            length = min(runs[t], k, n - t)
            out.append(length)
            t += length + 1
    return np.asarray(out, dtype=int)


def inspect_trace(trace: Trace, k: int = 5, accept_from: str = "flag") -> dict[str, Any]:
    """Every figure of the inspection as plain Python data (see :func:`format_report`)."""
    acc = verdicts(trace, accept_from)
    lengths = window_lengths(trace, acc, k)
    hist = np.bincount(lengths, minlength=k + 1)[: k + 1]
    # acceptance at window offset j among windows that reached j
    reached = np.array([(lengths >= j).sum() for j in range(k)])
    passed = np.array([(lengths >= j + 1).sum() for j in range(k)])
    per_position = np.divide(passed, reached, out=np.full(k, np.nan), where=reached > 0)
    cols = {"beta": trace.beta, "accept": acc.astype(float)}
    corr = {
        f: {
            name: float(np.corrcoef(trace.features[:, i], y)[0, 1]) if np.std(y) > 0 else float("nan")
            for name, y in cols.items()
        }
        for i, f in enumerate(FEATURES)
    }
    bins = np.linspace(0, 1, 11)
    top1 = trace.features[:, 0]
    which = np.clip(np.digitize(top1, bins) - 1, 0, 9)
    by_bin = []
    for b in range(10):
        sel = which == b
        by_bin.append(
            {
                "top1_low": float(bins[b]),
                "top1_high": float(bins[b + 1]),
                "positions": int(sel.sum()),
                "accept_rate": float(acc[sel].mean()) if sel.any() else float("nan"),
                "mean_beta": float(trace.beta[sel].mean()) if sel.any() else float("nan"),
            }
        )
    return {
        "path": trace.path,
        "samples": trace.samples,
        "positions": len(trace.beta),
        "accept_from": accept_from,
        "mean_beta": float(trace.beta.mean()),
        "mean_accept": float(acc.mean()),
        "mean_greedy_agree": float(trace.greedy.mean()),
        "k": k,
        "windows": len(lengths),
        "mean_accepted_length": float(lengths.mean()) if len(lengths) else float("nan"),
        "committed_per_round": float(lengths.mean() + 1) if len(lengths) else float("nan"),
        "accepted_length_hist": {int(i): int(c) for i, c in enumerate(hist)},
        "accept_by_window_position": [float(x) for x in per_position],
        "pearson": corr,
        "accept_by_top1_bin": by_bin,
        "metadata": trace.metadata,
    }


def format_report(r: dict[str, Any]) -> str:
    lines = [
        f"trace {r['path']}: {r['samples']} samples, {r['positions']} positions "
        f"(verdicts: {r['accept_from']})",
        f"mean beta {r['mean_beta']:.4f}   mean accept {r['mean_accept']:.4f}   "
        f"greedy agreement {r['mean_greedy_agree']:.4f}",
        f"K = {r['k']}: {r['windows']} windows, mean accepted length {r['mean_accepted_length']:.3f}, "
        f"committed per round {r['committed_per_round']:.3f}",
        "accepted length histogram: "
        + "  ".join(f"L={i}: {c}" for i, c in r["accepted_length_hist"].items()),
        "acceptance at window position (given reached): "
        + "  ".join(f"{j + 1}: {x:.3f}" for j, x in enumerate(r["accept_by_window_position"])),
        "Pearson correlation     with beta   with accept",
    ]
    for f, c in r["pearson"].items():
        lines.append(f"  {f:<20} {c['beta']:>10.3f} {c['accept']:>12.3f}")
    lines.append("acceptance by draft top-1 probability:")
    for b in r["accept_by_top1_bin"]:
        lines.append(
            f"  [{b['top1_low']:.1f}, {b['top1_high']:.1f})  {b['positions']:>6} positions  "
            f"accept {b['accept_rate']:.3f}  beta {b['mean_beta']:.3f}"
        )
    return "\n".join(lines)
