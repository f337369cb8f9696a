"""A real deployment: verification server, centralized server, device swarm.

Its HTTP and gRPC server and client come with the ``serve`` extra; :func:`require_serve` says so
in one line before anything here is imported (the modules import fastapi, pydantic, uvicorn,
httpx, grpcio and protobuf).
"""

from __future__ import annotations

import importlib.util

from wispsim.errors import WispsimError

SERVE_MODULES = ("fastapi", "pydantic", "uvicorn", "httpx", "prometheus_client", "grpc", "google.protobuf")
SERVE_HINT = "pip install 'wispsim[serve]'"


def require_serve(what: str) -> None:
    """A one-line error naming the missing packages and the extra, if the serve extra is missing."""
    missing = [m for m in SERVE_MODULES if _missing(m)]
    if missing:
        raise WispsimError(f"{what} needs the serve extra ({', '.join(missing)} missing): {SERVE_HINT}")


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a module set to None in sys.modules, or a broken one
        return True
