"""Real inference engines behind one interface (HF transformers, vLLM); torch imported lazily.

:func:`make_engine` builds an engine by name from an :class:`EngineSpec`; importing this package
registers every adapter but imports none of their libraries.
"""

from wispsim.engines import hf, vllm
from wispsim.engines.base import (
    DTYPES,
    ENGINES,
    Batch,
    BatchTiming,
    Engine,
    EngineSpec,
    make_engine,
    random_batch,
    require_torch,
)

__all__ = [
    "DTYPES",
    "ENGINES",
    "Batch",
    "BatchTiming",
    "Engine",
    "EngineSpec",
    "hf",
    "make_engine",
    "random_batch",
    "require_torch",
    "vllm",
]
