"""Flat records: one per completed round, batch and response.

These named tuples are the simulator's only output and also the Parquet schema; every summary is
computed from them (:mod:`wispsim.analysis.metrics`). Times are simulated seconds.

A run appends its records to a :class:`RecordTable`: a table of numbers and flags packs each row
into a byte buffer in the layout of its numpy record type (``struct``, about 0.2 us per round),
other tables keep plain tuples; every ``chunk_rows`` rows become typed column arrays (about 220
bytes per round instead of ~1.3 KB of Python objects). Past ``memory_rows`` rows a table
*spills*: its chunks go to a Parquet file in a temporary folder, one row group each, and the
run's memory stays bounded whatever its length.
Readers ask :class:`StoredRecords` for the columns (and rows) they need, so a summary of a
10-million-round run never holds all 27 columns at once.
"""

from __future__ import annotations

import functools
import os
import shutil
import struct
import tempfile
import typing
import weakref
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from wispsim.config import Scenario


class RoundRecord(NamedTuple):
    """One completed verification round: the device side and what the server did with it."""

    device: int
    slo: float  # the device's class: target tokens/s
    response: int  # global response id
    round: int  # index within the response
    position: int  # committed output tokens before the round
    t_start: float  # drafting starts
    tau_d: float  # the device's seconds per draft forward pass
    draft_time: float
    forward_passes: int
    predictor_calls: int
    k: int  # tokens sent for verification
    accepted: int  # L
    committed: int  # L + 1 (less on the last round if the response ends)
    uplink_time: float
    arrival: float  # at the server
    budget: float  # tau_c: server-side budget of the round
    deadline: float
    n_hat: float
    dispatch: float
    verify_time: float
    batch: int
    l_new: int
    l_cached: int
    cold: bool
    downlink_time: float
    t_end: float  # verdict back at the device
    measured: bool  # the round belongs to a measured response

    @property
    def queue_time(self) -> float:
        return self.dispatch - self.arrival


class BatchRecord(NamedTuple):
    """One batch a replica ran: a verification batch, or a step of the centralized engine."""

    batch: int
    replica: int
    kind: str  # "verify" | "step" (centralized)
    t_dispatch: float
    t_end: float
    size: int
    queue_len: int  # requests waiting when the batch was formed (incl. the batch)
    n_linear: int
    n_interactions: int
    n_cached: int
    t_hat: float  # the estimator's latency
    latency: float  # the simulated "true" latency: gpu_s and cpu_s together
    blocks_used: int  # KV blocks held after allocation
    evictions: int
    gpu_s: float  # the GPU's pass (noise applied; the drafter's passes under centralized-sd)
    cpu_s: float  # the engine core's CPU beside it (0 where the host is not modelled)


class ResponseRecord(NamedTuple):
    """One response: finished, or censored when the run decided it could not meet its SLO."""

    device: int
    slo: float
    response: int
    t_start: float
    t_end: float
    # the first output token is at the device (NaN: none yet when censored, or unknown); with
    # t_end it gives TTFT, TPOT and ITL (wispsim.analysis.token_latency)
    t_first: float
    prompt_len: int
    output_len: int
    rounds: int  # chunks streamed to the device: verification rounds; centralized: output_len
    cold_rounds: int
    speed: float  # output tokens / wall time (an upper bound if censored)
    violated: bool
    measured: bool  # started inside the measurement window
    censored: bool  # unfinished when it could no longer meet its SLO and the run ended
    # its times at the server (TTFT by its parts; NaN where unknown): centralized, it reached the
    # engine (past the front end and API server), the first engine step it could join began
    # (under async scheduling the one after next), the first step that ran it began; speculative,
    # its first round reached the server (twice) and its first batch began
    t_engine: float
    t_eligible: float
    t_scheduled: float


_DTYPES = {int: "int64", float: "float64", bool: "bool", str: "object"}
_STRUCT = {int: "q", float: "d", bool: "?"}  # the same layout in struct's codes (native order, packed)


CHUNK_ROWS = 65_536  # rows turned into column arrays at a time (and one Parquet row group)
MEMORY_ROWS = 1 << 20  # rows a table keeps in memory before it spills: ~230 MB of round records


