"""The API server's CPU for a response by its parts (benchmarks/vllm/stream_cost.py's cells):
the fit recovers known parts, and a bad table is refused by name."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from wispsim.errors import ConfigError
from wispsim.study.round_cost import (
    STREAM_COLUMNS,
    host_cpu_terms,
    merge_cpu,
    merge_terms,
    reference_round_ms,
    stream_cpu,
    stream_terms,
)

PARTS = {"request": 4.0, "chat": 1.0, "token": 0.01, "chunk": 0.08, "step": 0.15}  # ms


def _cells() -> pd.DataFrame:
    rows = []
    for c, m, steps in ((1, 16, 16), (1, 128, 128), (16, 16, 5), (16, 128, 90), (64, 16, 3), (64, 128, 70)):
        for chat in (False, True):
            for stream in (False, True):
                n = 4 * c
                tokens, chunks, n_steps = n * m, (n * m if stream else 0), n * steps
                cpu = (PARTS["request"] * n + PARTS["chat"] * n * chat + PARTS["token"] * tokens
                       + PARTS["chunk"] * chunks + PARTS["step"] * n_steps) / 1e3  # fmt: skip
                rows.append({"endpoint": "chat" if chat else "completions", "stream": stream,
                             "concurrency": c,
                             "max_tokens": m, "requests": n, "output_tokens": tokens, "chunks": chunks,
                             "steps": n_steps, "wall_s": 1.0, "api_cpu_s": cpu})  # fmt: skip
    return pd.DataFrame(rows)


def test_the_fit_recovers_each_part(tmp_path: Path) -> None:
    path = tmp_path / "stream.csv"
    _cells().to_csv(path, index=False)
    fit = stream_terms(stream_cpu(path))
    assert fit["host_scale"] == 1.0
    for k, v in PARTS.items():
        assert fit[k] == pytest.approx(v, rel=1e-6)
    assert fit["max_error"] < 1e-9
    terms = host_cpu_terms(
        pd.DataFrame(
            [
                {"group": g, "step": 0.0, "request": 0.0, "arrival": 1.0, "session": 0.5, "token": 0.0}
                for g in ("engine", "runner", "api")
            ]
        ),
        pd.DataFrame({"prefix": [128, 4096], "api_cpu_ms": [5.0, 8.0]}),
        pd.DataFrame({"kind": ["random-dataset"], "us_per_token": [3.0]}),
        fit,
    )
    assert terms["api_server_ms"]["chunk"] == pytest.approx(0.08) and terms["api_server_ms"][
        "chat"
    ] == pytest.approx(1.0)


def test_a_bad_table_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "stream.csv"
    _cells().assign(endpoint="embeddings").to_csv(path, index=False)
    with pytest.raises(ConfigError, match="endpoint: got 'embeddings'; allowed: completions, chat"):
        stream_cpu(path)
    _cells().assign(api_cpu_s=0.0).to_csv(path, index=False)
    with pytest.raises(ConfigError, match="api_cpu_s: must be > 0"):
        stream_cpu(path)
    _cells().drop(columns=["steps"]).to_csv(path, index=False)
    with pytest.raises(ConfigError, match="steps"):
        stream_cpu(path)
    assert "max_tokens" in STREAM_COLUMNS


def test_a_reference_round_scales_the_parts_to_the_measuring_host(tmp_path: Path) -> None:
    """Measured on a host twice as fast as the measuring one (its round costs half), every part
    is doubled; the reference row is no cell of the fit."""
    cells = _cells()
    ref = {"endpoint": "reference", "stream": False, "concurrency": 1, "max_tokens": 1, "requests": 100,
           "output_tokens": 100, "chunks": 0, "steps": 100, "wall_s": 1.0, "api_cpu_s": 0.25}  # fmt: skip
    path = tmp_path / "stream.csv"
    pd.concat([cells, pd.DataFrame([ref])]).to_csv(path, index=False)
    fit = stream_terms(stream_cpu(path), measuring_round_ms=5.0)  # 2.5 ms here
    assert fit["host_scale"] == pytest.approx(2.0)
    for k, v in PARTS.items():
        assert fit[k] == pytest.approx(2 * v, rel=1e-6)


MERGE = {"request": 1.0, "step": 0.15, "output": 0.01, "chunk": 0.04}  # ms


def _merge_cells() -> pd.DataFrame:
    """Cells as merge_cost.py records them: 128 streams, 32 or 128 tokens, more or fewer chunks a
    token as the API server falls behind (its steps rising and falling with the outputs)."""
    ref = {"endpoint": "reference", "concurrency": 1, "hogs": 0, "requests": 150, "output_tokens": 150}
    rows = [{**ref, "chunks": 0, "steps": 150, "api_cpu_s": 0.3}]
    for hogs, per_token in ((0, 1.0), (1, 0.5), (2, 0.3), (3, 0.25)):
        for m in (32, 128):
            n, tokens = 256, 256 * m
            chunks, steps = int(tokens * per_token), int(m * 2 * (1 + hogs))
            cpu = (MERGE["request"] * n + MERGE["step"] * steps + MERGE["output"] * tokens
                   + MERGE["chunk"] * chunks) / 1e3  # fmt: skip
            cell = {"endpoint": "completions", "concurrency": 128, "hogs": hogs, "requests": n}
            rows.append({**cell, "output_tokens": tokens, "chunks": chunks, "steps": steps, "api_cpu_s": cpu})
    return pd.DataFrame(rows)


def test_the_merge_fit_splits_a_chunk_into_what_a_merge_saves_and_what_it_does_not(tmp_path: Path) -> None:
    """With the step message's cost given, merged cells tell the chunk (saved by a merge) from the
    output (paid by every output); the host terms split the unmerged per-chunk cost by that share."""
    path = tmp_path / "merge.csv"
    _merge_cells().to_csv(path, index=False)
    cells = merge_cpu(path)
    assert reference_round_ms(cells) == pytest.approx(2.0)
    fit = merge_terms(cells, MERGE["step"])
    for k, v in MERGE.items():
        assert fit[k] == pytest.approx(v, rel=1e-6)
    assert fit["chunk_share"] == pytest.approx(0.8)
    stream = {"step": 0.5, "token": 0.0, "chunk": 0.25, "chat": 1.0}
    groups = [
        {"group": g, "step": 0.0, "request": 0.0, "arrival": 1.0, "session": 0.5, "token": 0.0}
        for g in ("engine", "runner", "api")
    ]
    cpu = pd.DataFrame({"prefix": [128, 4096], "api_cpu_ms": [5.0, 8.0]})
    tokenize = pd.DataFrame({"kind": ["random-dataset"], "us_per_token": [3.0]})
    terms = host_cpu_terms(pd.DataFrame(groups), cpu, tokenize, stream, None, fit)
    api = terms["api_server_ms"]
    assert api["chunk"] == pytest.approx(0.2) and api["output"] == pytest.approx(0.05)


def test_a_merge_table_with_no_merged_cell_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "merge.csv"
    _merge_cells().assign(chunks=lambda d: d["output_tokens"]).to_csv(path, index=False)
    with pytest.raises(ConfigError, match=r"chunks: no cell merged \(chunks < 0.9 x tokens\)"):
        merge_cpu(path)
