"""The bodies of the session API's requests (pydantic models), one rule for HTTP and gRPC: the HTTP
app parses its JSON into them and the gRPC service builds them from its messages
(:mod:`wispsim.serve.app`, :mod:`wispsim.serve.grpc_api`); a body that does not validate is one
line naming the field (:func:`validation_line`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class OpenBody(BaseModel):
    """``POST /sessions``: the session's prompt."""

    prompt: list[int] = Field(min_length=1)


class RoundBody(BaseModel):
    """``POST /sessions/{id}/rounds``: the draft, the replayed verdict and what the SLO needs."""

    draft: list[int] = Field(min_length=1, max_length=1024)
    accepted: int = Field(ge=0)
    commit: int = Field(ge=1)
    budget_s: float = Field(allow_inf_nan=False)
    n_hat: float = Field(gt=0, allow_inf_nan=False)


class GenerateBody(BaseModel):
    """``POST /generate``: a whole response for centralized serving."""

    prompt: list[int] = Field(min_length=1)
    output_tokens: int = Field(ge=1)


def validation_line(path: str, errors: Any) -> str:
    """One line for a body that does not validate: the path, the field, what is wrong."""
    err = errors[0] if errors else {"loc": ("body",), "msg": "invalid"}
    where = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
    return f"{path}: {where}: {err.get('msg')}"