def _columns(records: Sequence[tuple[Any, ...]], cls: Any) -> dict[str, np.ndarray]:
    """Column arrays of tuple records, through one structured array (numpy converts the rows in C:
    ~3x faster than a conversion per column)."""
    table = np.array(records, dtype=_record_dtype(cls)) if records else np.empty(0, _record_dtype(cls))
    return {f: np.ascontiguousarray(table[f]) for f in cls._fields}


@functools.cache
def _record_struct(cls: Any) -> struct.Struct | None:
    """The packed row layout of ``cls``'s numpy record type, or None when a field is not a number."""
    hints = typing.get_type_hints(cls)
    if any(hints[f] not in _STRUCT for f in cls._fields):
        return None
    packed = struct.Struct("=" + "".join(_STRUCT[hints[f]] for f in cls._fields))
    assert packed.size == _record_dtype(cls).itemsize
    return packed


@functools.cache
def _record_dtype(cls: Any) -> np.dtype:
    hints = typing.get_type_hints(cls)
    return np.dtype([(f, _DTYPES[hints[f]]) for f in cls._fields])


def frame(records: Sequence[tuple[Any, ...]], cls: Any) -> pd.DataFrame:
    """A DataFrame with the record type's columns and dtypes.

    ``records`` are tuples in the field order of ``cls`` (the named tuple class is the schema;
    a run's tables are built by :class:`RecordTable` instead).
    """
    return pd.DataFrame(_columns(records, cls))


Condition = tuple[str, str, Any]  # (column, "==" | ">=" | "<", value)
_OPS: dict[str, Callable[[pd.Series, Any], pd.Series]] = {
    "==": lambda a, v: a == v,
    ">=": lambda a, v: a >= v,
    "<": lambda a, v: a < v,
}


def _mask(df: pd.DataFrame, where: Sequence[Condition]) -> pd.Series:
    mask = None
    for col, op, value in where:
        m = _OPS[op](df[col], value)
        mask = m if mask is None else mask & m
    return mask


class StoredRecords:
    """A finished table of records: one DataFrame in memory, or a Parquet file a run spilled to.

    :meth:`frame` reads the columns and rows a caller needs; in memory it selects from the one
    DataFrame, on disk it reads row group by row group, so only the selection is ever held.
    """

    def __init__(self, cls: Any, data: pd.DataFrame | None = None, path: Path | None = None, rows: int = 0):
        self.cls = cls
        self._data = data
        self.path = path  # the spill file (None: in memory)
        self.rows = len(data) if data is not None else rows

    def __len__(self) -> int:
        return self.rows

    @property
    def spilled(self) -> bool:
        return self._data is None

    def frame(self, columns: Sequence[str] | None = None, where: Sequence[Condition] = ()) -> pd.DataFrame:
        """The records' ``columns`` (default: all), only the rows meeting every condition of
        ``where`` (``("t_end", ">=", 20.0)``; operators ``==``, ``>=``, ``<``).

        Row order is the order the records were written in; the index is 0..n-1 on disk and the
        in-memory frame's own labels otherwise (summaries never depend on it)."""
        cols = list(columns) if columns is not None else list(self.cls._fields)
        if self._data is not None:
            df = self._data
            if columns is None and not where:
                return df
            return df.loc[_mask(df, where) if where else slice(None), cols]
        import pyarrow.parquet as pq

        assert self.path is not None
        need = cols + [c for c, _, _ in where if c not in cols]
        parts = []
        with pq.ParquetFile(self.path) as pf:
            for i in range(pf.num_row_groups):
                part = pf.read_row_group(i, columns=need).to_pandas()
                parts.append((part[_mask(part, where)] if where else part)[cols])
        if not parts:
            return frame([], self.cls)[cols]
        return pd.concat(parts, ignore_index=True)

    def patch(self, change: Callable[[pd.DataFrame], pd.DataFrame]) -> None:
        """Replace the records by ``change`` of them (same columns and rows), in memory or, for a
        spilled table, row group by row group in its file."""
        if self._data is not None:
            self._data = change(self._data)
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        assert self.path is not None
        tmp = self.path.with_suffix(".patch")
        with pq.ParquetFile(self.path) as pf, pq.ParquetWriter(tmp, pf.schema_arrow) as out:
            for i in range(pf.num_row_groups):
                part = change(pf.read_row_group(i).to_pandas())
                out.write_table(pa.Table.from_pandas(part, schema=pf.schema_arrow, preserve_index=False))
        os.replace(tmp, self.path)

    def __getstate__(self) -> dict[str, Any]:
        # sent to another process (a Ray worker's result): the records travel, not the file path
        return {"cls": self.cls, "_data": self.frame(), "path": None, "rows": self.rows}

    def to_parquet(self, path: Path, index: bool = False) -> None:
        """Write every record to ``path`` (a copy of the spill file when the run spilled), like
        ``DataFrame.to_parquet(path, index=False)``."""
        assert not index, "records have no index to write"
        if self.path is not None:
            shutil.copyfile(self.path, path)
        else:
            assert self._data is not None
            self._data.to_parquet(path, index=False)


