"""Write a small SYNTHETIC acceptance trace in the recorded format, for tests and examples.

    python scripts/make_fixture_trace.py [--out traces/fixture-synthetic.parquet] [--seed 7]

This is not a recording of any model. It has the schema of a real per-position acceptance trace
(SPEC 5) so the replay code, the predictor and the tests have something to read before real
recordings exist; its numbers only have plausible shapes:

- ``beta`` (1 - TV(p, q)) follows an AR(1) process in logit space along each sample's positions
  (phi = 0.8), around a per-sample level drawn near logit(0.72), so easy and hard stretches
  alternate like in real text;
- the draft features (``top1_prob``, ``entropy``, ``margin``, ``logit_std``) are a noisy monotone
  function of beta, and ``target_top1_prob`` a noisier one;
- ``accept`` is a realized Bernoulli(beta) flag (what a sampled run records) and ``greedy_agree``
  a noisy threshold of beta (argmax agreement).

Schema (one row per output position of each sample; positions are consecutive from 0):

    sample_id int64, position int64, context_length int64 (prompt tokens + position),
    top1_prob, entropy, margin, logit_std, beta float64, greedy_agree bool, accept bool,
    target_top1_prob float64

File metadata (Parquet schema key/values, all strings) under ``wispsim.trace.``: ``synthetic``
("true" here, "false" for recordings), ``generator``, ``seed``, ``date``, ``note``,
``format_version``, ``draft_model``, ``target_model``, ``dataset``, ``temperature``,
``samples``, ``rows``.
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FORMAT_VERSION = "1"
SCHEMA = pa.schema(
    [
        ("sample_id", pa.int64()),
        ("position", pa.int64()),
        ("context_length", pa.int64()),
        ("top1_prob", pa.float64()),
        ("entropy", pa.float64()),
        ("margin", pa.float64()),
        ("logit_std", pa.float64()),
        ("beta", pa.float64()),
        ("greedy_agree", pa.bool_()),
        ("accept", pa.bool_()),
        ("target_top1_prob", pa.float64()),
    ]
)
NOTE = (
    "SYNTHETIC fixture, not a recording: beta is an AR(1) process in logit space per sample, "
    "features are a noisy monotone function of beta. For tests and examples only; never quote "
    "results obtained with it."
)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def make_columns(
    seed: int = 7,
    samples: int = 40,
    min_len: int = 60,
    max_len: int = 200,
    mean_beta: float = 0.72,
    phi: float = 0.8,
    level_std: float = 0.5,
    logit_std: float = 1.3,
    feature_noise: float = 0.5,
) -> dict[str, np.ndarray]:
    """The trace's columns as arrays, drawn from one generator seeded with ``seed``."""
    rng = np.random.default_rng(seed)
    innovation = logit_std * np.sqrt(1.0 - phi**2)  # keeps the AR(1) stationary std at logit_std
    centre = np.log(mean_beta / (1.0 - mean_beta))
    cols: dict[str, list[np.ndarray]] = {name: [] for name in SCHEMA.names}
    for s in range(samples):
        n = int(rng.integers(min_len, max_len + 1))
        prompt = int(rng.integers(32, 513))
        level = centre + level_std * rng.standard_normal()
        x = np.empty(n)
        x[0] = level + logit_std * rng.standard_normal()
        eps = rng.standard_normal(n)
        for t in range(1, n):
            x[t] = level + phi * (x[t - 1] - level) + innovation * eps[t]
        beta = _sigmoid(x)
        z = rng.standard_normal((n, 4))
        top1 = _sigmoid(x + feature_noise * z[:, 0])
        rest = 1.0 - top1
        top2 = np.minimum(rest * (0.3 + 0.4 * _sigmoid(z[:, 1])), top1)
        entropy = -top1 * np.log(top1) - rest * np.log(np.maximum(rest, 1e-12) / 10.0)
        cols["sample_id"].append(np.full(n, s, dtype=np.int64))
        cols["position"].append(np.arange(n, dtype=np.int64))
        cols["context_length"].append(prompt + np.arange(n, dtype=np.int64))
        cols["top1_prob"].append(top1)
        cols["entropy"].append(entropy)
        cols["margin"].append(top1 - top2)
        cols["logit_std"].append(1.5 + 3.0 * top1 + 0.3 * z[:, 2])
        cols["beta"].append(beta)
        cols["greedy_agree"].append(beta + 0.15 * z[:, 3] > 0.5)
        cols["accept"].append(rng.random(n) < beta)
        cols["target_top1_prob"].append(_sigmoid(x + 0.5 + 2 * feature_noise * rng.standard_normal(n)))
    return {k: np.concatenate(v) for k, v in cols.items()}


def write_trace(path: Path, seed: int = 7, date: str | None = None, **kw: float) -> pa.Table:
    columns = make_columns(seed, **kw)  # type: ignore[arg-type]
    meta = {
        "synthetic": "true",
        "generator": "scripts/make_fixture_trace.py",
        "seed": str(seed),
        "date": date or dt.date.today().isoformat(),
        "note": NOTE,
        "format_version": FORMAT_VERSION,
        "draft_model": "synthetic",
        "target_model": "synthetic",
        "dataset": "synthetic",
        "temperature": "1.0",
        "samples": str(int(columns["sample_id"].max()) + 1),
        "rows": str(len(columns["sample_id"])),
    }
    schema = SCHEMA.with_metadata({f"wispsim.trace.{k}": v for k, v in meta.items()})
    table = pa.Table.from_pydict(columns, schema=schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return table


def main() -> None:
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=root / "traces" / "fixture-synthetic.parquet")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--date", default=None, help="metadata date (default: today)")
    args = ap.parse_args()
    table = write_trace(args.out, args.seed, args.date, samples=args.samples)
    beta = table.column("beta").to_numpy()
    print(f"wrote {args.out}: {table.num_rows} rows, {args.samples} samples, mean beta {beta.mean():.3f}")


if __name__ == "__main__":
    main()
