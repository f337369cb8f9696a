"""GPU datasheets: the hardware facts physical profiles are priced on (wispsim/data/gpus.yaml, or a
user's YAML file of entries in its format). A user's entry names every field that changes the
price: its ``generation`` (whose measured kernel efficiencies it takes, efficiency.yaml) and its
``interconnect`` (what tensor-parallel all-reduces run over, interconnects.yaml) have no default.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from wispsim.errors import ConfigError
from wispsim.paths import data_dir

_DATA = data_dir()

GENERATIONS = ("ampere", "ada", "hopper", "blackwell", "cdna3")
INTERCONNECTS = ("nvlink3", "nvlink4", "nvlink5", "pcie4", "pcie5", "infinity-fabric")
GPU_FIELDS = {
    "name": "a display name",
    "generation": f"one of {', '.join(GENERATIONS)}",
    "memory_gib": "usable memory per GPU (GiB)",
    "hbm_bandwidth_gbs": "memory bandwidth per GPU (GB/s)",
    "bf16_tflops": "dense bf16 tensor-core peak (TFLOP/s)",
    "fp8_tflops": "dense fp8 peak (TFLOP/s), null without fp8 tensor cores",
    "bf16_maf_tflops": "the most a dense bf16 GEMM reaches at the clock it holds (TFLOP/s), if published",
    "fp8_maf_tflops": "the same for fp8 (TFLOP/s), where published",
    "interconnect": f"one of {', '.join(INTERCONNECTS)}",
    "link_gbs": "interconnect bandwidth per GPU, one direction (GB/s)",
    "source": "the datasheet the figures come from",
}


@dataclass(frozen=True, slots=True)
class GPU:
    """Datasheet facts of one GPU model (wispsim/data/gpus.yaml, or a user's file of entries in its
    format)."""

    key: str
    name: str
    memory_gib: float
    hbm_bandwidth_gbs: float
    bf16_tflops: float
    source: str = ""
    link_gbs: float | None = None  # per GPU, one direction: what tensor-parallel all-reduces use
    fp8_tflops: float | None = None  # dense; None where the GPU has no fp8 tensor cores
    generation: str = "hopper"  # whose measured kernel efficiencies it takes (efficiency.yaml)
    interconnect: str = "nvlink4"  # what all-reduces run over (interconnects.yaml); a file must name both
    # max-achievable FLOPs: the best dense GEMM at the clock the card holds under it (None: not
    # published; the generation's measured compute figure then stands alone)
    bf16_maf_tflops: float | None = None
    fp8_maf_tflops: float | None = None


@cache
def _gpu_table() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load((_DATA / "gpus.yaml").read_text())
    assert isinstance(data, dict)
    return data


def available_gpus() -> list[str]:
    return sorted(_gpu_table())


def load_gpu(key: str) -> GPU:
    """A shipped GPU by name (``h100-80gb``), or the one entry of a YAML file of entries in
    gpus.yaml's format (``my-cards.yaml``, or ``my-cards.yaml:key`` where it holds several)."""
    path, entry = key, ""
    if not Path(key).is_file() and ":" in key:
        path, _, entry = key.rpartition(":")
    if Path(path).suffix in (".yaml", ".yml") or Path(path).is_file():
        return _gpu_from_file(Path(path), entry)
    table = _gpu_table()
    if key not in table:
        raise ConfigError(
            "--gpu",
            "gpu",
            f"unknown GPU {key!r}; known: {', '.join(sorted(table))}, or a YAML file of entries",
        )
    return gpu_from_dict(key, table[key], "wispsim/data/gpus.yaml")


def _gpu_from_file(path: Path, entry: str) -> GPU:
    from wispsim.config.parse import read_yaml

    src = str(path)
    if not path.is_file():
        raise ConfigError(src, "", "no such GPU file (a YAML mapping of entries in gpus.yaml's format)")
    data = read_yaml(path)  # strict: duplicate keys, bad UTF-8, malformed YAML are one line
    if not isinstance(data, dict) or not data:
        raise ConfigError(src, "", "must be a mapping of GPU entries (key: {name, generation, ...})")
    if "hbm_bandwidth_gbs" in data:  # one bare entry
        return gpu_from_dict(path.stem, data, src)
    if not entry:
        if len(data) > 1:
            raise ConfigError(
                src, "", f"holds {len(data)} GPUs; name one as {src}:KEY ({', '.join(map(str, data))})"
            )
        entry = str(next(iter(data)))
    if entry not in data:
        raise ConfigError(src, entry, f"no such entry; known: {', '.join(map(str, data))}")
    return gpu_from_dict(entry, data[entry], src)


def gpu_from_dict(key: str, d: Any, src: str) -> GPU:
    """One GPU entry, checked: every field named (``generation`` and ``interconnect`` too: no
    default), numbers positive, kinds known."""
    if not isinstance(d, dict):
        raise ConfigError(src, key, "must be a mapping of " + ", ".join(GPU_FIELDS))
    extra = sorted(set(d) - set(GPU_FIELDS) - {"nvlink_gbs"})
    if extra:
        raise ConfigError(src, f"{key}.{extra[0]}", f"unknown field; allowed: {', '.join(GPU_FIELDS)}")

    def num(field: str, required: bool = True) -> float | None:
        v = d.get(field)
        if v is None:
            if required:
                raise ConfigError(src, f"{key}.{field}", f"is missing ({GPU_FIELDS[field]})")
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < 1e6:
            raise ConfigError(
                src, f"{key}.{field}", f"got {v!r}; allowed: a positive number ({GPU_FIELDS[field]})"
            )
        return float(v)

    for name, allowed in (("generation", GENERATIONS), ("interconnect", INTERCONNECTS)):
        if d.get(name) is None:  # no default: each prices the GPU differently
            raise ConfigError(src, f"{key}.{name}", f"is missing; allowed: {', '.join(allowed)}")
    gen, link = d["generation"], d["interconnect"]
    if gen not in GENERATIONS:
        raise ConfigError(src, f"{key}.generation", f"got {gen!r}; allowed: {', '.join(GENERATIONS)}")
    if "nvlink_gbs" in d and "link_gbs" not in d:  # the older spelling of link_gbs
        d = {**d, "link_gbs": d["nvlink_gbs"]}
    if link not in INTERCONNECTS:
        raise ConfigError(src, f"{key}.interconnect", f"got {link!r}; allowed: {', '.join(INTERCONNECTS)}")
    return GPU(
        key=key,
        name=str(d.get("name", key)),
        memory_gib=num("memory_gib"),  # type: ignore[arg-type]
        hbm_bandwidth_gbs=num("hbm_bandwidth_gbs"),  # type: ignore[arg-type]
        bf16_tflops=num("bf16_tflops"),  # type: ignore[arg-type]
        source=str(d.get("source", "")),
        link_gbs=num("link_gbs", required=False),
        fp8_tflops=num("fp8_tflops", required=False),
        generation=str(gen),
        interconnect=str(link),
        bf16_maf_tflops=num("bf16_maf_tflops", required=False),
        fp8_maf_tflops=num("fp8_maf_tflops", required=False),
    )