class RecordTable:
    """Records of one type while a run writes them (see the module docstring).

    :meth:`append` takes a tuple in the field order of ``cls``. When every field is a number or a
    flag the open chunk is ``buf``, rows packed by ``pack`` (the same bytearray all run long, so a
    hot loop may do ``buf += pack(*fields)`` itself and call :meth:`flush` once
    ``len(buf) >= chunk_bytes``); otherwise it is ``rows``, a list of tuples. Chunks are
    :data:`CHUNK_ROWS` rows, or ``memory_rows`` when that is smaller.
    """

    def __init__(self, cls: Any, memory_rows: int = MEMORY_ROWS) -> None:
        self.cls = cls
        self.memory_rows = memory_rows
        self.chunk_rows = max(1, min(CHUNK_ROWS, memory_rows))
        self.rows: list[tuple[Any, ...]] = []
        packer = _record_struct(cls)
        self.pack: Callable[..., bytes] | None = packer.pack if packer is not None else None
        self.row_bytes = packer.size if packer is not None else 0
        self.buf = bytearray()
        self.chunk_bytes = self.chunk_rows * self.row_bytes
        self._chunks: list[dict[str, np.ndarray]] = []
        self._kept = 0  # rows in _chunks
        self._written = 0  # rows in the spill file
        self._writer: Any = None
        self._schema: Any = None
        self._path: Path | None = None

    @property
    def packed(self) -> bool:
        """Whether rows are packed into ``buf`` (numbers and flags only) rather than kept as tuples."""
        return self.pack is not None

    def __len__(self) -> int:
        return self._kept + self._written + self._open_rows()

    def _open_rows(self) -> int:
        return len(self.buf) // self.row_bytes if self.packed else len(self.rows)

    def append(self, row: tuple[Any, ...]) -> None:
        if self.pack is not None:
            try:
                self.buf += self.pack(*row)
            except struct.error:
                raise TypeError(self.bad_row(row)) from None
            if len(self.buf) >= self.chunk_bytes:
                self.flush()
            return
        rows = self.rows
        rows.append(row)
        if len(rows) >= self.chunk_rows:
            self.flush()

    def bad_row(self, row: Sequence[Any]) -> str:
        """Why ``row`` cannot be packed: the first field whose value is not of its type."""
        hints = typing.get_type_hints(self.cls)
        for name, value in zip(self.cls._fields, row, strict=False):
            try:
                struct.pack("=" + _STRUCT[hints[name]], value)
            except struct.error:
                return (
                    f"{self.cls.__name__}.{name}: expected {hints[name].__name__}, "
                    f"got {type(value).__name__} {value!r}"
                )
        return f"{self.cls.__name__}: expected {len(self.cls._fields)} fields, got {len(row)}"

    def flush(self) -> None:
        """Turn the open chunk into column arrays (kept, or written as one row group)."""
        n = self._open_rows()
        if not n:
            return
        if self.packed:
            table = np.frombuffer(self.buf, dtype=_record_dtype(self.cls))
            cols = {f: table[f].copy() for f in self.cls._fields}
            del table  # the buffer cannot be cleared while a view of it exists
            self.buf.clear()
        else:
            cols = _columns(self.rows, self.cls)
            self.rows.clear()
        if self._writer is None and self._kept + n > self.memory_rows:
            self._spill()
        if self._writer is not None:
            self._write(cols, n)
        else:
            self._chunks.append(cols)
            self._kept += n

    def _spill(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        folder = Path(tempfile.mkdtemp(prefix="wispsim-records-"))
        self._path = folder / f"{self.cls.__name__}.parquet"
        arrow = {int: pa.int64(), float: pa.float64(), bool: pa.bool_(), str: pa.string()}
        hints = typing.get_type_hints(self.cls)
        self._schema = pa.schema([(f, arrow[hints[f]]) for f in self.cls._fields])
        self._writer = pq.ParquetWriter(self._path, self._schema)
        chunks, self._chunks, self._kept = self._chunks, [], 0
        for cols in chunks:
            self._write(cols, len(next(iter(cols.values()))))

    def _write(self, cols: dict[str, np.ndarray], n: int) -> None:
        import pyarrow as pa

        self._writer.write_table(pa.table(cols, schema=self._schema), row_group_size=max(n, 1))
        self._written += n

    def close(self) -> StoredRecords:
        """The finished table. A spill file lives in its own temporary folder until the returned
        :class:`StoredRecords` is garbage-collected (or the process exits)."""
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            assert self._path is not None
            stored = StoredRecords(self.cls, path=self._path, rows=self._written)
            weakref.finalize(stored, shutil.rmtree, self._path.parent, True)
            return stored
        chunks, self._chunks, self._kept = self._chunks, [], 0
        if not chunks:
            return StoredRecords(self.cls, frame([], self.cls))
        data = {}
        for f in self.cls._fields:  # column by column, freeing each column's chunks as it goes
            data[f] = np.concatenate([c.pop(f) for c in chunks]) if len(chunks) > 1 else chunks[0].pop(f)
        return StoredRecords(self.cls, pd.DataFrame(data, copy=False))


class Holdings:
    """What a replica holds at each pass it begins, for what the run says binds
    (:mod:`wispsim.analysis.binding`): the pass's start and length, its share of KV memory
    (reserved under admission control, else in use), its share of ``max_num_seqs`` (sequences
    running; a verification pass's rounds, or a resident build's admitted sessions) and whether it
    left admitted work waiting (rounds still queued; running sequences the step could not take)."""

    WIDTH = 5

    def __init__(self) -> None:
        self.data = array("d")

    def log(self, t: float, length: float, kv: float, seqs: float, backlog: bool) -> None:
        self.data.extend((t, length, kv, seqs, 1.0 if backlog else 0.0))

    def shares(self, window: tuple[float, float]) -> tuple[float, float, float]:
        """Over the passes begun inside ``window``: the mean KV and ``max_num_seqs`` shares; and
        the seconds inside ``window`` of the passes that left work waiting (NaN, NaN, 0: no pass
        began there)."""
        w0, w1 = window
        a = np.frombuffer(self.data, dtype=float).reshape(-1, self.WIDTH)
        t, end = a[:, 0], a[:, 0] + a[:, 1]
        backlog = float(((np.clip(end, w0, w1) - np.clip(t, w0, w1)) * a[:, 4]).sum())
        inside = a[(t >= w0) & (t < w1)]
        if not len(inside):
            return float("nan"), float("nan"), backlog
        return float(inside[:, 2].mean()), float(inside[:, 3].mean()), backlog


@dataclass
class SimResult:
    """Records of one run, with what produced them."""

    scenario: Scenario
    seed: int
    devices: int
    round_records: StoredRecords  # read parts with round_records.frame(columns, where)
    batches: pd.DataFrame
    responses: pd.DataFrame
    window: tuple[float, float]
    sim_end: float
    wall_s: float
    kv_blocks: int
    info: dict[str, Any] = field(default_factory=dict)
    block_size: int = 16  # tokens per KV block (server.engine.block_size, or the profile's engine's)

    @property
    def rounds(self) -> pd.DataFrame:
        """Every round record as one DataFrame. After a run that spilled (more rounds than
        :data:`MEMORY_ROWS`) this reads the whole file on each access: read the columns you need
        with ``round_records.frame(columns, where)`` instead."""
        return self.round_records.frame()
