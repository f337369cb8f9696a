"""wispsim: a SimPy simulator for capacity planning of distributed speculative LLM serving.

Edge devices draft tokens with a small model; a GPU server verifies the drafts in batches with
the large model. wispsim answers how many devices a verifier can serve while every device keeps
its token-speed SLO, under which policy, and where the knee is. Start with ``wispsim --help`` or::

    from wispsim import check, load_scenario, simulate, summarize

The package is layered (``docs/architecture.md``); this module only re-exports, lazily, so that
importing a low layer such as :mod:`wispsim.errors` does not load the simulator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from wispsim import native as _native
from wispsim.version import __version__

_native.install()  # the compiled hot path where it is current (wispsim.native)

__all__ = ["__version__", "check", "load_scenario", "simulate", "summarize"]

if TYPE_CHECKING:
    from wispsim.analysis.metrics import summarize
    from wispsim.sim.scenarios import check, load_scenario
    from wispsim.sim.simulation import simulate

_EXPORTS = {
    "check": "wispsim.sim.scenarios",
    "load_scenario": "wispsim.sim.scenarios",
    "simulate": "wispsim.sim.simulation",
    "summarize": "wispsim.analysis.metrics",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'wispsim' has no attribute {name!r}")
