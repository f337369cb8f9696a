"""wispsim: a SimPy simulator for capacity planning of distributed speculative LLM serving.

Edge devices draft tokens with a small model; a GPU server verifies the drafts in batches with
the large model. wispsim answers how many devices a verifier can serve while every device keeps
its token-speed SLO, under which policy, and where the knee is. Start with ``wispsim --help`` or
:func:`wispsim.simulation.simulate`.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
